"""Memory of a worker under unauthenticated junk (issue 14): starts a redis-server and
`cluster-dq serve` (1 worker), then sends

1. ``--requests`` requests (default 100,000), each with a different junk token: most of a valid
   shape (looked up in Redis once, then remembered in the bounded cache of refusals), some
   malformed (a 4 KB token, characters outside the grammar: refused by shape, no lookup);
2. ``--bodies`` unauthenticated 30 MB bulk bodies (answered 401 without being read),

and prints the worker's resident memory (VmRSS and VmHWM from /proc/<pid>/status) before and
after each phase, and the answers it got. Figures only; nothing is asserted.

    python loadtest/bench_junk.py
    python loadtest/bench_junk.py --requests 20000 --bodies 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import aiohttp
import httpx

from cluster_dq.localredis import start_server
from cluster_dq.testing.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]


def memory(pid: int) -> str:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return f"VmRSS {fields['VmRSS']:7.1f} MB  VmHWM {fields['VmHWM']:7.1f} MB"


def worker_pid(supervisor: int) -> int:
    """The supervisor's one worker process (the one serving the requests)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    for child in children:
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"spawn_main" in cmdline:  # not the resource tracker
            return int(child)
    raise RuntimeError(f"no worker among {children}")


def junk(i: int) -> str:
    if i % 10 == 9:
        return "x" * 4096 if i % 20 == 9 else f"bad token {i}!"  # malformed: refused by shape
    return f"junk-{i:020d}-{os.urandom(6).hex()}"  # a valid shape: one lookup each


async def flood(base: str, n: int, conns: int) -> Counter[int]:
    statuses: Counter[int] = Counter()
    queue = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conns)) as session:

        async def one() -> None:
            for i in queue:
                async with session.get(
                    f"{base}/api/ns{i % 50}/q/size", headers={"X-Token": junk(i)}
                ) as r:
                    await r.read()
                    statuses[r.status] += 1

        await asyncio.gather(*(one() for _ in range(conns)))
    return statuses


def bodies(base: str, n: int) -> Counter[str]:
    data = b"[" + b"x" * (30 * 1024 * 1024)
    out: Counter[str] = Counter()
    with httpx.Client(base_url=base, timeout=60) as client:
        for i in range(n):
            try:
                r = client.put("/api/ns/q/bulk", content=data, headers={"X-Token": junk(i)})
                out[str(r.status_code)] += 1
            except httpx.HTTPError as e:
                out[type(e).__name__] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--bodies", type=int, default=10)
    ap.add_argument("--conns", type=int, default=32)
    args = ap.parse_args()
    redis = start_server()
    svc = ServiceProcess.start(
        f"127.0.0.1:{redis.port}",
        env={"CLUSTER_DQ_LOGLEVEL": "warning", "CLUSTER_DQ_TOKENCACHESECOND": "60"},
        args=["--workers", "1"],
    )
    base = svc.base
    try:
        pid = worker_pid(svc.pid)
        httpx.get(f"{base}/api/ns/q/size", headers={"X-Token": "warm-up-token-000000000"})
        print(f"worker {pid} at start:                   {memory(pid)}", flush=True)
        t = time.perf_counter()
        statuses = asyncio.run(flood(base, args.requests, args.conns))
        took = time.perf_counter() - t
        print(
            f"after {args.requests:,} junk-token requests: {memory(pid)}   "
            f"({took:.1f} s, {args.requests / took:,.0f} req/s, answers {dict(statuses)})",
            flush=True,
        )
        out = bodies(base, args.bodies)
        print(
            f"after {args.bodies} x 30 MB unauthenticated bulk bodies: {memory(pid)}   answers {dict(out)}",
            flush=True,
        )
    finally:
        svc.stop(timeout=30)
        redis.kill()


if __name__ == "__main__":
    main()
