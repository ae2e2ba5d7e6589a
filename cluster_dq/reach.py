"""Which queues a look across several queues leaves out for now: those whose Redis node does not
answer (a Cluster master failing over). A look across queues is one operation; while one of its
queues' node is down, it fails as a whole, and a consume would wait out the failover before
taking the jobs of the queues on the healthy masters. When such a look fails, each of its
queues is asked on its own; the ones that do not answer are left out of the next looks, and are
asked again every ``RECHECK_S`` until they answer, when their watcher is told to look.

Only on a Cluster: on one Redis (standalone or Sentinel) every queue is on the same node, and
leaving some out would change nothing."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis.asyncio.cluster import RedisCluster

from cluster_dq.engine import commands as ops
from cluster_dq.engine import core, retry
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.errors import RedisFailure, Transient

T = TypeVar("T")

LOOK_BUDGET_S = 0.25  # how long a look across queues on a Cluster repeats before it gives up
ASK_BUDGET_S = 0.3  # how long one queue has to answer the question "are you there?"
RECHECK_S = 0.1  # how often a queue left out is asked again
IDLE_S = 10.0  # a queue no look has left out for this long is asked no more


class Reach:
    """The queues of one engine (pool) that looks across queues leave out, and the tasks that
    ask them again. ``back(namespace, queue)`` is called when one answers again; a queue no
    look has left out for ``IDLE_S`` is no longer asked, nor left out."""

    def __init__(self, engine: AsyncEngine, back: Callable[[str, str], None]) -> None:
        self.engine = engine
        self.applies = isinstance(engine.client, RedisCluster)
        self._back = back
        self._left_out: dict[tuple[str, str], float] = {}  # when a look last left it out
        self.down: set[tuple[str, str]] = set()
        self._asking: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._closed = False

    def live(self, namespace: str, queues: Sequence[str]) -> Sequence[str]:
        """``queues`` less those left out; all of them when none would be left."""
        if not self.down or len(queues) < 2:
            return queues
        live = [q for q in queues if (namespace, q) not in self.down]
        if live:
            now = time.monotonic()
            for q in queues:
                if (namespace, q) in self.down:
                    self._left_out[namespace, q] = now
        return live or queues

    async def run(
        self,
        namespace: str,
        queues: Sequence[str],
        deadline: float | None,
        look: Callable[[Sequence[str], float | None], Awaitable[T]],
    ) -> T:
        """``look(queues, deadline)``, a look at ``queues``. On a Cluster, a look across queues
        is repeated here rather than by the engine: each attempt gives up after
        ``LOOK_BUDGET_S``, has its queues asked on their own (``failed``), and the next one
        leaves out those that did not answer; until ``deadline`` (None: the retry budget,
        the request's deadline at the latest), and only while nothing can have been reserved."""
        if not self.applies or len(queues) < 2:
            return await look(queues, deadline)
        end = retry.bounded(deadline)
        if end is None:
            end = time.monotonic() + self.engine.config.retry_budget_s
        while True:
            live = self.live(namespace, queues)
            try:
                return await look(live, min(end, time.monotonic() + LOOK_BUDGET_S))
            except Transient as e:
                self.failed(namespace, live)
                if not core.reserved_nothing(e) or time.monotonic() + RECHECK_S >= end:
                    raise
            await asyncio.sleep(RECHECK_S)

    def failed(self, namespace: str, queues: Sequence[str]) -> None:
        """A look at ``queues`` could not reach Redis: ask each of them on its own."""
        if not self.applies or len(queues) < 2 or self._closed:
            return
        for q in queues:
            key = (namespace, q)
            if key not in self._asking:
                task = asyncio.create_task(self._ask(key), context=retry.detached())
                self._asking[key] = task
                task.add_done_callback(functools.partial(self._asked, key))

    def _asked(self, key: tuple[str, str], _: asyncio.Task[None]) -> None:
        self._asking.pop(key, None)

    async def _answers(self, namespace: str, queue: str) -> bool:
        engine = self.engine
        op = ops.sizes(engine.config, namespace, queue)
        try:  # (not cut short: a command cancelled in flight leaves its socket open)
            await engine.run(op, deadline=time.monotonic() + ASK_BUDGET_S)
        except RedisFailure:
            return False
        return True

    async def _ask(self, key: tuple[str, str]) -> None:
        """Left out while it does not answer and looks still leave it out; once it answers,
        its watcher looks."""
        self._left_out[key] = time.monotonic()
        answered = False
        try:
            while not self._closed:
                if await self._answers(*key):
                    answered = True
                    break
                if time.monotonic() - self._left_out[key] > IDLE_S:
                    break  # no look has left it out for a while: nobody asks for it
                self.down.add(key)
                await asyncio.sleep(RECHECK_S)
        finally:
            was_down = key in self.down
            self.down.discard(key)
            self._left_out.pop(key, None)
        if answered and was_down and not self._closed:
            self._back(*key)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._asking.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
