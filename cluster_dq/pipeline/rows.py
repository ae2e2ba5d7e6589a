"""The schedule's input rows: each checked against the service's own rules and normalised into a
job, or refused with the reason.

``check_values`` is the rule, one row at a time. ``check_batch`` gives the same answer for every
row of an Arrow record batch, at a fraction of the cost: the common row (names, an integer due
time, ttl, tries and priority, a body, no client id) is checked a column at a time with Arrow's
compute kernels; any other row (a refused one, a float delay, a client id, a column of another
type) is handed to ``check_values``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

from cluster_dq.errors import ClusterDQError
from cluster_dq.models import check_names
from cluster_dq.models import MAX_BODY, MAX_PRIORITY, MAX_SECONDS, MAX_TRIES, JobSpec
from cluster_dq.models import validate_spec

DEFAULT_TTL_S = 86_400
COLUMNS = (
    "namespace",
    "queue",
    "body",
    "delay_s",
    "due_ms",
    "ttl_s",
    "tries",
    "priority",
    "job_id",
)
# (ok, namespace, queue, body, due_ms, expire_at_ms (0 = never), tries, priority, job_id, reason)
Checked = tuple[bool, str, str, bytes, int, int, int, int, str | None, str]

_names_ok: set[tuple[str, str]] = set()  # (namespace, queue) pairs that passed check_names


def check_row(row: Any, reference_ms: int) -> Checked:
    """One input row (a dict or a ``Row``, absent columns None) -> a normalised job, or the
    reason it is refused."""
    get = row.asDict().get if hasattr(row, "asDict") else row.get
    return check_values(tuple(get(c) for c in COLUMNS), reference_ms)


def _names_checked(ns: str, q: str) -> None:
    if (ns, q) not in _names_ok:
        check_names(ns, q)
        if len(_names_ok) >= 100_000:
            _names_ok.clear()
        _names_ok.add((ns, q))


def check_values(values: Sequence[Any], reference_ms: int) -> Checked:
    """``check_row`` for the row's values in the order of ``COLUMNS``."""
    ns, q, body, delay_s, due_ms, ttl_s, tries, priority, job_id = values
    try:
        if not isinstance(ns, str) or not isinstance(q, str):
            raise ValueError("namespace and queue are required strings")
        _names_checked(ns, q)
        body = body.encode() if isinstance(body, str) else bytes(body) if body is not None else b""
        if delay_s is not None and due_ms is not None:
            raise ValueError("give delay_s or due_ms, not both")
        due = int(due_ms) if due_ms is not None else reference_ms + int((delay_s or 0) * 1000)
        ttl_ms = int((DEFAULT_TTL_S if ttl_s is None else ttl_s) * 1000)
        tries = int(tries if tries is not None else 1)
        priority = int(priority or 0)
        if due < 0:
            raise ValueError("due time before 1970")
        spec = JobSpec(body, max(due - reference_ms, 0), ttl_ms, tries, priority, None, job_id)
        validate_spec(spec)  # the service's own rules, message naming the field
        # the ttl counts from the reference time (the publish the schedule stands for), not
        # from when a partition happens to run: with --at in the future, that is much earlier
        expire_at = reference_ms + ttl_ms if ttl_ms else 0
        return (True, ns, q, body, due, expire_at, tries, priority, job_id, "")
    except (ClusterDQError, ValueError, TypeError, OverflowError) as e:  # inf: OverflowError
        field = getattr(e, "field", None)
        reason = f"{field}: {e}" if field else str(e)
        return (False, str(ns), str(q), b"", 0, 0, 0, 0, None, reason)


def batch_values(batch: Any) -> Iterator[tuple[Any, ...]]:
    """An Arrow record batch or table -> each row's values in ``COLUMNS`` order, None for a column the
    batch does not have."""
    got = dict(zip(batch.schema.names, batch.columns))
    n = batch.num_rows
    yield from zip(*(got[c].to_pylist() if c in got else repeat(None, n) for c in COLUMNS))


def check_batch(batch: Any, reference_ms: int) -> Iterator[Checked]:
    """``check_values`` of every row of ``batch`` (an Arrow record batch or table of some of
    ``COLUMNS``), in order."""
    fast = _fast_columns(batch, reference_ms)
    if fast is None:
        yield from (check_values(v, reference_ms) for v in batch_values(batch))
        return
    ok, ns, q, body, due, expire_at, tries, priority = fast
    slow: list[tuple[Any, ...]] | None = None
    for i, row_ok in enumerate(ok):
        if row_ok and (ns[i], q[i]) in _names_ok:
            yield (
                True,
                ns[i],
                q[i],
                body[i],
                due[i],
                expire_at[i],
                tries[i],
                priority[i],
                None,
                "",
            )
        else:  # refused, or checked a row at a time (its names the first time too)
            if slow is None:
                slow = list(batch_values(batch))
            yield check_values(slow[i], reference_ms)


