"""The pump: one leader per shard (Redis lease with renewal) runs the due steps of its queues.

Queues map to ``EngineConfig.shards`` logical shards (crc32 of ``ns/q``). Each shard has a
schedule zset (queue -> next event ms) kept by publishers (ZADD LT) and by the pump itself, so
the pump's cost follows the work that is due, not the number of queues or of jobs at rest.
Every step is an atomic, idempotent Lua script: two leaders at once (a stalled leader whose
lease ran out) can waste work but never move a job twice. A leader that fails to renew in
time stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
import uuid
from collections.abc import Iterable


from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.core import cancelling, end_if_cancelled
from cluster_dq.errors import Fenced, RedisFailure, ServerError
from cluster_dq.firing import Firer
from cluster_dq.keys import META_PATTERN, parse_qualified, queue_of_key
from cluster_dq.metrics import PoolMetrics, SizeBoard

log = logging.getLogger(__name__)

# The soonest any queue's next pump step comes after one (an earlier event signalled meanwhile
# still brings it forward): a queue with a job due every few ms is pumped every 250 ms, not at
# each job. Consumers do not wait for it: a consume promotes what is due and expires what ran
# out itself, and a waiting consumer's watcher wakes at a job's due time and at a reservation's
# end. What can wait up to 250 ms more for the pump is what no consumer asks for: ttls ending,
# dead letters of jobs nobody consumes, the sizes it posts.
MIN_STEP_MS = 250
GIVE_UP_S = 1.0  # how long a stopping pump tries to give its leases up


class Pump:
    def __init__(
        self,
        engine: AsyncEngine,
        shards: Iterable[int] | None = None,
        *,
        lease_ms: int = 3_000,
        poll_ms: int = 1_000,  # idle look at the schedule; buckets open 5 s ahead anyway
        batch: int = 64,
        metrics: PoolMetrics | None = None,
        board: SizeBoard | None = None,
        sizes_every_s: float = 10.0,
        reconcile_every_s: float = 60.0,
        move_schedules_to: AsyncEngine | None = None,
    ) -> None:
        self.engine = engine
        self.shards = list(shards if shards is not None else range(engine.config.shards))
        self.lease_ms = lease_ms
        self.poll_ms = poll_ms
        self.batch = batch
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.metrics = metrics
        self.board = board
        self.sizes_every_s = sizes_every_s
        self.reconcile_every_s = reconcile_every_s  # 0: no reconcile sweep
        self.leading: dict[int, float] = {}  # shard -> monotonic time the lease runs out
        self.epochs: dict[int, int] = {}  # shard -> fencing epoch of our leadership
        # shard -> monotonic time another instance's lease runs out, as its last renewal said
        self.others: dict[int, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._reported: dict[int, bool] = {}  # shard -> what the leader gauge says
        self._stopping = False
        # Recurring jobs: fired by the leader of each shard, on timers of their own.
        # (a pool that migrates moves them to its new pool instead: ``Firer.move_to``)
        self._acquired: dict[int, asyncio.Event] = {}  # shard -> set when we lead it again
        self.firer = Firer(
            engine, self.leads, metrics=metrics, move_to=move_schedules_to, led=self.until_leads
        )

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run_shard(s)) for s in self.shards]
        self._tasks += [
            asyncio.create_task(self.firer.run(s, lambda: self._stopping)) for s in self.shards
        ]
        if self.reconcile_every_s > 0 and 0 in self.shards:
            self._tasks.append(asyncio.create_task(self._reconcile_loop()))

    async def stop(self) -> None:
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        # Giving a lease up only spares the next leader its wait: tried for every shard still
        # led at once, for GIVE_UP_S at most and never past the lease itself (one after the
        # other with a write's whole budget each, a stop during an outage took 5 s per shard).
        now = time.monotonic()
        held = {shard: until for shard, until in self.leading.items() if until > now}
        try:
            # all waited for, whatever one of them raises (a bug: raised below, once they end)
            ended = await asyncio.gather(
                *(
                    self._give_up(shard, min(until, now + GIVE_UP_S))
                    for shard, until in held.items()
                ),
                return_exceptions=True,
            )
        finally:
            self.leading.clear()
            for shard in list(self._reported):
                self._report(shard)
        for error in ended:
            if error is not None:
                raise error

    async def _give_up(self, shard: int, deadline: float) -> None:
        # The deadline bounds the attempt too, not only its repeats: a stalled Redis (paused,
        # or its host) answers nothing, and a reply is awaited for the socket timeout (5 s).
        with contextlib.suppress(RedisFailure, TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self.engine.run(
                    ops.lead(shard, self.token, self.lease_ms, give_up=True), deadline=deadline
                )

    def leads(self, shard: int) -> bool:
        return self.leading.get(shard, 0.0) > time.monotonic()

    async def until_leads(self, shard: int) -> None:
        """Returns once this instance leads ``shard`` (a follower's firer sleeps here, not in
        a poll: every instance runs one per shard)."""
        while not self.leads(shard):
            acquired = self._acquired.setdefault(shard, asyncio.Event())
            await acquired.wait()

    async def _renew(self, shard: int) -> bool:
        asked = time.monotonic()
        try:
            epoch = await self.engine.run(ops.lead(shard, self.token, self.lease_ms))
        except RedisFailure as e:
            log.warning("pump lease renewal failed for shard %d: %s", shard, e)
            epoch = 0
        held = epoch > 0
        was = self.leads(shard)
        if epoch < 0:  # held by another for -epoch ms more
            self.others[shard] = asked - epoch / 1000
        else:
            self.others.pop(shard, None)
        if held:
            # Count the lease from when we asked, not from the reply: never overestimate it.
            self.leading[shard] = asked + self.lease_ms / 1000 * 0.9
            self.epochs[shard] = epoch
            acquired = self._acquired.pop(shard, None)
            if acquired is not None:
                acquired.set()
        else:
            self._lose(shard)
        self._report(shard)
        if held != was:
            log.debug("shard %d leadership %s", shard, "acquired" if held else "lost")
        return held

    def _lose(self, shard: int) -> None:
        self.leading.pop(shard, None)
        self.epochs.pop(shard, None)

    async def _run_shard(self, shard: int) -> None:
        renew_every = self.lease_ms / 3000
        next_renew = 0.0
        next_sizes = 0.0  # when to post this shard's queue sizes (only with a board)
        failures = 0  # consecutive failed steps (backoff)
        while not self._stopping:
            end_if_cancelled()
            try:
                now = time.monotonic()
                if now >= next_renew:
                    await self._renew(shard)
                    next_renew = now + renew_every * (0.9 + 0.2 * random.random())
                    if shard in self.others:
                        # A follower asks again when the leader's lease would run out, not at
                        # every renewal: with N instances the leases cost N calls per shard
                        # and lease, not 3N. Not later than 2/3 of a lease: a leader that
                        # gives its lease up (a stop) is replaced within that.
                        until = min(self.others[shard], now + self.lease_ms / 1000 * 2 / 3)
                        next_renew = max(next_renew, until + 0.05 * random.random())
                if not self.leads(shard):
                    self._report(shard)
                    next_sizes = 0.0  # a new leader posts at once
                    await asyncio.sleep(max(next_renew - time.monotonic(), 0.01))
                    continue
                wake = next_renew
                if self.board is not None:
                    if now >= next_sizes:
                        next_sizes = now + self.sizes_every_s
                        await self.post_sizes(shard)
                    wake = min(wake, next_sizes)
                wait_ms = await self.pump_shard(shard)
                wait = min(wait_ms / 1000, max(wake - time.monotonic(), 0))
                if wait > 0:
                    await asyncio.sleep(wait)
            except asyncio.CancelledError:
                raise
            except Fenced as e:
                # Another instance leads this shard now: stop at once (no lease to wait out).
                log.warning("pump shard %d: %s; leadership dropped", shard, e)
                self._lose(shard)
                self._report(shard)
                continue
            except ServerError as e:
                # Any other error reply (OOM at maxmemory, BUSY, READONLY, NOSCRIPT...): the
                # shard's loop must outlive it, or the shard is never pumped again.
                failures += 1
                await self._back_off(shard, failures, e)
                continue
            except RedisFailure as e:
                if cancelling():  # redis-py can turn a cancellation into a connection error
                    raise asyncio.CancelledError() from e
                failures += 1
                await self._back_off(shard, failures, e)
                continue
            except Exception:  # a bug must not silently end the shard's pump
                log.exception("pump shard %d step failed", shard)
                self._report(shard)
                await asyncio.sleep(1.0)
                continue
            failures = 0

    async def _back_off(self, shard: int, failures: int, error: BaseException) -> None:
        """After a failed step: log it, wait (0.2 s doubling to 5 s), and stop reporting a
        leadership whose lease ran out meanwhile."""
        wait = min(0.2 * 2 ** min(failures - 1, 5), 5.0)
        log.warning(
            "pump shard %d: %s: %s (failure %d; next try in %.1f s)",
            shard,
            type(error).__name__,
            error,
            failures,
            wait,
        )
        self._report(shard)
        await asyncio.sleep(wait)
        self._report(shard)

    def _report(self, shard: int) -> None:
        """The leader gauge follows the lease, also when it ran out without a renewal."""
        held = self.leads(shard)
        if self.metrics and self._reported.get(shard, False) != held:
            self.metrics.leadership(shard, held)
        self._reported[shard] = held

    async def pump_shard(self, shard: int) -> int:
        """Runs every due queue of the shard once; returns ms until there is more to do."""
        now = self.engine.clock()
        epoch = self.epochs.get(shard, 0)
        claim = ops.claim(shard, now, self.batch, self.lease_ms, epoch)
        due = await self.engine.run(claim, idempotent=True)
        for qualified in due:
            if not self.leads(shard):
                return 0  # lease ran out mid-batch: stop at once
            ns, q = parse_qualified(qualified)
            at = self.engine.clock()
            sizes = await self.engine.run(ops.tick(self.engine.config, ns, q, at), idempotent=True)
            nxt = sizes.next_event_ms
            if nxt is not None:
                nxt = max(nxt, at + MIN_STEP_MS)  # a backlog is worked in steps, never a spin
            empty = nxt is None and not (
                sizes.delayed or sizes.ready or sizes.reserved or sizes.dead
            )
            await self.engine.run(
                ops.reschedule(shard, qualified, nxt, epoch, empty), idempotent=True
            )
        if self.metrics:
            self.metrics.batch(shard, len(due))
        if len(due) >= self.batch:
            return 0
        head = await self.engine.run(ops.next_schedule(shard), idempotent=True)
        if head is None:
            return self.poll_ms
        return max(0, min(head - self.engine.clock(), self.poll_ms))

    async def _reconcile_loop(self) -> None:
        """While this process leads shard 0, it sweeps the whole pool every
        ``reconcile_every_s`` (one sweeper per pool; shard 0's leadership elects it)."""
        while not self._stopping:
            end_if_cancelled()
            await asyncio.sleep(self.reconcile_every_s * (0.9 + 0.2 * random.random()))
            if not self.leads(0):
                continue
            try:
                found = await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a sweep that fails is tried again next time
                if cancelling():
                    raise asyncio.CancelledError() from e
                log.warning("reconcile sweep failed: %s: %s", type(e).__name__, e)
                continue
            if found:
                log.warning(
                    "reconcile: %d queue(s) were missing from their shard's schedule "
                    "(a lost signal) and were signalled: %s",
                    len(found),
                    ", ".join(found[:10]),
                )

    async def reconcile(self, page: int = 500, pause_s: float = 0.02) -> list[str]:
        """One sweep: SCANs every queue's META (on a Cluster, every master) and signals the
        queues whose shard schedule lost them (``ops.reconcile``). Paced: a page of ``page``
        queues, then a pause, so a large keyspace costs Redis little at a time. The jobs of such
        a queue were never at risk (consumers promote and expire on their own), but until it is
        signalled the pump does not expire its reservations or ttls, and /info does not list it."""
        client = self.engine.client
        found: list[str] = []
        batch: list[str | bytes] = []
        async for key in client.scan_iter(match=META_PATTERN, count=page):
            batch.append(key)
            if len(batch) >= page:
                found += await self._reconcile_page(batch)
                batch = []
                await asyncio.sleep(pause_s)
        if batch:
            found += await self._reconcile_page(batch)
        if found and self.metrics:
            self.metrics.reconciled(len(found))
        return found

    async def _reconcile_page(self, keys: list[str | bytes]) -> list[str]:
        queues = list({queue_of_key(k) for k in keys})
        return await self.engine.run(
            ops.reconcile(self.engine.config, queues, self.engine.clock()), idempotent=True
        )

    async def post_sizes(self, shard: int) -> None:
        """Measures every queue of a shard this process leads, for the metrics."""
        assert self.board is not None
        queues = await self.engine.run(ops.queues_of_shard(shard), idempotent=True)
        sizes = await self.engine.run(ops.sizes_of(self.engine.config, queues), idempotent=True)
        pool = self.metrics.pool if self.metrics else "default"
        self.board.post(pool, shard, sizes)
