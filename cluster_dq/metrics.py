"""Prometheus metrics (admin port ``/metrics``), correct with several worker processes.

The supervisor points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before it spawns the
workers, so counters and histograms of every worker are summed at scrape time
(prometheus-client's multiprocess mode). Queue sizes are not counters: each shard's pump
leader measures the queues of its shard every ``SizeIntervalSecond`` and posts them to a
``SizeBoard``; a scrape reports the fresh posts only, so every queue is reported by the one
instance that leads its shard, and no instance ever scans every queue.

Every metric, with its meaning, is listed in the README (section Metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from bisect import bisect_left
from collections import Counter as Counter_
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from cluster_dq import history
from cluster_dq.engine.commands import Sizes
from cluster_dq.keys import parse_qualified
from cluster_dq.names import OTHER_QUEUE
from cluster_dq.models import Job

if TYPE_CHECKING:
    from cluster_dq.settings import Settings

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
FLUSH_AT = 100_000  # buffered observations that make a flush at once
QUEUE = ("namespace", "queue")
LATENESS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    3600,
)
HTTP_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
REDIS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

published = Counter("cluster_dq_jobs_published", "Jobs published (new ids).", QUEUE)
delivered = Counter("cluster_dq_jobs_delivered", "Jobs handed to consumers (each delivery).", QUEUE)
acked = Counter("cluster_dq_jobs_acked", "Jobs acknowledged (deleted) that existed.", QUEUE)
ttr_expired = Counter(
    "cluster_dq_jobs_ttr_expired", "Reservations whose time-to-run passed without an ack.", QUEUE
)
ttl_expired = Counter("cluster_dq_jobs_ttl_expired", "Jobs removed because their ttl ended.", QUEUE)
dead_lettered = Counter(
    "cluster_dq_jobs_dead_lettered", "Jobs moved to the dead-letter queue (no tries left).", QUEUE
)
respawned = Counter("cluster_dq_jobs_respawned", "Dead-letter jobs put back to ready.", QUEUE)
released = Counter(
    "cluster_dq_jobs_released", "Reserved jobs given back by their consumer (release).", QUEUE
)
schedule_published = Counter(
    "cluster_dq_schedule_occurrences_published",
    "Occurrences of recurring jobs published as new jobs.",
    QUEUE,
)
schedule_missed = Counter(
    "cluster_dq_schedule_occurrences_missed",
    "Occurrences of recurring jobs skipped: older than the catch-up window when fired.",
    QUEUE,
)
lateness = Histogram(
    "cluster_dq_job_lateness_seconds",
    "First delivery time minus due time.",
    QUEUE,
    buckets=LATENESS_BUCKETS,
)
first_delivery = Histogram(
    "cluster_dq_publish_to_first_delivery_seconds",
    "First delivery time minus publish time.",
    QUEUE,
    buckets=LATENESS_BUCKETS,
)

http_requests = Counter(
    "cluster_dq_http_requests", "HTTP requests answered.", ("port", "route", "method", "status")
)
http_duration = Histogram(
    "cluster_dq_http_request_duration_seconds",
    "HTTP request duration.",
    ("port", "route", "method"),
    buckets=HTTP_BUCKETS,
)

pump_batches = Counter("cluster_dq_pump_batches", "Pump claims of due queues.", ("pool", "shard"))
pump_steps = Counter(
    "cluster_dq_pump_queue_steps", "Pump steps of single queues.", ("pool", "shard")
)
reconciled = Counter(
    "cluster_dq_reconciled_queues",
    "Queues the reconcile sweep found missing from their shard's schedule (a lost "
    "signal: a publisher died between its two steps) and signalled.",
    ("pool",),
)
pump_moved = Counter(
    "cluster_dq_pump_jobs_moved",
    "Delayed jobs moved to ready when due (by the pump or a consumer).",
    ("pool",),
)
pump_leader = Gauge(
    "cluster_dq_pump_leader",
    "1 while this instance leads the shard's pump.",
    ("pool", "shard"),
    multiprocess_mode="livesum",
)
redis_duration = Histogram(
    "cluster_dq_redis_call_duration_seconds",
    "Round trip of one Redis step (a script, a command or a pipeline).",
    ("pool",),
    buckets=REDIS_BUCKETS,
)
redis_errors = Counter(
    "cluster_dq_redis_errors", "Failed Redis steps, by exception type.", ("pool", "kind")
)


# The counters a queue's 24-h history keeps too (history.py), and its field of each.
HISTORY_FIELDS = {
    published: history.PUBLISHED,
    acked: history.ACKED,
    ttr_expired: history.TTR_EXPIRED,
    dead_lettered: history.DEAD,
    released: history.RELEASED,
}

PER_QUEUE = (
    published,
    delivered,
    acked,
    ttr_expired,
    ttl_expired,
    dead_lettered,
    respawned,
    released,
    lateness,
    first_delivery,
)


# -- recording (by the service, the pools' engines and pumps, and the HTTP middleware) ------


# The HTTP labels take few values whatever a client sends (issue 25). A request that no route
# serves (its path matches none: 404; or its method is not the route's: 405; the parser takes
# ~35 methods) is route "unmatched", method "other", untimed. Otherwise the route is the route
# template, never the raw path, and the method one the route serves. The status is one of the
# codes the app gives, or its class ("4xx"). A request refused for its token (401) is counted,
# not timed. So the series are bounded by the routes, not by the requests: whatever a client
# sends, its odd requests share four series (two ports, 404 and 405), and one refused for its
# token adds one counter per (route, method) served.
UNMATCHED = "unmatched"
OTHER_HTTP = "other"
STATUSES = frozenset(
    (200, 201, 204, 303, 304, 400, 401, 403, 404, 405, 408, 409, 413, 414, 415, 421, 429, 431)
    + (499, 500, 503, 504)
)
UNTIMED = frozenset((401,))


def status_label(status: int) -> str:
    """A status's label: its code if the app gives it, else its class ("5xx"), else "other"."""
    if status in STATUSES:
        return str(status)
    return f"{status // 100}xx" if 100 <= status <= 599 else OTHER_HTTP


