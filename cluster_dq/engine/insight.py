"""Pure read-only operations for the dashboard's panels: where a queue's delayed jobs fall in
time (the precise ``delayed`` zset and the wheel buckets), and who holds each shard's pump
lease. Steps and reply decoding only, as in the other operations (steps.py); nothing here writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster_dq.engine.steps import Cmd, Op
from cluster_dq.keys import BUCKET_WIDTH_MS, QueueKeys, ShardKeys
from cluster_dq.models import id_due_ms, id_to_text, is_wheel_member, wheel_member

MAX_WHEEL_BUCKETS = 2_000  # wheel buckets one histogram looks at (512 jobs each at most)
MAX_SPLIT_BUCKETS = 50  # wheel buckets read id by id when a histogram bin is under 10 s
CHUNK = 200  # commands per pipeline


@dataclass(frozen=True, slots=True)
class DelayedSpan:
    """The earliest and latest due time (ms) among a queue's delayed jobs."""

    first_ms: int
    last_ms: int


@dataclass(frozen=True, slots=True)
class DelayedCounts:
    """Delayed jobs per bin ``[edges[i], edges[i+1])``; ``outside``: due before the first edge
    or at or after the last one; ``unread``: jobs of wheel buckets past ``MAX_WHEEL_BUCKETS``
    (not placed in a bin)."""

    counts: list[int]
    outside: int
    unread: int


@dataclass(frozen=True, slots=True)
class DelayedJob:
    job_id: str
    due_ms: int
    in_wheel: bool


@dataclass(frozen=True, slots=True)
class Leader:
    """One shard's pump lease: its holder's token ('' = none), ms left, epoch."""

    shard: int
    holder: str
    ttl_ms: int
    epoch: int
    queues: int


def _score(pair: Any) -> int | None:
    if not pair:
        return None
    first = pair[0]
    return int(float(first[1] if isinstance(first, (tuple, list)) else pair[1]))


def _pairs(flat: Any) -> list[tuple[bytes, int]]:
    """A ZRANGE WITHSCORES reply (redis-py pairs, or a flat list) -> (member, score)."""
    if flat and isinstance(flat[0], (tuple, list)):
        return [(m, int(float(s))) for m, s in flat]
    return [(m, int(float(s))) for m, s in zip(flat[0::2], flat[1::2])]


def delayed_span(ns: str, q: str) -> Op[DelayedSpan | None]:
    """Earliest and latest due time of the queue's delayed jobs (a wheel bucket counts from its
    window's start to its end), None when it has none. One round trip."""
    qk = QueueKeys(ns, q)
    first_d, last_d, first_w, last_w = yield (
        Cmd(("ZRANGE", qk.delayed, 0, 0, "WITHSCORES")),
        Cmd(("ZRANGE", qk.delayed, -1, -1, "WITHSCORES")),
        Cmd(("ZRANGE", qk.wheel, 0, 0, "WITHSCORES")),
        Cmd(("ZRANGE", qk.wheel, -1, -1, "WITHSCORES")),
    )
    firsts = [s for s in (_score(first_d), _score(first_w)) if s is not None]
    lasts = [_score(last_d), _score(last_w)]
    if not firsts:
        return None
    wheel_end = lasts[1] + BUCKET_WIDTH_MS - 1 if lasts[1] is not None else None
    return DelayedSpan(min(firsts), max(x for x in (lasts[0], wheel_end) if x is not None))


