"""What one reconcile sweep costs (README "Reconcile sweep"), on a standalone Redis it starts:

    python loadtest/bench_sweep.py --queues 100000

Publishes one delayed job into each of ``--queues`` queues, times a sweep that finds nothing,
then removes every 10th queue from its shard's schedule (a lost signal) and times the sweep
that repairs them. The cost follows the number of queues (keys), not of jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.keys import ShardKeys, shard_of
from cluster_dq.localredis import Server, start_server
from cluster_dq.models import JobSpec
from cluster_dq.pools import close_client, make_client
from cluster_dq.pump import Pump


def fill(d: Server, queues: int) -> int:
    with d.sync_client() as c:
        engine = SyncEngine(c)
        now = int(time.time() * 1000)
        for i in range(0, queues, 256):
            batches = [
                ("sweep", f"q{k}", [JobSpec(b"x" * 64, delay_ms=3_600_000)])
                for k in range(i, min(i + 256, queues))
            ]
            engine.run(ops.publish_many(engine.config, batches, now), idempotent=True)
        return int(c.dbsize())


def lose_signals(d: Server, queues: int, every: int, shards: int) -> int:
    with d.sync_client() as c:
        pipe = c.pipeline(transaction=False)
        for k in range(0, queues, every):
            pipe.zrem(ShardKeys(shard_of(f"sweep/q{k}", shards)).schedule, f"sweep/q{k}")
        return sum(pipe.execute())


async def sweeps(d: Server, queues: int) -> None:
    client = make_client(d.pool_settings())
    try:
        pump = Pump(AsyncEngine(client))
        t = time.perf_counter()
        found = await pump.reconcile()
        print(
            f"  sweep, nothing lost: {time.perf_counter() - t:.2f} s, {len(found)} queue(s) signalled"
        )
        lost = lose_signals(d, queues, 10, pump.engine.config.shards)
        t = time.perf_counter()
        found = await pump.reconcile()
        print(
            f"  sweep, {lost:,} signals lost: {time.perf_counter() - t:.2f} s, {len(found):,} queue(s) signalled"
        )
    finally:
        await close_client(client)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--queues", type=int, default=100_000)
    a = ap.parse_args()
    d = start_server()
    try:
        keys = fill(d, a.queues)
        print(
            f"bench_sweep: {a.queues:,} queues with a delayed job each, {keys:,} keys (standalone)"
        )
        asyncio.run(sweeps(d, a.queues))
    finally:
        d.stop()


if __name__ == "__main__":
    main()
