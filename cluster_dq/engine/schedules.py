"""Recurring jobs as engine operations: pure step builders and reply decoding, as the other operations (steps.py).

A schedule lives in its queue's ``schedules`` hash (tag ``{ns/q}``); its shard's ``timers``
zset (tag ``{shard-N}``) says when a firer looks at it next. Every change of a schedule is one
``schedule_set`` call, a compare-and-set of its state; the timer is set in a separate step
after it (another slot), as a publish's shard ``signal`` is. A firing step claims due
occurrences with that compare-and-set, publishes them through ``publish.publish`` under
their deterministic ids, then confirms them (``cluster_dq/schedules.py`` has the rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster_dq.engine.publish import publish
from cluster_dq.engine.steps import EngineConfig, Op, fixed_keys, lua
from cluster_dq.errors import BadRequest, Contended, NotFound
from cluster_dq.keys import QueueKeys, ShardKeys, shard_of
from cluster_dq.schedules import (
    CLAIM_LEASE_MS,
    MAX_SCHEDULES_PER_QUEUE,
    NEVER,
    Schedule,
    State,
    occurrence_id,
    plan,
)
from cluster_dq.engine.steps import Cmd

CAS_TRIES = 8  # a request's compare-and-set against concurrent firers and writers


def member_of(ns: str, q: str, name: str) -> str:
    """The timer index member of a schedule: ``ns/q/name`` (no part contains ``/``)."""
    return f"{ns}/{q}/{name}"


def parse_member(member: str | bytes) -> tuple[str, str, str]:
    text = member.decode() if isinstance(member, bytes) else member
    ns, q, name = text.split("/")
    return ns, q, name


def _timers(cfg: EngineConfig, ns: str, q: str) -> str:
    return ShardKeys(shard_of(f"{ns}/{q}", cfg.shards)).timers


def _read(qk: QueueKeys, name: str) -> Op[tuple[Schedule, bytes] | None]:
    d, s = yield Cmd(("HMGET", qk.schedules, f"d:{name}", f"s:{name}"))
    if d is None or s is None:
        return None
    return Schedule.from_json(d), s


def _set(
    qk: QueueKeys, name: str, expected: bytes | str, state: str, definition: str = ""
) -> Op[tuple[bool, int]]:
    done, count = yield lua(
        "schedule_set",
        {"queue": fixed_keys(qk), "schedules": qk.schedules},
        name=name,
        expected=expected,
        state=state,
        definition=definition,
        limit=MAX_SCHEDULES_PER_QUEUE,
    )
    return int(done) == 1, int(count)


def _set_timer(cfg: EngineConfig, ns: str, q: str, name: str, at: int | None) -> Op[None]:
    if at is not None:
        yield Cmd(("ZADD", _timers(cfg, ns, q), at, member_of(ns, q, name)))


def get(ns: str, q: str, name: str) -> Op[tuple[Schedule, State] | None]:
    found = yield from _read(QueueKeys(ns, q), name)
    return None if found is None else (found[0], State.decode(found[1]))


def put(
    cfg: EngineConfig, ns: str, q: str, schedule: Schedule, paused: bool, now: int
) -> Op[tuple[State, bool]]:
    """Creates or replaces a schedule; (its state, whether it was created). The same
    definition again keeps its firing state (only ``paused`` changes), so a deploy that PUTs
    its schedules at every start neither skips nor repeats an occurrence; a changed one starts
    afresh from ``now`` (its counts kept). Raises ``BadRequest`` when the queue is full."""
    qk = QueueKeys(ns, q)
    definition = schedule.to_json()
    for _ in range(CAS_TRIES):
        found = yield from _read(qk, schedule.name)
        raw: bytes | str = ""
        if found is None:
            state = State.fresh(schedule, now, paused)
        else:
            old_def, raw = found
            old = State.decode(raw)
            if old_def == schedule:
                state = _paused(schedule, old, paused, now)
            else:
                fresh = State.fresh(schedule, now, paused)
                passed = 0 if old.paused else _passed(old_def, old.next_ms, now)
                state = fresh.with_(fired=old.fired, missed=old.missed + passed)
        done, count = yield from _set(qk, schedule.name, raw, state.encode(), definition)
        if done:
            yield from _set_timer(cfg, ns, q, schedule.name, state.due_at())
            return state, found is None
        if found is None and count >= MAX_SCHEDULES_PER_QUEUE:
            raise BadRequest(
                f"too many schedules in this queue (at most {MAX_SCHEDULES_PER_QUEUE})", "name"
            )
    raise _busy()


MOST_COUNTED = 1_000  # a cron's occurrences a change of definition counts missed, at most


def _passed(schedule: Schedule, next_ms: int, now: int) -> int:
    """Occurrences of ``schedule`` from ``next_ms`` (its next, not fired) up to ``now``: those
    a change of definition leaves unfired, counted missed. Every N ms: counted exactly; a cron:
    walked, up to ``MOST_COUNTED`` (about 50 ms of croniter; more would stall the loop)."""
    if next_ms > now:
        return 0
    if schedule.every_ms is not None:
        return (now - next_ms) // schedule.every_ms + 1
    n, t = 0, next_ms
    while t <= now and n < MOST_COUNTED:
        n, t = n + 1, schedule.next_after(t)
    return n


def _paused(schedule: Schedule, state: State, paused: bool, now: int) -> State:
    """``state`` paused or resumed. Occurrences that passed while a schedule was paused are
    not fired when it resumes: it goes on from the next one after ``now``."""
    if paused or not state.paused:
        return state.with_(paused=paused)
    nxt = state.next_ms if state.next_ms > now else schedule.next_after(now)
    return state.with_(paused=False, next_ms=nxt)


def set_paused(
    cfg: EngineConfig, ns: str, q: str, name: str, paused: bool, now: int
) -> Op[tuple[Schedule, State]]:
    qk = QueueKeys(ns, q)
    for _ in range(CAS_TRIES):
        found = yield from _read(qk, name)
        if found is None:
            raise NotFound("schedule not found")
        schedule, raw = found
        state = _paused(schedule, State.decode(raw), paused, now)
        done, _ = yield from _set(qk, name, raw, state.encode())
        if done:
            # A pause leaves the timer: the firer that finds the schedule paused drops it
            # (schedule_unindex), so a pause racing a resume cannot leave it unindexed.
            yield from _set_timer(cfg, ns, q, name, state.due_at())
            return schedule, state
    raise _busy()


def delete(cfg: EngineConfig, ns: str, q: str, name: str) -> Op[None]:
    qk = QueueKeys(ns, q)
    for _ in range(CAS_TRIES):
        found = yield from _read(qk, name)
        if found is None:
            raise NotFound("schedule not found")
        done, _ = yield from _set(qk, name, found[1], "")
        if done:
            yield Cmd(("ZREM", _timers(cfg, ns, q), member_of(ns, q, name)))
            return
    raise _busy()


# -- a queue moving to another pool (``firing.move_schedule`` drives these, pool by pool) ------

MOVING = "moving"  # the generation of a schedule being moved away: "moving0", "moving1"


def is_moving(state: State) -> bool:
    return state.gen.startswith(MOVING)


def was_paused(state: State) -> bool:
    """Whether a schedule being moved was paused by its user before the move began."""
    return state.gen == f"{MOVING}1"


def mark_moving(cfg: EngineConfig, ns: str, q: str, name: str) -> Op[tuple[Schedule, State] | None]:
    """A move's first step, on the pool the queue leaves: the schedule stops firing there (one
    compare-and-set: paused, under the generation ``MOVING``, which keeps the user's pause;
    a firer's claim or confirmation made after it fails). Its definition and that state;
    None when there is no such schedule. A schedule marked already is answered as it is.
    Its timer is set to ``NEVER``: no firer takes it as due (and drops it as paused), and the
    migrating pool's firer, which looks at every timer, finishes a move cut short."""
    qk = QueueKeys(ns, q)
    for _ in range(CAS_TRIES):
        found = yield from _read(qk, name)
        if found is None:
            return None
        schedule, raw = found
        state = State.decode(raw)
        if is_moving(state):
            return schedule, state
        moving = state.with_(gen=f"{MOVING}{int(state.paused)}", paused=True)
        done, _ = yield from _set(qk, name, raw, moving.encode())
        if done:
            yield from _set_timer(cfg, ns, q, name, NEVER)
            return schedule, moving
    raise _busy()


