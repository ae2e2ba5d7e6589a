"""The history's arithmetic (``cluster_dq/history.py``), as properties: the buckets of a window,
their expiry (a queue never holds more than 24 h of them, whenever and however often it is
written), the tally, the quantiles; and its steps (``engine/history.py``) against real Redis on
the suite's topology: buckets written over two days leave at most 288 alive, all in the
window; two processes' counts add up; a bucket's bytes."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_dq import history, metrics
from cluster_dq.clock import now_ms
from cluster_dq.engine import history as history_ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.keys import QueueKeys

NS, Q = "shop", "orders"
MOMENTS = st.integers(min_value=0, max_value=2**45)


@given(MOMENTS)
def test_a_window_is_the_288_buckets_alive_at_that_moment(now: int) -> None:
    w = history.window(now)
    assert len(w) == history.BUCKETS == 288
    assert w[-1] == history.bucket_of(now)
    assert all(b * history.BUCKET_MS <= now < (b + 1) * history.BUCKET_MS for b in w[-1:])
    # every bucket of the window is alive at ``now``, the one before it is gone
    assert all(history.expires_at(b) > now for b in w)
    assert history.expires_at(w[0] - 1) <= now
    # and none covers more than 24 h back
    assert now - w[0] * history.BUCKET_MS <= history.KEEP_MS


# ms before now: any of three days, and often near the 24-h edge, where a bucket must go
BACK = st.one_of(
    st.integers(min_value=-3_600_000, max_value=3 * 86_400_000),
    st.integers(
        min_value=history.KEEP_MS - 2 * history.BUCKET_MS,
        max_value=history.KEEP_MS + 2 * history.BUCKET_MS,
    ),
)


@settings(max_examples=300)
@given(st.lists(BACK, min_size=1, max_size=600), MOMENTS)
def test_whatever_is_written_when_a_queue_holds_at_most_24_h(backs: list[int], now: int) -> None:
    """Writes at any moments of the last three days (a writer's clock an hour ahead
    included): what Redis still holds at ``now`` (a key whose PEXPIREAT has not passed) is
    inside ``window(now)``, so 288 at most."""
    writes = [now - back for back in backs]
    alive = {history.bucket_of(t) for t in writes if history.expires_at(history.bucket_of(t)) > now}
    future = {b for b in alive if b > history.bucket_of(now)}  # a writer's clock ahead of ours
    assert alive - future <= set(history.window(now))
    assert len(alive - future) <= history.BUCKETS


def test_a_tally_counts_per_queue_and_pool_and_is_emptied_by_a_take() -> None:
    t = history.Tally(cap=2)
    t.add("a", NS, Q, history.PUBLISHED, 3)
    t.add("a", NS, Q, history.PUBLISHED, 2)
    t.add("b", NS, Q, history.ACKED, 1)
    t.delivered("a", NS, Q, 4, 3, [0, 7, 4000])
    t.add("a", NS, "third", history.PUBLISHED, 1)  # past the cap: dropped, counted
    rows, dropped = t.take()
    assert dropped == 1 and set(rows) == {("a", NS, Q), ("b", NS, Q)}
    inc = dict(history.increments(rows[("a", NS, Q)]))
    # 0 ms in the first bin (<= 1), 7 ms in <= 10, 4 s in <= 5 s
    assert inc == {"p": 5, "d": 4, "f": 3, "s": 4007, "n": 3, "h0": 1, "h3": 1, "h11": 1}
    assert history.increments(rows[("b", NS, Q)]) == [("a", 1)]
    assert t.take() == ({}, 0)


def test_the_lateness_bins_are_the_prometheus_histograms() -> None:
    assert [b / 1000 for b in history.LATE_BOUNDS_MS] == list(metrics.LATENESS_BUCKETS)


@given(st.lists(st.integers(min_value=0, max_value=10_000_000), min_size=1, max_size=300))
def test_a_quantile_is_the_bound_of_the_bin_that_holds_it(values: list[int]) -> None:
    t = history.Tally()
    t.delivered("p", NS, Q, len(values), len(values), values)
    (row,) = t.take()[0].values()
    bins = row[len(history.COUNTS) :]
    for q in (0.5, 0.99):
        bound = history.quantile_ms(bins, q)
        exact = sorted(values)[max(int(q * len(values) + 0.999999) - 1, 0)]  # nearest rank
        assert bound is not None
        assert exact <= bound or bound == history.LATE_BOUNDS_MS[-1]
        below = [b for b in history.LATE_BOUNDS_MS if b < bound]
        assert not below or exact > below[-1]  # the bin holding it, not one above


def test_rows_parse_from_either_reply_shape_and_add_up() -> None:
    flat = [b"p", b"3", b"a", b"1", b"zz", b"9"]  # a field this version does not know: left out
    as_dict = {b"p": b"4", b"h2": b"1"}
    rows = [history.parse(flat), history.parse(as_dict), history.parse(None)]
    total = history.added(rows)
    assert dict(history.increments(total)) == {"p": 7, "a": 1, "h2": 1}


def test_a_point_is_per_minute_and_the_current_bucket_counts_what_has_passed() -> None:
    start = 1_000 * history.BUCKET_MS
    row = history.parse({b"p": b"10", b"d": b"6", b"f": b"4", b"n": b"2", b"s": b"30"})
    whole = history.point(1_000, row, start + 10 * history.BUCKET_MS)
    assert (whole.minutes, whole.published, whole.redelivered) == (5, 2, 0.4)
    assert whole.late_mean_ms == 15
    half = history.point(1_000, row, start + 150_000)  # 2.5 of its 5 minutes have passed
    assert half.published == 4
    young = history.point(1_000, row, start + 1_000)  # at least a minute: no spike at its start
    assert young.published == 10


# -- against real Redis ----------------------------------------------------------------------


async def test_buckets_written_over_two_days_leave_a_day_in_the_window(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    now = now_ms()
    row = [0] * len(history.FIELDS)
    row[history.PUBLISHED] = 1
    # a write every 5 min from 48 h ago to now (as an instance with a wrong clock might)
    for back in range(0, 48 * 60, 5):
        await engine.run(history_ops.add(NS, Q, history.bucket_of(now - back * 60_000), row))
    pattern = QueueKeys(NS, Q).history(0)[:-1].replace("{", "\\{").replace("}", "\\}") + "*"
    alive = {int(k.rsplit(b":", 1)[1]) for k in sync_redis.scan_iter(match=pattern, count=1000)}  # type: ignore[union-attr]
    window = set(history.window(now_ms()))
    assert alive <= window | {history.bucket_of(now) + 1}
    assert len(alive) <= history.BUCKETS
    assert len(alive) >= history.BUCKETS - 2  # the day's buckets are all there
    rows = await engine.run(history_ops.read(NS, Q, history.window(now)))
    assert len(rows) == history.BUCKETS
    assert sum(r[history.PUBLISHED] for r in rows) == len(alive & set(history.window(now)))


async def test_two_processes_counts_add_up_in_one_bucket(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    now = now_ms()
    mine, theirs = history.Tally(), history.Tally()
    mine.add("default", NS, Q, history.PUBLISHED, 3)
    mine.delivered("default", NS, Q, 2, 2, [5, 20])
    theirs.add("default", NS, Q, history.PUBLISHED, 4)
    theirs.delivered("default", NS, Q, 1, 0, [])
    for t in (mine, theirs):
        for (_, ns, q), row in t.take()[0].items():
            await engine.run(history_ops.add(ns, q, history.bucket_of(now), row))
    rows = await engine.run(history_ops.read(NS, Q, history.window(now)))
    assert rows[:-1] == [[0] * len(history.FIELDS)] * (history.BUCKETS - 1)
    got = dict(history.increments(rows[-1]))
    assert got == {"p": 7, "d": 3, "f": 2, "s": 25, "n": 2, "h2": 1, "h4": 1}
    totals = history.totals(rows)
    assert (totals["published"], totals["redelivered"], totals["late_p99_ms"]) == (7, 1, 25)


@pytest.mark.parametrize("busy", [False, True])
async def test_the_bytes_of_a_bucket(
    engine: AsyncEngine, sync_redis: redis.Redis, busy: bool
) -> None:
    """A busy bucket (every count and 8 lateness bins) and a quiet one (publish and ack): what
    docs/dashboard.md says a queue's history costs. Printed (-s), bounded loosely."""
    row = [0] * len(history.FIELDS)
    names = range(len(history.COUNTS) + 8) if busy else (history.PUBLISHED, history.ACKED)
    for i in names:
        row[i] = 123_456
    bucket = history.bucket_of(now_ms())
    await engine.run(history_ops.add(NS, Q, bucket, row))
    key = QueueKeys(NS, Q).history(bucket)
    used = int(sync_redis.memory_usage(key))  # type: ignore[arg-type]
    print(f"history bucket, {'busy' if busy else 'quiet'}: {used} B, x288 = {used * 288} B/day")
    assert used < (400 if busy else 200)


def test_a_queues_history_counts_as_left_behind_only_if_it_never_expires(
    sync_redis: redis.Redis,
) -> None:
    """``queue_keys`` (what "nothing left behind" checks) passes a queue's history buckets
    that expire within the day, as the acked-ids memory, and fails one that does not: a
    system test's queues flagged the buckets an instance flushed at its stop."""
    from cluster_dq.keys import QueueKeys
    from cluster_dq.testing.invariants import queue_keys

    key = QueueKeys("hist", "left").history(5_986_474)
    sync_redis.hset(key, "p", 1)
    sync_redis.pexpire(key, history.KEEP_MS)
    assert queue_keys(sync_redis, "hist", "left") == []
    sync_redis.persist(key)
    with pytest.raises(AssertionError, match="must expire in a day"):
        queue_keys(sync_redis, "hist", "left")
    sync_redis.delete(key)
