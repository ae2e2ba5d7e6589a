"""Recurring jobs: the occurrence rule against croniter, and firing against real Redis (every
topology) over simulated time: each occurrence published exactly once with competing firers,
a leadership change, a firer that dies between its claim and its publish, a restart after a
gap inside and beyond the catch-up window, pause, resume and delete, a daylight-saving change;
and the HTTP routes, bad input refused whole."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
import redis
from croniter import croniter  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from cluster_dq.engine import commands as ops
from cluster_dq.engine import schedules as sched_ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import Call, EngineConfig, Eval
from cluster_dq.clock import now_ms
from cluster_dq.errors import Contended
from cluster_dq.firing import Firer
from cluster_dq.pump import Pump
from cluster_dq.settings import PoolSettings
from cluster_dq.keys import QueueKeys, ShardKeys, shard_of
from cluster_dq.models import OCCURRENCE_ID_RE, decode_id, is_client_id_valid
from cluster_dq.localredis import Server
from cluster_dq.pools import close_client, make_client
from cluster_dq.schedules import (
    CLAIM_LEASE_MS,
    FIRE_BATCH,
    ON_TIME_MS,
    Schedule,
    State,
    Template,
    occurrence_id,
    plan,
)
from tests.support import Deployment
from tests.support import ADMIN_AUTH
from tests.support.run import examples

NS, Q = "ns", "sq"
SHARD = shard_of(f"{NS}/{Q}", EngineConfig().shards)
T0 = 1_790_000_000_000  # a Tuesday in 2026, 00:53:20 UTC
REMEMBER = 60_000

# -- the occurrence rule (no Redis) ----------------------------------------------------------

ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    single = st.integers(low, high).map(str)
    step = st.integers(1, max(1, (high - low) // 2)).map(lambda s: f"*/{s}")
    span = st.tuples(st.integers(low, high), st.integers(low, high)).map(
        lambda t: f"{min(t)}-{max(t)}"
    )
    listed = st.lists(st.integers(low, high), min_size=1, max_size=3, unique=True).map(
        lambda xs: ",".join(map(str, sorted(xs)))
    )
    return st.one_of(st.just("*"), single, step, span, listed)


CRONS = st.tuples(
    _field(0, 59), _field(0, 23), st.just("*") | _field(1, 28), _field(1, 12), _field(0, 6)
).map(" ".join)


def _template() -> Template:
    return Template("tick", ttl_ms=3_600_000)


@settings(max_examples=examples(150), deadline=None)
@given(
    expr=CRONS,
    tz=st.sampled_from(ZONES),
    after=st.integers(T0 - 400 * 86_400_000, T0 + 400 * 86_400_000),
)
def test_cron_occurrences_are_croniter_s_from_any_point(expr: str, tz: str, after: int) -> None:
    """The schedule's occurrences after any instant are croniter's in that zone; and resuming
    from just before any occurrence (what a firing step does) continues the same sequence."""
    schedule = Schedule("c", _template(), cron=expr, tz=tz)
    it = croniter(
        expr, datetime.fromtimestamp(after / 1000, tz=timezone.utc).astimezone(ZoneInfo(tz))
    )
    expected = []
    while len(expected) < 6:
        t = int(round(it.get_next(float) * 1000))
        if t > after:
            expected.append(t)
    got = schedule.occurrences(after)
    ours = [next(got) for _ in range(6)]
    assert ours == expected
    assert all(a < b for a, b in zip(ours, ours[1:]))
    for i, t in enumerate(ours[:-1]):
        assert schedule.next_after(t) == ours[i + 1]
        assert schedule.next_after(t - 1) == t


@settings(max_examples=examples(200), deadline=None)
@given(
    every=st.integers(1_000, 10**9),
    start=st.integers(0, 2 * T0),
    after=st.integers(0, 2 * T0),
)
def test_every_occurrences_are_the_start_plus_multiples(every: int, start: int, after: int) -> None:
    schedule = Schedule("e", _template(), every_ms=every, start_ms=start)
    got = schedule.occurrences(after)
    first, second = next(got), next(got)
    assert first > after and second == first + every and (first - start) % every == 0
    assert first >= start and (first - every <= after or first == start)


@settings(max_examples=examples(200), deadline=None)
@given(
    every=st.integers(1_000, 20_000),
    catch_up=st.integers(0, 120_000),
    steps=st.lists(st.tuples(st.integers(0, 200_000), st.booleans()), min_size=1, max_size=40),
)
def test_the_rule_claims_every_occurrence_once_or_counts_it_missed(
    every: int, catch_up: int, steps: list[tuple[int, bool]]
) -> None:
    """A model of the firing state alone: over any steps of time, with claims abandoned at
    random (a firer dying after its claim), every occurrence up to the end is published
    (possibly repeated under the same id, only while its id is remembered) or counted missed,
    and an occurrence is missed only when it was older than the window when first looked at."""
    schedule = Schedule("m", _template(), every_ms=every, catch_up_ms=catch_up)
    state = State.fresh(schedule, T0, False)
    first = state.next_ms
    now = T0
    published: dict[int, list[int]] = {}  # occurrence -> when it was published
    for advance, abandon in steps:
        now += advance
        for _ in range(10_000):
            step = plan(schedule, state, now, REMEMBER)
            if step is None:
                break
            state = step.claimed
            if step.fire and abandon:
                abandon = False
                continue  # the claimer died: the occurrences stay claimed
            for t in step.fire:
                published.setdefault(t, []).append(now)
            state = state.with_(flying=(), claim_ms=0, fired=state.fired + len(step.fire))
    passed = [t for t in range(first, state.next_ms, every)]
    assert all(len(times) == 1 for times in published.values())
    assert set(published) <= set(passed) and not set(published) & set(state.flying)
    # every occurrence the state moved past was published, is claimed, or is counted missed
    assert len(published) + len(state.flying) + state.missed == len(passed)
    assert state.next_ms > now or state.flying  # nothing due left behind but a claim
    if not any(abandon for _, abandon in steps) and max(a for a, _ in steps) <= catch_up:
        assert state.missed == 0 and not state.flying


def test_occurrence_ids_are_client_ids_and_never_server_ids() -> None:
    for name in ["a", "x" * 40, "y" * 64, "0" * 64, "Z-_9" * 16]:
        for t in [0, T0, 2**47]:
            jid = occurrence_id(name, t)
            assert is_client_id_valid(jid) and decode_id(jid) is None, jid
    assert occurrence_id("x" * 64, T0) != occurrence_id("x" * 63 + "y", T0)


# -- firing against Redis over simulated time --------------------------------------------------


class Clock:
    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


class FaultyEngine(AsyncEngine):
    """Fails the next call of a script: before it runs ("crash": the firer died before the
    step) or after it ran (its reply lost and the firer gone). A permanent error, so the
    operation is not repeated: the firing step ends there, as if its process had died."""

    fail: tuple[str, bool] | None = None
    injected = 0
    transient = False  # a lost reply the engine repeats (ConnectionError), not a death
    skip = 0  # matching calls let through before the one that fails

    async def _call(self, call: Call) -> Any:
        if isinstance(call, Eval) and self.fail and self.fail[0] == call.script:
            if self.skip:
                self.skip -= 1
                return await super()._call(call)
            _, after = self.fail
            self.fail = None
            self.injected += 1
            if after:
                await super()._call(call)
            if self.transient:
                raise RedisConnectionError("injected: the reply was lost")
            raise ResponseError("injected: the firer died")
        return await super()._call(call)

    async def _pipeline(self, calls: tuple[Call, ...]) -> list[Any]:
        for c in calls:
            if isinstance(c, Eval) and self.fail and self.fail[0] == c.script:
                self.fail = None
                self.injected += 1
                raise ResponseError("injected: the firer died")
        return await super()._pipeline(calls)


@pytest.fixture
async def engines(
    engine: AsyncEngine, deployment: Deployment
) -> AsyncIterator[tuple[FaultyEngine, FaultyEngine, Clock]]:
    """Two service instances on the topology (two clients), sharing one simulated clock."""
    clock = Clock(T0)
    out = []
    for _ in range(2):
        client = make_client(deployment.pool_settings())
        if isinstance(client, AsyncRedisCluster):
            await client.initialize()
        out.append(FaultyEngine(client, EngineConfig(), clock=clock))
    yield out[0], out[1], clock
    for e in out:
        await close_client(e.client)


async def _put(e: AsyncEngine, schedule: Schedule, paused: bool = False) -> State:
    state, _ = await e.run(sched_ops.put(e.config, NS, Q, schedule, paused, e.clock()))
    return state


async def _drain(e: AsyncEngine, now: int) -> list[str]:
    """Takes and acks every ready job (so a second publish of an id would create a new job
    once the acked-id memory has passed)."""
    out: list[str] = []
    while True:
        jobs = await e.run(ops.consume(e.config, NS, [Q], 60_000, 100, now))
        if not jobs:
            return out
        ids = [j.job_id for j in jobs]
        await e.run(ops.ack(NS, Q, ids, now, e.config.remember_acked_ms))
        out += ids


async def _fire_all(firers: list[Firer]) -> None:
    for _ in range(200):
        waits = await asyncio.gather(*(f.fire_shard(SHARD) for f in firers), return_exceptions=True)
        if all(isinstance(w, int) and w > 0 for w in waits):
            return
    raise AssertionError("firing never settled")


def _expected(schedule: Schedule, after: int, until: int) -> list[str]:
    out = []
    for t in schedule.occurrences(after):
        if t > until:
            return out
        out.append(occurrence_id(schedule.name, t))
    raise AssertionError


async def test_a_changed_definition_counts_the_old_ones_due_occurrences_missed(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    """A changed definition starts again after now: the old one's occurrences that were due
    and not fired yet were dropped silently (fired and missed unchanged). They are counted
    missed; a paused schedule's are not (a resume skips them as well)."""
    a, _, clock = engines
    old = Schedule("chg", _template(), every_ms=1_000)
    assert (await _put(a, old)).next_ms == clock.t + 1_000
    clock.t += 2_500  # occurrences at +1_000 and +2_000 due, no firer ran
    new = Schedule("chg", _template(), every_ms=2_000)
    state = await _put(a, new)
    assert (state.missed, state.fired, state.next_ms) == (2, 0, clock.t + 1_500)
    await _put(a, new, paused=True)
    clock.t += 10_000
    newer = Schedule("chg", _template(), every_ms=3_000)
    assert (await _put(a, newer, paused=True)).missed == 2  # paused: nothing was due
    # a cron's are walked: at +1 min and +2 min due (T0 is not on a minute), then changed
    minutely = Schedule("cron", _template(), cron="* * * * *")
    first = (await _put(a, minutely)).next_ms
    clock.t = first + 60_000 + 30_000
    state = await _put(a, Schedule("cron", _template(), cron="*/2 * * * *"))
    assert state.missed == 2


