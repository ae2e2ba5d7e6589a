"""A job's due time moved by a reschedule or a revival (kick): its record carries the new one,
so that its lateness (``cluster_dq_job_lateness_seconds``, the lifecycle log's ``due``) counts
from when it is due now, not from the time its id says; a record whose id says its due time
gains nothing (lib/record.lua ``with_due``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from cluster_dq.backoff import Backoff
from cluster_dq.engine import commands as ops
from cluster_dq.engine import control
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.keys import QueueKeys
from cluster_dq.models import JobSpec, Record, decode_id, id_due_ms, id_to_member
from cluster_dq.testing.invariants import check_queue
from tests.support import flush
from tests.support.run import against_redis

NS, Q = "ns", "moved"
T = 1_700_000_000_000  # the tests' clock (ms)
DELAY = 60_000

KINDS = {
    "wheel": {},  # rests in a wheel bucket, short
    "priority": {"priority": 3},  # rests whole in the delayed set
    "client": {"job_id": "order-17"},  # a client's id says no due time
    "group": {"group": "tenant-a"},
    "sections": {"attributes": {"k": "v"}, "backoff": Backoff(2, 100, 1_000, 0)},
}


@pytest.fixture
def sync_engine(sync_redis: redis.Redis) -> SyncEngine:
    return SyncEngine(sync_redis, EngineConfig())


def stored(r: redis.Redis, job_id: str) -> Record:
    raw = r.hget(QueueKeys(NS, Q).jobs, id_to_member(job_id))
    assert raw is not None
    return Record.unpack(raw)


@against_redis(40)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    moves=st.lists(
        st.tuples(st.sampled_from(["reschedule", "kick", "home"]), st.integers(-5_000, 90_000)),
        min_size=1,
        max_size=3,
    ),
)
def test_a_moved_job_carries_its_new_due_time_and_is_late_from_it(
    sync_engine: SyncEngine, sync_redis: redis.Redis, kind: str, moves: list[tuple[str, int]]
) -> None:
    flush(sync_redis)
    e, cfg = sync_engine, sync_engine.config
    spec = JobSpec(b"body", delay_ms=DELAY, ttl_ms=0, tries=3, **KINDS[kind])  # type: ignore[arg-type]
    [pub] = e.run(ops.publish(cfg, NS, Q, [spec], T))
    job_id = pub.job_id
    member = decode_id(job_id)
    said = id_due_ms(member) if member is not None else None  # what its id says
    first = e.run(ops.peek_job(NS, Q, job_id))
    assert first is not None
    now, due, carried = T, said, said is None  # (a client's id: any move sets one)
    for way, d in moves:
        now += 1_000
        if way == "kick":  # buried before any delivery, then kicked with a delay
            e.run(control.bury(NS, Q, job_id, "", now))
            e.run(control.kick(cfg, NS, Q, job_id, max(d, 0), 3, 0, now))
            due = now + max(d, 0)
        else:  # "home": back to the time its id says (a client's id: some time all the same)
            at = T + DELAY if way == "home" else now + d
            e.run(control.reschedule_job(cfg, NS, Q, job_id, at, now))
            due = max(at, now)
        looked = e.run(ops.peek_job(NS, Q, job_id))
        assert looked is not None and looked.scheduled_ms == due
        assert (looked.body, looked.attributes, looked.group, looked.priority) == (
            first.body,
            first.attributes,
            first.group,
            first.priority,
        )
        # the section, once a move set a time its id does not say; kept after, set each time
        carried = carried or due != said
        rec = stored(sync_redis, job_id)
        assert rec.due_ms == (due if carried else None)
        assert (rec.body, rec.backoff) == (b"body", spec.backoff)
        check_queue(sync_redis, NS, Q)
    # delivered when due, it is late from then on
    assert due is not None
    e.run(ops.tick(cfg, NS, Q, due))
    [job] = e.run(ops.consume(cfg, NS, (Q,), 30_000, 1, due + 250))
    assert (job.job_id, job.deliveries, job.scheduled_ms) == (job_id, 1, due)
    check_queue(sync_redis, NS, Q)


def test_a_job_rescheduled_to_the_time_its_id_says_is_unchanged_byte_for_byte(
    sync_engine: SyncEngine, sync_redis: redis.Redis
) -> None:
    """A reschedule to the due time in its id takes the job out of the wheel and writes its
    record whole, with no due time: what a record without the section says already."""
    flush(sync_redis)
    e, cfg = sync_engine, sync_engine.config
    spec = JobSpec(b"x", delay_ms=DELAY, ttl_ms=0, attributes={"a": "b"})
    [pub] = e.run(ops.publish(cfg, NS, Q, [spec], T))
    e.run(control.reschedule_job(cfg, NS, Q, pub.job_id, T + DELAY, T + 1))
    want = Record(T, 0, 1, 0, 0, b"x", {"a": "b"})
    assert stored(sync_redis, pub.job_id) == want
    e.run(control.reschedule_job(cfg, NS, Q, pub.job_id, T + 2 * DELAY, T + 2))
    assert stored(sync_redis, pub.job_id) == replace(want, due_ms=T + 2 * DELAY)
    check_queue(sync_redis, NS, Q)


def test_a_job_rescheduled_into_the_past_is_due_now_behind_the_jobs_already_due(
    sync_engine: SyncEngine, sync_redis: redis.Redis
) -> None:
    """Its record said "due now" (its lateness) while its READY score kept the past time: it
    went ahead of the jobs already due, and the queue listing's oldest due time and lateness
    (read from the score) counted from the past (from 1970, for ``at=0``)."""
    flush(sync_redis)
    e, cfg = sync_engine, sync_engine.config
    first, moved = e.run(ops.publish(cfg, NS, Q, [JobSpec(b"a"), JobSpec(b"b")], T))
    e.run(control.reschedule_job(cfg, NS, Q, moved.job_id, 0, T + 10))
    looked = e.run(ops.peek_job(NS, Q, moved.job_id))
    assert looked is not None and (looked.due_ms, looked.scheduled_ms) == (T + 10, T + 10)
    got = e.run(ops.consume(cfg, NS, (Q,), 30_000, 2, T + 20))
    assert [j.job_id for j in got] == [first.job_id, moved.job_id]
    check_queue(sync_redis, NS, Q)
