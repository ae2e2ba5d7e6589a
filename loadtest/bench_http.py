"""HTTP benchmark: starts a redis-server and `cluster-dq serve` (1, then 2 workers), drives
them from this separate process, and prints jobs/s and latency percentiles for: publish one
job per request, bulk publish (64 per request), consume + ack one at a time (2 requests per
job), consume 100 + batch ack (2 requests per 100 jobs) and the end-to-end cycle with the batch
verbs (bulk publish 64, consume 100, batch ack).

    python loadtest/bench_http.py                  # 10 s per scenario, 1 and 2 workers
    python loadtest/bench_http.py --seconds 3 --workers 1

Figures only; nothing is asserted. The load generator shares the 2 cores with the service
and Redis, so these are lower bounds of what the service does on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import uvloop

from cluster_dq.localredis import start_server
from cluster_dq.testing.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] * 1000 if s else float("nan")


async def drive(name: str, seconds: float, conns: int, make: object) -> None:
    """Runs ``make(session)`` from ``conns`` workers for ``seconds``; each call returns the
    number of jobs it completed, or an error kind (str)."""
    lat: list[float] = []
    jobs = 0
    errors: dict[str, int] = {}
    stop = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=conns)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal jobs
            while time.perf_counter() < stop:
                t = time.perf_counter()
                try:
                    done = await make(session)  # type: ignore[operator]
                except aiohttp.ClientError as e:
                    done = type(e).__name__
                if isinstance(done, int):
                    lat.append(time.perf_counter() - t)
                    jobs += done
                else:
                    errors[done] = errors.get(done, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conns)))
        took = time.perf_counter() - started
    print(
        f"  {name:<42} {jobs / took:>9,.0f} jobs/s  {len(lat) / took:>7,.0f} calls/s  "
        f"p50 {pct(lat, 50):6.2f} ms  p99 {pct(lat, 99):6.2f} ms  errors {errors or 0}",
        flush=True,
    )


async def scenarios(base: str, token: str, seconds: float, only: str = "") -> None:
    h = {"X-Token": token}
    body = os.urandom(32).hex().encode()  # 64 bytes
    bulk = json.dumps([body.decode()] * 64).encode()

    def put(path: str, data: bytes, jobs: int) -> object:
        async def call(s: aiohttp.ClientSession) -> int | str:
            async with s.put(f"{base}{path}", data=data, headers=h) as r:
                await r.read()
                return jobs if r.status == 201 else f"HTTP {r.status}"

        return call

    async def take(s: aiohttp.ClientSession, q: str, count: int) -> list[str] | str:
        async with s.get(f"{base}/api/bench/{q}?ttr=60&count={count}", headers=h) as r:
            if r.status != 200:
                await r.read()
                return "empty queue" if r.status == 404 else f"HTTP {r.status}"
            got = await r.json()
        return [j["job_id"] for j in (got if isinstance(got, list) else [got])]

    async def ack_each(s: aiohttp.ClientSession, q: str, ids: list[str]) -> int | str:
        for jid in ids:  # lmstfy's way: one DELETE per job
            async with s.delete(f"{base}/api/bench/{q}/job/{jid}", headers=h) as r:
                await r.read()
                if r.status != 204:
                    return f"HTTP {r.status}"
        return len(ids)

    async def ack_batch(s: aiohttp.ClientSession, q: str, ids: list[str]) -> int | str:
        async with s.post(f"{base}/api/bench/{q}/ack", json=ids, headers=h) as r:
            answer = await r.json()
            return answer["acked"] if r.status == 200 else f"HTTP {r.status}"  # type: ignore[no-any-return]

    def consume(q: str, count: int, ack: object) -> object:
        async def call(s: aiohttp.ClientSession) -> int | str:
            ids = await take(s, q, count)
            return ids if isinstance(ids, str) else await ack(s, q, ids)  # type: ignore[operator]

        return call

    async def end_to_end(s: aiohttp.ClientSession) -> int | str:
        """Publish 64 (bulk), consume up to 100, batch ack them: the batch verbs' cycle."""
        async with s.put(f"{base}/api/bench/e2e/bulk", data=bulk, headers=h) as r:
            await r.read()
            if r.status != 201:
                return f"HTTP {r.status}"
        return await consume("e2e", 100, ack_batch)(s)  # type: ignore[operator, no-any-return]

    async def preload(q: str, jobs: int) -> None:
        connector = aiohttp.TCPConnector(limit=16)
        async with aiohttp.ClientSession(connector=connector) as s:
            for start in range(0, jobs, 64 * 16):
                await asyncio.gather(
                    *(
                        put(f"/api/bench/{q}/bulk", bulk, 64)(s)  # type: ignore[operator]
                        for _ in range(min(16, (jobs - start + 63) // 64))
                    )
                )

    runs = [  # name, connections, call, jobs the queue needs beforehand
        ("publish, one job per request", 64, put("/api/bench/one", body, 1), None),
        ("bulk publish, 64 jobs per request", 16, put("/api/bench/bulk/bulk", bulk, 64), None),
        ("consume + ack, one job (2 requests)", 64, consume("one", 1, ack_each), ("one", 10_000)),
        (
            "consume 100 + batch ack (2 requests)",
            8,
            consume("batch", 100, ack_batch),
            ("batch", 60_000),
        ),
        (
            "consume 100 + 100 acks (lmstfy, 101 requests)",
            8,
            consume("bulk", 100, ack_each),
            ("bulk", 10_000),
        ),
        ("end to end: bulk 64 + consume 100 + batch ack", 8, end_to_end, None),
    ]
    for name, conns, call, needs in runs:
        if only not in name:
            continue
        if needs:  # enough jobs for the whole run, whatever ran before
            await preload(needs[0], int(seconds * needs[1]))
        await drive(name, seconds, conns, call)


def wrk(
    name: str, url: str, token: str, body: bytes, seconds: float, conns: int, jobs: int
) -> None:
    """The same publish scenarios driven by wrk (C), which costs the 2 cores far less."""
    import re
    import shutil
    import tempfile

    if not shutil.which("wrk"):
        print("  (wrk not installed: apt-get install wrk)")
        return
    with tempfile.NamedTemporaryFile() as f:
        f.write(body)
        f.flush()
        env = {**os.environ, "WRK_BODY_FILE": f.name, "WRK_TOKEN": token}
        done = subprocess.run(
            [
                "wrk",
                "-t2",
                f"-c{conns}",
                f"-d{max(1, round(seconds))}s",  # whole seconds; "-d0s" fails
                "--latency",
                "-s",
                str(ROOT / "loadtest" / "wrk_put.lua"),
                url,
            ],
            env=env,
            capture_output=True,
            text=True,
        )
    found = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if done.returncode or not found:
        raise SystemExit(f"wrk exited {done.returncode}: {done.stderr or done.stdout}")
    out = done.stdout
    rps = float(found.group(1))
    dist = out.split("Latency Distribution", 1)[-1]
    p50 = re.search(r"50%\s+(\S+)", dist).group(1)  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+(\S+)", dist).group(1)  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    print(
        f"  wrk {name:<30} {rps * jobs:>9,.0f} jobs/s  {rps:>7,.0f} req/s  p50 {p50:>8}  p99 {p99:>8}"
        f"  non-2xx {bad.group(1) if bad else 0}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--workers", type=int, action="append")
    ap.add_argument("--wrk", action="store_true", help="also drive the publish scenarios with wrk")
    ap.add_argument("--only", default="", help="run the scenarios whose name contains this text")
    ap.add_argument("--wrk-only", action="store_true", help="only the wrk publish scenarios")
    ap.add_argument(
        "--metrics",
        choices=["on", "off"],
        action="append",
        help="run with metrics on and/or off (EnableMetrics), to measure their cost",
    )
    ap.add_argument(
        "--lifecycle",
        choices=["on", "off"],
        action="append",
        help="run with the lifecycle event log on and/or off (LifecycleDir)",
    )
    a = ap.parse_args()
    runs = [
        (w, m, lc)
        for w in a.workers or [1, 2]
        for m in a.metrics or ["on"]
        for lc in a.lifecycle or ["off"]
    ]
    for workers, metrics, lifecycle in runs:
        redis = start_server()
        events_dir = (
            tempfile.mkdtemp(prefix="cluster-dq-bench-events-") if lifecycle == "on" else ""
        )
        env = {
            "CLUSTER_DQ_LOGLEVEL": "warning",
            "CLUSTER_DQ_ENABLEMETRICS": "1" if metrics == "on" else "0",
            "CLUSTER_DQ_LIFECYCLEDIR": events_dir,
        }
        svc = ServiceProcess.start(
            f"127.0.0.1:{redis.port}", env=env, args=["--workers", str(workers)], first_port=18000
        )
        port, admin = svc.port, svc.admin_port
        try:
            token = httpx.post(
                f"http://127.0.0.1:{admin}/token/bench", params={"description": "bench"}
            ).json()["token"]
            print(
                f"{workers} worker(s), metrics {metrics}, lifecycle events {lifecycle}, "
                f"{a.seconds:g} s per scenario:",
                flush=True,
            )
            if not a.wrk_only:
                uvloop.run(scenarios(f"http://127.0.0.1:{port}", token, a.seconds, a.only))
            if a.wrk or a.wrk_only:
                body = os.urandom(32).hex().encode()
                base = f"http://127.0.0.1:{port}"
                wrk(
                    "publish, one job per request",
                    f"{base}/api/bench/w1",
                    token,
                    body,
                    a.seconds,
                    64,
                    1,
                )
                wrk(
                    "bulk publish, 64 per request",
                    f"{base}/api/bench/w2/bulk",
                    token,
                    json.dumps([body.decode()] * 64).encode(),
                    a.seconds,
                    16,
                    64,
                )
        finally:
            svc.stop(timeout=30)
            redis.kill()
            if events_dir:
                shutil.rmtree(events_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
