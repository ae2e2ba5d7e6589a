"""Sync handlers in child processes (``Worker(isolation="process")``): for CPU-bound handlers
(no shared interpreter lock) and crashy ones (a segfault, ``os._exit`` or the kernel's OOM
killer takes one child, not the worker).

``ProcessPool`` keeps ``size`` children, each fed by one thread of the worker: a call goes to
an idle child over a pipe, its result or exception comes back the same way. A child is
replaced when it dies under a call (the call fails with ``ChildDied``), when the caller gives
up on its call (a time limit: the child is killed, so the handler really stops), after
``max_tasks`` calls, and when its peak resident memory passed ``max_memory`` bytes after a
call. Children start with ``forkserver`` (``spawn`` where there is none): never a ``fork`` of
the worker's threads and event loop. The handler is pickled once per child (it must be
importable by name: a module-level function), each job per call. What runs in a child is
``_child.py``."""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from cluster_dq.client._child import GOT, READY, child_main
from cluster_dq.client._runner import DaemonThreads, Pool, cancel_waiting, start

log = logging.getLogger("cluster_dq.worker")
STOP_GRACE = 5.0  # seconds a retiring child gets to end on its own before it is killed
START_TIMEOUT = 60.0  # seconds a new child gets to say it is ready
MAX_CHILDREN = 512  # processes one worker may start for its handler
NO_PROCESS_WAIT = 5.0  # seconds a job no process could be started for waits to be taken again


class ChildDied(Exception):
    """The process running the handler ended before it answered: killed (by the OOM killer,
    an operator), crashed, or it exited."""


class NotReceived(ChildDied):
    """The child ended before it received the job (it died idle): the job never ran."""


class NoProcess(Exception):
    """No child could be started to run the handler (the OS refused a process): the job is
    given back without spending a try."""


_LIVE: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


@atexit.register
def _kill_children() -> None:
    """At the worker's exit, before multiprocessing's own exit function: children left (a
    stop that did not wait) are killed, not sent the SIGTERM they ignore."""
    for pool in list(_LIVE):
        pool.kill_all()


def method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def check_picklable(handler: Callable[..., Any]) -> None:
    """A ValueError now, rather than each job failing later, for a handler a child cannot
    import by name (a lambda, a closure, a method of an instance that does not pickle)."""
    try:
        pickle.dumps(handler)
    except Exception as e:
        raise ValueError(
            "isolation='process' runs the handler in another process, which imports it by "
            f"name: use a module-level function ({type(e).__name__}: {e})"
        ) from None


ISOLATIONS = ("thread", "process")


