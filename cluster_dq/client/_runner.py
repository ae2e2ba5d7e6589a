"""Where a worker's handlers run, so that a stop never waits for one for ever: sync handlers in
daemon threads (``DaemonThreads``: the interpreter does not wait for them at exit, as it does
for a ``ThreadPoolExecutor``'s), and ``run_loop``, the event loop of ``Worker.run()`` and of
``python -m cluster_dq.client.worker``, which ends without waiting past ``CANCEL_GRACE`` for a
task that ignores its cancellation (``asyncio.run`` would wait for it for ever)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, Protocol, TypeVar

log = logging.getLogger("cluster_dq.worker")
P = ParamSpec("P")
T = TypeVar("T")
CANCEL_GRACE = 1.0  # seconds the tasks left when a loop ends get to end once cancelled

busy: set[threading.Thread] = set()  # threads of ours running a call now
abandoned: list[asyncio.Task[Any]] = []  # tasks still running when their loop was closed

# When each call a pool started began (``time.monotonic()``): a time limit counts from there,
# not from the call's submission, which may wait for a thread or a process to be free.
_started: weakref.WeakKeyDictionary[Future[Any], float] = weakref.WeakKeyDictionary()


class NotStarted(Exception):
    """A sync handler's call no thread or process began within the job's time limit."""

    def __init__(self, limit: float) -> None:
        super().__init__(
            f"no thread or process was free for the handler within the job's time limit of "
            f"{limit:g} s"
        )


def start(future: Future[Any]) -> bool:
    """``future.set_running_or_notify_cancel()``, noting when the call began (``started``):
    noted first, so that a call ``cancel()`` finds no longer pending has its time."""
    _started[future] = time.monotonic()
    if not future.set_running_or_notify_cancel():
        del _started[future]
        return False
    return True


def started(future: Future[Any]) -> float | None:
    """When the pool began the call (``time.monotonic()``); None while it waits its turn."""
    return _started.get(future)


_Call = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class Pool(Protocol):
    """Where sync handlers run (``DaemonThreads``, ``_processes.ProcessPool``).
    ``stops_abandoned``: whether an abandoned call is stopped (its process killed) rather than
    left to run."""

    stops_abandoned: bool

    def submit(self, fn: Callable[..., T], /, *args: Any) -> Future[T]: ...
    def abandon(self, future: Future[Any]) -> bool: ...
    def abandoned(self) -> int: ...
    def stuck(self) -> bool: ...
    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None: ...


class DaemonThreads(Executor):
    """Up to ``size`` daemon threads named ``prefix-N``, started when needed, running the
    calls submitted in order. A call still running after ``shutdown`` keeps its thread until
    it returns; that thread does not hold the interpreter at exit."""

    stops_abandoned = False

    def __init__(self, size: int, prefix: str) -> None:
        self._size, self._prefix = size, prefix
        self._work: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._abandoned: set[Future[Any]] = set()
        self._most_abandoned = size  # threads left to their calls at once, beside ``size``

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a call after shutdown")
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._size:
                name = f"{self._prefix}-{len(self._threads)}"
                thread = threading.Thread(target=self._serve, name=name, daemon=True)
                thread.start()  # before the call is queued: one the OS refuses is never run
                self._threads.append(thread)
            self._work.put((future, fn, args, kwargs))
        return future

    def _serve(self) -> None:
        me = threading.current_thread()
        while (call := self._work.get()) is not None:
            future, fn, args, kwargs = call
            del call
            if start(future):
                busy.add(me)
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # the caller's to judge, whatever it is
                    future.set_exception(e)
                else:
                    future.set_result(result)
                    del result
                finally:
                    busy.discard(me)
            with self._lock:
                retire = future in self._abandoned
                if retire:  # another thread took its place meanwhile: this one ends
                    self._abandoned.discard(future)
                    self._size -= 1
                    self._threads.remove(me)
            del future, fn, args, kwargs  # nothing of the call kept while idle
            if retire:
                return
            self._idle.release()

    def abandon(self, future: Future[Any]) -> bool:
        """A call its caller stopped waiting for (a time limit): it keeps its thread until it
        returns, but no longer counts against ``size``, so another call may start a thread
        meanwhile; that call's thread ends once it returns. At most ``size`` calls are
        abandoned at once: past that (False), the call keeps its place in ``size``, and the
        pool runs fewer calls until it returns."""
        if future.cancel():  # not started yet: it never will
            return True
        with self._lock:
            if future.done() or future in self._abandoned:
                return True
            if len(self._abandoned) >= self._most_abandoned:
                return False
            self._abandoned.add(future)
            self._size += 1
            return True

    def stuck(self) -> bool:
        """Whether calls past their limit may keep every thread (as many abandoned as may be):
        a call waiting its turn may then wait for ever."""
        with self._lock:
            return len(self._abandoned) >= self._most_abandoned

    def abandoned(self) -> int:
        """Calls abandoned and still running."""
        with self._lock:
            return len(self._abandoned)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                cancel_waiting(self._work)
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def cancel_waiting(work: queue.SimpleQueue[Any]) -> None:
    """Cancels the calls still waiting in a pool's queue (each a tuple, its future first)."""
    while True:
        try:
            call = work.get_nowait()
        except queue.Empty:
            return
        if call is not None:
            call[0].cancel()


def run_loop(
    main: Coroutine[Any, Any, T],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """``asyncio.run(main)`` in a loop made by ``loop_factory``, except at the end: the tasks
    left are cancelled and get ``CANCEL_GRACE`` seconds to end; one still running then (a
    handler that swallows its cancellation) is logged, left behind in ``abandoned`` and never
    resumed, instead of waited for for ever."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        main.close()
        raise RuntimeError("run_loop() cannot be called from a running event loop")
    loop = (loop_factory or asyncio.new_event_loop)()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _end_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _end_tasks(loop: asyncio.AbstractEventLoop) -> None:
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not left:
        return
    for t in left:
        t.cancel()
    done, pending = loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_GRACE))
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            loop.call_exception_handler(
                {"message": "a task raised while the loop ended", "exception": t.exception()}
            )
    if pending:
        names = ", ".join(sorted(t.get_name() for t in pending))
        log.warning(
            "%d task(s) still running %.1f s after being cancelled, left behind (never "
            "resumed): %s",
            len(pending),
            CANCEL_GRACE,
            names,
        )
        for t in pending:
            t._log_destroy_pending = False  # type: ignore[attr-defined]  # said above
        abandoned.extend(pending)
