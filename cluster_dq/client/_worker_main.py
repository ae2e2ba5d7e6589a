"""``python -m cluster_dq.client.worker module:function --queue q ...``: runs a ``Worker``
with a handler found by name until SIGTERM/SIGINT (a second one forces the stop)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import uvloop

from cluster_dq.client import _runner
from cluster_dq.client.aio import AsyncClient
from cluster_dq.client.errors import DQError
from cluster_dq.client.worker import Worker


def find(target: str) -> Any:
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
    p.add_argument("--bury-on", action="append", default=[], help="module:ExceptionClass")
    p.add_argument("--metrics-port", type=int, help="serve /metrics on 127.0.0.1:PORT")
    p.add_argument("--log-level", default="INFO")
    return p


async def serve(args: argparse.Namespace) -> None:
    handler, bury_on = find(args.handler), tuple(find(t) for t in args.bury_on)
    client = AsyncClient(args.url, args.token, args.namespace, max_connections=64)
    async with client:
        worker = Worker(
            client,
            args.queue,
            handler,
            concurrency=args.concurrency,
            ttr=args.ttr,
            batch=args.batch,
            consumers=args.consumers,
            poll_timeout=args.poll_timeout,
            shutdown_timeout=args.shutdown_timeout,
            bury_on=bury_on,
            metrics=args.metrics_port is not None,
        )
        await worker.serve(signals=True)


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr="127.0.0.1")
    sys.path.insert(0, "")  # handlers are found from the current directory, as python -m does
    code: int = 0
    try:
        _runner.run_loop(serve(args), uvloop.new_event_loop)
    except (ValueError, DQError) as e:  # a bad setting, a refused token: one line, no traceback
        raise SystemExit(f"error: {e}") from None
    except SystemExit as e:  # a handler's sys.exit(): the worker stopped gracefully first
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:  # sys.exit("message"): said on stderr, status 1, as Python does
            print(e.code, file=sys.stderr)
            code = 1
    threads, tasks = len(_runner.busy), len(_runner.abandoned)
    if threads or tasks:
        # handlers still running past the stop (named in the worker's line): their jobs were
        # given back and the acks sent; nothing is left to wait for, and an interpreter's
        # exit could still trip on a thread (a lock held, a daemon writing at finalization)
        logging.getLogger("cluster_dq.worker").warning(
            "exiting now with %d handler thread(s) and %d task(s) still running",
            threads,
            tasks,
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise SystemExit(code)
