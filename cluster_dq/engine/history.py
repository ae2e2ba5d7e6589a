"""Pure operations on a queue's history (``keys.QueueKeys.history``, ``cluster_dq/history.py``):
add one process's counts to a bucket, read the buckets of the last 24 h. Plain commands on the
queue's slot; a bucket's hash expires on its own 24 h after the bucket began, so nothing trims
it and a queue keeps at most ``history.BUCKETS`` of them."""

from __future__ import annotations

from collections.abc import Sequence

from cluster_dq import history
from cluster_dq.engine.steps import Cmd, Op
from cluster_dq.keys import QueueKeys

READ_CHUNK = 96  # buckets read per pipeline (three pipelines for a day)


def add(ns: str, q: str, bucket: int, row: Sequence[int]) -> Op[None]:
    """Adds a tallied row (``history.Tally``) to the queue's bucket. Not safe to repeat: a
    repeat after a lost reply would count twice (the service does not)."""
    fields = history.increments(row)
    if not fields:
        return
    key = QueueKeys(ns, q).history(bucket)
    yield (
        *(Cmd(("HINCRBY", key, name, n)) for name, n in fields),
        Cmd(("PEXPIREAT", key, history.expires_at(bucket))),
    )


def read(ns: str, q: str, buckets: range) -> Op[list[list[int]]]:
    """The rows of ``buckets`` (zeros for a bucket with nothing kept), in that order."""
    qk = QueueKeys(ns, q)
    rows: list[list[int]] = []
    for start in range(0, len(buckets), READ_CHUNK):
        part = buckets[start : start + READ_CHUNK]
        replies = yield tuple(Cmd(("HGETALL", qk.history(b))) for b in part)
        rows += [history.parse(r) for r in replies]
    return rows
