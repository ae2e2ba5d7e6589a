"""What runs inside a worker's child process (``Worker(isolation="process")``; the pool that
feeds it is ``_processes.py``): it loads the handler once, then takes one job at a time over
its pipe and answers the handler's result or exception, with its peak memory.

A child lets SIGINT and SIGTERM pass (stopping is the worker's: a signal to the whole group,
or systemd's to the whole unit, must let the running handler finish), leads a process group of
its own (a kill takes whatever its handler started), ends when the worker does, even
mid-handler, and never lets a copy of itself made by the handler's ``fork()`` answer on its
pipe. The signals are caught by a handler that does nothing rather than ignored: what the
handler starts with ``exec`` gets them back as they were (an ignored signal stays ignored
across ``exec``, so a subprocess would not end on ``terminate()``), and an interrupted system
call is restarted, not failed."""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

ORPHAN_CHECK = 1.0  # seconds between a child's looks at whether the worker is still there
READY = b"ready"
GOT = b"got"  # a job received (before its handler runs): one not confirmed never ran


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child (its ``__cause__``)."""

    def __str__(self) -> str:
        return str(self.args[0])


def child_main(conn: Connection, worker: int) -> None:
    """A child's life: the handler first (``READY``, or why it does not load), then a job in,
    its outcome out, until told to stop (None) or the worker goes."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _let_pass)
        signal.siginterrupt(sig, False)
    with contextlib.suppress(OSError):
        os.setsid()
    me = os.getpid()
    threading.Thread(target=_orphaned, args=(worker,), daemon=True).start()
    try:
        handler = conn.recv()  # (unpickled: its module imported here)
    except (EOFError, OSError):
        return
    except Exception as e:
        conn.send((False, _Carried(e), 0))
        return
    conn.send(READY)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the worker is gone
            return
        if job is None:
            return
        conn.send(GOT)
        try:
            reply: tuple[bool, Any, int] = (True, handler(job), 0)
        except SystemExit as e:  # the handler ends its process: as any other child's end
            _leave_if_forked(me)
            os._exit(e.code if isinstance(e.code, int) else 1)
        except KeyboardInterrupt:
            _leave_if_forked(me)
            os._exit(130)
        except BaseException as e:  # the caller's to judge, whatever it is
            _leave_if_forked(me)
            reply = (False, _Carried(e), 0)
        _leave_if_forked(me)
        del job
        reply = (reply[0], reply[1], _peak())
        try:
            conn.send(reply)
        except OSError:  # the worker is gone
            return
        except Exception as e:  # the result does not pickle
            why = TypeError(f"the handler's result cannot be sent back: {type(e).__name__}: {e}")
            conn.send((False, _Carried(why), _peak()))


def _let_pass(signum: int, frame: Any) -> None:
    """SIGINT and SIGTERM in a child: nothing (see the module's docstring)."""


def _leave_if_forked(me: int) -> None:
    """A copy the handler made with ``fork()`` that returned here ends: only the child itself
    answers on the pipe (a copy's answer would be taken for another job's)."""
    if os.getpid() != me:
        os._exit(0)


def _orphaned(worker: int) -> None:
    """Ends the child, and what its handler started, when the worker is gone (killed: no
    shutdown ran), even while a handler still runs: nobody is left to take its answer. (Not
    its parent: that is the forkserver.) Linux: a pidfd readable when the worker ends;
    elsewhere, a look every ``ORPHAN_CHECK`` seconds."""
    try:
        if hasattr(os, "pidfd_open"):
            select.select([os.pidfd_open(worker)], [], [])
        else:
            while True:
                os.kill(worker, 0)
                time.sleep(ORPHAN_CHECK)
    except OSError:  # (gone already, or no such process)
        pass
    with contextlib.suppress(OSError):
        if os.getpgid(0) == os.getpid():  # (a group of its own: its handler's processes too)
            os.killpg(0, signal.SIGKILL)
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


def _rebuild(exc: BaseException, tb: str, pid: int) -> BaseException:
    exc.__cause__ = RemoteTraceback(f"\n(in the handler's process {pid})\n{tb}")
    return exc
