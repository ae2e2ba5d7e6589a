"""The schedule's batch check (Arrow kernels over columns) against its row check, the rule: for
every row of every batch, the same normalised job or the same refusal."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_dq.models import MAX_BODY, MAX_SECONDS, MAX_TRIES
from cluster_dq.pipeline.rows import COLUMNS, check_batch, check_batches, check_values

REF = 1_800_000_000_000
MOST_MS = MAX_SECONDS * 1000

names = st.sampled_from(["ns", "queue-1", "a_b", "bad name", "", "_hidden", "x" * 300, None])
edges = [0, 1, -1, 999, MOST_MS // 1000, MOST_MS // 1000 + 1, MAX_TRIES, MAX_TRIES + 1, 255, 256]
small_ints = st.one_of(st.none(), st.sampled_from(edges), st.integers(-(2**40), 2**40))
due_ms = st.one_of(
    st.none(),
    st.sampled_from([0, -1, REF, REF - 1, REF + MOST_MS, REF + MOST_MS + 1, 2**62]),
    st.integers(REF - 10**6, REF + 10**9),
)
bodies = st.one_of(st.none(), st.binary(max_size=40), st.just(b"x" * (MAX_BODY + 1)))
job_ids = st.one_of(st.none(), st.none(), st.sampled_from(["client-1", "bad id!", "a" * 65]))

rows = st.fixed_dictionaries(
    {
        "namespace": names,
        "queue": names,
        "body": bodies,
        "delay_s": small_ints,
        "due_ms": due_ms,
        "ttl_s": small_ints,
        "tries": small_ints,
        "priority": small_ints,
        "job_id": job_ids,
    }
)
# which columns a batch has, and the integer type of its number columns
layouts = st.tuples(
    st.sets(st.sampled_from(COLUMNS[3:]), max_size=len(COLUMNS) - 3),
    st.sampled_from([pa.int64(), pa.int32(), pa.uint64(), pa.float64()]),
)

TYPES = {"namespace": pa.string(), "queue": pa.string(), "body": pa.binary(), "job_id": pa.string()}


def _batch(rows: list[dict], columns: list[str], number: pa.DataType) -> pa.RecordBatch:
    arrays = {}
    for c in columns:
        values = [r[c] for r in rows]
        kind = TYPES.get(c, number)
        if pa.types.is_integer(kind):  # values the type cannot hold become None here
            info = (-(2**31), 2**31 - 1) if kind == pa.int32() else (-(2**63), 2**63 - 1)
            if kind == pa.uint64():
                info = (0, 2**64 - 1)
            values = [v if v is None or info[0] <= v <= info[1] else None for v in values]
        elif pa.types.is_floating(kind):
            values = [v if v is None else float(v) for v in values]
        arrays[c] = pa.array(values, kind)
    return pa.RecordBatch.from_pydict(arrays)


def _row_values(batch: pa.RecordBatch) -> list[tuple]:
    got = batch.to_pydict()
    return [tuple(got[c][i] if c in got else None for c in COLUMNS) for i in range(batch.num_rows)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows, min_size=1, max_size=30), layouts, st.integers(1, 4))
def test_the_batch_check_agrees_with_the_row_check_on_every_row(rows, layout, pieces):
    extra, number = layout
    columns = ["namespace", "queue", "body", *sorted(extra)]
    step = -(-len(rows) // pieces)
    batches = [_batch(rows[i : i + step], columns, number) for i in range(0, len(rows), step)]
    expected = [check_values(v, REF) for b in batches for v in _row_values(b)]
    assert list(check_batches(batches, REF)) == expected
    assert [c for b in batches for c in check_batch(b, REF)] == expected


def test_the_common_row_takes_the_column_path():
    """A guard that the comparison above compares two paths: the common row (names, integer
    times, a body, no client id) is never handed to the row check."""
    from cluster_dq.pipeline import rows as module

    batch = pa.RecordBatch.from_pydict(
        {
            "namespace": ["ns"] * 3,
            "queue": ["q"] * 3,
            "body": [b"a", b"b", b"c"],
            "due_ms": pa.array([REF + 5, REF + 6, REF + 7], pa.int64()),
            "ttl_s": pa.array([60, 60, 0], pa.int64()),
        }
    )
    list(check_batch(batch, REF))  # the names are checked once, a row at a time
    called = []
    original = module.check_values
    module.check_values = lambda *a: called.append(a) or original(*a)  # type: ignore[assignment]
    try:
        got = list(check_batch(batch, REF))
    finally:
        module.check_values = original  # type: ignore[assignment]
    assert called == []
    assert got[0] == (True, "ns", "q", b"a", REF + 5, REF + 60_000, 1, 0, None, "")
    assert got[2][5] == 0  # ttl 0: never expires


@pytest.mark.parametrize("bad", [{"ttl_s": 5, "delay_s": 5}, {"tries": 0}, {"priority": 256}])
def test_a_refused_row_in_a_batch_gets_the_row_checks_reason(bad):
    row = {"namespace": "ns", "queue": "q", "body": b"x", "ttl_s": 60} | bad
    batch = _batch([row], list(row), pa.int64())
    ((ok, *_, reason),) = check_batch(batch, REF)
    assert not ok and reason == check_values(_row_values(batch)[0], REF)[9] != ""


def test_a_rows_derived_id_is_the_same_in_every_version():
    """A rerun finds the jobs of an earlier run only by their ids: the id a row gets (blake2b-64
    of ``ns/q \\0 due_ms \\0 body``, its lane that hash modulo the window's lanes) must never
    drift with how it is computed. The value below is the one the first version computed."""
    from cluster_dq.pipeline.schedule import derived_id

    assert derived_id("ns", "q-1", 1_800_000_000_123, b"body \x00 bytes", 782) == (
        "01MCC5RM3V0BZV5WS440S29E51"
    )
    assert derived_id("ns", "q-2", 1_800_000_000_123, b"body \x00 bytes", 782) != (
        "01MCC5RM3V0BZV5WS440S29E51"
    )


def test_rows_due_at_the_reference_time_after_a_batch_with_delays_keep_it():
    """Found by review: a group of batches, the later one with neither delay_s nor due_ms set,
    took due time 0 (1970) instead of the reference time: pyarrow's coalesce over chunked
    columns of different chunk layouts answers 0 where it should fall through."""
    first = _batch(
        [{"namespace": "ns", "queue": "q", "body": b"a", "delay_s": 60, "due_ms": None}] * 2,
        ["namespace", "queue", "body", "delay_s", "due_ms"],
        pa.int64(),
    )
    later = _batch(
        [{"namespace": "ns", "queue": "q", "body": b"b", "delay_s": None, "due_ms": None}] * 2,
        ["namespace", "queue", "body", "delay_s", "due_ms"],
        pa.int64(),
    )
    got = [c[4] for c in check_batches([first, later], REF)]
    assert got == [REF + 60_000] * 2 + [REF] * 2


def test_a_body_column_of_nulls_is_checked_as_the_row_rule_does():
    """Found by review: a body column of Arrow's null type crashed the column check (no
    binary_length for it); the row rule takes such a row with an empty body."""
    batch = pa.RecordBatch.from_pydict(
        {"namespace": ["ns"], "queue": ["q"], "body": pa.nulls(1), "ttl_s": pa.array([60])}
    )
    expected = [check_values(v, REF) for v in _row_values(batch)]
    assert expected[0][0] and expected[0][3] == b""
    assert list(check_batches([batch, batch], REF)) == expected * 2


def test_view_typed_columns_are_checked_as_the_row_rule_does():
    """Found by review: a group of string_view/binary_view batches raised (no byte size for
    view types) before any row was checked."""
    batch = pa.RecordBatch.from_pydict(
        {
            "namespace": pa.array(["ns"], pa.string_view()),
            "queue": pa.array(["q"], pa.string_view()),
            "body": pa.array([b"x"], pa.binary_view()),
        }
    )
    expected = [check_values(v, REF) for v in _row_values(batch)]
    assert expected[0][0]
    assert list(check_batches([batch, batch], REF)) == expected * 2
