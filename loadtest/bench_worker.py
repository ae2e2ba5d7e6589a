"""Worker benchmark: starts a redis-server and `cluster-dq serve`, publishes ``--jobs`` no-op
jobs through the bulk route (64 per request), then runs one client ``Worker`` (batch consume
of 100, batch ack) over them and prints jobs/s and the CPU seconds per 1,000 jobs of the
service, Redis and the worker process.

    python loadtest/bench_worker.py                          # 200,000 jobs
    python loadtest/bench_worker.py --jobs 50000 --seconds 5 # stops after 5 s of work
    python loadtest/bench_worker.py --batch 1 --ack-batch 1 --consumers 1 --concurrency 1
                                            # one job per consume, one ack per job
    python loadtest/bench_worker.py --middleware 3           # 3 no-op middleware per job

Figures only; nothing is asserted. Everything shares the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
import uvloop

from cluster_dq.client import AsyncClient, Job
from cluster_dq.client.worker import Worker
from cluster_dq.localredis import start_server
from cluster_dq.testing.service_process import ServiceProcess

NS, QUEUE = "bench", "noop"


def cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        t = p.cpu_times()
        total += t.user + t.system
    return total


async def preload(client: AsyncClient, jobs: int, conns: int = 8) -> None:
    left = jobs

    async def one() -> None:
        nonlocal left
        while left > 0:
            n = min(64, left)
            left -= n
            await client.publish_many(QUEUE, ["0"] * n)

    await asyncio.gather(*(one() for _ in range(conns)))


async def bench(
    base: str,
    token: str,
    a: argparse.Namespace,
    service: list[psutil.Process],
    redis: psutil.Process,
) -> None:
    async with AsyncClient(base, token, NS, max_connections=64, timeout=60) as client:
        t = time.perf_counter()
        await preload(client, a.jobs)
        took = time.perf_counter() - t
        print(f"preload: {a.jobs} jobs in {took:.1f} s ({a.jobs / took:,.0f} jobs/s, bulk of 64)")

        async def noop(job: Job) -> None:
            return None

        async def passing(job: Job, call_next: Callable[[Job], Awaitable[Any]]) -> Any:
            return await call_next(job)

        calls = {"consume": 0, "ack": 0}
        consume_many, ack_many = client.consume_many, client.ack_many

        async def counted_consume(*args: Any, **kwargs: Any) -> Any:
            calls["consume"] += 1
            return await consume_many(*args, **kwargs)

        async def counted_ack(*args: Any, **kwargs: Any) -> Any:
            calls["ack"] += 1
            return await ack_many(*args, **kwargs)

        client.consume_many = counted_consume  # type: ignore[method-assign]
        client.ack_many = counted_ack  # type: ignore[method-assign]
        worker = Worker(
            client,
            QUEUE,
            noop,
            concurrency=a.concurrency,
            batch=a.batch,
            consumers=a.consumers,
            ack_batch=a.ack_batch,
            poll_timeout=1.0,
            heartbeat=False,
            middleware=[passing] * a.middleware,
        )
        profile = cProfile.Profile() if a.profile else None
        before = cpu(service), cpu([redis]), time.process_time()
        t = time.perf_counter()
        if profile:
            profile.enable()
        serving = asyncio.create_task(worker.serve())
        stop = t + a.seconds
        while worker.counts["acked"] < a.jobs and time.perf_counter() < stop:
            await asyncio.sleep(0.01)
        took = time.perf_counter() - t
        done = worker.counts["acked"]
        after = cpu(service), cpu([redis]), time.process_time()
        if profile:
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        await worker.stop()
        await serving
    per_k = [(x - y) / max(done, 1) * 1000 for x, y in zip(after, before, strict=True)]
    print(
        f"requests: {calls['consume']:,} consumes ({done / max(calls['consume'], 1):.0f} jobs "
        f"each), {calls['ack']:,} batch acks ({done / max(calls['ack'], 1):.0f} jobs each)"
    )
    print(
        f"worker (concurrency {a.concurrency}, {a.consumers} consume(s) of {a.batch} in flight, "
        f"acks of {a.ack_batch}, {a.middleware} middleware): {done} acked in "
        f"{took:.2f} s: {done / took:,.0f} jobs/s"
    )
    print(
        f"CPU seconds per 1,000 jobs: service {per_k[0]:.4f}, redis {per_k[1]:.4f}, "
        f"worker {per_k[2]:.4f} ({os.cpu_count()} cores)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=60.0, help="stop the worker after this")
    ap.add_argument("--concurrency", type=int, default=300)
    ap.add_argument("--service-workers", type=int, default=1)
    ap.add_argument("--consumers", type=int, default=3, help="consumes in flight at once")
    ap.add_argument("--batch", type=int, default=100, help="jobs per consume (1..100)")
    ap.add_argument("--middleware", type=int, default=0, help="no-op middleware around each job")
    ap.add_argument("--ack-batch", type=int, default=300, help="acks per batch ack request")
    ap.add_argument("--profile", action="store_true", help="cProfile the worker phase")
    a = ap.parse_args()
    redis = start_server()
    try:
        env = {"CLUSTER_DQ_LOGLEVEL": "warning"}
        args = ["--workers", str(a.service_workers)]
        with ServiceProcess.start(f"127.0.0.1:{redis.port}", env=env, args=args) as svc:
            procs = [psutil.Process(svc.pid), *psutil.Process(svc.pid).children(recursive=True)]
            import httpx

            token = httpx.post(f"{svc.admin}/token/{NS}", params={"description": "b"}).json()
            uvloop.run(bench(svc.base, token["token"], a, procs, psutil.Process(redis.process.pid)))
    finally:
        redis.kill()


if __name__ == "__main__":
    main()
