"""Helpers for the test suite, the drills, the profiles and the benchmarks that run the real
service; standard library only, so the runtime never depends on a test tool."""

import signal


def default_sigint() -> None:
    """``preexec_fn`` of a child that will be sent SIGINT: the signal's default action in it.

    A background job of a non-interactive shell (``nohup``, ``cmd &``) starts with SIGINT
    ignored, and an ignored signal stays ignored in every child it starts, across fork and
    exec: Python then installs no KeyboardInterrupt handler, and a child sent SIGINT never
    sees it. A test must not depend on how its runner was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def default_stop_signals() -> None:
    """``preexec_fn`` of a ``cluster-dq serve`` that will be sent SIGINT or SIGHUP: both at
    their default in it, as from a terminal (a test run under ``nohup`` has SIGHUP ignored,
    which the service then keeps ignoring, as it should)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
