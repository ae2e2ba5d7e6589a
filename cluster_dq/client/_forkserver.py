"""The first module a process pool's forkserver preloads: there, and in every child it forks,
SIGTERM is ignored. A SIGTERM to the worker's whole process group (systemd's
``KillMode=control-group``, ``kill -TERM -PGID``) must leave stopping to the worker, which lets
running handlers finish; and a forkserver's end is taken by multiprocessing for the end of
each of its children. It is set at import, in the forkserver's own main thread, whichever
thread of the worker started it, and again by each forkserver that replaces one. Imported
anywhere else (not the forkserver's preload), it does nothing."""

import os
import signal
import sys


def _preloaded_by_forkserver() -> bool:
    frame = sys._getframe(1)
    where = os.path.join("multiprocessing", "forkserver.py")
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_code.co_filename.endswith(where):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


if _preloaded_by_forkserver():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
