"""Engine benchmark: prints Redis bytes per delayed job, publish and consume+ack rates,
lateness percentiles with consumers waiting, and the burst case (N jobs due in one second).

    python loadtest/bench_engine.py                 # full: 1,000,000 jobs for memory and burst
    python loadtest/bench_engine.py --jobs 100000   # quicker
    python loadtest/bench_engine.py --jobs 2000 --ops 500 --late 200 --late-seconds 1 --expired 500
                                                    # a smoke run of every section, ~15 s
    python loadtest/bench_engine.py --only lateness --queues 8 --late 5000
                                                    # multi-queue long-polls, lateness by queue

Each section runs on a fresh redis-server started on a loopback port and stopped after.
Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable

import uvloop
from redis.asyncio import Redis

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.localredis import Server, start_server
from cluster_dq.models import JobSpec, id_due_ms, id_to_member
from cluster_dq.pump import Pump
from cluster_dq.waiters import WaiterHub

NS = "bench"
BODY = 64


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


async def gather_limited(n: int, width: int, make: Callable[[int], Awaitable[None]]) -> None:
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            await make(i)

    await asyncio.gather(*(worker() for _ in range(width)))


def fresh(extra: list[str] | None = None) -> tuple[Server, AsyncEngine]:
    server = start_server(extra=extra)
    return server, AsyncEngine(Redis(host="127.0.0.1", port=server.port, max_connections=256))


async def load(
    engine: AsyncEngine, q: str, n: int, delay_of: Callable[[int], int], now: int | None = None
) -> float:
    """Publishes n jobs of 64 bytes in bulks of 64 from 32 tasks; returns jobs/s."""
    t = time.perf_counter()

    async def bulk(i: int) -> None:
        base = i * 64
        specs = [
            JobSpec(os.urandom(BODY), delay_ms=delay_of(base + k), ttl_ms=0)
            for k in range(min(64, n - base))
        ]
        await engine.run(ops.publish(engine.config, NS, q, specs, now if now else now_ms()))

    await gather_limited((n + 63) // 64, 32, bulk)
    return n / (time.perf_counter() - t)


async def memory(n: int, spread_s: int) -> None:
    server, engine = fresh()
    try:
        r = engine.client
        await r.execute_command("MEMORY", "PURGE")
        base = int((await r.info("memory"))["used_memory"])
        rate = await load(
            engine, "mem", n, lambda i: 60_000 + (i * 7919 % n) * spread_s * 1000 // n
        )
        info = await r.info("memory")
        s = await engine.run(ops.sizes(engine.config, NS, "mem"))
        per_job = (int(info["used_memory"]) - base) / n
        buckets = await r.zcard("dq:{bench/mem}:wheel")
        print(
            f"memory  {n:>9,} delayed jobs over {spread_s:>6,} s: {per_job:6.1f} B/job "
            f"(rss {int(info['used_memory_rss']) / n:6.1f}); {buckets} buckets, "
            f"{s.delayed - (await r.zcard('dq:{bench/mem}:delayed')):,} in the wheel; "
            f"loaded at {rate:,.0f} jobs/s"
        )
    finally:
        server.kill()


async def throughput(n: int) -> None:
    server, engine = fresh()
    try:
        cfg = engine.config
        t = time.perf_counter()

        async def one(i: int) -> None:
            await engine.run(ops.publish(cfg, NS, "tp", [JobSpec(b"x" * BODY)], now_ms()))

        await gather_limited(n, 50, one)
        single = n / (time.perf_counter() - t)
        bulk = await load(engine, "tp2", n, lambda i: 0)

        async def drain(q: str, count: int, tasks: int) -> float:
            """consume + ack until the queue is empty; jobs/s."""
            done = 0
            started = time.perf_counter()

            async def consumer() -> None:
                nonlocal done
                while jobs := await engine.run(ops.consume(cfg, NS, [q], 60_000, count, now_ms())):
                    await engine.run(ops.ack(NS, q, [j.job_id for j in jobs]))
                    done += len(jobs)

            await asyncio.gather(*(consumer() for _ in range(tasks)))
            return done / (time.perf_counter() - started)

        batch = await drain("tp", 100, 8)
        one_by_one = await drain("tp2", 1, 50)
        print(
            f"engine  publish one/call (50 tasks): {single:9,.0f} jobs/s   bulk of 64 (32 tasks): {bulk:9,.0f} jobs/s"
        )
        print(
            f"engine  consume+ack batch of 100 (8 tasks): {batch:9,.0f} jobs/s   one/call (50 tasks): {one_by_one:9,.0f} jobs/s"
        )
    finally:
        server.kill()


async def lateness(n: int, spread_s: int = 20, consumers: int = 20) -> None:
    server, engine = fresh()
    hub = WaiterHub(engine)
    pump = Pump(engine)
    pump.start()
    late: list[int] = []
    try:
        tasks = []

        async def consumer() -> None:
            while len(late) < n:
                for job in await hub.consume(NS, ["late"], 60_000, 1, 2_000):
                    late.append(now_ms() - id_due_ms(id_to_member(job.job_id)))
                    await engine.run(ops.ack(NS, "late", [job.job_id]))

        tasks = [asyncio.create_task(consumer()) for _ in range(consumers)]
        await asyncio.sleep(0.5)
        t0 = now_ms()
        # n jobs due over the next 2 to 2 + spread_s s, published in bulks as in real life
        await load(engine, "late", n, lambda i: 2_000 + (i * 7919 % n) * spread_s * 1000 // n)
        deadline = time.monotonic() + 60
        while len(late) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        early = sum(1 for x in late if x < 0)
        print(
            f"lateness {len(late):,} delayed jobs, {consumers} consumers waiting: "
            f"p50 {pct(late, 50)} ms  p99 {pct(late, 99)} ms  max {max(late)} ms  "
            f"early {early}  (load started {now_ms() - t0} ms ago)"
        )
    finally:
        await hub.close()
        await pump.stop()
        server.kill()


async def lateness_multi(n: int, queues: int, consumers: int = 20, rate: int = 500) -> None:
    """The load profile's shape at engine level: ``consumers`` long-poll (timeout 1 s) all of
    ``q0..q{queues-1}`` in that (priority) order, one job each, and ack it; a producer
    publishes one job per call at ``rate`` jobs/s into a random queue, due 0-2 s later. There
    is spare consumer capacity, so any lateness is the mechanism's. Per-queue percentiles."""
    server, engine = fresh()
    hub = WaiterHub(engine)
    pump = Pump(engine)
    pump.start()
    names = [f"q{i}" for i in range(queues)]
    late: dict[str, list[int]] = {q: [] for q in names}
    done = 0
    try:

        async def consumer() -> None:
            nonlocal done
            while True:
                for job in await hub.consume(NS, names, 60_000, 1, 1_000):
                    late[job.queue].append(now_ms() - id_due_ms(id_to_member(job.job_id)))
                    done += 1
                    await engine.run(ops.ack(NS, job.queue, [job.job_id]))

        tasks = [asyncio.create_task(consumer()) for _ in range(consumers)]
        await asyncio.sleep(0.5)
        rng = random.Random(7)
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            pause = started + i / rate - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            spec = JobSpec(os.urandom(BODY), delay_ms=rng.randint(0, 2_000), ttl_ms=3_600_000)
            await engine.run(ops.publish(engine.config, NS, rng.choice(names), [spec], now_ms()))
        deadline = time.monotonic() + 10
        while done < n and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        busy = (time.process_time() - cpu) / (time.perf_counter() - started)
        calls = (await engine.client.info("commandstats"))["cmdstat_evalsha"]["calls"]
        every = [x for q in names for x in late[q]]
        print(
            f"lateness {done:,}/{n:,} jobs at {rate}/s due 0-2 s ahead over {queues} queues, "
            f"{consumers} consumers long-polling {','.join(names)}: p50 {pct(every, 50)} ms  "
            f"p99 {pct(every, 99)} ms  max {max(every)} ms  early {sum(x < 0 for x in every)}; "
            f"{calls / max(done, 1):.1f} scripts per job; this process busy {busy:.0%} "
            "(near 100 %: it is the bottleneck, and the consumers have no spare capacity)"
        )
        for q in names:
            xs = late[q] or [0]
            print(
                f"lateness   {q}: {len(late[q]):6,} jobs  p50 {pct(xs, 50):4} ms  "
                f"p99 {pct(xs, 99):4} ms  max {max(xs):5} ms"
            )
    finally:
        await hub.close()
        await pump.stop()
        server.kill()


