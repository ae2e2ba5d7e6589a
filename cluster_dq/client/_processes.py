"""Sync handlers in child processes (``Worker(isolation="process")``): for CPU-bound handlers
(no shared interpreter lock) and crashy ones (a segfault, ``os._exit`` or the kernel's OOM
killer takes one child, not the worker).

``ProcessPool`` keeps ``size`` children, each fed by one thread of the worker: a call goes to
an idle child over a pipe, its result or exception comes back the same way. A child is
replaced when it dies under a call (the call fails with ``ChildDied``), when the caller gives
up on its call (a time limit: the child is killed, so the handler really stops), after
``max_tasks`` calls, and when its peak resident memory passed ``max_memory`` bytes after a
call. Children start with ``forkserver`` (``spawn`` where there is none): never a ``fork`` of
the worker's threads and event loop. The handler and the job are pickled, so the handler must
be importable by name (a module-level function)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import pickle
import queue
import resource
import select
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from multiprocessing import forkserver
from multiprocessing.connection import Connection, wait
from typing import Any

from cluster_dq.client._runner import DaemonThreads, Pool, cancel_waiting

log = logging.getLogger("cluster_dq.worker")
STOP_GRACE = 5.0  # seconds a retiring child gets to end on its own before it is killed
START_TIMEOUT = 60.0  # seconds a new child gets to say it is ready
MAX_CHILDREN = 512  # processes one worker may start for its handler
NO_PROCESS_WAIT = 5.0  # seconds a job no process could be started for waits to be taken again
ORPHAN_CHECK = 1.0  # seconds between a child's looks at whether the worker is still there


class ChildDied(Exception):
    """The process running the handler ended before it answered: killed (by the OOM killer,
    an operator), crashed, or it exited."""


class NoProcess(Exception):
    """No child could be started to run the handler (the OS refused a process): the job is
    given back without spending a try."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child (its ``__cause__``)."""

    def __str__(self) -> str:
        return str(self.args[0])


_LIVE: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


@atexit.register
def _kill_children() -> None:
    """At the worker's exit, before multiprocessing's own exit function: children left (a
    stop that did not wait) are killed, not sent the SIGTERM they ignore."""
    for pool in list(_LIVE):
        pool.kill_all()


def _forkserver_deaf_to_sigterm() -> None:
    """Starts the forkserver, if it does not run yet, with SIGTERM ignored (inherited through
    its exec, and by every child it forks): a SIGTERM to the worker's whole process group
    (systemd's ``KillMode=control-group``, ``kill -TERM -PGID``) must leave stopping to the
    worker, which lets running handlers finish. (The forkserver's end is every child's end:
    multiprocessing takes it for the child's exit.) Only the main thread may set a handler;
    elsewhere the forkserver starts as multiprocessing starts it."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, previous)


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
        """The pool a handler runs in: none for an async one (it runs on the event loop)."""
        size = self.size
        if self.kind == "thread":
            return None if is_async else DaemonThreads(size, "dq-worker")
        if is_async:
            raise ValueError("isolation='process' runs sync handlers: make it a plain function")
        check_picklable(handler)
        memory = None if self.max_memory_mib is None else self.max_memory_mib << 20
        module = getattr(handler, "__module__", None)  # imported once, by the forkserver
        preload = [module] if module and module != "__main__" else []
        return ProcessPool(
            size, "dq-child", max_tasks=self.max_tasks, max_memory=memory, preload=preload
        )


class ProcessPool(Executor):
    def __init__(
        self,
        size: int,
        prefix: str,
        *,
        max_tasks: int | None = None,
        max_memory: int | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        self._context = multiprocessing.get_context(method())
        if self._context.get_start_method() == "forkserver":  # (no effect once it runs)
            self._context.set_forkserver_preload(["cluster_dq.client", *preload])
            _forkserver_deaf_to_sigterm()
        try:
            first: _Child | None = _Child(self._context, f"{prefix}-0")
        except Exception as e:
            raise RuntimeError(
                f"isolation='process': no process could be started for the handler ({e}). "
                "A script that runs a Worker must do so under `if __name__ == '__main__':` "
                "(each child imports the script; docs/worker.md)"
            ) from e
        self._max_tasks, self._max_memory = max_tasks, max_memory
        self._work: queue.SimpleQueue[
            tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None
        ]
        self._work = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: dict[Future[Any], _Child] = {}
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
        if kwargs:
            raise TypeError("ProcessPool.submit takes positional arguments only")
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a call after shutdown")
            self._work.put((future, fn, args))
        return future

    def _serve(self, child: _Child | None) -> None:
        """One child's thread: feeds its child calls, replaces it as soon as it goes, so that
        the next call rarely waits for a child to start."""
        name = threading.current_thread().name
        child = child or self._start(name)
        try:
            while (call := self._work.get()) is not None:
                future, fn, args = call
                del call
                child = child or self._start(name)
                with self._lock:  # (abandon() takes it too: a call it sees running has a child)
                    if not future.set_running_or_notify_cancel():
                        continue
                    if child is not None:
                        self._running[future] = child
                if child is None:
                    future.set_exception(NoProcess("no process could be started for it"))
                    continue
                try:
                    ok, value, peak = child.run(fn, args)
                except ChildDied as e:
                    self.replaced["killed" if child.killed else "died"] += 1
                    if not child.killed:
                        log.error("%s: %s; replaced", name, e)
                    child = None
                    future.set_exception(e)
                except BaseException as e:  # the call could not be sent (it does not pickle)
                    future.set_exception(e)
                else:
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
                    del value
                    child = self._maybe_retire(child, peak, name)
                finally:
                    with self._lock:
                        self._running.pop(future, None)
                del future, fn, args  # nothing of the call kept while idle
                if child is None and not self._closed:
                    child = self._start(name)
        finally:
            if child is not None:
                child.stop()

    def _start(self, name: str) -> _Child | None:
        try:
            return _Child(self._context, name)
        except Exception:  # (the OS refused a process: tried again for the next call)
            log.exception("%s: could not start a process for the handler", name)
            return None

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
        child.stop()
        return None

    def abandon(self, future: Future[Any]) -> bool:
        """A call its caller stopped waiting for (a time limit): not started, it never will;
        running, its child is killed (the handler stops there) and replaced."""
        with self._lock:
            if future.cancel():
                return True
            child = self._running.get(future)
        if child is not None:
            child.kill()
        return True

    def kill_all(self) -> None:
        """Kills every child still running a call."""
        with self._lock:
            running = list(self._running.values())
        for child in running:
            child.kill()

    def abandoned(self) -> int:
        return 0  # an abandoned call's child is killed: none keeps running

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
    """One child process and the parent's end of its pipe."""

    def __init__(self, context: Any, name: str) -> None:
        parent, child = context.Pipe()
        self.process = context.Process(
            target=_child_main, args=(child, os.getpid()), name=name, daemon=True
        )
        self.process.start()
        child.close()
        self.conn: Connection = parent
        self.tasks = 0
        self.killed = False
        # it says it is ready once it runs its loop: one that dies starting (a script that
        # starts a worker at import, a handler module that does not import) is said here
        ready = wait([self.conn, self.process.sentinel], START_TIMEOUT)
        if self.conn not in ready:
            self.kill()
            self.process.join()
            self.conn.close()
            raise ChildDied(
                f"the handler's process {self.process.pid} "
                f"{exit_text(self.process.exitcode)} while starting"
            )
        self.conn.recv()

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any, int]:
        """(ok, result or exception, peak RSS in bytes); ``ChildDied`` when it ended first."""
        self.tasks += 1
        try:
            self.conn.send((fn, args))  # (pickled first: one that does not pickle sends nothing)
            ready = wait([self.conn, self.process.sentinel])
            if self.conn in ready:
                reply: tuple[bool, Any, int] = self.conn.recv()
                return reply
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
        self.process.join()
        self.conn.close()
        raise ChildDied(
            f"the handler's process {self.process.pid} {exit_text(self.process.exitcode)}"
        )

    def kill(self) -> None:
        """Kills the child and whatever its handler started (its own process group)."""
        self.killed = True
        pid = self.process.pid
        try:
            if pid is not None and os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
                return
        except OSError:  # (gone already)
            pass
        self.process.kill()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(STOP_GRACE)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
        self.conn.close()


def exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


# -- in the child -----------------------------------------------------------------------------


def _child_main(conn: Connection, worker: int) -> None:
    """A child's loop: a call in, its outcome out, until told to stop or the worker goes."""
    # A terminal's Ctrl-C and a SIGTERM to the whole group are for the worker, which stops its
    # children itself; its own process group, so that a kill takes what the handler started.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.setsid()
    threading.Thread(target=_orphaned, args=(worker,), daemon=True).start()
    conn.send(b"ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        except Exception as e:  # the call did not unpickle (its module does not import here)
            conn.send((False, _carried(e), _peak()))
            continue
        if message is None:
            return
        fn, args = message
        try:
            reply: tuple[bool, Any, int] = (True, fn(*args), 0)
        except SystemExit as e:  # the handler ends its process: as any other child's end
            os._exit(e.code if isinstance(e.code, int) else 1)
        except KeyboardInterrupt:
            os._exit(130)
        except BaseException as e:  # the caller's to judge, whatever it is
            reply = (False, _carried(e), 0)
        del message, fn, args
        reply = (reply[0], reply[1], _peak())
        try:
            conn.send(reply)
        except Exception as e:  # the result does not pickle
            why = TypeError(f"the handler's result cannot be sent back: {type(e).__name__}: {e}")
            conn.send((False, _carried(why), _peak()))


def _orphaned(worker: int) -> None:
    """Ends the child when the worker is gone (killed: no shutdown ran), even while a handler
    still runs: nobody is left to take its answer. (Not its parent: that is the forkserver,
    which outlives the worker while any child lives.) Linux: a pidfd readable when the worker
    ends; elsewhere, a look every ``ORPHAN_CHECK`` seconds."""
    try:
        if hasattr(os, "pidfd_open"):
            select.select([os.pidfd_open(worker)], [], [])
        else:
            while True:
                os.kill(worker, 0)
                time.sleep(ORPHAN_CHECK)
    except OSError:  # (gone already, or no such process)
        pass
    os._exit(1)


def _peak() -> int:
    """This process's peak resident memory, bytes (Linux counts KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class _Carried:
    """An exception on its way to the parent, with its traceback as text (a traceback does
    not pickle); one that does not pickle at all goes as a RuntimeError naming it."""

    def __init__(self, exc: BaseException) -> None:
        self.tb, self.pid = "".join(traceback.format_exception(exc)), os.getpid()
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        self.exc = exc

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.exc, self.tb, self.pid)


def _carried(exc: BaseException) -> Any:
    return _Carried(exc)


def _rebuild(exc: BaseException, tb: str, pid: int) -> BaseException:
    exc.__cause__ = RemoteTraceback(f"\n(in the handler's process {pid})\n{tb}")
    return exc