def test_a_name_shaped_as_a_shortened_one_has_ids_of_its_own() -> None:
    """A 41-character name equal to a long name's shortened form (its first 24 characters,
    ``-``, 16 hex of its sha1) had the long name's occurrence ids: the two schedules shared
    them, one published nothing while counting every occurrence fired."""
    import hashlib

    long = "L" * 30 + "x" * 20
    lookalike = long[:24] + "-" + hashlib.sha1(long.encode()).hexdigest()[:16]
    assert occurrence_id(long, T0) != occurrence_id(lookalike, T0)
    assert occurrence_id("short", T0) == f"s-short-{T0}"
    for name in (long, lookalike, "a" * 30):
        assert OCCURRENCE_ID_RE.fullmatch(occurrence_id(name, T0)), name
        assert OCCURRENCE_ID_RE.fullmatch(occurrence_id(name, 2**47)), name


async def test_every_occurrence_is_published_once_with_competing_firers_and_a_leader_change(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    """Two instances fire at once (both believe they lead), leadership moves from one to the
    other mid-way, and one dies after claiming (before its publish, and after it): over 20
    simulated minutes each occurrence reaches a consumer exactly once, none missed."""
    a, b, clock = engines
    schedule = Schedule("tick", _template(), every_ms=7_000, catch_up_ms=600_000)
    start = clock.t
    await _put(a, schedule)
    leader = {"a": True, "b": True}
    fa = Firer(a, lambda s: leader["a"])
    fb = Firer(b, lambda s: leader["b"])
    seen: list[str] = []
    step = 0
    end = start + 20 * 60_000
    faults = {
        5: (a, ("publish", False)),
        9: (b, ("publish", True)),
        14: (a, ("schedule_set", True)),
    }
    while clock.t < end:
        step += 1
        clock.t += [300, 2_000, 6_900, 7_000, 13_000, 450][step % 6]
        if step == 40:
            leader["a"] = False  # a's lease ran out: b alone from here
        if step == 60:
            leader["a"], leader["b"] = True, False  # and back to a
        if step in faults:
            e, fault = faults[step]
            e.fail = fault
        await _fire_all([fa, fb])
        seen += await _drain(a, clock.t)
    clock.t += CLAIM_LEASE_MS  # a claim abandoned at the very end is taken over
    await _fire_all([fa])
    seen += await _drain(a, clock.t)
    expected = _expected(schedule, start, clock.t)
    assert len(seen) == len(set(seen)), "an occurrence was published twice"
    assert sorted(seen) == sorted(expected)
    got = await a.run(sched_ops.get(NS, Q, "tick"))
    assert got is not None and got[1].missed == 0 and got[1].fired == len(expected)


async def test_a_claim_or_confirmation_repeated_after_a_lost_reply_is_not_a_conflict(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    """The engine repeats a step whose reply was lost; the repeated compare-and-set finds the
    state it set itself and counts as done, so the occurrence is published at once (not after
    the 5-s claim lease) and confirmed."""
    a, _, clock = engines
    schedule = Schedule("lost", _template(), every_ms=10_000)
    start = clock.t
    await _put(a, schedule)
    firer = Firer(a, lambda s: True)
    a.transient = True
    for skip in (0, 1):  # the claim's reply lost, then the confirmation's
        clock.t += 10_000
        a.skip, a.fail = skip, ("schedule_set", True)
        await _fire_all([firer])
        assert a.fail is None  # injected
        assert await _drain(a, clock.t) == _expected(schedule, clock.t - 10_000, clock.t)
    state = (await a.run(sched_ops.get(NS, Q, "lost")))[1]  # type: ignore[index]
    assert state.fired == len(_expected(schedule, start, clock.t)) and not state.flying


async def test_a_gap_inside_the_window_fires_every_missed_occurrence_once_beyond_it_only_the_window(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    a, _, clock = engines
    schedule = Schedule("gap", _template(), every_ms=10_000, catch_up_ms=60_000)
    start = clock.t
    await _put(a, schedule)
    firer = Firer(a, lambda s: True)
    clock.t += 25_000
    await _fire_all([firer])
    seen = await _drain(a, clock.t)
    assert seen == _expected(schedule, start, clock.t)
    # every instance down 55 s (inside the 60-s window): all of them, once
    before = clock.t
    clock.t += 55_000
    await _fire_all([firer])
    seen = await _drain(a, clock.t)
    assert seen == _expected(schedule, before, clock.t) and len(seen) in (5, 6)
    # down 5 minutes: only the occurrences of the last 60 s, the rest counted as missed
    before = clock.t
    clock.t += 300_000
    await _fire_all([firer])
    seen = await _drain(a, clock.t)
    assert seen == _expected(schedule, clock.t - 60_000 - 1, clock.t)
    state = (await a.run(sched_ops.get(NS, Q, "gap")))[1]  # type: ignore[index]
    assert state.missed == len(_expected(schedule, before, clock.t - 60_000 - 1))
    assert state.missed > 0


async def test_catch_up_zero_still_fires_occurrences_a_firer_reaches_a_moment_late(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    """``catch_up_ms: 0`` means "publish nothing after a downtime", not "miss everything": a
    firer never wakes at the occurrence's very millisecond (its timer, a leader's poll, a
    step that fires others first), and an occurrence a moment late is on time. It used to
    count every occurrence missed: a schedule that never fired."""
    a, _, clock = engines
    schedule = Schedule("punctual", _template(), every_ms=1_000, catch_up_ms=0)
    start = clock.t
    await _put(a, schedule)
    firer = Firer(a, lambda s: True)
    seen: list[str] = []
    for _ in range(5):
        nxt = schedule.next_after(clock.t)
        clock.t = nxt + 40  # each occurrence reached 40 ms late
        await _fire_all([firer])
        seen += await _drain(a, clock.t)
    assert seen == _expected(schedule, start, clock.t)
    state = (await a.run(sched_ops.get(NS, Q, "punctual")))[1]  # type: ignore[index]
    assert (state.fired, state.missed) == (5, 0)
    # a real downtime still skips: only what is at most ON_TIME_MS late is published
    before = clock.t
    clock.t += 60_000
    await _fire_all([firer])
    assert await _drain(a, clock.t) == _expected(schedule, clock.t - ON_TIME_MS - 1, clock.t)
    state = (await a.run(sched_ops.get(NS, Q, "punctual")))[1]  # type: ignore[index]
    assert state.missed == len(_expected(schedule, before, clock.t - ON_TIME_MS - 1)) > 50


async def test_an_occurrence_refused_by_a_full_queue_is_counted_missed_not_fired(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    """A queue at its max_size refuses an occurrence's job: the schedule must not count it
    fired (it used to: `fired` grew while no job was written)."""
    a, _, clock = engines
    await a.run(ops.configure(a.config, NS, Q, [("max_size", "2")]))
    schedule = Schedule("capped", _template(), every_ms=1_000, catch_up_ms=60_000)
    start = clock.t
    await _put(a, schedule)
    firer = Firer(a, lambda s: True)
    clock.t += 5_000
    await _fire_all([firer])
    due = _expected(schedule, start, clock.t)
    assert len(due) == 5
    sizes = await a.run(ops.sizes(a.config, NS, Q))
    assert sizes.ready == 2
    state = (await a.run(sched_ops.get(NS, Q, "capped")))[1]  # type: ignore[index]
    assert (state.fired, state.missed) == (2, 3)
    assert await _drain(a, clock.t) == due[:2]


async def test_thousands_of_due_occurrences_fire_in_bounded_batches(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    a, _, clock = engines
    schedule = Schedule("burst", _template(), every_ms=1_000, catch_up_ms=3_600_000)
    start = clock.t
    await _put(a, schedule)
    firer = Firer(a, lambda s: True)
    clock.t += 2_000_000  # 2,000 occurrences due at once
    steps = 0
    while await firer.fire_shard(SHARD) == 0:
        steps += 1
    assert steps >= 2_000 // FIRE_BATCH - 1  # one publish of at most 64 per step
    sizes = await a.run(ops.sizes(a.config, NS, Q))
    assert sizes.ready == len(_expected(schedule, start, clock.t)) == 2_000


async def test_pause_resume_and_delete_stop_and_restart_firing(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    a, _, clock = engines
    schedule = Schedule("pr", _template(), every_ms=5_000)
    await _put(a, schedule)
    firer = Firer(a, lambda s: True)
    clock.t += 12_000
    await _fire_all([firer])
    assert len(await _drain(a, clock.t)) == 2
    await a.run(sched_ops.set_paused(a.config, NS, Q, "pr", True, clock.t))
    clock.t += 60_000
    await _fire_all([firer])
    assert await _drain(a, clock.t) == []
    timers = ShardKeys(SHARD).timers
    assert await a.client.zscore(timers, sched_ops.member_of(NS, Q, "pr")) is None  # at rest
    resumed_at = clock.t
    _, state = await a.run(sched_ops.set_paused(a.config, NS, Q, "pr", False, clock.t))
    assert state.next_ms > resumed_at  # what passed while paused is not fired
    clock.t += 11_000
    await _fire_all([firer])
    assert await _drain(a, clock.t) == _expected(schedule, resumed_at, clock.t)
    await a.run(sched_ops.delete(a.config, NS, Q, "pr"))
    clock.t += 60_000
    await _fire_all([firer])
    assert await _drain(a, clock.t) == []
    assert await a.run(sched_ops.get(NS, Q, "pr")) is None
    assert await a.client.zcard(timers) == 0
    assert await a.client.hlen(QueueKeys(NS, Q).schedules) == 0


async def test_putting_the_same_schedule_again_keeps_its_place(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    """A deploy that PUTs its schedules at every start neither skips nor repeats one."""
    a, _, clock = engines
    schedule = Schedule("same", _template(), every_ms=10_000)
    start = clock.t
    await _put(a, schedule)
    firer = Firer(a, lambda s: True)
    clock.t += 35_000  # three due, not fired yet (every instance was down)
    await _put(a, schedule)
    await _fire_all([firer])
    assert await _drain(a, clock.t) == _expected(schedule, start, clock.t)


async def test_a_cron_schedule_across_daylight_saving_changes(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    """Paris, 2026: 02:30 does not exist on 29 March and happens twice on 25 October.
    Fired over those days, the schedule publishes croniter's occurrences, once each."""
    a, _, clock = engines
    paris = ZoneInfo("Europe/Paris")
    for day in (datetime(2026, 3, 27, 12, tzinfo=paris), datetime(2026, 10, 23, 12, tzinfo=paris)):
        await a.client.delete(QueueKeys(NS, Q).schedules)
        clock.t = int(day.timestamp() * 1000)
        start = clock.t
        schedule = Schedule("dst", _template(), cron="30 2 * * *", tz="Europe/Paris")
        await _put(a, schedule)
        firer = Firer(a, lambda s: True)
        seen: list[str] = []
        for _ in range(4 * 24):
            clock.t += 3_600_000
            await _fire_all([firer])
            seen += await _drain(a, clock.t)
        expected = _expected(schedule, start, clock.t)
        assert seen == expected
        local = [
            datetime.fromtimestamp(int(i.rsplit("-", 1)[1]) / 1000, tz=paris).strftime(
                "%d %H:%M %z"
            )
            for i in seen
        ]
        if day.month == 3:  # 02:30 does not exist on the 29th: croniter fires at 03:00
            assert local == ["28 02:30 +0100", "29 03:00 +0200", "30 02:30 +0200", "31 02:30 +0200"]
        else:  # 02:30 happens twice on the 25th: croniter fires at both
            assert local == [
                "24 02:30 +0200",
                "25 02:30 +0200",
                "25 02:30 +0100",
                "26 02:30 +0100",
                "27 02:30 +0100",
            ]


async def test_real_pumps_fire_once_across_a_killed_leader(
    engines: tuple[FaultyEngine, FaultyEngine, Clock],
) -> None:
    """Two real pumps (service clock, leases in Redis) on the schedule's shard; the leader is
    killed (its tasks cancelled, its lease left to run out) and the other takes over: the
    jobs are consecutive occurrences, none twice, none missing."""
    a, b, _ = engines
    for e in (a, b):
        e.clock = now_ms
    schedule = Schedule("live", _template(), every_ms=1_000)
    first = (await _put(a, schedule)).next_ms
    pumps = [Pump(e, [SHARD], lease_ms=900, poll_ms=100, reconcile_every_s=0) for e in (a, b)]
    for p in pumps:
        p.start()
    try:
        await _wait_until(lambda: any(p.leads(SHARD) for p in pumps), "a leader")
        await _published_through(a, "live", first + 1_000)  # two by the first leader
        leader, other = pumps if pumps[0].leads(SHARD) else pumps[::-1]
        for t in leader._tasks:  # killed: no lease given back
            t.cancel()
        _, running = await asyncio.wait(leader._tasks, timeout=10)
        assert not running, f"cancelled 10 s ago, still running: {running}"
        killed_at = now_ms()
        await _wait_until(lambda: other.leads(SHARD), "the other takes over")
        await _published_through(a, "live", killed_at + 2_000)  # two due since the kill
        await a.run(sched_ops.delete(a.config, NS, Q, "live"))
    finally:
        for p in pumps:
            await p.stop()
    ids = await _drain(a, now_ms())
    times = sorted(int(i.rsplit("-", 1)[1]) for i in ids)
    assert len(set(times)) == len(times) and times[0] < killed_at < times[-1]
    assert times == list(range(times[0], times[-1] + 1, 1_000))
    state_gone = await a.run(sched_ops.get(NS, Q, "live"))
    assert state_gone is None


async def _published_through(e: AsyncEngine, name: str, at_ms: int, within: float = 20.0) -> None:
    """Waits until schedule ``name`` has published (claimed and confirmed) every occurrence
    up to ``at_ms``."""
    deadline = time.monotonic() + within
    while True:
        found = await e.run(sched_ops.get(NS, Q, name))
        assert found is not None, name
        state = found[1]
        if state.next_ms > at_ms and not state.flying:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"never published through {at_ms}: {state}")
        await asyncio.sleep(0.05)


async def _wait_until(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


# -- HTTP ----------------------------------------------------------------------------------------


@pytest.fixture
def api(service: tuple[str, str], sync_redis: redis.Redis) -> Iterator[httpx.Client]:
    base, admin = service
    token = httpx.post(f"{admin}/token/{NS}", params={"description": "t"}, auth=ADMIN_AUTH).json()[
        "token"
    ]
    with httpx.Client(base_url=base, headers={"X-Token": token}, timeout=30) as client:
        yield client


def _raw(client: redis.Redis) -> dict[Any, Any]:
    return client.hgetall(QueueKeys(NS, Q).schedules)  # type: ignore[return-value]


def test_a_publish_cannot_take_a_schedules_occurrence_id(
    api: httpx.Client, sync_redis: redis.Redis
) -> None:
    """An occurrence's id (``s-<name>-<ms>``) given as a publish's ``job_id`` would take that
    occurrence's place: its body delivered, the schedule's own job never published though
    counted as fired. Refused (400 naming ``job_id``), nothing written; an id of that shape
    but for the 13 to 15 digits (an occurrence is never before now, nor after 2^47 ms) is a
    client id like any other."""
    r = api.put(f"/api/{NS}/{Q}/schedules/sx", json={"every_ms": 2_000, "job": {"body": "real"}})
    assert r.status_code == 201, r.text
    at = api.get(f"/api/{NS}/{Q}/schedules/sx").json()["next_at_ms"]
    before = _raw(sync_redis), sync_redis.hlen(QueueKeys(NS, Q).jobs)
    far = occurrence_id("sx", 2**47)  # the latest start_ms: 15 digits
    for forged in [occurrence_id("sx", at + 2_000), occurrence_id("n" * 40, at), far]:
        r = api.put(f"/api/{NS}/{Q}", params={"job_id": forged}, content=b"forged")
        assert r.status_code == 400, r.text
        assert "job_id" in r.json()["error"] and "schedule" in r.json()["error"]
    assert (_raw(sync_redis), sync_redis.hlen(QueueKeys(NS, Q).jobs)) == before
    for fine in ["s-sx-2000", "s-sx-1795466700000000", "sx-1795466700000"]:
        r = api.put(f"/api/{NS}/{Q}", params={"job_id": fine}, content=b"mine")
        assert r.status_code == 201, (fine, r.text)
    api.delete(f"/api/{NS}/{Q}/schedules/sx")


BAD: list[tuple[str, Any, str]] = [
    ("/api/ns/sq/schedules/bad.name", {"every_ms": 5000}, "name"),
    ("/api/ns/sq/schedules/" + "n" * 65, {"every_ms": 5000}, "name"),
    ("/api/ns/sq/schedules/x", {"cron": "61 * * * *"}, "cron"),
    ("/api/ns/sq/schedules/x", {"cron": "* * * *"}, "cron"),
    ("/api/ns/sq/schedules/x", {"cron": "0 0 30 2 *"}, "cron"),
    # croniter's random fields: a new draw at every evaluation, so no two firing steps (or
    # instances) agree on the next occurrence
    ("/api/ns/sq/schedules/x", {"cron": "R R * * *"}, "cron"),
    ("/api/ns/sq/schedules/x", {"cron": "0 r(1-5) * * *"}, "cron"),
    ("/api/ns/sq/schedules/x", {"cron": "R/15 * * * *"}, "cron"),
    ("/api/ns/sq/schedules/x", {"cron": "*/5 * * * *", "tz": "Mars/Olympus"}, "tz"),
    ("/api/ns/sq/schedules/x", {"cron": "*/5 * * * *", "every_ms": 5000}, "cron"),
    ("/api/ns/sq/schedules/x", {}, "cron"),
    ("/api/ns/sq/schedules/x", {"every_ms": 999}, "every_ms"),
    ("/api/ns/sq/schedules/x", {"every_ms": "5000"}, "every_ms"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "tz": "UTC"}, "tz"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "catch_up_ms": -1}, "catch_up_ms"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "catch_up_ms": 8 * 86_400_000}, "catch_up_ms"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "paused": "yes"}, "paused"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "color": 1}, "color"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "job": {"tries": 0}}, "job.tries"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "job": {"tries": -1}}, "job.tries"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "job": {"priority": 256}}, "job.priority"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "job": {"delay_ms": -1}}, "job.delay_ms"),
    (
        "/api/ns/sq/schedules/x",
        {"every_ms": 5000, "job": {"delay_ms": 10, "ttl_ms": 10}},
        "job.ttl",
    ),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "job": {"body": 5}}, "job.body"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "job": []}, "job"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "job": {"group": "a b"}}, "job.group"),
    ("/api/ns/sq/schedules/x", {"every_ms": 5000, "job": {"group": 7}}, "job.group"),
    ("/api/ns/sq/schedules/x", [1], "body"),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD)
