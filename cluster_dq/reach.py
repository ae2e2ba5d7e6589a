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
import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence

from redis.asyncio.cluster import RedisCluster

from cluster_dq.engine import commands as ops
from cluster_dq.engine import retry
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.errors import RedisFailure, Transient

LOOK_BUDGET_S = 0.25  # how long a look across queues on a Cluster repeats before it gives up
ASK_BUDGET_S = 0.3  # how long one queue has to answer the question "are you there?"
RECHECK_S = 0.1  # how often a queue left out is asked again


class Reach:
    """The queues of one engine (pool) that looks across queues leave out, and the tasks that
    ask them again. ``back(namespace, queue)`` is called when one answers again; a queue that
    nobody waits on any more (``wanted`` says no) is no longer asked, nor left out."""

    def __init__(
        self,
        engine: AsyncEngine,
        back: Callable[[str, str], None],
        wanted: Callable[[str, str], bool],
    ) -> None:
        self.engine = engine
        self.applies = isinstance(engine.client, RedisCluster)
        self._back, self._wanted = back, wanted
        self.down: set[tuple[str, str]] = set()
        self._asking: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._closed = False

    def live(self, namespace: str, queues: Sequence[str]) -> Sequence[str]:
        """``queues`` less those left out; all of them when none would be left."""
        if not self.down or len(queues) < 2:
            return queues
        live = [q for q in queues if (namespace, q) not in self.down]
        return live or queues

    def budget(self, queues: Sequence[str], deadline: float | None) -> float | None:
        """The deadline of a look at ``queues``: a look across queues on a Cluster gives up
        after ``LOOK_BUDGET_S``, so that a node down is found and left out (its caller looks
        again shortly, as after any failure)."""
        if not self.applies or len(queues) < 2 or deadline is None:
            return deadline
        return min(deadline, time.monotonic() + LOOK_BUDGET_S)

    @contextlib.contextmanager
    def watching(self, namespace: str, queues: Sequence[str]) -> Iterator[None]:
        """Around a look at ``queues``: when it cannot reach Redis, ``failed``."""
        try:
            yield
        except Transient:
            self.failed(namespace, queues)
            raise

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
        """Left out while it does not answer; once it does, its watcher looks."""
        while not self._closed and not await self._answers(*key):
            if key in self.down and not self._wanted(*key):  # nobody waits on it any more
                self.down.discard(key)
                return
            self.down.add(key)
            await asyncio.sleep(RECHECK_S)
        if key in self.down and not self._closed:
            self.down.discard(key)
            self._back(*key)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._asking.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