async def burst(n: int, consumers: int = 8) -> None:
    server, engine = fresh(["--slowlog-log-slower-than", "1000", "--slowlog-max-len", "10000"])
    pump = Pump(engine)
    try:
        r = engine.client
        due_at = now_ms() + 5_000 + n * 1000 // 30_000  # after the load (~40k/s here)
        published_at = due_at - 3_600_000  # as if published an hour ago, all due at due_at
        await load(engine, "burst", n, lambda i: 3_600_000, now=published_at)
        await r.slowlog_reset()
        wait = (due_at - now_ms()) / 1000
        print(f"burst   {n:,} jobs loaded; waiting {wait:.1f} s for their common due second")
        await asyncio.sleep(max(wait, 0))
        pump.start()
        t = time.perf_counter()
        done = 0

        async def consumer() -> None:
            nonlocal done
            idle = 0
            while done < n and idle < 50:
                jobs = await engine.run(
                    ops.consume(engine.config, NS, ["burst"], 60_000, 100, now_ms())
                )
                if not jobs:
                    idle += 1
                    await asyncio.sleep(0.01)
                    continue
                idle = 0
                await engine.run(ops.ack(NS, "burst", [j.job_id for j in jobs]))
                done += len(jobs)

        await asyncio.gather(*(consumer() for _ in range(consumers)))
        took = time.perf_counter() - t
        slow = await r.slowlog_get(10000)
        longest = max((e["duration"] for e in slow), default=0)
        over50 = sum(1 for e in slow if e["duration"] > 50_000)
        print(
            f"burst   drained {done:,} jobs in {took:.1f} s = {done / took:,.0f} jobs/s "
            f"({consumers} consumers, batch 100); scripts over 1 ms: {len(slow)}, "
            f"longest {longest / 1000:.2f} ms, over 50 ms: {over50}"
        )
    finally:
        await pump.stop()
        server.kill()