def delayed_counts(ns: str, q: str, edges: Sequence[int]) -> Op[DelayedCounts]:
    """How many delayed jobs are due in each bin between ``edges`` (ascending ms): ZCOUNT on the
    precise zset; for the wheel, each bucket's size, placed by its window (bins of 10 s or
    more are aligned on windows by the caller) or, for narrower bins, by the due time its
    ids carry. Bounded: ``MAX_WHEEL_BUCKETS`` buckets, ``MAX_SPLIT_BUCKETS`` read id by id."""
    qk = QueueKeys(ns, q)
    n = len(edges) - 1
    zc = [Cmd(("ZCOUNT", qk.delayed, edges[i], f"({edges[i + 1]}")) for i in range(n)]
    got = yield (*zc, Cmd(("ZCARD", qk.delayed)), Cmd(("HGET", qk.meta, "w")))
    counts = [int(c) for c in got[:n]]
    outside = int(got[n]) - sum(counts)
    in_wheel = int(got[n + 1] or 0)
    if not in_wheel:
        return DelayedCounts(counts, outside, 0)
    buckets = _pairs(
        (yield Cmd(("ZRANGE", qk.wheel, 0, MAX_WHEEL_BUCKETS - 1, "WITHSCORES"))) or []
    )
    narrow = n > 0 and min(edges[i + 1] - edges[i] for i in range(n)) < BUCKET_WIDTH_MS
    split = narrow and len(buckets) <= MAX_SPLIT_BUCKETS
    seen = 0
    for i in range(0, len(buckets), CHUNK):
        part = buckets[i : i + CHUNK]
        verb = "HKEYS" if split else "HLEN"
        found = yield tuple(Cmd((verb, qk.bucket(name.decode()))) for name, _ in part)
        for (name, start), reply in zip(part, found):
            dues = (
                [id_due_ms(wheel_member(name.decode(), f)) for f in reply]
                if split
                else [start] * int(reply)
            )
            seen += len(dues)
            for due in dues:
                at = _bin(edges, due)
                if at is None:
                    outside += 1
                else:
                    counts[at] += 1
    return DelayedCounts(counts, outside, max(in_wheel - seen, 0))


def _bin(edges: Sequence[int], t: int) -> int | None:
    if t < edges[0] or t >= edges[-1]:
        return None
    lo, hi = 0, len(edges) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if edges[mid] <= t:
            lo = mid
        else:
            hi = mid
    return lo


def delayed_between(ns: str, q: str, start: int, end: int, limit: int) -> Op[list[DelayedJob]]:
    """Up to ``limit`` delayed jobs due in ``[start, end)``, soonest first: from the precise
    zset, and from the wheel buckets whose window meets the range (their ids carry the due
    time). Bounded: ``limit`` from the zset, ``MAX_SPLIT_BUCKETS`` buckets."""
    qk = QueueKeys(ns, q)
    near, wheel = yield (
        Cmd(("ZRANGE", qk.delayed, start, f"({end}", "BYSCORE", "LIMIT", 0, limit, "WITHSCORES")),
        Cmd(
            (
                "ZRANGE",
                qk.wheel,
                start - BUCKET_WIDTH_MS + 1,
                f"({end}",
                "BYSCORE",
                "LIMIT",
                0,
                MAX_SPLIT_BUCKETS,
            )
        ),
    )
    out = [DelayedJob(id_to_text(m), due, False) for m, due in _pairs(near or [])]
    if wheel:
        found = yield tuple(Cmd(("HKEYS", qk.bucket(b.decode()))) for b in wheel)
        for b, fields in zip(wheel, found):
            for f in fields:
                m = wheel_member(b.decode(), f)
                due = id_due_ms(m) if is_wheel_member(m) else None
                if due is not None and start <= due < end:
                    out.append(DelayedJob(id_to_text(m), due, True))
    out.sort(key=lambda j: (j.due_ms, j.job_id))
    return out[:limit]


def leaders(shards: int) -> Op[list[Leader]]:
    """Every shard's pump lease (holder, ms left, epoch) and its number of queues: one
    pipeline (on a Cluster, split by slot by the client)."""
    steps: list[Cmd] = []
    for s in range(shards):
        sk = ShardKeys(s)
        steps += [
            Cmd(("GET", sk.lock)),
            Cmd(("PTTL", sk.lock)),
            Cmd(("GET", sk.epoch)),
            Cmd(("SCARD", sk.queues)),
        ]
    got = yield tuple(steps)
    out = []
    for s in range(shards):
        holder, ttl, epoch, queues = got[4 * s : 4 * s + 4]
        text = holder.decode() if isinstance(holder, bytes) else (holder or "")
        out.append(Leader(s, text, max(int(ttl), 0), int(epoch or 0), int(queues)))
    return out