def adopt(cfg: EngineConfig, ns: str, q: str, schedule: Schedule, state: State) -> Op[bool]:
    """A move's second step, on the pool the queue moves to: the schedule with the state it
    had, unless one of that name is there already (a move done before; or a PUT made there
    since, which stands). True when this step put it there."""
    qk = QueueKeys(ns, q)
    done, _ = yield from _set(qk, schedule.name, "", state.encode(), schedule.to_json())
    if done:
        yield from _set_timer(cfg, ns, q, schedule.name, state.due_at())
        return True
    if (yield from _read(qk, schedule.name)) is None:  # refused: the queue is full there
        raise BadRequest(
            f"too many schedules in this queue on the pool it moves to "
            f"(at most {MAX_SCHEDULES_PER_QUEUE}): schedule {schedule.name} not moved",
            "name",
        )
    return False


def forget_moved(cfg: EngineConfig, ns: str, q: str, name: str, moving: State) -> Op[None]:
    """A move's last step, on the pool the queue left: the schedule goes, if it is still as
    ``mark_moving`` left it, and so does its timer."""
    yield from _set(QueueKeys(ns, q), name, moving.encode(), "")
    yield Cmd(("ZREM", _timers(cfg, ns, q), member_of(ns, q, name)))


def drop_timer(cfg: EngineConfig, ns: str, q: str, name: str) -> Op[None]:
    """The timer of a schedule that is not there any more."""
    yield Cmd(("ZREM", _timers(cfg, ns, q), member_of(ns, q, name)))


