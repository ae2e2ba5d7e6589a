"""Group commit: concurrent requests for the same thing share one script call.

Most lmstfy clients publish and ack one job per request, and each request used to cost its own
script call: a command packed, written and parsed by redis-py, a Lua invocation in Redis.
``GroupCommit`` runs the first request for a key at once, alone (an idle service adds no wait
and no task); requests for that key that arrive while its call is in flight wait for it to end
and then go together, as one call of up to ``max_items``. Under load a batch holds what arrived
during one round trip, so the cost per request falls as the load rises; at most one call per
key is in flight, and a request waits at most one round trip longer.

A batch's outcome is each member's: its result, or the batch's error for all (every member's
own request would have failed the same way, since the call is the one it would have made).
A member whose request is cancelled does not cancel the batch (the others still need it).
With ``orphan``, every call runs in a task of its own, and the result of a member that was
cancelled before it could take it goes to ``orphan(key, result)`` (consume: reserved jobs
nobody will get are given back, not left to their ttr).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

GROUP_MAX = 64  # requests one call serves, at most (a bulk publish's 64 jobs)

K = TypeVar("K", bound=Hashable)
I = TypeVar("I")  # noqa: E741 (an item)
R = TypeVar("R")


class Failed:
    """A result that is one member's own error: ``submit`` raises it for that member alone
    (a batch whose members must each be told something of their own, such as their job id)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _own(result: Any) -> Any:
    if isinstance(result, Failed):
        raise result.error
    return result


class _Batch(Generic[I, R]):
    __slots__ = ("items", "done", "gone")

    def __init__(self, done: asyncio.Future[Sequence[R]]) -> None:
        self.items: list[I] = []
        self.done = done
        self.gone: list[int] = []  # members cancelled before the result came


def _retrieved(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()  # read: no "exception was never retrieved" when every member went away


class GroupCommit(Generic[K, I, R]):
    """``run(key, items)`` returns one result per item, in order."""

    def __init__(
        self,
        run: Callable[[K, list[I]], Awaitable[Sequence[R]]],
        max_items: int,
        orphan: Callable[[K, R], None] | None = None,
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._run = run
        self._orphan = orphan
        self.max_items = max_items
        self._waiting: dict[K, deque[_Batch[I, R]]] = {}  # keys with a call in flight
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0  # how many calls ran, and for how many items (for benchmarks)
        self.items = 0

    def busy(self) -> int:
        return len(self._waiting)

    async def submit(self, key: K, item: I) -> R:
        waiting = self._waiting.get(key)
        if waiting is None:  # idle: this request's call goes now, alone
            self._waiting[key] = deque()
            if self._orphan is None:
                try:
                    return _own((await self._call(key, [item]))[0])  # type: ignore[no-any-return]
                finally:
                    self._next(key)
            batch = self._new_batch()
            self._start(key, batch)
        elif not waiting or len(waiting[-1].items) >= self.max_items:
            batch = self._new_batch()
            waiting.append(batch)
        else:
            batch = waiting[-1]
        index = len(batch.items)
        batch.items.append(item)
        try:
            return _own((await asyncio.shield(batch.done))[index])  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self._abandon(key, batch, index)
            raise

    @staticmethod
    def _new_batch() -> _Batch[I, R]:
        done: asyncio.Future[Sequence[R]] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieved)
        return _Batch(done)

    def _abandon(self, key: K, batch: _Batch[I, R], index: int) -> None:
        if not batch.done.done():
            batch.gone.append(index)  # its result goes to orphan() when it comes
        elif self._orphan and not batch.done.cancelled() and batch.done.exception() is None:
            self._orphan(key, batch.done.result()[index])  # came, but was not taken

    async def _call(self, key: K, items: list[I]) -> Sequence[R]:
        self.calls += 1
        self.items += len(items)
        return await self._run(key, items)

    def _next(self, key: K) -> None:
        """The call in flight for ``key`` ended: the next batch goes, or the key is idle."""
        waiting = self._waiting[key]
        if not waiting:
            del self._waiting[key]
            return
        self._start(key, waiting.popleft())

    def _start(self, key: K, batch: _Batch[I, R]) -> None:
        task = asyncio.get_running_loop().create_task(self._complete(key, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _complete(self, key: K, batch: _Batch[I, R]) -> None:
        try:
            results = await self._call(key, batch.items)
        except Exception as e:
            batch.done.set_exception(e)
        except BaseException:  # cancelled (shutdown): the members must not wait forever
            batch.done.cancel()
            raise
        else:
            if len(results) != len(batch.items):
                batch.done.set_exception(
                    RuntimeError(f"{len(results)} results for {len(batch.items)} items")
                )
            else:
                batch.done.set_result(results)
                if self._orphan:
                    for index in batch.gone:
                        self._orphan(key, results[index])
        finally:
            self._next(key)