def _fast_columns(batch: Any, ref: int) -> tuple[list[Any], ...] | None:
    """The rows ``check_values`` would accept as they are, checked a column at a time: (row
    ok, namespace, queue, body, due ms, expire at ms, tries, priority) as lists; None when the
    batch's columns are not all of the types this handles (then every row is checked alone)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(batch, pa.Table):
        # One chunk per column: pyarrow's kernels over chunked columns of different chunk
        # layouts can answer wrongly (coalesce gave 0 where it should fall through).
        batch = batch.combine_chunks()
    n = batch.num_rows
    got = dict(zip(batch.schema.names, batch.columns))
    if not {"namespace", "queue", "body"} <= got.keys():
        return None
    int_ = pa.types.is_integer

    def column(name: str, test: Any) -> Any:
        a = got.get(name)
        if a is None:
            return pa.nulls(n, pa.int64())
        return a if test(a.type) or pa.types.is_null(a.type) else False

    def exactly(name: str, test: Any) -> Any:  # not the null type: such rows take the row rule
        return got[name] if test(got[name].type) else False

    ns, q = exactly("namespace", pa.types.is_string), exactly("queue", pa.types.is_string)
    body = exactly("body", pa.types.is_binary)
    delay_s, due_ms, ttl_s = column("delay_s", int_), column("due_ms", int_), column("ttl_s", int_)
    tries, priority, job_id = column("tries", int_), column("priority", int_), got.get("job_id")
    if any(c is False for c in (ns, q, body, delay_s, due_ms, ttl_s, tries, priority)):
        return None
    i64 = pa.int64()
    try:  # an unsigned value beyond int64, an overflow: row by row
        delay_ms = pc.multiply_checked(delay_s.cast(i64), 1000)
        due = pc.coalesce(due_ms.cast(i64), pc.add_checked(delay_ms, ref), pa.scalar(ref, i64))
        ttl_ms = pc.multiply_checked(pc.fill_null(ttl_s.cast(i64), DEFAULT_TTL_S), 1000)
        tries_ = pc.fill_null(tries.cast(i64), 1)
        priority_ = pc.fill_null(priority.cast(i64), 0)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    delay = pc.max_element_wise(pc.subtract(due, ref), 0)
    most = MAX_SECONDS * 1000
    conditions = [
        ns.is_valid(),
        q.is_valid(),
        body.is_valid(),
        pc.or_(delay_s.is_null(), due_ms.is_null()),
        pc.greater_equal(due, 0),
        pc.less_equal(delay, most),
        pc.less_equal(ttl_ms, most),
        pc.greater_equal(ttl_ms, 0),
        pc.or_(pc.equal(ttl_ms, 0), pc.greater(ttl_ms, delay)),
        pc.and_(pc.greater(tries_, 0), pc.less_equal(tries_, MAX_TRIES)),
        pc.and_(pc.greater_equal(priority_, 0), pc.less_equal(priority_, MAX_PRIORITY)),
        pc.less_equal(pc.binary_length(body), MAX_BODY),
    ]
    if job_id is not None:
        conditions.append(job_id.is_null())
    ok = conditions[0]
    for c in conditions[1:]:
        ok = pc.and_kleene(ok, c)
    expire_at = pc.if_else(pc.equal(ttl_ms, 0), 0, pc.add(ttl_ms, ref))
    # to_numpy().tolist(): a twentieth of to_pylist's cost (no Arrow scalar per value); every
    # column here is free of nulls, or its rows are not ok
    columns = (pc.fill_null(ok, False), ns, q, body, due, expire_at, tries_, priority_)
    return tuple(c.to_numpy(zero_copy_only=False).tolist() for c in columns)


GROUP_ROWS = 8192  # rows checked together: Arrow's kernels cost ~10 us a call, whatever its size
GROUP_BYTES = 64 << 20


def check_batches(batches: Iterable[Any], reference_ms: int) -> Iterator[Checked]:
    """``check_batch`` over a task's batches, several small ones (up to ``GROUP_ROWS`` rows and
    ``GROUP_BYTES``) checked as one."""
    import pyarrow as pa

    group: list[Any] = []
    rows = size = 0
    for batch in batches:
        if group and (
            rows + batch.num_rows > GROUP_ROWS
            or size + batch.get_total_buffer_size() > GROUP_BYTES
            or (batch.schema != group[0].schema)
        ):
            yield from check_batch(pa.Table.from_batches(group), reference_ms)
            group, rows, size = [], 0, 0
        group.append(batch)
        rows, size = rows + batch.num_rows, size + batch.get_total_buffer_size()
    if group:
        yield from check_batch(pa.Table.from_batches(group), reference_ms)