@dataclass(frozen=True)
class Isolation:
    """Where a worker runs a sync handler: ``thread`` (one of its threads), or ``process``
    (a child process, replaced after ``max_tasks`` jobs, or once its peak resident memory
    passed ``max_memory_mib`` after a job)."""

    kind: str = "thread"
    max_tasks: int | None = None
    max_memory_mib: int | None = None
    size: int = 1  # the worker's concurrency: threads, or processes

    def __post_init__(self) -> None:
        if self.kind not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, not {self.kind!r}")
        if self.kind == "process" and self.size > MAX_CHILDREN:
            raise ValueError(
                f"isolation='process' starts a process per unit of concurrency: at most "
                f"{MAX_CHILDREN}, not {self.size}"
            )
        for what, n in (("tasks", self.max_tasks), ("memory", self.max_memory_mib)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise ValueError(f"max_{what}_per_child must be an integer >= 1, or None")
        if self.kind == "thread" and (self.max_tasks or self.max_memory_mib):
            raise ValueError(
                "max_tasks_per_child and max_memory_per_child need isolation='process'"
            )

    def pool(self, handler: Callable[..., Any], is_async: bool) -> Pool | None:
        """The pool a handler runs in: none for an async one (it runs on the event loop).
        A process pool starts its first child, which loads the handler, before it answers."""
        size = self.size
        if self.kind == "thread":
            return None if is_async else DaemonThreads(size, "dq-worker")
        if is_async:
            raise ValueError("isolation='process' runs sync handlers: make it a plain function")
        check_picklable(handler)
        memory = None if self.max_memory_mib is None else self.max_memory_mib << 20
        return ProcessPool(handler, size, "dq-child", max_tasks=self.max_tasks, max_memory=memory)


class ProcessPool(Executor):
    def __init__(
        self,
        handler: Callable[..., Any],
        size: int,
        prefix: str,
        *,
        max_tasks: int | None = None,
        max_memory: int | None = None,
    ) -> None:
        self._handler = handler
        self._context = multiprocessing.get_context(method())
        if self._context.get_start_method() == "forkserver":  # (no effect once it runs)
            module = getattr(handler, "__module__", None)  # imported once, by the forkserver
            mine = [module] if module and module != "__main__" else []
            self._context.set_forkserver_preload(["cluster_dq.client", *mine])
        try:
            first: _Child | None = _Child(self._context, f"{prefix}-0", handler)
        except Exception as e:
            raise RuntimeError(
                f"isolation='process': no process could run the handler ({e}). A script "
                "that runs a Worker must do so under `if __name__ == '__main__':` (each child "
                "imports the script), and the handler's module must import in a new process "
                "(docs/worker.md)"
            ) from e
        self._max_tasks, self._max_memory = max_tasks, max_memory
        self._work: queue.SimpleQueue[tuple[Future[Any], Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[Future[Any], _Child] = {}
        self._children: set[_Child] = set() if first is None else {first}
        self._closed = False
        self.replaced = dict.fromkeys(("died", "killed", "tasks", "memory"), 0)
        self._threads = [
            threading.Thread(
                target=self._serve,
                args=(first if i == 0 else None,),
                name=f"{prefix}-{i}",
                daemon=True,
            )
            for i in range(size)
        ]
        _LIVE.add(self)
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """``fn(job)`` in a child: ``fn`` is the pool's handler (each child loaded it once)."""
        if fn is not self._handler or len(args) != 1 or kwargs:
            raise TypeError("a ProcessPool runs its own handler on one job")
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a call after shutdown")
            self._work.put((future, args[0]))
        return future

    def _serve(self, child: _Child | None) -> None:
        """One child's thread: feeds its child calls, replaces it as soon as it goes, so that
        the next call rarely waits for a child to start."""
        name = threading.current_thread().name
        child = child or self._start(name)
        try:
            while (call := self._work.get()) is not None:
                future, job = call
                del call
                if child is not None and child.gone():  # (died idle: OOM killer, an operator)
                    log.error("%s: the handler's process %s; replaced", name, child.ending())
                    self._forget(child)
                    self.replaced["died"] += 1
                    child = None
                child = child or self._start(name)
                with self._lock:  # (abandon() takes it too: a call it sees running has a child)
                    if not start(future):
                        continue
                    if child is not None:
                        self._running[future] = child
                if child is None:
                    future.set_exception(NoProcess("no process could be started for it"))
                    continue
                try:
                    try:
                        ok, value, peak = child.run(job)
                    except NotReceived as e:  # (it died idle: the job goes to a new one)
                        log.error("%s: %s; replaced", name, e)
                        self._forget(child)
                        self.replaced["died"] += 1
                        child = self._start(name)
                        if child is None:
                            raise NoProcess("no process could be started for it") from e
                        with self._lock:
                            self._running[future] = child
                        ok, value, peak = child.run(job)
                except NoProcess as e:
                    self._done(future)
                    future.set_exception(e)
                    continue
                except ChildDied as e:
                    assert child is not None
                    self._done(future)
                    self._forget(child)
                    self.replaced["killed" if child.killed else "died"] += 1
                    if not child.killed:
                        log.error("%s: %s; replaced", name, e)
                    child = None
                    future.set_exception(e)
                except BaseException as e:  # the job could not be sent (it does not pickle)
                    self._done(future)
                    future.set_exception(e)
                else:
                    self._done(future)  # (before its outcome: a late abandon kills nothing)
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
                    del value
                    child = self._maybe_retire(child, peak, name)
                del future, job  # nothing of the call kept while idle
                if child is None and not self._closed:
                    child = self._start(name)
        finally:
            if child is not None:
                self._forget(child)
                child.stop()

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.pop(future, None)

    def _start(self, name: str) -> _Child | None:
        try:
            child = _Child(self._context, name, self._handler)
        except Exception:  # (the OS refused a process: tried again for the next call)
            log.exception("%s: could not start a process for the handler", name)
            return None
        with self._lock:
            self._children.add(child)
        return child

    def _forget(self, child: _Child) -> None:
        with self._lock:
            self._children.discard(child)

    def _maybe_retire(self, child: _Child, peak: int, name: str) -> _Child | None:
        why = ""
        if self._max_tasks is not None and child.tasks >= self._max_tasks:
            why = "tasks"
        elif self._max_memory is not None and peak > self._max_memory:
            why = "memory"
            log.info(
                "%s: child %s reached %d MiB (max %d MiB): replaced",
                name,
                child.process.pid,
                peak >> 20,
                self._max_memory >> 20,
            )
        if not why:
            return child
        self.replaced[why] += 1
        self._forget(child)
        child.stop()
        return None

    def abandon(self, future: Future[Any]) -> bool:
        """A call its caller stopped waiting for (a time limit): not started, it never will;
        running, its child is killed (the handler stops there) and replaced; done, nothing."""
        with self._lock:  # (the call cannot finish and its child take another meanwhile)
            if future.cancel():
                return True
            child = self._running.get(future)
            if child is not None:
                child.kill()
        return True

    def kill_all(self) -> None:
        """Kills every child, idle or running a call (the process is exiting: an idle child
        ignores the SIGTERM multiprocessing's own exit would send it, then waits on it)."""
        with self._lock:
            children = list(self._children)
        for child in children:
            child.kill()

    def abandoned(self) -> int:
        return 0  # an abandoned call's child is killed: none keeps running

    def stuck(self) -> bool:
        return False  # (so a call waiting its turn gets a child once one is killed)

    stops_abandoned = True  # (call_handler says so)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Ends the children once their calls are done; with ``cancel_futures``, calls not
        started are cancelled and children still running a call are killed (the worker gave
        their jobs back)."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                cancel_waiting(self._work)
                for child in self._running.values():
                    child.kill()
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class _Child:
    """One child process, the parent's end of its pipe, and what tells of its end: a pidfd
    of the child where there is one (the process's sentinel is its forkserver's connection,
    which a forkserver's death closes under a child that still runs)."""

    def __init__(self, context: Any, name: str, handler: Callable[..., Any]) -> None:
        parent, child = context.Pipe()
        self.process = context.Process(
            target=child_main, args=(child, os.getpid()), name=name, daemon=True
        )
        self.process.start()
        child.close()
        self.conn: Connection = parent
        self.tasks = 0
        self.killed = False
        self.ended: Any = _pidfd(self.process.pid) or self.process.sentinel
        # it loads the handler, then says it is ready: one that cannot (a script that starts
        # a worker at import, a handler module that does not import there) is said here
        try:
            self.conn.send(handler)
            ready = wait([self.conn, self.ended], START_TIMEOUT)
            answer = self.conn.recv() if self.conn in ready else None
        except (EOFError, OSError):
            answer = None
        if answer != READY:
            self._end()
            self._close()
            if isinstance(answer, tuple):  # (False, the error, 0): it did not load
                raise ChildDied(f"the handler did not load there: {answer[1]!r}")
            raise ChildDied(f"the handler's process {self.ending()} while starting")

    def run(self, job: Any) -> tuple[bool, Any, int]:
        """(ok, result or exception, peak RSS in bytes); ``ChildDied`` when it ended first."""
        self.tasks += 1
        received = False
        try:
            self.conn.send(job)  # (pickled first: one that does not pickle sends nothing)
            if self.conn in wait([self.conn, self.ended]) and self.conn.recv() == GOT:
                received = True
                if self.conn in wait([self.conn, self.ended]):
                    reply: tuple[bool, Any, int] = self.conn.recv()
                    return reply
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
        if not received:
            self._end()
            self._close()
            raise NotReceived(f"the handler's process {self.ending()} before it got the job")
        self._end()  # (in case it still runs: its forkserver died, or its pipe broke)
        self._close()
        raise ChildDied(f"the handler's process {self.ending()}")

    def gone(self) -> bool:
        """Whether the child ended (looked at without waiting)."""
        return bool(wait([self.ended], 0))

    def ending(self) -> str:
        """``<pid> was killed by …`` / ``exited with status …``, its pipe closed."""
        self._close()
        self.process.join(STOP_GRACE)
        return f"{self.process.pid} {exit_text(self.process.exitcode)}"

    def kill(self) -> None:
        """Kills the child and whatever its handler started (its own process group)."""
        self.killed = True
        self._end()

    def _end(self) -> None:
        pid = self.process.pid
        try:
            if pid is not None and os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
                return
        except OSError:  # (gone already)
            pass
        self.process.kill()

    def stop(self) -> None:
        """Tells an idle child to end, then ends what its handler left running."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(STOP_GRACE)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
        if self.process.pid:  # (its group: what its handler left running)
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self._close()

    def _close(self) -> None:
        self.conn.close()
        if isinstance(self.ended, int) and self.ended != self.process.sentinel:
            with contextlib.suppress(OSError):
                os.close(self.ended)
            self.ended = self.process.sentinel


def _pidfd(pid: int | None) -> int | None:
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # (gone already: the sentinel says so)
        return None


def exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