def http_labels(route: str, served: frozenset[str], method: str) -> tuple[str, str]:
    """(route, method) labels of a request matched to ``route`` (a template, or "unmatched"),
    which serves the methods ``served``."""
    if method in served:
        return route, method
    return UNMATCHED, OTHER_HTTP


class Metrics:
    """What one process records, passed to whatever records (``Service``, ``RedisPool``, the
    HTTP middleware, ``SizeBoard``); no module state. ``from_settings`` gives ``NoMetrics``
    when ``EnableMetrics`` is off (only to measure what the metrics cost).

    Queue names are chosen by clients: the per-queue series are bounded by ``max_queues``
    (``MetricsMaxQueues``) distinct (namespace, queue) pairs; the queues beyond it are counted
    together under queue="_other" of their namespace."""

    enabled = True

    def __init__(self, max_queues: int = 1_000, buffered: bool = False) -> None:
        self.max_queues = max_queues
        self._queues: set[tuple[str, str]] = set()
        self._children: dict[tuple[object, ...], Any] = {}
        # Buffered (``serve``): counts and observations add up in plain dicts and reach
        # prometheus-client at ``flush()`` (every second, and before a scrape), so a request
        # costs a dict update, not mmap stores (multiprocess mode) per counter and bucket.
        self.buffered = buffered
        self._counts: dict[Any, float] = {}
        self._observed: dict[Any, list[float]] = {}
        self._pending = 0
        # The queues' history (history.py): set by a worker that flushes it (HistoryFlushSecond).
        self.tally: history.Tally | None = None

    @classmethod
    def from_settings(cls, settings: Settings, buffered: bool = False) -> Metrics:
        if not settings.EnableMetrics:
            return NoMetrics(settings.MetricsMaxQueues)
        return cls(settings.MetricsMaxQueues, buffered)

    def _inc(self, child: Any, n: float = 1) -> None:
        if not self.buffered:
            child.inc(n)
            return
        self._counts[child] = self._counts.get(child, 0) + n

    def _observe(self, child: Any, values: Sequence[float]) -> None:
        if not self.buffered:
            observe_many(child, values)
            return
        if values:
            self._observed.setdefault(child, []).extend(values)
            self._pending += len(values)
            if self._pending > FLUSH_AT:  # bounded memory whatever the flush period
                self.flush()

    def flush(self) -> None:
        """What the buffer holds, into prometheus-client (its files, in multiprocess mode)."""
        counts, observed = self._counts, self._observed
        self._counts, self._observed, self._pending = {}, {}, 0
        for child, n in counts.items():
            child.inc(n)
        for child, values in observed.items():
            observe_many(child, values)

    async def flush_every(self, seconds: float) -> None:
        """The buffered recorder's flusher (a task of the worker; cancelled at shutdown)."""
        try:
            while True:
                await asyncio.sleep(seconds)
                self.flush()
        finally:
            self.flush()

    def queue_labels(self, ns: str, q: str) -> tuple[str, str]:
        """The labels a queue's series get: its own, or ``(ns, "_other")`` past the cap."""
        if (ns, q) in self._queues:
            return ns, q
        if len(self._queues) < self.max_queues:
            self._queues.add((ns, q))
            return ns, q
        return ns, OTHER_QUEUE

    def forget_queue(self, ns: str, q: str) -> None:
        """A destroyed queue's series go (and free their place under the cap). Not in
        multiprocess mode (``serve``): prometheus-client cannot remove a series there (its values
        stay in each worker's mmap file and every scrape sums them), so they stay until the
        instance restarts, and keep their place under the cap, which still bounds them."""
        if (ns, q) not in self._queues or multiproc_dir():
            return
        self.flush()  # nothing of the queue left in the buffer to bring its series back
        self._queues.discard((ns, q))
        for metric in PER_QUEUE:
            with contextlib.suppress(KeyError):
                metric.remove(ns, q)
        for key in [k for k in self._children if k[1:] == (ns, q)]:
            del self._children[key]

    def child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: the lookup costs as much as the increment itself.
        Label values are bounded (queues, route templates), so is the cache."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def count(self, counter: Counter, ns: str, q: str, n: int, pool: str = "") -> None:
        """``n`` more of a queue's ``counter``; with the ``pool`` the work happened in, in the
        queue's history too (the counters of ``HISTORY_FIELDS``)."""
        if n:
            self._inc(self.child(counter, *self.queue_labels(ns, q)), n)
            if pool and self.tally is not None and counter in HISTORY_FIELDS:
                self.tally.add(pool, ns, q, HISTORY_FIELDS[counter], n)

    def http(self, port: str, route: str, method: str, status: int, seconds: float) -> None:
        """One request, labelled by ``http_labels``; the status is folded here. Timed unless
        no route served it or its token was refused."""
        self._inc(self.child(http_requests, port, route, method, status_label(status)))
        if route != UNMATCHED and status not in UNTIMED:
            self._observe(self.child(http_duration, port, route, method), (seconds,))

    def record_delivered(
        self, jobs: Iterable[Job], now_ms: int, pool_of: Callable[[str], str] | None = None
    ) -> None:
        """Deliveries, and the lateness of first ones; ``pool_of(queue)``: the pool a queue's
        history is written to (none: not in its history)."""
        per_queue: dict[tuple[str, str], tuple[list[int], list[float], list[float]]] = {}
        for job in jobs:
            count_, late, first = per_queue.setdefault((job.namespace, job.queue), ([0], [], []))
            count_[0] += 1
            if job.deliveries == 1:
                due = job.scheduled_ms
                if due is not None:  # a client-chosen id carries no due time
                    late.append(max(now_ms - due, 0) / 1000)
                first.append(max(now_ms - job.published_ms, 0) / 1000)
        tally = self.tally if pool_of is not None else None
        for (ns, q), (count_, late, first) in per_queue.items():
            if tally is not None and pool_of is not None:
                late_ms = [round(s * 1000) for s in late]
                tally.delivered(pool_of(q), ns, q, count_[0], len(first), late_ms)
            ns, q = self.queue_labels(ns, q)
            self._inc(self.child(delivered, ns, q), count_[0])
            self._observe(self.child(lateness, ns, q), late)
            self._observe(self.child(first_delivery, ns, q), first)

    def pool(self, name: str) -> PoolMetrics:
        return PoolMetrics(name, self)


