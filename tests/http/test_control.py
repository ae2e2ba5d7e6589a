# ruff: noqa: F811  (the HTTP fixtures are imported from test_http and used as arguments)
"""Per-job control and the dead letter against real Redis, on every topology: bury, kick,
reschedule one job by id; deaths and last errors; the dead-letter cursor, filtered redrive and
purge. Every refusal changes nothing (a snapshot of the queue's keys before and after); races
lose and duplicate nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from cluster_dq.backoff import Backoff
from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine import control
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.control import DeadFilter
from cluster_dq.errors import BadRequest, Conflict, WrongState
from cluster_dq.keys import ShardKeys, QueueKeys, shard_of
from cluster_dq.models import MAX_BODY, Job, JobSpec, JobState, id_to_member
from cluster_dq.testing.invariants import check_queue, queue_keys
from tests.support.run import against_redis

NS, Q = "ns", "q"
MIN = 60_000


async def publish(engine: AsyncEngine, now: int, *specs: JobSpec) -> list[str]:
    out = await engine.run(ops.publish(engine.config, NS, Q, list(specs), now))
    return [p.job_id for p in out]


async def consume(engine: AsyncEngine, now: int, ttr: int = 30_000, count: int = 1) -> list[Job]:
    return await engine.run(ops.consume(engine.config, NS, [Q], ttr, count, now))


async def peek(engine: AsyncEngine, jid: str) -> Job | None:
    return await engine.run(ops.peek_job(NS, Q, jid))


def snapshot(r: redis.Redis) -> dict[bytes, Any]:
    """Every key of the queue and its whole content."""
    out: dict[bytes, Any] = {}
    for key in queue_keys(r, NS, Q):
        kind = r.type(key)
        if kind == b"hash":
            out[key] = r.hgetall(key)
        elif kind == b"zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = r.dump(key)
    return out


async def unchanged(r: redis.Redis, refused: Any, error: type[Exception]) -> None:
    before = snapshot(r)
    with pytest.raises(error):
        await refused
    assert snapshot(r) == before


async def bury(engine: AsyncEngine, jid: str, text: str, now: int, lease: str | None = None) -> Job:
    job = await engine.run(control.bury(NS, Q, jid, text, now, lease))
    assert job is not None
    return job


# -- bury --------------------------------------------------------------------------------------


async def test_bury_takes_a_job_from_every_live_state_into_dead_with_its_reason(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    reserved, held = await publish(engine, t, JobSpec(b"reserved", tries=3), JobSpec(b"held"))
    jobs = {j.job_id: j for j in await consume(engine, t, count=2)}
    assert set(jobs) == {reserved, held}
    ready, near, far = await publish(
        engine,
        t,
        JobSpec(b"ready"),
        JobSpec(b"near", delay_ms=2_000),
        JobSpec(b"far", delay_ms=10 * MIN),  # rests in a wheel bucket
    )
    k = QueueKeys(NS, Q)
    assert sync_redis.hget(k.meta, "w") == b"1"
    for jid, was in (
        (near, JobState.DELAYED),
        (far, JobState.DELAYED),
        (reserved, JobState.RESERVED),
        (ready, JobState.READY),
    ):
        before = await peek(engine, jid)
        assert before is not None and before.state is was
        job = await bury(engine, jid, f"bad {jid}", t + 10)
        assert job.state is JobState.DEAD and job.job_id == jid
        assert job.note is not None and job.note.reason == "buried"
        assert job.note.last_error == f"bad {jid}" and job.note.died_ms == t + 10
        check_queue(sync_redis, NS, Q)
    # with the lease of its delivery
    job = await bury(engine, held, "", t + 11, lease=jobs[held].lease)
    assert job.note is not None and job.note.last_error is None and job.note.reason == "buried"
    assert sync_redis.hget(k.meta, "w") is None  # the wheel job left its bucket
    found = await peek(engine, far)  # found by id, though its id names its old bucket
    assert found is not None and found.state is JobState.DEAD and found.body == b"far"
    assert found.note is not None and found.note.last_error == f"bad {far}"
    s = await engine.run(ops.sizes(engine.config, NS, Q))
    assert (s.dead, s.reserved, s.delayed, s.ready) == (5, 0, 0, 0)
    # dead jobs never expire; an ack removes the job and its note
    assert await engine.run(ops.ack(NS, Q, [far])) == [JobState.DEAD]
    assert not sync_redis.hexists(k.notes, id_to_member(far))
    check_queue(sync_redis, NS, Q)


async def test_bury_refusals_change_nothing(engine: AsyncEngine, sync_redis: redis.Redis) -> None:
    t = now_ms()
    a, b = await publish(engine, t, JobSpec(b"a", tries=2), JobSpec(b"b", tries=2))
    await bury(engine, a, "first", t)
    (held,) = await consume(engine, t)
    assert held.job_id == b
    await unchanged(sync_redis, engine.run(control.bury(NS, Q, a, "again", t)), WrongState)
    await unchanged(
        sync_redis, engine.run(control.bury(NS, Q, b, "x", t, lease="00" * 8)), Conflict
    )
    await unchanged(  # a lease on a dead job: the lease does not hold it
        sync_redis, engine.run(control.bury(NS, Q, a, "x", t, lease=held.lease)), Conflict
    )
    before = snapshot(sync_redis)
    assert await engine.run(control.bury(NS, Q, "no-such-job", "x", t)) is None
    assert await engine.run(control.bury(NS, Q, "0" * 26, "x", t)) is None  # a wheel-shaped id
    assert snapshot(sync_redis) == before
    check_queue(sync_redis, NS, Q)


async def test_bury_of_a_job_past_its_ttl_finds_nothing_and_keeps_nothing_forever(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """A job whose ttl has ended is gone (a release says `expired`), even before the pump
    removes it: a bury must not make it a dead job, which would never expire."""
    t = now_ms()
    ready, delayed = await publish(
        engine, t, JobSpec(b"r", ttl_ms=1_000), JobSpec(b"d", delay_ms=500, ttl_ms=1_000)
    )
    before = snapshot(sync_redis)
    for jid in (ready, delayed):
        assert await engine.run(control.bury(NS, Q, jid, "late", t + 1_500)) is None
    assert snapshot(sync_redis) == before
    assert (await engine.run(ops.sizes(engine.config, NS, Q))).dead == 0
    check_queue(sync_redis, NS, Q)


# -- deaths and last errors ------------------------------------------------------------------


async def test_every_death_records_why_and_when_and_the_last_error_survives_revival(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    ttr, nacked, quiet = await publish(
        engine, t, JobSpec(b"ttr"), JobSpec(b"nack", tries=2), JobSpec(b"quiet", tries=2)
    )
    got = {j.job_id: j for j in await consume(engine, t, ttr=1_000, count=3)}
    # a release with an error text, the job goes back: the error is kept, no death
    await engine.run(
        ops.release(
            engine.config, NS, Q, [nacked], 0, t + 1, nack=True, error="boom 1", leases=[None]
        )
    )
    await engine.run(ops.release(engine.config, NS, Q, [quiet], 0, t + 1, nack=True))
    job = await peek(engine, nacked)
    assert job is not None and job.note is not None
    assert (job.note.reason_code, job.note.died_ms, job.note.last_error) == (0, 0, "boom 1")
    q_job = await peek(engine, quiet)
    assert q_job is not None and q_job.note is None  # no error, no death: no note at all
    assert not sync_redis.hexists(QueueKeys(NS, Q).notes, id_to_member(quiet))
    # the last tries: the nacked one released again (its error replaced), the other runs out
    again = {j.job_id: j for j in await consume(engine, t + 2, ttr=1_000, count=2)}
    assert set(again) == {nacked, quiet}
    await engine.run(
        ops.release(engine.config, NS, Q, [nacked], 0, t + 3, nack=True, error="boom 2")
    )
    await engine.run(ops.release(engine.config, NS, Q, [quiet], 0, t + 3, nack=True))
    await engine.run(ops.tick(engine.config, NS, Q, t + 1_000))  # ttr of `ttr` ran out
    assert got[ttr].tries_left == 0
    notes = {jid: (await peek(engine, jid)) for jid in (ttr, nacked, quiet)}
    expect = {
        ttr: ("ttr_expired", t + 1_000, None),
        nacked: ("tries_exhausted", t + 3, "boom 2"),
        quiet: ("tries_exhausted", t + 3, None),
    }
    for jid, job in notes.items():
        assert job is not None and job.state is JobState.DEAD and job.note is not None
        assert (job.note.reason, job.note.died_ms, job.note.last_error) == expect[jid], jid
    check_queue(sync_redis, NS, Q)
    # kick forgets the death, keeps the last error; respawn (lmstfy) likewise
    kicked = await engine.run(control.kick(engine.config, NS, Q, nacked, 0, 2, 0, t + 5))
    assert kicked is not None and kicked.state is JobState.READY and kicked.tries_left == 2
    assert kicked.note is not None and kicked.note.reason_code == 0
    assert kicked.note.last_error == "boom 2"
    assert await engine.run(ops.respawn(engine.config, NS, Q, 10, 0, t + 6)) == 2
    job = await peek(engine, ttr)
    assert job is not None and job.state is JobState.READY and job.note is None
    check_queue(sync_redis, NS, Q)


# -- kick ------------------------------------------------------------------------------------


async def _dead(engine: AsyncEngine, t: int, n: int, tries: int = 1) -> list[str]:
    ids = await publish(engine, t, *[JobSpec(str(i).encode(), tries=tries) for i in range(n)])
    for jid in ids:
        await bury(engine, jid, "to kick", t)
    return ids


async def test_kick_to_ready_or_delayed_with_fresh_tries_and_ttl(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    a, b = await _dead(engine, t, 2)
    job = await engine.run(control.kick(engine.config, NS, Q, a, 0, 1, 0, t + 1))
    assert job is not None and (job.state, job.tries_left, job.expire_at_ms) == (
        JobState.READY,
        1,
        0,
    )
    job = await engine.run(control.kick(engine.config, NS, Q, b, 5_000, 3, MIN, t + 1))
    assert job is not None and (job.state, job.tries_left, job.expire_at_ms) == (
        JobState.DELAYED,
        3,
        t + 1 + MIN,
    )
    k = QueueKeys(NS, Q)
    assert sync_redis.zscore(k.delayed, id_to_member(b)) == t + 5_001
    assert int(sync_redis.hget(k.meta, "next") or 0) <= t + 5_001  # the pump looks by then
    sk = ShardKeys(shard_of(k.qualified, engine.config.shards))
    assert (sync_redis.zscore(sk.schedule, k.qualified) or 0) <= t + 5_001  # signalled
    check_queue(sync_redis, NS, Q)
    (got,) = await consume(engine, t + 2)
    assert got.job_id == a
    assert await consume(engine, t + 5_000) == []
    (got,) = await consume(engine, t + 5_001)
    assert got.job_id == b and got.tries_left == 2


async def test_kick_refusals_change_nothing(engine: AsyncEngine, sync_redis: redis.Redis) -> None:
    t = now_ms()
    ready, far, held = await publish(
        engine, t, JobSpec(b"r"), JobSpec(b"far", delay_ms=10 * MIN), JobSpec(b"held")
    )
    await consume(engine, t)  # reserves `ready`
    for jid in (ready, far, held):
        kick = control.kick(engine.config, NS, Q, jid, 0, 1, 0, t)
        await unchanged(sync_redis, engine.run(kick), WrongState)
    before = snapshot(sync_redis)
    assert await engine.run(control.kick(engine.config, NS, Q, "nobody", 0, 1, 0, t)) is None
    assert snapshot(sync_redis) == before


# -- reschedule ------------------------------------------------------------------------------


async def test_reschedule_moves_ready_delayed_and_wheel_jobs_and_the_pump_follows(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    ready, near, far = await publish(
        engine,
        t,
        JobSpec(b"ready"),
        JobSpec(b"near", delay_ms=3_000),
        JobSpec(b"far", delay_ms=30 * MIN, ttl_ms=60 * MIN),
    )
    k = QueueKeys(NS, Q)
    sk = ShardKeys(shard_of(k.qualified, engine.config.shards))

    async def move(jid: str, due: int, now: int) -> Job:
        job = await engine.run(control.reschedule_job(engine.config, NS, Q, jid, due, now))
        assert job is not None
        return job

    # the wheel job comes forward: into jobs + delayed, META.next and the shard follow
    assert (await move(far, t + 2_000, t)).state is JobState.DELAYED
    assert sync_redis.hget(k.meta, "w") is None
    assert sync_redis.zscore(k.delayed, id_to_member(far)) == t + 2_000
    assert sync_redis.zscore(k.expire, id_to_member(far)) == t + 60 * MIN
    assert int(sync_redis.hget(k.meta, "next") or 0) <= t + 2_000
    assert (sync_redis.zscore(sk.schedule, k.qualified) or 0) <= t + 2_000
    # the ready job goes back to a delay, the near one becomes ready now
    assert (await move(ready, t + 4_000, t)).state is JobState.DELAYED
    assert (await move(near, t, t)).state is JobState.READY
    check_queue(sync_redis, NS, Q)
    (job,) = await consume(engine, t + 1)
    assert job.job_id == near
    assert await consume(engine, t + 1_999) == []
    (job,) = await consume(engine, t + 2_000)
    assert job.job_id == far and job.body == b"far"  # found by id through its old bucket
    assert await engine.run(ops.ack(NS, Q, [far])) == [JobState.RESERVED]
    await engine.run(ops.tick(engine.config, NS, Q, t + 4_000))
    assert (await peek(engine, ready)).state is JobState.READY  # type: ignore[union-attr]
    check_queue(sync_redis, NS, Q)


async def test_reschedule_tells_waiting_consumers_of_the_new_due_time(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """Long-polls set their timers from what they heard: a job brought forward must be
    announced (`due:<ms>`, or `1` when READY was empty and is not any more)."""
    t = now_ms()
    far, other = await publish(
        engine, t, JobSpec(b"far", delay_ms=30 * MIN), JobSpec(b"other", delay_ms=30 * MIN)
    )
    sub = sync_redis.pubsub()
    sub.ssubscribe(QueueKeys(NS, Q).notify)  # sharded: on a Cluster, the queue's slot's node
    read = getattr(sub, "get_sharded_message", sub.get_message)

    def heard() -> list[bytes]:
        out = []
        for _ in range(50):
            msg = read(timeout=0.1)
            if msg is None and out:
                break
            if msg is not None and msg["type"] == "smessage":
                out.append(msg["data"])
        return out

    heard()  # the subscription's own confirmation
    await engine.run(control.reschedule_job(engine.config, NS, Q, far, t + 2_000, t))
    assert heard() == [f"due:{t + 2_000}".encode()]
    await engine.run(control.reschedule_job(engine.config, NS, Q, other, t, t))
    assert heard() == [b"1"]
    sub.close()


async def test_reschedule_refusals_change_nothing(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    held, dead, short, far = await publish(
        engine,
        t,
        JobSpec(b"held"),
        JobSpec(b"dead"),
        JobSpec(b"short", ttl_ms=10_000),
        JobSpec(b"far", delay_ms=30 * MIN, ttl_ms=40 * MIN),
    )
    await consume(engine, t)
    await bury(engine, dead, "", t)
    cfg = engine.config
    for jid in (held, dead):
        op = control.reschedule_job(cfg, NS, Q, jid, t + 1_000, t)
        await unchanged(sync_redis, engine.run(op), WrongState)
    for jid, due in ((short, t + 10_000), (short, t + 20_000), (far, t + 40 * MIN)):
        op = control.reschedule_job(cfg, NS, Q, jid, due, t)
        await unchanged(sync_redis, engine.run(op), BadRequest)
    before = snapshot(sync_redis)
    assert await engine.run(control.reschedule_job(cfg, NS, Q, "none", t, t)) is None
    assert snapshot(sync_redis) == before


# -- dead-letter listing, redrive, purge ----------------------------------------------------


async def _walk(engine: AsyncEngine, limit: int, between: Any = None) -> list[str]:
    seen: list[str] = []
    after = None
    for _ in range(10_000):  # a cursor that does not move on fails here, not by hanging
        page, after = await engine.run(control.dead_page(NS, Q, after, limit))
        seen += [d.job_id for d in page]
        if between is not None:
            await between()
        if after is None:
            return seen
    raise AssertionError("the walk does not end")


async def test_listing_shows_each_dead_job_once_oldest_first_even_at_one_death_time(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    ids = await publish(engine, t, *[JobSpec(b"x" * i, tries=1) for i in range(1, 41)])
    early = ids[:5]
    for jid in early:
        await bury(engine, jid, "early", t - 100)
    await consume(engine, t, ttr=10, count=35)
    await engine.run(ops.tick(engine.config, NS, Q, t + 10))  # 35 die in the same ms
    for limit in (1, 3, 7, 35, 40, 100):
        listed = await _walk(engine, limit)
        assert len(listed) == 40 and set(listed) == set(ids), limit
        assert listed[:5] == sorted(early, key=id_to_member)
    page, _ = await engine.run(control.dead_page(NS, Q, None, 40))
    first = page[0]
    assert (first.reason, first.last_error, first.died_ms) == ("buried", "early", t - 100)
    assert first.size == ids.index(first.job_id) + 1 and first.published_ms == t
    assert page[-1].reason == "ttr_expired" and page[-1].deliveries == 1


async def test_listing_reads_a_dead_job_with_its_own_backoff_and_attributes(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    """The record's backoff section (flags & 2) sits between the header and the attributes:
    the listing must step over it (it used to cut the record at the header: a 500)."""
    t = now_ms()
    backoff = Backoff(2, 1_000, 60_000, 250)
    specs = [
        JobSpec(b"body-1", backoff=backoff),
        JobSpec(b"body-22", backoff=backoff, attributes={"k": "v"}),
        JobSpec(b"body-333", attributes={"k": "w"}),
    ]
    ids = await publish(engine, t, *specs)
    for jid in ids:
        await bury(engine, jid, "why", t)
    page, after = await engine.run(control.dead_page(NS, Q, None, 10))
    assert after is None
    got = {d.job_id: (d.size, d.attributes, d.reason, d.last_error) for d in page}
    assert got == {
        ids[0]: (6, None, "buried", "why"),
        ids[1]: (7, {"k": "v"}, "buried", "why"),
        ids[2]: (8, {"k": "w"}, "buried", "why"),
    }
    check_queue(sync_redis, NS, Q)


async def test_listing_cursor_is_stable_while_jobs_die_and_are_kicked(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    stay = await _dead(engine, t, 30)
    movers = await _dead(engine, t, 30)
    cfg = engine.config
    it = iter(movers)
    more: list[str] = []

    async def churn() -> None:  # between pages: kick some, bury new ones at the same time
        kick_ids = [j for j in (next(it, None) for _ in range(3)) if j is not None]
        kicks = [control.kick(cfg, NS, Q, j, 0, 1, 0, t) for j in kick_ids]
        fresh = await publish(engine, t, JobSpec(b"n"), JobSpec(b"m"))
        more.extend(fresh)
        await asyncio.gather(
            *(engine.run(k) for k in kicks),
            *(engine.run(control.bury(NS, Q, j, "", t)) for j in fresh),
        )

    listed = await _walk(engine, 4, churn)
    assert len(listed) == len(set(listed)), "a job listed twice"
    assert set(stay) <= set(listed), "a job dead the whole walk was skipped"
    check_queue(sync_redis, NS, Q)


@against_redis(25)
@given(
    deaths=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["buried", "ttr_expired"])),
        min_size=0,
        max_size=25,
    ),
    reason=st.sampled_from([None, "buried", "ttr_expired", "tries_exhausted"]),
    span=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    limit=st.integers(1, 6),
    purge=st.booleans(),
)
async def test_filtered_redrive_and_purge_match_a_model(
    engine: AsyncEngine,
    sync_redis: redis.Redis,
    deaths: list[tuple[int, str]],
    reason: str | None,
    span: tuple[int, int],
    limit: int,
    purge: bool,
) -> None:
    await engine.run(ops.destroy(engine.config, NS, Q))
    t = now_ms()
    model: dict[str, tuple[int, str]] = {}
    for at, why in deaths:
        (jid,) = await publish(engine, t, JobSpec(b"j"))
        if why == "buried":
            await bury(engine, jid, "", t + at)
        else:
            await consume(engine, t + at - 1, ttr=1)
            await engine.run(ops.tick(engine.config, NS, Q, t + at))
        model[jid] = (t + at, why)
    lo, hi = min(span), max(span)
    filt = DeadFilter(reason, t + lo, t + hi)
    want = {j for j, (at, why) in model.items() if lo <= at - t <= hi and reason in (None, why)}
    done, after, calls = 0, None, 0
    while calls < 1_000:  # a cursor that does not move on fails below, not by hanging
        if purge:
            step = control.purge_dead(NS, Q, filt, after, limit)
        else:
            step = control.redrive_dead(engine.config, NS, Q, filt, after, limit, 0, 1, 0, t + 9)
        reply = await engine.run(step)
        assert reply.count <= limit
        done += reply.count
        calls += 1
        if not reply.more:
            break
        after = reply.after
    assert not reply.more, "the sweep does not end"
    assert done == len(want)
    listed = set(await _walk(engine, 7))
    assert listed == set(model) - want
    s = await engine.run(ops.sizes(engine.config, NS, Q))
    assert s.ready == (0 if purge else len(want))
    check_queue(sync_redis, NS, Q)


@against_redis(20)
@given(
    initial=st.lists(st.integers(0, 2), min_size=0, max_size=20),
    churn=st.lists(
        st.tuples(st.sampled_from(["bury", "kick", "ack"]), st.integers(0, 2), st.integers(0, 99)),
        max_size=30,
    ),
    limit=st.integers(1, 5),
)
async def test_a_walk_lists_in_cursor_order_every_job_dead_throughout_exactly_once(
    engine: AsyncEngine,
    sync_redis: redis.Redis,
    initial: list[int],
    churn: list[tuple[str, int, int]],
    limit: int,
) -> None:
    await engine.run(ops.destroy(engine.config, NS, Q))
    t = now_ms()
    dead: dict[str, int] = {}  # job -> time of death (the model)
    for at in initial:
        (jid,) = await publish(engine, t, JobSpec(b"j"))
        await bury(engine, jid, "", t + at)
        dead[jid] = t + at
    ever_left: set[str] = set()
    ever_dead, at_start = set(dead), set(dead)
    steps = iter(churn)

    async def between() -> None:  # a few writes between two pages
        for op, at, pick in (s for _, s in zip(range(2), steps)):
            victims = sorted(dead)
            if op == "bury" or not victims:
                (jid,) = await publish(engine, t, JobSpec(b"n"))
                await bury(engine, jid, "", t + at)
                dead[jid] = t + at
                ever_dead.add(jid)
                continue
            jid = victims[pick % len(victims)]
            if op == "kick":
                await engine.run(control.kick(engine.config, NS, Q, jid, 0, 1, 0, t))
            else:
                await engine.run(ops.ack(NS, Q, [jid]))
            del dead[jid]
            ever_left.add(jid)

    seen: list[tuple[int, bytes, str]] = []
    after = None
    for _ in range(1_000):  # a cursor that does not move on fails here, not by hanging
        page, after = await engine.run(control.dead_page(NS, Q, after, limit))
        seen += [(d.died_ms, id_to_member(d.job_id), d.job_id) for d in page]
        await between()
        if after is None:
            break
    assert after is None, "the walk does not end"
    positions = [(died, member) for died, member, _ in seen]
    assert positions == sorted(set(positions)), "not in cursor order, or a job twice"
    listed = {jid for _, _, jid in seen}
    assert at_start - ever_left <= listed, "a job dead the whole walk was skipped"
    assert listed <= ever_dead
    check_queue(sync_redis, NS, Q)


async def test_a_sweep_examines_a_bounded_number_of_entries_per_call(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    ids = await publish(engine, t, *[JobSpec(b"x") for _ in range(control.DEAD_EXAMINE + 5)])
    held = {j.job_id for j in await consume(engine, t, ttr=2, count=5)}
    rest = [j for j in ids if j not in held]
    for i in range(0, len(rest), 50):  # (a flood of concurrent calls would be repeated, restamped)
        await asyncio.gather(*(bury(engine, j, "", t + 1) for j in rest[i : i + 50]))
    await engine.run(ops.tick(engine.config, NS, Q, t + 2))  # the 5 die after the 1,000 buried
    filt = DeadFilter("ttr_expired")
    first = await engine.run(control.purge_dead(NS, Q, filt, None, 1_000))
    assert first.count == 0 and first.more  # 1,000 looked at, none matched: where it stopped
    second = await engine.run(control.purge_dead(NS, Q, filt, first.after, 1_000))
    assert second.count == 5 and not second.more
    assert (await engine.run(ops.sizes(engine.config, NS, Q))).dead == control.DEAD_EXAMINE
    check_queue(sync_redis, NS, Q)


async def test_large_bodies_make_shorter_pages_not_longer_calls(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    ids = await publish(engine, t, *[JobSpec(bytes(MAX_BODY)) for _ in range(12)])
    for jid in ids:
        await bury(engine, jid, "", t)
    page, after = await engine.run(control.dead_page(NS, Q, None, 100))
    assert 1 <= len(page) < 12 and after is not None
    assert all(d.size == MAX_BODY for d in page)
    assert sorted(await _walk(engine, 100)) == sorted(ids)
    moved = await engine.run(
        control.redrive_dead(engine.config, NS, Q, DeadFilter(), None, 100, 0, 1, 0, t)
    )
    assert 1 <= moved.count < 12 and moved.more
    check_queue(sync_redis, NS, Q)


# -- races -----------------------------------------------------------------------------------


async def test_bury_races_ack_exactly_one_wins(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    for _ in range(3):
        ids = await publish(engine, t, *[JobSpec(b"x", tries=2) for _ in range(30)])
        jobs = await consume(engine, t, count=30)

        async def bury_one(j: Job) -> Job | None:
            try:
                return await engine.run(control.bury(NS, Q, j.job_id, "race", t, j.lease))
            except Conflict:
                return None

        buried, acked = await asyncio.gather(
            asyncio.gather(*(bury_one(j) for j in jobs)),
            asyncio.gather(*(engine.run(ops.ack(NS, Q, [j.job_id])) for j in jobs)),
        )
        for jid, b, a in zip([j.job_id for j in jobs], buried, acked):
            found = await peek(engine, jid)
            if b is not None:  # bury first, then the ack (without a lease) removed the dead job
                assert a == [JobState.DEAD] and found is None
            else:  # the ack came first: nothing to bury
                assert a == [JobState.RESERVED] and found is None
        assert sorted(ids) == sorted(j.job_id for j in jobs)
        check_queue(sync_redis, NS, Q)


async def test_bury_with_lease_races_a_leased_ack_never_both_never_neither(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    for _ in range(3):
        await publish(engine, t, *[JobSpec(b"x", tries=2) for _ in range(30)])
        jobs = await consume(engine, t, count=30)

        async def attempt(op: Any) -> bool:
            try:
                await engine.run(op)
                return True
            except Conflict:
                return False

        outcomes = await asyncio.gather(
            *(attempt(control.bury(NS, Q, j.job_id, "r", t, j.lease)) for j in jobs),
            *(attempt(ops.ack(NS, Q, [j.job_id], t, leases=[j.lease])) for j in jobs),
        )
        for i, j in enumerate(jobs):
            bury_won, ack_won = outcomes[i], outcomes[len(jobs) + i]
            found = await peek(engine, j.job_id)
            assert bury_won != ack_won, "exactly one of them holds the delivery"
            if bury_won:
                assert found is not None and found.state is JobState.DEAD
            else:
                assert found is None
        await engine.run(ops.delete_dead(NS, Q, 100))
        check_queue(sync_redis, NS, Q)


async def test_kick_races_respawn_the_job_is_ready_exactly_once(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    for _ in range(3):
        ids = await _dead(engine, t, 40)

        async def kick(jid: str) -> bool:
            try:
                return (
                    await engine.run(control.kick(engine.config, NS, Q, jid, 0, 1, 0, t))
                    is not None
                )
            except WrongState:
                return False

        kicked, respawned = await asyncio.gather(
            asyncio.gather(*(kick(j) for j in ids)),
            engine.run(ops.respawn(engine.config, NS, Q, 100, 0, t)),
        )
        assert sum(kicked) + respawned == len(ids)
        got = await consume(engine, t, count=100)
        assert sorted(j.job_id for j in got) == sorted(ids)  # each exactly once
        assert await consume(engine, t) == []
        await engine.run(ops.ack(NS, Q, ids))
        check_queue(sync_redis, NS, Q)


async def test_reschedule_races_promotion_and_consume_delivered_exactly_once(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    cfg = engine.config
    for round_ in range(3):
        base = t + round_ * 10_000
        ids = await publish(engine, base, *[JobSpec(b"x", delay_ms=1_000) for _ in range(40)])

        async def resched(jid: str) -> None:
            try:
                await engine.run(control.reschedule_job(cfg, NS, Q, jid, base + 500, base + 1_000))
            except WrongState:
                pass  # consumed first: reserved

        delivered: list[Job] = []

        async def consumer() -> None:
            for _ in range(20):
                delivered.extend(await consume(engine, base + 1_000, count=5))

        await asyncio.gather(
            *(resched(j) for j in ids),
            engine.run(ops.tick(cfg, NS, Q, base + 1_000)),
            consumer(),
            consumer(),
        )
        delivered += await consume(engine, base + 2_000, count=100)
        assert sorted(j.job_id for j in delivered) == sorted(ids)  # none lost, none twice
        await engine.run(ops.ack(NS, Q, ids))
        check_queue(sync_redis, NS, Q)


async def test_redrive_while_jobs_die_loses_and_duplicates_nothing(
    engine: AsyncEngine, sync_redis: redis.Redis
) -> None:
    t = now_ms()
    cfg = engine.config
    first = await _dead(engine, t, 60)
    later = await publish(engine, t, *[JobSpec(b"y") for _ in range(60)])

    async def redrive_all() -> int:
        n, after = 0, None
        for _ in range(1_000):  # a cursor that does not move on fails, not hangs
            reply = await engine.run(
                control.redrive_dead(cfg, NS, Q, DeadFilter(), after, 7, 0, 1, 0, t)
            )
            n += reply.count
            if not reply.more:
                return n
            after = reply.after
        raise AssertionError("the redrive does not end")

    async def kill_all() -> None:
        for jid in later:
            await engine.run(control.bury(NS, Q, jid, "", t))

    n, _ = await asyncio.gather(redrive_all(), kill_all())
    n += await redrive_all()  # what died after the walk passed
    assert n == 120
    got = await consume(engine, t, count=100) + await consume(engine, t, count=100)
    assert sorted(j.job_id for j in got) == sorted(first + later)
    check_queue(sync_redis, NS, Q)


# -- over HTTP -------------------------------------------------------------------------------


def _size(api: httpx.Client) -> dict[str, int]:
    r = api.get("/api/ns/q/size")
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


def test_http_tour_bury_with_a_reason_list_and_kick_back(api: httpx.Client) -> None:
    jid = api.put("/api/ns/q", params={"tries": 3}, content=b"payload").json()["job_id"]
    lease = api.get("/api/ns/q", params={"ttr": 30}).json()["lease"]
    r = api.post(
        f"/api/ns/q/job/{jid}/bury", params={"lease": lease}, json={"reason": "bad input ü"}
    )
    assert r.status_code == 200, r.text
    job = r.json()
    assert (job["job_id"], job["state"], job["reason"], job["last_error"]) == (
        jid,
        "dead",
        "buried",
        "bad input ü",
    )
    assert job["deliveries"] == 1 and job["died_at"] > 0
    shown = api.get(f"/api/ns/q/job/{jid}").json()
    assert {k: shown[k] for k in ("state", "reason", "last_error", "died_at")} == {
        k: job[k] for k in ("state", "reason", "last_error", "died_at")
    }
    listed = api.get("/api/ns/q/deadletter/jobs").json()
    assert listed["cursor"] is None
    (entry,) = listed["jobs"]
    assert entry == {
        "job_id": jid,
        "reason": "buried",
        "died_at": job["died_at"],
        "deliveries": 1,
        "last_error": "bad input ü",
        "size": 7,
        "published_at": entry["published_at"],
    }
    r = api.post(f"/api/ns/q/deadletter/{jid}/kick", params={"tries": 2})
    assert r.status_code == 200 and r.json()["state"] == "ready"
    assert r.json()["remain_tries"] == 2 and r.json()["last_error"] == "bad input ü"
    assert "reason" not in r.json()
    assert api.get("/api/ns/q", params={"ttr": 30}).json()["job_id"] == jid


def test_http_refusals_are_clear_and_change_nothing(
    api: httpx.Client, sync_redis: redis.Redis
) -> None:
    jid = api.put("/api/ns/q", content=b"x").json()["job_id"]
    dead = api.put("/api/ns/q", content=b"y").json()["job_id"]
    assert api.post(f"/api/ns/q/job/{dead}/bury", params={"reason": "r"}).status_code == 200
    before = snapshot(sync_redis)
    cases = [
        ("post", f"/api/ns/q/job/{jid}/bury", {"reason": "x" * 1025}, None, 400, "reason"),
        ("post", f"/api/ns/q/job/{jid}/bury", {}, {"reason": "ü" * 513}, 400, "reason"),
        ("post", f"/api/ns/q/job/{jid}/bury", {}, {"reason": 5}, 400, "reason"),
        ("post", f"/api/ns/q/job/{jid}/bury", {}, {"why": "x"}, 400, "body"),
        ("post", f"/api/ns/q/job/{jid}/bury", {"lease": "zz"}, None, 400, "lease"),
        ("post", f"/api/ns/q/job/{dead}/bury", {}, None, 409, "dead"),
        ("post", "/api/ns/q/job/nobody/bury", {}, None, 404, "not found"),
        ("post", f"/api/ns/q/deadletter/{jid}/kick", {}, None, 409, "ready"),
        ("post", "/api/ns/q/deadletter/nobody/kick", {}, None, 404, "not found"),
        ("post", f"/api/ns/q/deadletter/{dead}/kick", {"tries": 0}, None, 400, "tries"),
        ("post", f"/api/ns/q/deadletter/{dead}/kick", {"delay": 5, "ttl": 5}, None, 400, "ttl"),
        ("post", f"/api/ns/q/job/{jid}/reschedule", {}, None, 400, "exactly one"),
        ("post", f"/api/ns/q/job/{jid}/reschedule", {"delay": 1, "at": 5}, None, 400, "one"),
        ("post", f"/api/ns/q/job/{jid}/reschedule", {"at": "x"}, None, 400, "at"),
        ("post", f"/api/ns/q/job/{dead}/reschedule", {"delay": 1}, None, 409, "dead"),
        ("post", "/api/ns/q/job/nobody/reschedule", {"delay": 1}, None, 404, "not found"),
        ("get", "/api/ns/q/deadletter/jobs", {"limit": 0}, None, 400, "limit"),
        ("get", "/api/ns/q/deadletter/jobs", {"limit": 1001}, None, 400, "limit"),
        ("get", "/api/ns/q/deadletter/jobs", {"cursor": "zz"}, None, 400, "cursor"),
        ("get", "/api/ns/q/deadletter/jobs", {"cursor": "1::"}, None, 400, "cursor"),
        # a sweep's cursor (4 parts) is not a listing's; an id no job can have; a walk begun
        # after now (its end would keep it going for ever)
        ("get", "/api/ns/q/deadletter/jobs", {"cursor": "0:1:x:2"}, None, 400, "cursor"),
        ("get", "/api/ns/q/deadletter/jobs", {"cursor": "0:0:\u00e9"}, None, 400, "cursor"),
        (
            "post",
            "/api/ns/q/deadletter/redrive",
            {"cursor": "0:1:x:" + "9" * 20},
            None,
            400,
            "cursor",
        ),
        (
            "post",
            "/api/ns/q/deadletter/purge",
            {"cursor": "0:1:x:" + "9" * 16},
            None,
            400,
            "cursor",
        ),
        ("post", "/api/ns/q/deadletter/redrive", {"reason": "bogus"}, None, 400, "reason"),
        ("post", "/api/ns/q/deadletter/redrive", {"from": 5, "to": 4}, None, 400, "from"),
        ("post", "/api/ns/q/deadletter/purge", {"limit": 1001}, None, 400, "limit"),
    ]
    for method, path, params, body, status, text in cases:
        r = getattr(api, method)(path, params=params, **({"json": body} if body else {}))
        assert r.status_code == status, (path, params, r.text)
        assert text in r.json()["error"], (path, params, r.text)
        if status == 409:
            assert r.json()["state"] == text
    assert snapshot(sync_redis) == before


def test_http_release_keeps_an_error_text_and_is_lmstfys_without_one(api: httpx.Client) -> None:
    jid = api.put("/api/ns/q", params={"tries": 3}, content=b"x").json()["job_id"]
    api.get("/api/ns/q", params={"ttr": 30})
    r = api.post(f"/api/ns/q/job/{jid}/release")
    assert r.json() == {"msg": "released", "job_id": jid, "state": "ready"}
    assert "last_error" not in api.get(f"/api/ns/q/job/{jid}").json()
    api.get("/api/ns/q", params={"ttr": 30})
    r = api.post(f"/api/ns/q/job/{jid}/release", params={"error": "timeout calling X"})
    assert r.json() == {"msg": "released", "job_id": jid, "state": "ready"}
    assert api.get(f"/api/ns/q/job/{jid}").json()["last_error"] == "timeout calling X"
    api.get("/api/ns/q", params={"ttr": 30})
    r = api.post(f"/api/ns/q/job/{jid}/release", json={"error": "gave up"})
    assert r.json()["state"] == "dead"
    job = api.get(f"/api/ns/q/job/{jid}").json()
    assert (job["reason"], job["last_error"], job["deliveries"]) == (
        "tries_exhausted",
        "gave up",
        3,
    )
    r = api.post(f"/api/ns/q/job/{jid}/release", params={"error": "x" * 1025})
    assert r.status_code == 400


def test_http_keep_try_release_is_a_snooze_that_spends_no_try(
    api: httpx.Client, sync_redis: redis.Redis
) -> None:
    """`keep_try=1`: the delivery is not counted and the try is restored, so the job comes back
    as it was (a job on its last try does not die); the error text is kept; a stale lease is
    a 409 that changes nothing; a bad value is a 400 that changes nothing."""
    jid = api.put("/api/ns/q", params={"tries": 2}, content=b"x").json()["job_id"]
    first = api.get("/api/ns/q", params={"ttr": 30}).json()
    assert (first["remain_tries"], first["deliveries"]) == (1, 1)
    r = api.post(
        f"/api/ns/q/job/{jid}/release",
        params={"keep_try": 1, "lease": first["lease"], "error": "busy, later"},
    )
    assert r.json() == {"msg": "released", "job_id": jid, "state": "ready"}
    peeked = api.get(f"/api/ns/q/job/{jid}").json()
    assert (peeked["state"], peeked["remain_tries"], peeked["deliveries"]) == ("ready", 2, 0)
    assert peeked["last_error"] == "busy, later"
    again = api.get("/api/ns/q", params={"ttr": 30}).json()
    assert (again["job_id"], again["remain_tries"], again["deliveries"]) == (jid, 1, 1)
    # a stale lease (the first delivery's): 409, nothing changes
    before = snapshot(sync_redis)
    r = api.post(f"/api/ns/q/job/{jid}/release", params={"keep_try": 1, "lease": first["lease"]})
    assert r.status_code == 409 and r.json()["state"] == "reserved", r.text
    for bad in ("2", "yes", "", "-1", "true"):
        r = api.post(f"/api/ns/q/job/{jid}/release", params={"keep_try": bad})
        assert r.status_code == 400 and "keep_try" in r.json()["error"], (bad, r.text)
    assert snapshot(sync_redis) == before
    # the last try: a plain release would kill it (see above); a keep_try release does not,
    # with a delay too
    api.post(f"/api/ns/q/job/{jid}/release")  # spends the first try: 1 left
    last = api.get("/api/ns/q", params={"ttr": 30}).json()
    assert (last["remain_tries"], last["deliveries"]) == (0, 2)
    r = api.post(
        f"/api/ns/q/job/{jid}/release",
        params={"keep_try": "1", "lease": last["lease"], "delay_ms": 200},
    )
    assert r.json()["state"] == "delayed"
    peeked = api.get(f"/api/ns/q/job/{jid}").json()
    assert (peeked["state"], peeked["remain_tries"], peeked["deliveries"]) == ("delayed", 1, 1)
    assert api.get("/api/ns/q/deadletter/size").json()["size"] == 0
    got = api.get("/api/ns/q", params={"ttr": 30, "timeout": 5}).json()
    assert (got["job_id"], got["remain_tries"], got["deliveries"]) == (jid, 0, 2)
    # keep_try=0 is the plain release: the last try's delivery counts, the job dies
    r = api.post(f"/api/ns/q/job/{jid}/release", params={"keep_try": 0, "lease": got["lease"]})
    assert r.json()["state"] == "dead"


def test_http_reschedule_redrive_and_purge_loop_with_a_cursor(api: httpx.Client) -> None:
    jid = api.put("/api/ns/q", params={"delay": 600}, content=b"x").json()["job_id"]
    r = api.post(f"/api/ns/q/job/{jid}/reschedule", params={"at": 0})
    assert r.status_code == 200 and r.json()["state"] == "ready"
    r = api.post(f"/api/ns/q/job/{jid}/reschedule", params={"delay_ms": 60_000})
    assert r.status_code == 200 and r.json()["state"] == "delayed"
    short = api.put("/api/ns/q", params={"ttl": 10}, content=b"x").json()["job_id"]
    r = api.post(f"/api/ns/q/job/{short}/reschedule", params={"delay": 20})
    assert r.status_code == 400 and "ttl" in r.json()["error"]
    ids = api.put("/api/ns/q/bulk", json=list(range(25))).json()["job_ids"]
    for i in ids:
        assert api.post(f"/api/ns/q/job/{i}/bury").status_code == 200
    moved, cursor, calls = 0, None, 0
    while calls < 100:  # a cursor that does not move on fails below, not by hanging
        params = {"limit": 4, "reason": "buried", "delay": 1}
        r = api.post(
            "/api/ns/q/deadletter/redrive",
            params={**params, **({"cursor": cursor} if cursor else {})},
        )
        assert r.status_code == 200, r.text
        moved += r.json()["count"]
        calls += 1
        cursor = r.json()["cursor"]
        assert r.json()["more"] == (cursor is not None)
        if cursor is None:
            break
    assert moved == 25 and calls >= 7
    assert _size(api)["delayed"] == 26 and _size(api)["dead"] == 0
    for i in ids[:5]:
        api.post(f"/api/ns/q/job/{i}/bury")
    r = api.post("/api/ns/q/deadletter/purge", params={"limit": 1000})
    assert r.json() == {"msg": "purged", "count": 5, "more": False, "cursor": None}
    assert _size(api)["dead"] == 0


def test_http_a_redrive_walk_ends_while_the_jobs_it_moved_die_again(api: httpx.Client) -> None:
    """A walk redrives what was dead when it began: a job it moved that dies again meanwhile
    (its consumer still fails) is not redriven again by the same walk. It used to be: with
    jobs that keep failing, the walk never ended and redrove them over and over."""
    ids = [api.put("/api/ns/rw", content=b"x").json()["job_id"] for _ in range(3)]
    for jid in ids:
        assert api.post(f"/api/ns/rw/job/{jid}/bury").status_code == 200
    redriven: list[str] = []
    cursor, calls = None, 0
    while calls < 30:
        r = api.post(
            "/api/ns/rw/deadletter/redrive",
            params={"limit": 1, **({"cursor": cursor} if cursor else {})},
        )
        assert r.status_code == 200, r.text
        calls += 1
        got = api.get("/api/ns/rw", params={"ttr": 30})  # its consumer fails it at once
        if got.status_code == 200:
            redriven.append(got.json()["job_id"])
            r2 = api.post(f"/api/ns/rw/job/{got.json()['job_id']}/release")
            assert r2.json()["state"] == "dead"
        cursor = r.json()["cursor"]
        if cursor is None:
            break
    assert cursor is None and calls <= 4, (calls, redriven)
    assert sorted(redriven) == sorted(ids)
    assert api.get("/api/ns/rw/size").json()["dead"] == 3


def test_a_sweep_begun_by_an_instance_whose_clock_runs_ahead_goes_on(api: httpx.Client) -> None:
    """A redrive or purge cursor carries when its walk began, by the clock of the instance that
    began it: one a little ahead of this one's was refused mid-walk (400 invalid cursor). It
    goes on, walking up to now; a start a day ahead is no cursor of ours."""
    ahead = now_ms() + 5_000
    for verb in ("redrive", "purge"):
        r = api.post(f"/api/ns/q/deadletter/{verb}", params={"cursor": f"0:::{ahead}"})
        assert r.status_code == 200, r.text