def timers(shard: int, limit: int) -> Op[list[str]]:
    """The shard's first ``limit`` timer members, due or not (``ns/q/name``)."""
    found = yield Cmd(("ZRANGE", ShardKeys(shard).timers, 0, limit - 1))
    return [m.decode() if isinstance(m, bytes) else m for m in found]


def _busy() -> Contended:
    return Contended(
        "the schedule kept being changed by others meanwhile; nothing was changed, try again"
    )


def page(ns: str, q: str, cursor: int, count: int) -> Op[tuple[int, list[tuple[Schedule, State]]]]:
    """One page of a queue's schedules (HSCAN: a schedule changed meanwhile may be seen twice
    or not at all). The next cursor (0: done) and the schedules."""
    qk = QueueKeys(ns, q)
    nxt, found = yield Cmd(("HSCAN", qk.schedules, cursor, "MATCH", "d:*", "COUNT", count))
    pairs = list(found.items()) if isinstance(found, dict) else list(zip(found[::2], found[1::2]))
    if not pairs:
        return int(nxt), []
    names = [(k.decode() if isinstance(k, bytes) else k)[2:] for k, _ in pairs]
    states = yield Cmd(("HMGET", qk.schedules, *(f"s:{n}" for n in names)))
    out = [
        (Schedule.from_json(d), State.decode(s))
        for (_, d), s in zip(pairs, states, strict=True)
        if s is not None
    ]
    out.sort(key=lambda item: item[0].name)
    return int(nxt), out


# -- firing -----------------------------------------------------------------------------------


def _pairs(flat: Any) -> list[tuple[Any, float]]:
    """ZRANGE ... WITHSCORES as (member, score) pairs, however the client parsed it."""
    items = list(flat)
    if items and isinstance(items[0], (tuple, list)):
        return [(m, float(s)) for m, s in items]
    return [(m, float(s)) for m, s in zip(items[::2], items[1::2])]