class NoMetrics(Metrics):
    """``EnableMetrics = false``: records nothing (sizes are still labelled, for the board)."""

    enabled = False

    def count(self, counter: Counter, ns: str, q: str, n: int, pool: str = "") -> None:
        pass

    def http(self, port: str, route: str, method: str, status: int, seconds: float) -> None:
        pass

    def record_delivered(
        self, jobs: Iterable[Job], now_ms: int, pool_of: Callable[[str], str] | None = None
    ) -> None:
        pass

    def pool(self, name: str) -> PoolMetrics:
        return NoPoolMetrics(name, self)


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """``histogram.observe(v) for v in values`` with one write per bucket touched and one to
    the sum, not two per value: in multiprocess mode each write is an mmap store, and a
    consume of 100 jobs observes 200 values. Relies on prometheus-client's Histogram fields
    (``_upper_bounds``, ``_buckets``, ``_sum``; pinned version, checked by a test)."""
    if len(values) < 3:
        for v in values:
            histogram.observe(v)
        return
    for i, n in Counter_(bisect_left(histogram._upper_bounds, v) for v in values).items():
        histogram._buckets[i].inc(n)
    histogram._sum.inc(sum(values))


class PoolMetrics:
    """The per-pool sink of the engine (Redis round trips) and the pump (moves, leadership)."""

    def __init__(self, pool: str, metrics: Metrics | None = None) -> None:
        self.pool = pool
        self.metrics = metrics or Metrics()
        self._duration = redis_duration.labels(pool)
        self._moved = pump_moved.labels(pool)

    def redis_call(self, seconds: float, error: BaseException | None) -> None:
        self._duration.observe(seconds)
        if error is not None:
            redis_errors.labels(self.pool, type(error).__name__).inc()

    def moved(self, ns: str, q: str, promoted: int, retried: int, dead: int, expired: int) -> None:
        if promoted:
            self._moved.inc(promoted)
        if not (retried or dead or expired):
            return
        tally = self.metrics.tally
        if tally is not None and (retried or dead):  # its history, in this pool
            tally.add(self.pool, ns, q, history.TTR_EXPIRED, retried + dead)
            tally.add(self.pool, ns, q, history.DEAD, dead)
        ns, q = self.metrics.queue_labels(ns, q)
        child = self.metrics.child
        if retried or dead:
            child(ttr_expired, ns, q).inc(retried + dead)
        if dead:
            child(dead_lettered, ns, q).inc(dead)
        if expired:
            child(ttl_expired, ns, q).inc(expired)

    def leadership(self, shard: int, held: bool) -> None:
        pump_leader.labels(self.pool, str(shard)).set(1 if held else 0)

    def reconciled(self, queues: int) -> None:
        reconciled.labels(self.pool).inc(queues)

    def batch(self, shard: int, queues: int) -> None:
        if queues:  # idle polls are not batches
            pump_batches.labels(self.pool, str(shard)).inc()
            pump_steps.labels(self.pool, str(shard)).inc(queues)


