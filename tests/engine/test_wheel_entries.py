"""A wheel bucket stores a job short (a 10-byte field, its record relative to its due time) or
whole (its 16-byte id and its record: a delay or ttl of 2^32 ms or more, and every entry
written before the short form). Every way a job leaves or is read from a bucket must give back
exactly the job that was published, whichever form holds it: the Lua readers (open, bury,
reschedule, peek, kick, progress, ack, a repeated publish) and the Python ones (dump, heads,
the delayed histogram)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from cluster_dq.backoff import Backoff
from cluster_dq.engine import commands as ops
from cluster_dq.engine import control, insight
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.errors import Conflict, WrongState
from cluster_dq.keys import QueueKeys, ShardKeys, bucket_name, shard_of
from cluster_dq.models import (
    WHEEL_SHORT_FIELD,
    JobSpec,
    JobState,
    Record,
    decode_id,
    id_due_ms,
    id_lane,
    id_to_text,
    new_id,
)
from cluster_dq.testing.invariants import check_queue
from tests.support import flush
from tests.support.run import against_redis

NS, Q = "wheelform", "q"
T = 1_700_000_000_000  # the tests' clock (ms)
WIDE = 2**32


@pytest.fixture
def sync_engine(sync_redis: redis.Redis) -> SyncEngine:
    return SyncEngine(sync_redis, EngineConfig())


def bucket_entries(r: redis.Redis) -> dict[bytes, bytes]:
    qk = QueueKeys(NS, Q)
    out: dict[bytes, bytes] = {}
    for name in r.zrange(qk.wheel, 0, -1):
        out.update(r.hgetall(qk.bucket(name.decode())))
    return out


def expected(spec: JobSpec) -> Record:
    return Record(
        T,
        T + spec.ttl_ms if spec.ttl_ms else 0,
        spec.tries,
        0,
        0,
        spec.body,
        spec.attributes,
        spec.backoff,
    )


def same_job(job: Any, rec: Record, due: int) -> None:
    assert (job.published_ms, job.expire_at_ms, job.tries_left, job.deliveries) == (
        rec.published_ms,
        rec.expire_at_ms,
        rec.tries_left,
        0,
    )
    assert (job.priority, job.body, job.attributes, job.due_ms) == (
        0,
        rec.body,
        rec.attributes,
        due,
    )


delays = st.one_of(
    st.integers(60_000, 10 * 86_400_000),  # short
    st.integers(WIDE - 20_000, WIDE + 20_000),  # either side of the short form's edge
    st.integers(WIDE, 2**40),  # whole
)
ways_out = st.sampled_from(["open", "bury", "reschedule", "ack"])


@against_redis(40)
@given(
    delay=delays,
    ttl_extra=st.one_of(st.just(None), st.integers(1, 2**33)),
    tries=st.integers(1, 65535),
    body=st.binary(max_size=90),
    attributes=st.one_of(st.none(), st.dictionaries(st.sampled_from("abc"), st.text("xyz"))),
    backoff=st.one_of(
        st.none(),
        st.builds(
            Backoff,
            st.sampled_from([1, 2]),
            st.integers(1, 10**6),
            st.integers(0, 10**7),
            st.integers(0, 1000),
        ),
    ),
    way=ways_out,
    via=st.sampled_from(["publish", "republish"]),
)
def test_a_wheel_job_reads_back_as_it_was_published(
    sync_engine: SyncEngine,
    sync_redis: redis.Redis,
    delay: int,
    ttl_extra: int | None,
    tries: int,
    body: bytes,
    attributes: dict[str, str] | None,
    backoff: Backoff | None,
    way: str,
    via: str,
) -> None:
    flush(sync_redis)
    e, cfg = sync_engine, sync_engine.config
    ttl = 0 if ttl_extra is None else delay + ttl_extra
    spec = JobSpec(
        body,
        delay_ms=delay,
        ttl_ms=ttl,
        tries=tries,
        attributes=attributes or None,
        backoff=backoff,
    )
    if via == "publish":
        [pub] = e.run(ops.publish(cfg, NS, Q, [spec], T))
    else:  # republish.lua places it (lib/place.lua's place), replacing a ready job
        [old] = e.run(ops.publish(cfg, NS, Q, [JobSpec(b"old")], T))
        gone, pub = e.run(ops.republish(cfg, NS, Q, old.job_id, spec, T))
        assert gone is JobState.READY
    job_id, due, rec = pub.job_id, T + delay, expected(spec)
    [(field, _)] = bucket_entries(sync_redis).items()
    short = delay < WIDE and ttl < WIDE
    assert len(field) == (WHEEL_SHORT_FIELD if short else 16)
    # the readers: Python's (a dump, the dashboard's heads) and Lua's (a lookup by id)
    [dumped] = e.run(ops.dump_wheel(NS, Q))
    assert dumped.job_id == job_id
    same_job(dumped, rec, due)
    [head] = e.run(ops.heads(NS, Q, JobState.DELAYED, 5))
    same_job(head, rec, due)
    same_job(e.run(ops.peek_job(NS, Q, job_id)), rec, due)
    [one] = e.run(insight.delayed_between(NS, Q, due, due + 1, 5))
    assert (one.job_id, one.due_ms, one.in_wheel) == (job_id, due, True)
    counts = e.run(insight.delayed_counts(NS, Q, [due - 1, due, due + 1]))
    assert counts.counts == [0, 1]
    check_queue(sync_redis, NS, Q)
    # a publish of the same id again finds it, in whichever form it rests
    again = JobSpec(b"other", job_id=job_id, due_ms=due, ttl_ms=ttl, tries=tries)
    assert e.run(ops.publish(cfg, NS, Q, [again], T + 1))[0].duplicate
    member = decode_id(job_id)
    assert member is not None and id_due_ms(member) == due
    jobs_key = QueueKeys(NS, Q).jobs
    if way == "open":  # the pump opens the bucket 5 s before its window
        e.run(ops.tick(cfg, NS, Q, due - due % 10_000 - 4_000))
    elif way == "bury":
        e.run(control.bury(NS, Q, job_id, "", T + 2))
    elif way == "reschedule":
        e.run(control.reschedule_job(cfg, NS, Q, job_id, T + 30_000, T + 2))
    else:
        assert e.run(ops.ack(NS, Q, [job_id], T + 2)) == [JobState.DELAYED]
        assert sync_redis.hget(jobs_key, member) is None
        assert not bucket_entries(sync_redis)
        check_queue(sync_redis, NS, Q)
        return
    assert not bucket_entries(sync_redis)
    if way == "reschedule":  # a due time its id does not say: the record carries it
        rec = replace(rec, due_ms=T + 30_000)
    assert sync_redis.hget(jobs_key, member) == rec.pack()  # backoff included, byte for byte
    check_queue(sync_redis, NS, Q)


def whole_entry(r: redis.Redis, due: int, lane: int, rec: Record) -> str:
    """A job written whole, as every entry was before the short form: what a queue upgraded
    in place still holds."""
    qk, member = QueueKeys(NS, Q), new_id(due, lane)
    name = bucket_name(due, lane)
    r.hset(qk.bucket(name), member, rec.pack())
    r.zadd(qk.wheel, {name: due - due % 10_000})
    r.hincrby(qk.meta, "w", 1)
    return id_to_text(member)


@pytest.mark.parametrize(
    "way", ["peek", "publish-again", "bury", "reschedule", "kick", "progress", "ack", "open"]
)
def test_a_job_written_whole_before_the_short_form_is_still_found(
    sync_engine: SyncEngine, sync_redis: redis.Redis, way: str
) -> None:
    e, cfg = sync_engine, sync_engine.config
    due = T + 3_600_000
    rec = Record(T, T + 7_200_000, 3, 0, 0, b"old", {"k": "v"}, None)
    job_id = whole_entry(sync_redis, due, 2, rec)
    member = decode_id(job_id)
    assert member is not None and id_lane(member) == 2
    check_queue(sync_redis, NS, Q)
    jobs_key = QueueKeys(NS, Q).jobs
    if way == "peek":
        same_job(e.run(ops.peek_job(NS, Q, job_id)), rec, due)
        [dumped] = e.run(ops.dump_wheel(NS, Q))
        same_job(dumped, rec, due)
        return
    if way == "publish-again":  # the same id given again: a duplicate, not a second entry
        again = JobSpec(b"new", job_id=job_id, due_ms=due, ttl_ms=7_200_000)
        assert e.run(ops.publish(cfg, NS, Q, [again], T + 1))[0].duplicate
        assert len(bucket_entries(sync_redis)) == 1
    elif way == "bury":
        e.run(control.bury(NS, Q, job_id, "", T + 2))
        assert sync_redis.hget(jobs_key, member) == rec.pack()
    elif way == "reschedule":
        e.run(control.reschedule_job(cfg, NS, Q, job_id, T + 30_000, T + 2))
        assert sync_redis.hget(jobs_key, member) == replace(rec, due_ms=T + 30_000).pack()
    elif way == "kick":  # a resting job is not dead: refused, nothing changed
        with pytest.raises(WrongState):
            e.run(control.kick(cfg, NS, Q, job_id, 0, 1, 0, T + 2))
        assert len(bucket_entries(sync_redis)) == 1
    elif way == "progress":  # a resting job is not reserved: refused (delayed), nothing changed
        with pytest.raises(Conflict):
            e.run(ops.progress(NS, Q, job_id, b"{}", T + 2, None))
    elif way == "ack":
        assert e.run(ops.ack(NS, Q, [job_id], T + 2)) == [JobState.DELAYED]
        assert not bucket_entries(sync_redis)
    else:
        e.run(ops.tick(cfg, NS, Q, due - due % 10_000 - 4_000))
        assert sync_redis.hget(jobs_key, member) == rec.pack()
        assert not bucket_entries(sync_redis)
    check_queue(sync_redis, NS, Q)


def test_a_bucket_holds_short_and_whole_entries_side_by_side(
    sync_engine: SyncEngine, sync_redis: redis.Redis
) -> None:
    """A whole entry from before the short form, and short ones published after it, in the
    same bucket: each read back as its own job when the bucket opens."""
    e, cfg = sync_engine, sync_engine.config
    due = T + 3_600_000
    old = Record(T, 0, 1, 0, 0, b"old")
    member = decode_id(whole_entry(sync_redis, due, 0, old))
    specs = [JobSpec(b"new %d" % i, delay_ms=3_600_000 + i, ttl_ms=0) for i in range(5)]
    published = e.run(ops.publish(cfg, NS, Q, specs, T))
    assert len(bucket_entries(sync_redis)) == 6
    lengths = sorted(len(f) for f in bucket_entries(sync_redis))
    assert lengths == [WHEEL_SHORT_FIELD] * 5 + [16]
    check_queue(sync_redis, NS, Q)
    e.run(ops.tick(cfg, NS, Q, due - due % 10_000 - 4_000))
    jobs_key = QueueKeys(NS, Q).jobs
    assert sync_redis.hget(jobs_key, member) == old.pack()
    for spec, p in zip(specs, published, strict=True):
        m = decode_id(p.job_id)
        assert m is not None
        assert sync_redis.hget(jobs_key, m) == expected(spec).pack()
    check_queue(sync_redis, NS, Q)


def test_a_whole_entry_clears_the_short_only_mark_and_is_found(
    sync_engine: SyncEngine, sync_redis: redis.Redis
) -> None:
    """META.s lets lookups skip the whole form: a queue whose wheel holds only short entries
    has it; a job that must rest whole (a ttl of 2^32 ms or more) clears it in the same call,
    and is then found, published again as a duplicate, and acked like any other."""
    e, cfg = sync_engine, sync_engine.config
    meta = QueueKeys(NS, Q).meta
    delay = 3_600_000
    [a] = e.run(ops.publish(cfg, NS, Q, [JobSpec(b"a", delay_ms=delay, ttl_ms=0)], T))
    assert sync_redis.hget(meta, "s") == b"1"
    check_queue(sync_redis, NS, Q)
    long_ttl = JobSpec(b"b", delay_ms=delay, ttl_ms=WIDE + delay)
    [b] = e.run(ops.publish(cfg, NS, Q, [long_ttl], T))
    assert sorted(len(f) for f in bucket_entries(sync_redis)) == [WHEEL_SHORT_FIELD, 16]
    assert sync_redis.hget(meta, "s") is None
    check_queue(sync_redis, NS, Q)
    same_job(e.run(ops.peek_job(NS, Q, b.job_id)), expected(long_ttl), T + delay)
    again = JobSpec(b"b", job_id=b.job_id, due_ms=T + delay, ttl_ms=WIDE + delay)
    assert e.run(ops.publish(cfg, NS, Q, [again], T + 1))[0].duplicate
    assert e.run(ops.ack(NS, Q, [b.job_id, a.job_id], T + 2)) == [JobState.DELAYED] * 2
    assert not bucket_entries(sync_redis)
    # an empty wheel holds no whole entry: the next short one marks it again
    e.run(ops.publish(cfg, NS, Q, [JobSpec(b"c", delay_ms=delay, ttl_ms=0)], T + 3))
    assert sync_redis.hget(meta, "s") == b"1"
    check_queue(sync_redis, NS, Q)


def test_a_bulk_schedule_run_again_writes_nothing_new_and_changes_no_record(
    sync_engine: SyncEngine, sync_redis: redis.Redis
) -> None:
    """A bulk schedule's given ids go into their buckets with HSETNX: a retried Spark task, or a
    rerun later (a new publish time, even other tries and ttl for the same derived id), must
    find every job present and leave each record as the first run wrote it, byte for byte; a
    job resting whole under one of its ids is found too."""
    from cluster_dq.pipeline.schedule import derived_member

    e, cfg = sync_engine, sync_engine.config
    due = T + 3_600_000
    bodies = [b"row %d" % i for i in range(20)]
    jobs = [(derived_member(NS, Q, due, b, 1), due, T + 7_200_000, 2, 0, b) for b in bodies]
    assert e.run(ops.publish_bulk(cfg, [(NS, Q, jobs)], T)) == [0]
    before = bucket_entries(sync_redis)
    assert len(before) == 20 and all(len(f) == WHEEL_SHORT_FIELD for f in before)
    assert e.run(ops.publish_bulk(cfg, [(NS, Q, jobs)], T + 60_000)) == [20]
    other = [(m, d, exp + 1_000_000, tries + 3, p, b) for m, d, exp, tries, p, b in jobs]
    assert e.run(ops.publish_bulk(cfg, [(NS, Q, other)], T + 60_000)) == [20]
    assert bucket_entries(sync_redis) == before
    assert check_queue(sync_redis, NS, Q)["wheel"] == 20
    # the first of them resting whole (written by a version without short entries)
    flush(sync_redis)
    qk, name = QueueKeys(NS, Q), bucket_name(due, 0)
    old = Record(T - 5, T + 7_200_000, 2, 0, 0, bodies[0]).pack()
    sync_redis.hset(qk.bucket(name), jobs[0][0], old)
    sync_redis.zadd(qk.wheel, {name: due - due % 10_000})
    sync_redis.hincrby(qk.meta, "w", 1)
    assert e.run(ops.publish_bulk(cfg, [(NS, Q, jobs)], T)) == [1]
    entries = bucket_entries(sync_redis)
    assert len(entries) == 20 and entries[jobs[0][0]] == old
    check_queue(sync_redis, NS, Q)


def test_wheel_widen_rewrites_every_short_entry_whole_for_a_downgrade(
    sync_engine: SyncEngine, sync_redis: redis.Redis, deployment: Any, tmp_path: Any, capsys: Any
) -> None:
    """``cluster-dq wheel widen``: every queue's short entries become the whole entries a
    version without short ones reads (the 16-byte id, the record), META.s goes, and every job is
    still there and found, whatever its form was."""
    from cluster_dq import cli

    e, cfg = sync_engine, sync_engine.config
    published: dict[str, list[tuple[str, Record]]] = {}
    # queue a: short entries only (META.s set); queue b: one whole entry beside short ones
    for q, ttls in (("a", [0, 7_200_000]), ("b", [0, 7_200_000, WIDE + 3_600_000])):
        specs = [
            JobSpec(b"%s %d" % (q.encode(), i), delay_ms=3_600_000 + i * 20_000, ttl_ms=ttl)
            for i, ttl in enumerate(ttls)
        ]
        pubs = e.run(ops.publish(cfg, NS, q, specs, T))
        published[q] = [(p.job_id, expected(s)) for p, s in zip(pubs, specs, strict=True)]
        e.run(ops.publish(cfg, NS, q, [JobSpec(b"ready")], T))  # not in the wheel: untouched
    assert sync_redis.hget(QueueKeys(NS, "a").meta, "s") == b"1"
    # queue b's registration lost (a signal that never came): found all the same
    shard = ShardKeys(shard_of(f"{NS}/b", cfg.shards))
    assert sync_redis.srem(shard.queues, f"{NS}/b") == 1
    pool = deployment.pool_settings()
    lines = [
        "[Pool.default]",
        f'Addr = "{pool.Addr}"',
        f'MasterName = "{pool.MasterName}"',
        f"Cluster = {'true' if pool.Cluster else 'false'}",
    ]
    conf = tmp_path / "dq.toml"
    conf.write_text("\n".join(lines) + "\n")
    assert cli.main(["-c", str(conf), "wheel", "widen"]) == 0
    assert "4 wheel entries widened in 2 queues" in capsys.readouterr().out  # 2 + 2 short
    for q, jobs in published.items():
        qk = QueueKeys(NS, q)
        entries: dict[bytes, bytes] = {}
        for name in sync_redis.zrange(qk.wheel, 0, -1):
            entries.update(sync_redis.hgetall(qk.bucket(name.decode())))
        assert entries == {decode_id(j): rec.pack() for j, rec in jobs}
        assert sync_redis.hget(qk.meta, "s") is None
        check_queue(sync_redis, NS, q)
        for job_id, rec in jobs:
            same_job(e.run(ops.peek_job(NS, q, job_id)), rec, id_due_ms(decode_id(job_id) or b""))