def look(shard: int, now: int, limit: int) -> Op[tuple[list[tuple[str, float]], int | None]]:
    """Claims the shard's schedules whose timer is due: each timer is pushed to a lease
    (``now + CLAIM_LEASE_MS``, plus half a ms so that no writer's whole-ms timer equals it),
    where it is looked at again should the firer die. (member, lease) pairs, and, when none
    is due, the shard's earliest timer (ms; None: no timer) from the same round trip, so an
    idle look costs one."""
    timers = ShardKeys(shard).timers
    found, head = yield (
        Cmd(("ZRANGE", timers, "-inf", now, "BYSCORE", "LIMIT", 0, limit)),
        Cmd(("ZRANGE", timers, 0, 0, "WITHSCORES")),
    )
    if not found:
        first = _pairs(head)
        return [], int(first[0][1]) if first else None
    lease = now + CLAIM_LEASE_MS + 0.5
    args: list[Any] = []
    for m in found:
        args += [repr(lease), m]
    yield Cmd(("ZADD", timers, "XX", *args))
    return [(m.decode() if isinstance(m, bytes) else m, lease) for m in found], None


def due(shard: int, now: int, limit: int) -> Op[list[tuple[str, float]]]:
    """``look``'s claimed schedules only."""
    claimed, _ = yield from look(shard, now, limit)
    return claimed


def next_timer(shard: int) -> Op[int | None]:
    head = _pairs((yield Cmd(("ZRANGE", ShardKeys(shard).timers, 0, 0, "WITHSCORES"))))
    return int(head[0][1]) if head else None


@dataclass(frozen=True, slots=True)
class Fired:
    """What one firing step did: occurrences it published (each is published by one step:
    the one that confirms its claim), of them the jobs it created (an occurrence published
    again after a lost reply finds its job there already), occurrences it counted as
    missed, and whether more are due now."""

    published: int = 0
    created: int = 0
    missed: int = 0
    more: bool = False


def fire(cfg: EngineConfig, shard: int, member: str, lease: float, now: int) -> Op[Fired]:
    """One firing step of one schedule (the firer claimed its timer at ``lease``)."""
    ns, q, name = parse_member(member)
    qk = QueueKeys(ns, q)
    timers = ShardKeys(shard).timers
    found = yield from _read(qk, name)
    state = None if found is None else State.decode(found[1])
    if found is None or state is None or state.paused:
        yield lua("schedule_unindex", {"timers": timers}, member=member, score=repr(lease))
        return Fired()
    schedule, raw = found
    step = plan(schedule, state, now, cfg.remember_acked_ms)
    if step is None:
        yield from _set_timer(cfg, ns, q, name, state.due_at())
        return Fired()
    claimed = step.claimed
    done, _ = yield from _set(qk, name, raw, claimed.encode())
    if not done:
        return Fired()  # another firer or a writer changed it: whoever did sets its timer
    missed = claimed.missed - state.missed
    if not step.fire:
        yield from _set_timer(cfg, ns, q, name, claimed.due_at())
        return Fired(missed=missed, more=claimed.next_ms <= now)
    specs = [
        schedule.job.spec(occurrence_id(name, t), t + schedule.job.delay_ms) for t in step.fire
    ]
    published = yield from publish(cfg, ns, q, specs, now)
    new = sum(1 for p in published if not p.duplicate and not p.full)
    refused = sum(1 for p in published if p.full)  # the queue is at its max_size: missed
    confirmed = claimed.with_(
        flying=(),
        claim_ms=0,
        fired=claimed.fired + len(specs) - refused,
        missed=claimed.missed + refused,
    )
    done, _ = yield from _set(qk, name, claimed.encode(), confirmed.encode())
    if done:
        yield from _set_timer(cfg, ns, q, name, confirmed.due_at())
    return Fired(len(specs) - refused, new, missed + refused, done and confirmed.next_ms <= now)
