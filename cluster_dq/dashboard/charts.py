"""The lateness and redelivery charts' data: a small in-process ring of samples of the
service's own counters (as a scrape of this instance sees them) per viewed queue, the
differences between samples, and SVG polylines to draw them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from cluster_dq.metrics import LATENESS_BUCKETS, multiproc_dir

FAMILIES = {
    "cluster_dq_jobs_delivered_total": "delivered",
    "cluster_dq_jobs_ttr_expired_total": "ttr_expired",
    "cluster_dq_jobs_dead_lettered_total": "dead",
    "cluster_dq_jobs_released_total": "released",
    "cluster_dq_publish_to_first_delivery_seconds_count": "first",
    "cluster_dq_job_lateness_seconds_count": "late_count",
    "cluster_dq_job_lateness_seconds_sum": "late_sum",
}
LATE_BOUNDS = (*LATENESS_BUCKETS, float("inf"))
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sample:
    """A queue's counters at one instant (totals since the instance started)."""

    t: float
    values: dict[str, float]
    late_buckets: tuple[float, ...]  # cumulative counts per LATE_BOUNDS


@dataclass(frozen=True, slots=True)
class Point:
    """What happened between two samples."""

    t: float
    seconds: float
    delivered: float
    redelivered: float  # deliveries that were not a job's first (ttr expiries, releases)
    ttr_expired: float
    released: float
    dead: float
    late_mean_ms: float | None
    late_p99_ms: float | None  # the upper bound of the bucket holding the 99th percentile


def read_counters(queues: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Sample]:
    """The per-queue counters the charts draw, as a scrape of this instance sees them (every
    worker's, in multiprocess mode)."""
    wanted = set(queues)
    directory = multiproc_dir()
    registry = REGISTRY
    if directory:
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, directory)  # type: ignore[no-untyped-call]
    now = time.time()
    values: dict[tuple[str, str], dict[str, float]] = {k: {} for k in wanted}
    buckets: dict[tuple[str, str], dict[float, float]] = {k: {} for k in wanted}
    for family in registry.collect():
        if not family.name.startswith(("cluster_dq_job", "cluster_dq_publish_to_first")):
            continue
        for s in family.samples:
            key = (s.labels.get("namespace", ""), s.labels.get("queue", ""))
            if key not in wanted:
                continue
            if s.name == "cluster_dq_job_lateness_seconds_bucket":
                bound = float(s.labels["le"])
                buckets[key][bound] = buckets[key].get(bound, 0.0) + s.value
            elif s.name in FAMILIES:
                name = FAMILIES[s.name]
                values[key][name] = values[key].get(name, 0.0) + s.value
    return {
        k: Sample(now, values[k], tuple(buckets[k].get(b, 0.0) for b in LATE_BOUNDS))
        for k in wanted
    }


def points(samples: list[Sample]) -> list[Point]:
    """The differences between consecutive samples (a counter that went back, an instance
    restarted, counts from zero)."""
    out = []
    for a, b in zip(samples, samples[1:]):

        def d(name: str) -> float:
            x, y = a.values.get(name, 0.0), b.values.get(name, 0.0)
            return y - x if y >= x else y

        delivered, first = d("delivered"), d("first")
        count, total = d("late_count"), d("late_sum")
        deltas = [max(y - x, 0.0) for x, y in zip(a.late_buckets, b.late_buckets)]
        p99 = None
        if count > 0 and deltas:
            need = 0.99 * deltas[-1]
            for bound, c in zip(LATE_BOUNDS, deltas):
                if c >= need:
                    p99 = bound * 1000 if bound != float("inf") else LATE_BOUNDS[-2] * 1000
                    break
        out.append(
            Point(
                b.t,
                b.t - a.t,
                delivered,
                max(delivered - first, 0.0),
                d("ttr_expired"),
                d("released"),
                d("dead"),
                total / count * 1000 if count > 0 else None,
                p99,
            )
        )
    return out


class CounterRing:
    """A small in-process ring of counter samples per watched queue: one sample every
    ``every_s``, ``keep`` samples per queue, at most ``max_queues`` queues (a queue is watched
    from its first view until ``keep * every_s`` without one). Bounded memory whatever the
    traffic; a worker that serves no chart samples nothing."""

    def __init__(
        self,
        every_s: float = 5.0,
        keep: int = 120,
        max_queues: int = 32,
        read: Callable[[Iterable[tuple[str, str]]], dict[tuple[str, str], Sample]] = read_counters,
        flush: Callable[[], None] | None = None,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self.every_s = every_s
        self.keep = keep
        self.max_queues = max_queues
        self.read = read
        self.flush = flush
        self.stopping = stopping or asyncio.Event()  # set: the worker is shutting down
        self.rings: dict[tuple[str, str], deque[Sample]] = {}
        self.viewed: dict[tuple[str, str], float] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, ns: str, q: str) -> None:
        key = (ns, q)
        if key not in self.rings and len(self.rings) >= self.max_queues:
            oldest = min(self.viewed, key=lambda k: self.viewed[k])
            self.rings.pop(oldest, None)
            self.viewed.pop(oldest, None)
        if key not in self.rings:  # its first sample now: the next one shows what came since
            self.rings[key] = deque(self._read([key]).values(), maxlen=self.keep)
        self.viewed[key] = time.monotonic()
        if (self._task is None or self._task.done()) and not self.stopping.is_set():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def sample(self) -> None:
        idle = time.monotonic() - self.keep * self.every_s
        for key in [k for k, t in self.viewed.items() if t < idle]:
            self.rings.pop(key, None)
            self.viewed.pop(key, None)
        if not self.rings:
            return
        if self.flush is not None:
            self.flush()
        for key, s in self._read(list(self.rings)).items():
            self.rings[key].append(s)

    def _read(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Sample]:
        """The counters, or none this time: a worker's counter file removed (or unreadable)
        while it was read is an OSError, as for the overview's rates."""
        try:
            return self.read(keys)
        except OSError as e:
            log.warning("chart counters not read: %s", e)
            return {}

    def series(self, ns: str, q: str) -> list[Point]:
        return points(list(self.rings.get((ns, q), ())))

    async def _run(self) -> None:
        while self.rings and not self.stopping.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.every_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def polyline(
    values: list[float | None], width: int = 300, height: int = 60, top: float | None = None
) -> str:
    """SVG polyline points for a small chart: x evenly spread, y scaled to ``top`` (the largest
    value when not given; a gap, None, is drawn at zero; one value is a flat line)."""
    if not values:
        return ""
    if len(values) == 1:  # one interval so far: a flat line across, not an invisible point
        values = values * 2
    if top is None:
        top = max((v for v in values if v is not None), default=0.0)
    top = top or 1.0
    step = width / max(len(values) - 1, 1)
    return " ".join(
        f"{i * step:.1f},{height - (v or 0.0) / top * (height - 2) - 1:.1f}"
        for i, v in enumerate(values)
    )