def test_bad_schedules_are_refused_and_change_nothing(
    api: httpx.Client, sync_redis: redis.Redis, path: str, body: Any, field: str
) -> None:
    # first due far away: one due during the test (every minute, on the minute, unless
    # start_ms says otherwise) fired between the two looks at Redis, a rare failure
    good = api.put(
        "/api/ns/sq/schedules/x",
        json={"every_ms": 60_000, "start_ms": 2**46, "job": {"body": "k"}},
    )
    assert good.status_code == 201
    before = _raw(sync_redis)
    r = api.put(path, json=body)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]
    assert _raw(sync_redis) == before


def test_not_json_and_unknown_schedules(api: httpx.Client, sync_redis: redis.Redis) -> None:
    r = api.put("/api/ns/sq/schedules/x", content=b"{not json")
    assert r.status_code == 400 and _raw(sync_redis) == {}
    for method, path in [
        ("GET", "/api/ns/sq/schedules/nope"),
        ("DELETE", "/api/ns/sq/schedules/nope"),
        ("POST", "/api/ns/sq/schedules/nope/pause"),
        ("POST", "/api/ns/sq/schedules/nope/resume"),
    ]:
        r = api.request(method, path)
        assert (r.status_code, r.json()) == (404, {"error": "schedule not found"})
    assert api.get("/api/ns/sq/schedules", params={"limit": 0}).status_code == 400
    assert api.get("/api/ns/sq/schedules", params={"limit": 101}).status_code == 400
    assert api.get("/api/ns/sq/schedules", params={"cursor": "x"}).status_code == 400
    assert httpx.get(f"{str(api.base_url).rstrip('/')}/api/ns/sq/schedules").status_code == 401