class NoPoolMetrics(PoolMetrics):
    """A pool's sink that records nothing (``NoMetrics``); it still names the pool."""

    def redis_call(self, seconds: float, error: BaseException | None) -> None:
        pass

    def moved(self, ns: str, q: str, promoted: int, retried: int, dead: int, expired: int) -> None:
        pass

    def leadership(self, shard: int, held: bool) -> None:
        pass

    def reconciled(self, queues: int) -> None:
        pass

    def batch(self, shard: int, queues: int) -> None:
        pass


# -- queue sizes, posted by the shard leaders -------------------------------------------------

STATES = ("ready", "delayed", "reserved", "dead")


class SizeBoard:
    """Latest sizes of the queues of the shards this process leads. With a directory (the
    multiprocess directory), posts go to one small JSON file per pool and shard so that any
    worker's scrape sees every worker's posts; posts older than ``stale_after`` (a shard that
    another instance leads now) are not reported."""

    def __init__(
        self, directory: str | None, stale_after: float, labels: Metrics | None = None
    ) -> None:
        self.directory = Path(directory) if directory else None
        self.labels = labels or Metrics()  # the service's: sizes are labelled as its counters
        self.stale_after = stale_after
        self._posts: dict[tuple[str, int], dict[str, object]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def post(self, pool: str, shard: int, sizes: dict[str, Sizes]) -> None:
        post: dict[str, object] = {
            "pool": pool,
            "at": time.time(),
            "queues": {qn: [s.ready, s.delayed, s.reserved, s.dead] for qn, s in sizes.items()},
        }
        if self.directory is None:
            self._posts[(pool, shard)] = post
            return
        path = self.directory / f"sizes-{pool}-{shard}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(post))
        tmp.replace(path)  # atomic: a scrape never reads half a post

    def _read(self) -> Iterator[dict[str, object]]:
        if self.directory is None:
            yield from self._posts.values()
            return
        for path in self.directory.glob("sizes-*.json"):
            try:
                yield json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # removed or replaced meanwhile

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "cluster_dq_queue_jobs",
            "Jobs in a queue by state (measured by the shard's pump leader).",
            labels=("pool", "namespace", "queue", "state"),
        )
        fresh_after = time.time() - self.stale_after
        # Labelled as the counters are (queue_labels): past the cap, summed under "_other".
        rows: dict[tuple[str, str, str], list[int]] = {}
        for post in self._read():
            if float(post["at"]) < fresh_after:  # type: ignore[arg-type]
                continue
            pool = str(post["pool"])
            queues: dict[str, list[int]] = post["queues"]  # type: ignore[assignment]
            for qualified, counts in queues.items():
                row = rows.setdefault(
                    (pool, *self.labels.queue_labels(*parse_qualified(qualified))), [0, 0, 0, 0]
                )
                for i, n in enumerate(counts):
                    row[i] += n
        for (pool, ns, q), counts in rows.items():
            for state, n in zip(STATES, counts, strict=True):
                family.add_metric([pool, ns, q, state], n)
        yield family