async def expired(n: int) -> None:
    """The worst case of a consume: ``n`` expired jobs ahead of a live one, nobody pumping.
    Prints the longest script (SLOWLOG) and how many calls the consume took to get past them."""
    server, engine = fresh(["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"])
    try:
        r = engine.client
        t = now_ms()
        for i in range(0, n, 64):
            specs = [JobSpec(os.urandom(BODY), ttl_ms=1_000) for _ in range(min(64, n - i))]
            await engine.run(ops.publish(engine.config, NS, "expired", specs, t))
        await engine.run(
            ops.publish(engine.config, NS, "expired", [JobSpec(b"live", ttl_ms=0)], t + 1)
        )
        await r.slowlog_reset()
        consumes = 0
        got: list[object] = []
        started = time.perf_counter()
        while not got and consumes < 1_000:
            consumes += 1  # one consume request (each runs up to 8 bounded scripts)
            got = await engine.run(
                ops.consume(engine.config, NS, ["expired"], 30_000, 1, t + 2_000)
            )
        took = time.perf_counter() - started
        slow = [e for e in await r.slowlog_get(100000) if b"EVALSHA" in e["command"][:7]]
        longest = max((e["duration"] for e in slow), default=0)
        print(
            f"expired {n:,} expired jobs ahead of a live one: {len(slow)} scripts, longest "
            f"{longest / 1000:.2f} ms; {consumes} consume requests, {took * 1000:.0f} ms in all, "
            f"live job {'delivered' if got else 'NOT delivered'}"
        )
    finally:
        server.kill()


async def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=1_000_000, help="jobs for memory and burst")
    ap.add_argument("--ops", type=int, default=50_000, help="jobs for the throughput runs")
    ap.add_argument("--late", type=int, default=10_000, help="jobs for the lateness run")
    ap.add_argument(
        "--late-seconds", type=int, default=20, help="the lateness run's jobs fall due over this"
    )
    ap.add_argument(
        "--queues",
        type=int,
        help="lateness: the profile's shape instead, consumers long-polling q0..qN-1",
    )
    ap.add_argument("--rate", type=int, default=500, help="multi-queue lateness: jobs/s")
    ap.add_argument("--expired", type=int, default=50_000, help="expired jobs ahead of a consume")
    ap.add_argument(
        "--only", choices=["memory", "throughput", "lateness", "burst", "expired"], action="append"
    )
    a = ap.parse_args()
    only = set(a.only or ["memory", "throughput", "lateness", "burst", "expired"])
    if "memory" in only:
        await memory(a.jobs, 3_600)
        await memory(a.jobs, 86_400)
    if "throughput" in only:
        await throughput(a.ops)
    if "lateness" in only:
        if a.queues:
            await lateness_multi(a.late, a.queues, rate=a.rate)
        else:
            await lateness(a.late, a.late_seconds)
    if "burst" in only:
        await burst(a.jobs)
    if "expired" in only:
        await expired(a.expired)


if __name__ == "__main__":
    uvloop.run(main())