def test_bodies_python_cannot_take_are_refused_not_500s(
    api: httpx.Client, sync_redis: redis.Redis
) -> None:
    """JSON allows a lone surrogate in a string ("\\ud800"), which UTF-8 cannot encode, and
    nests arrays deeper than Python's recursion limit: both were 500s (found documenting the
    route for OpenAPI). Now a 400 naming the field, and nothing written."""
    for raw, field in [
        (b'{"every_ms": 5000, "job": {"body": "\\ud800"}}', "job.body"),
        (b'{"cron": "* * * * *", "job": {"body": "a\\udfffb"}}', "job.body"),
        (b"[" * 100_000, "body"),
        (b'{"every_ms": 5000, "job": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "body"),
    ]:
        r = api.put("/api/ns/sq/schedules/x", content=raw)
        assert r.status_code == 400, r.text
        assert field in r.json()["error"]
    assert _raw(sync_redis) == {}


def test_schedule_routes_and_real_firing(api: httpx.Client) -> None:
    """Create, read, list (paged), pause, resume, replace, delete; and the running service's
    pump fires an every-second schedule on its own, each job under its occurrence's id."""
    r = api.put(
        "/api/ns/sq/schedules/nightly",
        json={"cron": "0 3 * * *", "tz": "Europe/Paris", "job": {"body": "report", "tries": 3}},
    )
    assert r.status_code == 201
    got = r.json()
    assert got["name"] == "nightly" and got["tz"] == "Europe/Paris" and got["paused"] is False
    local = datetime.fromtimestamp(got["next_at_ms"] / 1000, tz=ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute) == (3, 0) and got["next_at_ms"] > time.time() * 1000
    assert got["job"] == {
        "body": "report",
        "delay_ms": 0,
        "ttl_ms": 86_400_000,
        "tries": 3,
        "priority": 0,
    }
    assert api.put("/api/ns/sq/schedules/nightly", json={"cron": "0 4 * * *"}).status_code == 200
    assert api.get("/api/ns/sq/schedules/nightly").json()["cron"] == "0 4 * * *"
    for i in range(5):
        assert (
            api.put(f"/api/ns/sq/schedules/s{i}", json={"every_ms": 3_600_000}).status_code == 201
        )
    names: list[str] = []
    cursor = "0"
    for _ in range(20):
        page = api.get("/api/ns/sq/schedules", params={"cursor": cursor, "limit": 2}).json()
        names += [s["name"] for s in page["schedules"]]
        cursor = page["cursor"]
        if cursor == "0":
            break
    assert sorted(set(names)) == ["nightly", "s0", "s1", "s2", "s3", "s4"]
    paused = api.post("/api/ns/sq/schedules/s0/pause").json()
    assert paused["paused"] is True and paused["next_at_ms"] is None
    assert api.post("/api/ns/sq/schedules/s0/resume").json()["paused"] is False
    assert api.delete("/api/ns/sq/schedules/s0").status_code == 204
    assert api.get("/api/ns/sq/schedules/s0").status_code == 404
    for name in ["nightly", "s1", "s2", "s3", "s4"]:  # none of them may fire into what follows
        assert api.delete(f"/api/ns/sq/schedules/{name}").status_code == 204
    api.delete("/api/ns/sq")  # in case one fired meanwhile (an hour began)

    fast = {"every_ms": 1_000, "job": {"group": "tenant-9"}}
    r = api.put("/api/ns/sq/schedules/fast", json=fast)
    assert r.status_code == 201 and r.json()["job"]["group"] == "tenant-9"
    deadline = time.monotonic() + 20
    ids: list[str] = []
    while len(ids) < 3 and time.monotonic() < deadline:
        r = api.get("/api/ns/sq", params={"timeout": 2, "count": 10})
        if r.status_code == 200:
            ids += [j["job_id"] for j in r.json()]
            assert {j["group"] for j in r.json()} == {"tenant-9"}  # each job in its group
    assert len(ids) >= 3 and len(set(ids)) == len(ids)
    times = sorted(int(i.rsplit("-", 1)[1]) for i in ids)
    assert all(i.startswith("s-fast-") for i in ids)
    assert all(t % 1_000 == 0 for t in times) and times == list(
        range(times[0], times[0] + 1_000 * len(times), 1_000)
    )
    assert api.delete("/api/ns/sq/schedules/fast").status_code == 204


def test_a_put_that_loses_every_compare_and_set_is_a_409_that_changed_nothing() -> None:
    """A schedule changed by others between each read and its compare-and-set, every time the
    PUT tries: the PUT gives up with Contended (409: repeat it), not a 400 blaming the input."""
    op = sched_ops.put(
        EngineConfig(), NS, Q, Schedule("busy", Template("b"), every_ms=1_000), False, 0
    )
    step = next(op)
    tries = 0
    with pytest.raises(Contended):
        while True:
            if isinstance(step, Eval):  # schedule_set: lost to another writer
                tries += 1
                step = op.send([0, 1])
            else:  # the read: absent each time (deleted again by the other writer)
                step = op.send([None, None])
    assert tries == sched_ops.CAS_TRIES


@pytest.fixture
async def old_pool(
    redis_server: Server, engines: tuple[FaultyEngine, FaultyEngine, Clock]
) -> AsyncIterator[FaultyEngine]:
    """A second pool (standalone, DB 9) on the engines' clock: the pool a queue moves from."""
    with redis.Redis(port=redis_server.port, db=9) as r:
        r.flushdb()
    client = make_client(PoolSettings("old", Addr=f"127.0.0.1:{redis_server.port}", DB=9))
    e = FaultyEngine(client, EngineConfig(), clock=engines[2])
    yield e
    await close_client(client)


async def test_a_schedule_moved_to_a_new_pool_publishes_each_occurrence_once(
    engines: tuple[FaultyEngine, FaultyEngine, Clock], old_pool: FaultyEngine
) -> None:
    """A queue's schedule moves from ``old`` (standalone) to the pool under test while an
    occurrence is claimed on ``old`` and not published (its firer died), and while a firer of
    ``old`` that knows nothing of the move (an instance not restarted yet) goes on firing
    there, and while the first move dies half-way (marked on ``old``, not yet on the new
    pool): over both pools, every occurrence reaches a consumer exactly once, none missed;
    the new pool holds the schedule with its counts, the old one nothing."""
    new, _, clock = engines
    old = old_pool
    schedule = Schedule("tick", _template(), every_ms=7_000, catch_up_ms=600_000)
    start = clock.t
    await _put(old, schedule)
    seen: list[str] = []
    firer = Firer(old, lambda s: True)
    for _ in range(5):  # fired on old
        clock.t += 7_000
        await _fire_all([firer])
        seen += await _drain(old, clock.t)
    clock.t += 7_000
    old.fail = ("publish", False)  # claims the occurrence, dies before publishing it
    await _fire_all([firer])
    state = (await old.run(sched_ops.get(NS, Q, "tick")))[1]  # type: ignore[index]
    assert state.flying  # claimed, not confirmed
    mover = Firer(old, lambda s: True, move_to=new)
    stale = Firer(old, lambda s: True)  # an instance that does not know of the move yet
    on_new = Firer(new, lambda s: True)
    new.fail = ("schedule_set", False)  # the first move dies before the new pool has it
    for step in range(30):
        clock.t += [300, 2_000, 6_900, 7_000, 450][step % 5]
        await _fire_all([stale, mover, on_new] if step % 2 else [mover, stale, on_new])
        seen += await _drain(old, clock.t) + await _drain(new, clock.t)
    assert new.injected == 1  # the first move did die half-way
    expected = _expected(schedule, start, clock.t)
    assert len(seen) == len(set(seen)), "an occurrence was published twice"
    assert sorted(seen) == sorted(expected)
    assert await old.run(sched_ops.get(NS, Q, "tick")) is None
    moved = await new.run(sched_ops.get(NS, Q, "tick"))
    assert moved is not None and moved[0] == schedule
    assert moved[1].fired == len(expected) and moved[1].missed == 0