def multiproc_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class _Workers:
    """The counters of every worker of this instance (their multiprocess files), read as a
    scrape reads them. A worker that died has its files removed by the supervisor: a file
    listed but gone is left out, and one removed while it was read (FileNotFoundError) has the
    files listed and read again."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    def collect(self) -> Iterable[Metric]:
        for attempt in range(5):
            files = [str(p) for p in self.directory.glob("*.db") if p.exists()]
            try:
                merge = MultiProcessCollector.merge
                merged: Iterable[Metric] = merge(files, accumulate=True)  # type: ignore[no-untyped-call]
                return merged
            except FileNotFoundError:
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")


def _counters() -> Any:
    """The registry of this instance's counters: every worker's (in a multiprocess run)."""
    directory = multiproc_dir()
    if not directory:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Workers(directory))
    return registry


def render(board: SizeBoard) -> tuple[bytes, str]:
    """The exposition of every worker of this instance, and the content type."""
    return generate_latest(_counters()) + generate_latest(board.registry), CONTENT_TYPE_LATEST


RATE_COUNTERS = {"published": published, "delivered": delivered, "acked": acked}


def queue_totals() -> dict[tuple[str, str], dict[str, float]]:
    """The counts of ``RATE_COUNTERS`` per (namespace, queue), summed over every worker of
    this instance as a scrape sums them (flush the caller's buffer first): the dashboard's
    rates are their differences over time."""
    registry = _counters()
    wanted = {c._name.removesuffix("_total"): kind for kind, c in RATE_COUNTERS.items()}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for family in registry.collect():
        kind = wanted.get(family.name.removesuffix("_total"))
        if kind is None:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # the _created samples
            key = (sample.labels["namespace"], sample.labels["queue"])
            row = out.setdefault(key, dict.fromkeys(RATE_COUNTERS, 0.0))
            row[kind] += sample.value
    return out
