"""A queue's last 24 hours, fleet-wide: what each process counted per queue (``Tally``), the
5-minute buckets those counts are added to in Redis (one small hash per queue and bucket,
expiring 24 h after the bucket began), and the series a chart draws from the buckets read
back. Pure: no I/O (``engine/history.py`` has the steps, ``service/history.py`` runs them).

Why 5 minutes: 288 points cover a day, which a chart 576 px wide draws at 2 px each; a finer
grain would be averaged away on screen and cost five times the keys (docs/dashboard.md has
the bytes per queue).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

BUCKET_MS = 300_000  # one bucket: 5 minutes
KEEP_MS = 86_400_000  # kept 24 h after the bucket began
BUCKETS = KEEP_MS // BUCKET_MS  # 288 live at most, the current one included
MAX_TALLY_QUEUES = 10_000  # queues one process tallies between two flushes; more are dropped

# The counts kept per bucket, each a hash field of one letter.
PUBLISHED, DELIVERED, FIRST, ACKED, TTR_EXPIRED, DEAD, RELEASED, LATE_SUM, LATE_COUNT = range(9)
COUNTS = ("p", "d", "f", "a", "t", "x", "r", "s", "n")
# Lateness of first deliveries (delivered minus due, ms) by bucket: the upper bounds of
# ``cluster_dq_job_lateness_seconds`` in ms, and one more without a bound.
# (the same bounds as the Prometheus histogram's, so both tell the same p99)
LATE_BOUNDS_MS: tuple[float, ...] = (
    *(1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000),
    *(30_000, 60_000, 300_000, 3_600_000),
)
FIELDS = COUNTS + tuple(f"h{i}" for i in range(len(LATE_BOUNDS_MS) + 1))
_FIRST_BIN = len(COUNTS)
_INDEX = {name: i for i, name in enumerate(FIELDS)}


def bucket_of(ms: int) -> int:
    """The bucket a moment falls in (its number: ms since the epoch // ``BUCKET_MS``)."""
    return ms // BUCKET_MS


def expires_at(bucket: int) -> int:
    """When a bucket's hash goes (ms): 24 h after the bucket began. So at any moment at most
    ``BUCKETS`` buckets of a queue are alive, the current one and the 287 before it."""
    return bucket * BUCKET_MS + KEEP_MS


def window(now_ms: int) -> range:
    """The buckets of the last 24 h at ``now_ms``, oldest first (the current one last): those
    whose hash may still be alive."""
    last = bucket_of(now_ms)
    return range(last - BUCKETS + 1, last + 1)


class Tally:
    """What one process counted per (pool, namespace, queue) since its last flush: a list of
    ints per queue, indexed as ``FIELDS``. An add is a dict lookup and an int add (it runs in
    the request's path); a queue with nothing counted has no entry, so costs nothing. At most
    ``MAX_TALLY_QUEUES`` queues between two flushes: counts of more are dropped (``dropped``
    says how many), which bounds the memory whatever the clients do."""

    __slots__ = ("rows", "dropped", "cap")

    def __init__(self, cap: int = MAX_TALLY_QUEUES) -> None:
        self.rows: dict[tuple[str, str, str], list[int]] = {}
        self.dropped = 0
        self.cap = cap

    def _row(self, pool: str, ns: str, q: str) -> list[int] | None:
        key = (pool, ns, q)
        row = self.rows.get(key)
        if row is None:
            if len(self.rows) >= self.cap:
                self.dropped += 1
                return None
            row = self.rows[key] = [0] * len(FIELDS)
        return row

    def add(self, pool: str, ns: str, q: str, field: int, n: int) -> None:
        row = self._row(pool, ns, q)
        if row is not None:
            row[field] += n

    def delivered(
        self, pool: str, ns: str, q: str, n: int, first: int, late_ms: Sequence[int]
    ) -> None:
        """``n`` deliveries, ``first`` of them a job's first, and the lateness of those first
        deliveries whose id carries a due time."""
        row = self._row(pool, ns, q)
        if row is None:
            return
        row[DELIVERED] += n
        row[FIRST] += first
        for ms in late_ms:
            row[LATE_SUM] += ms
            row[_FIRST_BIN + bisect_left(LATE_BOUNDS_MS, ms)] += 1
        row[LATE_COUNT] += len(late_ms)

    def take(self) -> tuple[dict[tuple[str, str, str], list[int]], int]:
        """What was counted since the last take (and how many counts were dropped), emptied."""
        rows, dropped = self.rows, self.dropped
        self.rows, self.dropped = {}, 0
        return rows, dropped


def increments(row: Sequence[int]) -> list[tuple[str, int]]:
    """A tallied row as the hash fields to add to, only those not zero."""
    return [(FIELDS[i], n) for i, n in enumerate(row) if n]


def parse(raw: Mapping[bytes | str, bytes | str] | Sequence[bytes | str] | None) -> list[int]:
    """A bucket's HGETALL (a dict as redis-py gives it, or RESP's flat list) as a row; fields
    this version does not know are left out."""
    row = [0] * len(FIELDS)
    if not raw:
        return row
    pairs: Iterable[tuple[bytes | str, bytes | str]]
    if isinstance(raw, Mapping):
        pairs = raw.items()
    else:
        pairs = zip(raw[0::2], raw[1::2])
    for name, value in pairs:
        i = _INDEX.get(name.decode() if isinstance(name, bytes) else name)
        if i is not None:
            row[i] += int(value)
    return row


def added(rows: Iterable[Sequence[int]]) -> list[int]:
    """Rows of the same bucket (from several pools) as one."""
    out = [0] * len(FIELDS)
    for row in rows:
        for i, n in enumerate(row):
            out[i] += n
    return out


@dataclass(frozen=True, slots=True)
class Point:
    """One bucket of a queue's history: counts per minute (averaged over the bucket, or over
    the part of it that has passed, for the current one) and the lateness of first deliveries
    (None when there were none)."""

    start_ms: int
    minutes: float
    published: float
    delivered: float
    acked: float
    redelivered: float  # deliveries that were not a job's first
    ttr_expired: float
    dead: float
    released: float
    late_n: int
    late_mean_ms: float | None
    late_p50_ms: float | None  # the upper bound of the lateness bucket holding the median
    late_p99_ms: float | None  # ... holding the 99th percentile (past the last bound: that bound)


def quantile_ms(bins: Sequence[int], q: float) -> float | None:
    """The upper bound (ms) of the lateness bin that holds quantile ``q``; past the last bound,
    the last bound (as Prometheus' histogram_quantile would)."""
    total = sum(bins)
    if total <= 0:
        return None
    need = q * total
    seen = 0
    for i, n in enumerate(bins):
        seen += n
        if seen >= need:
            break
    return float(LATE_BOUNDS_MS[min(i, len(LATE_BOUNDS_MS) - 1)])


def point(bucket: int, row: Sequence[int], now_ms: int) -> Point:
    start = bucket * BUCKET_MS
    span = min(BUCKET_MS, max(now_ms - start, 60_000))  # the current bucket: what has passed
    minutes = span / 60_000
    bins = row[_FIRST_BIN:]
    n = row[LATE_COUNT]
    return Point(
        start,
        minutes,
        row[PUBLISHED] / minutes,
        row[DELIVERED] / minutes,
        row[ACKED] / minutes,
        max(row[DELIVERED] - row[FIRST], 0) / minutes,
        row[TTR_EXPIRED] / minutes,
        row[DEAD] / minutes,
        row[RELEASED] / minutes,
        n,
        row[LATE_SUM] / n if n > 0 else None,
        quantile_ms(bins, 0.5),
        quantile_ms(bins, 0.99),
    )


def series(rows: Sequence[Sequence[int]], now_ms: int) -> list[Point]:
    """The points of ``window(now_ms)``, given the rows read for its buckets in that order."""
    return [point(b, row, now_ms) for b, row in zip(window(now_ms), rows)]


def totals(rows: Iterable[Sequence[int]]) -> dict[str, int]:
    """The whole window's counts by name (``published``, ``delivered``, …)."""
    row = added(rows)
    return {
        "published": row[PUBLISHED],
        "delivered": row[DELIVERED],
        "acked": row[ACKED],
        "redelivered": max(row[DELIVERED] - row[FIRST], 0),
        "ttr_expired": row[TTR_EXPIRED],
        "dead": row[DEAD],
        "released": row[RELEASED],
        "late_n": row[LATE_COUNT],
        "late_p99_ms": int(quantile_ms(row[_FIRST_BIN:], 0.99) or 0),
    }
