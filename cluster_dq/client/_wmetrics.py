"""The worker's own Prometheus metrics (optional): jobs by queue and outcome, handler
durations, handlers in flight. One set per registry, shared by the workers using it."""

from __future__ import annotations

import weakref

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

OUTCOMES = ("acked", "released", "snoozed", "buried", "lost", "failed")
_sets: weakref.WeakKeyDictionary[CollectorRegistry, WorkerMetrics] = weakref.WeakKeyDictionary()


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = Counter(
            "cluster_dq_worker_jobs",
            "Jobs a worker finished, by outcome: acked (confirmed), released, snoozed, buried, "
            "lost (its lease was gone: taken back), failed (the service did not confirm)",
            ["queue", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "cluster_dq_worker_handler_seconds",
            "How long a handler ran",
            ["queue"],
            registry=registry,
        )
        self.time_limited = Counter(
            "cluster_dq_worker_time_limited",
            "Jobs whose handler ran past their time limit (released with TimeLimitExceeded)",
            ["queue"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "cluster_dq_worker_in_flight",
            "Jobs a worker holds: handlers running, or waiting to run",
            registry=registry,
        )
        self._children: dict[tuple[str, str], Counter] = {}

    def count(self, queue: str, outcome: str) -> None:
        child = self._children.get((queue, outcome))
        if child is None:
            child = self._children[(queue, outcome)] = self.jobs.labels(queue, outcome)
        child.inc()


def metrics_for(registry: CollectorRegistry | None) -> WorkerMetrics:
    """The metric set of ``registry`` (None: the default one), made on first use."""
    reg = REGISTRY if registry is None else registry
    found = _sets.get(reg)
    if found is None:
        found = _sets[reg] = WorkerMetrics(reg)
    return found


def serve(port: int) -> None:
    """``/metrics`` on 127.0.0.1:``port`` (the worker command's ``--metrics-port``); a port
    taken, or not ours to take, ends the command with one line, no traceback."""
    try:
        start_http_server(port, addr="127.0.0.1")
    except OSError as e:
        raise SystemExit(f"error: --metrics-port {port}: {e.strerror}") from None
