"""A queue's last 24 hours, fleet-wide (``cluster_dq/history.py``): every process adds what it
counted (``Metrics.tally``) to the queues' 5-minute buckets once a minute, in the pool where the
work happened; the dashboard reads them back over every pool a queue may be in."""

from __future__ import annotations

import asyncio
import logging
import random
import time

from cluster_dq import history
from cluster_dq.clock import now_ms
from cluster_dq.engine import history as history_ops
from cluster_dq.errors import ClusterDQError
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service.core import ServiceCore

log = logging.getLogger("cluster_dq.history")
FLUSH_CONCURRENCY = 32  # queues written at once by one flush
MAX_OFFSET_S = 5.0  # flushes of the fleet spread over this much after each period's start
FINAL_FLUSH_S = 5.0  # how long the flush at shutdown may take


class History(ServiceCore):
    async def flush_history(self, at_ms: int) -> tuple[int, int]:
        """Adds what this process counted since its last flush to the buckets ``at_ms`` falls
        in, one pipeline per queue; (queues written, queues whose write failed). A write that
        fails is not repeated: its counts are lost (a gap in the chart), never counted twice."""
        tally = self.metrics.tally
        if tally is None:
            return 0, 0
        rows, dropped = tally.take()
        if dropped:
            log.warning(
                "history: counts of %d more queues than %d in one flush were dropped",
                dropped,
                tally.cap,
            )
        bucket = history.bucket_of(at_ms)
        items = [(key, row) for key, row in rows.items() if any(row)]
        failed = 0
        for start in range(0, len(items), FLUSH_CONCURRENCY):
            done = await asyncio.gather(
                *(
                    self._add_history(pool, ns, q, bucket, row)
                    for (pool, ns, q), row in items[start : start + FLUSH_CONCURRENCY]
                )
            )
            failed += done.count(False)
        if failed:
            log.warning(
                "history: %d of %d queues not written (Redis unavailable)", failed, len(items)
            )
        return len(items) - failed, failed

    async def _add_history(
        self, pool_name: str, ns: str, q: str, bucket: int, row: list[int]
    ) -> bool:
        pool = self.pools.get(pool_name)
        if pool is None:
            return False
        try:
            await self._run(pool, history_ops.add(ns, q, bucket, row))
        except ClusterDQError:
            return False
        return True

    async def keep_history(self, every_s: float) -> None:
        """Flushes every ``every_s`` (a divisor of the bucket's 5 minutes), at a fixed offset
        of up to 5 s past each period's start (so a fleet's flushes spread), counting what came
        in the period to the bucket the period is in; and once more when cancelled (shutdown),
        so a restart loses nothing. A task of the worker."""
        offset = random.uniform(0, min(MAX_OFFSET_S, every_s / 4))
        try:
            while True:
                now = time.time()
                due = (now // every_s + 1) * every_s + offset
                await asyncio.sleep(due - now)
                try:
                    await self.flush_history(int((due - offset) * 1000) - 1)
                except Exception:  # the task outlives anything: the next period flushes again
                    log.exception("history not flushed")
        finally:
            try:
                await asyncio.wait_for(self.flush_history(now_ms()), FINAL_FLUSH_S)
            except Exception as e:
                log.warning("history: last flush not done: %s", e)

    async def queue_history(
        self, route: PoolRoute[RedisPool], ns: str, q: str, now: int
    ) -> list[list[int]]:
        """The rows of ``history.window(now)``, oldest first, summed over the pools that may
        hold the queue (every instance's counts are in them)."""
        buckets = history.window(now)
        per_pool = [
            await self._run(p, history_ops.read(ns, q, buckets), idempotent=True)
            for p in route.place(ns, q).reads
        ]
        return [history.added(rows) for rows in zip(*per_pool)]
