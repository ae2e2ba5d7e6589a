"""The worker's command line (``python -m cluster_dq.client.worker``, ``python -m
cluster_dq.client``): its options, and the ``Worker`` arguments they stand for. ``main`` is in
``worker.py``, which runs it."""

from __future__ import annotations

import argparse
import importlib
from typing import Any


def _find(target: str) -> Any:
    """``package.module:attribute`` -> the attribute."""
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise SystemExit(f"{target!r}: expected module:function")
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"{target!r}: {e}") from None
    return found


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cluster_dq.client.worker",
        description="Runs a Worker over the queues with the handler named module:function "
        "until SIGTERM or SIGINT (a second one forces the stop).",
    )
    p.add_argument("handler", help="module:function, async or not, taking a Job")
    p.add_argument("--queue", "-q", action="append", required=True, help="repeat: priority order")
    p.add_argument("--url", help="default: CLUSTER_DQ_URL")
    p.add_argument("--token", help="default: CLUSTER_DQ_TOKEN")
    p.add_argument("--namespace", help="default: CLUSTER_DQ_NAMESPACE")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--ttr", type=float, default=60.0, help="seconds; renewed while running")
    p.add_argument("--batch", type=int, default=100, help="jobs per consume, 1..100")
    p.add_argument("--consumers", type=int, default=1, help="consumes in flight at once")
    p.add_argument("--poll-timeout", type=float, default=5.0, help="long-poll seconds")
    p.add_argument("--shutdown-timeout", type=float, default=30.0)
    p.add_argument("--time-limit", type=float, help="seconds a handler may run on one job")
    p.add_argument(
        "--isolation",
        choices=("thread", "process"),
        default="thread",
        help="where a sync handler runs: a thread, or a child process",
    )
    p.add_argument("--max-tasks-per-child", type=int, help="jobs before a child is replaced")
    p.add_argument(
        "--max-memory-per-child", type=int, help="MiB of peak memory before a child is replaced"
    )
    p.add_argument("--bury-on", action="append", default=[], help="module:ExceptionClass")
    p.add_argument(
        "--middleware", action="append", default=[], help="module:callable; repeat: outermost first"
    )
    p.add_argument("--on-startup", help="module:function, called with the worker before it starts")
    p.add_argument("--on-shutdown", help="module:function, called with the worker once stopped")
    p.add_argument("--metrics-port", type=int, help="serve /metrics on 127.0.0.1:PORT")
    p.add_argument("--log-level", default="INFO")
    return p


def worker_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``Worker`` keyword arguments the parsed options stand for (what names a function or
    a class found by name)."""
    return {
        "handler": _find(args.handler),
        "concurrency": args.concurrency,
        "ttr": args.ttr,
        "batch": args.batch,
        "consumers": args.consumers,
        "poll_timeout": args.poll_timeout,
        "shutdown_timeout": args.shutdown_timeout,
        "time_limit": args.time_limit,
        "isolation": args.isolation,
        "max_tasks_per_child": args.max_tasks_per_child,
        "max_memory_per_child": args.max_memory_per_child,
        "bury_on": tuple(_find(t) for t in args.bury_on),
        "middleware": [_find(m) for m in args.middleware],
        "on_startup": _find(args.on_startup) if args.on_startup else None,
        "on_shutdown": _find(args.on_shutdown) if args.on_shutdown else None,
        "metrics": args.metrics_port is not None,
    }
