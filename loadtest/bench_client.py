"""Client CPU per request: ``cluster_dq.client.AsyncClient`` beside httpx's ``AsyncClient`` and
aiohttp's ``ClientSession``, each sending ``GET /api/{ns}/{q}/size`` to one service worker at
1, 4, 16 and 64 requests in flight, in the same process, rounds interleaved. The figure is
the benchmark process's CPU time (user + system, all threads) over the requests it completed:
what a producer or a one-job-at-a-time consumer pays for its client.

    python loadtest/bench_client.py                              # 3 rounds of 3 s per point
    python loadtest/bench_client.py --rounds 1 --seconds 1 --concurrency 1,4

Figures only; nothing is asserted. The service and Redis share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import uvloop

from cluster_dq.client import AsyncClient
from cluster_dq.localredis import start_server
from cluster_dq.testing.service_process import ServiceProcess

NS, QUEUE = "bench", "sizes"
KINDS = ("cluster_dq", "httpx", "aiohttp")


async def measure(call: Callable[[], Awaitable[object]], inflight: int, seconds: float) -> float:
    """µs of this process's CPU per completed call, with ``inflight`` calls at once."""
    done = 0
    stop = 0.0

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await call()
            done += 1

    stop = time.monotonic() + 0.3  # warm up: connections made, caches filled
    await asyncio.gather(*(loop() for _ in range(inflight)))
    done = 0
    cpu = time.process_time()
    stop = time.monotonic() + seconds
    await asyncio.gather(*(loop() for _ in range(inflight)))
    return (time.process_time() - cpu) / max(done, 1) * 1e6


async def bench(base: str, token: str, a: argparse.Namespace) -> None:
    path = f"/api/{NS}/{QUEUE}/size"
    results: dict[tuple[str, int], list[float]] = {}
    for r in range(a.rounds):
        line = []
        for n in a.concurrency:
            for kind in KINDS:
                limits = max(n, 1)
                if kind == "cluster_dq":
                    async with AsyncClient(base, token, NS, max_connections=limits) as dq:
                        us = await measure(lambda: dq.size(QUEUE), n, a.seconds)
                elif kind == "httpx":
                    headers = {"X-Token": token}
                    lim = httpx.Limits(max_connections=limits)
                    async with httpx.AsyncClient(base_url=base, headers=headers, limits=lim) as hx:

                        async def hx_call() -> object:
                            r = await hx.get(path)
                            r.raise_for_status()
                            return r.json()

                        us = await measure(hx_call, n, a.seconds)
                else:
                    conn = aiohttp.TCPConnector(limit=limits)
                    headers = {"X-Token": token}
                    async with aiohttp.ClientSession(base, headers=headers, connector=conn) as s:

                        async def aio_call() -> object:
                            async with s.get(path) as r:
                                r.raise_for_status()
                                return await r.json()

                        us = await measure(aio_call, n, a.seconds)
                results.setdefault((kind, n), []).append(us)
                line.append(f"{kind}@{n} {us:.0f}")
        print(f"round {r + 1}: " + ", ".join(line) + " µs", flush=True)
    print()
    print(
        f"{'in flight':>9}  {'cluster_dq':>10}  {'httpx':>8}  {'aiohttp':>8}  cluster_dq ÷ aiohttp"
    )
    for n in a.concurrency:
        med = {k: statistics.median(results[(k, n)]) for k in KINDS}
        ratio = med["cluster_dq"] / med["aiohttp"]
        print(
            f"{n:>9}  {med['cluster_dq']:>10.0f}  {med['httpx']:>8.0f}  {med['aiohttp']:>8.0f}"
            f"  {ratio:.2f}"
        )
    print("(µs of client CPU per request, medians of the rounds)")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="per point and round")
    ap.add_argument(
        "--concurrency",
        type=lambda raw: [int(x) for x in raw.split(",")],
        default=[1, 4, 16, 64],
        help="requests in flight, comma-separated",
    )
    a = ap.parse_args()
    redis = start_server()
    try:
        env = {"CLUSTER_DQ_LOGLEVEL": "warning"}
        with ServiceProcess.start(
            f"127.0.0.1:{redis.port}", env=env, args=["--workers", "1"]
        ) as svc:
            print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, service: 1 worker")
            uvloop.run(bench(svc.base, svc.mint_token(NS), a))
    finally:
        redis.kill()


if __name__ == "__main__":
    main()
