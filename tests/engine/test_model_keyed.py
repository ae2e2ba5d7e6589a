"""The model-based test's keyed publishes (tests/engine/test_model.py): ``KeyedModel``, the same
machine with its publishes under a dedup key or an Idempotency-Key weighted up, faults aimed at
them and time moved to the ends of their windows, on a fifth of the examples; a history
written out that reaches every outcome of a throttle window and an Idempotency-Key, faults
included; and the open defects the model found there, each shown alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine import control
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.models import Dedup, Idempotency, JobSpec
from tests.support.model_harness import (
    EXAMPLES,
    IDEM_MS,
    QUEUES,
    STATS,
    Fault,
    dedup_keys,
    dedup_modes,
    delays,
    groups,
    idem_keys,
    keyed_ids,
    machine_settings,
    prios,
    ttls,
    windows,
)
from tests.support.lost_reply import first_reply_lost
from tests.support.model_publish_keyed import fingerprint
from tests.support.model_ref import EVENTS
from tests.support.model_rules import EngineModel

faults = st.tuples(
    st.sampled_from(["lost", "lost", "before", "stall", *Fault.REFUSALS]),
    st.sampled_from([0, 10, 600, 25_000]),
)
# other clients' moves while a keyed publish's repeat is held (its reply lost): its job taken,
# acked, buried or nacked (released, a delay), another publish under the key (its mode), time
# passing (ms, within the repeat's budget)
moves_between = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["take", "take", "ack", "bury"]), st.none()),
        st.tuples(st.just("publish"), dedup_modes),
        st.tuples(st.just("advance"), st.sampled_from([1, 40, 900, 4_000])),
        st.tuples(st.just("nack"), st.sampled_from([0, 6_000])),
    ),
    min_size=1,
    max_size=4,
)
bulks = st.lists(
    st.tuples(keyed_ids, delays, ttls, st.integers(1, 3), prios, groups), min_size=1, max_size=3
)


class KeyedModel(EngineModel):
    """The same machine, its keyed publishes three times as often, one in three of them under a
    fault aimed at its script (a lost reply, a failure before sending, a refusal, a stall), and
    time moved to a window's end (a millisecond before, at, or after it), so that throttle
    windows and Idempotency-Keys' answers are found, end, and are found ended within 40
    steps, with their jobs reserved, dead or gone meanwhile."""

    def arm(self, fault: tuple[str, int]) -> None:
        if self.net.armed is None:  # (one armed at a time)
            self.net.armed = Fault(fault[0], 0, fault[1])  # step 0: the publish_keyed script

    @rule(
        q=st.sampled_from(QUEUES),
        key=dedup_keys,
        mode=dedup_modes,
        window=windows,
        delay=delays,
        ttl=ttls,
        tries=st.integers(1, 3),
        group=groups,
        job_id=keyed_ids,
    )
    def publish_deduplicated_again(
        self,
        q: str,
        key: str,
        mode: str,
        window: int,
        delay: int,
        ttl: int,
        tries: int,
        group: str | None,
        job_id: str | None,
    ) -> None:
        self.publish_deduplicated(q, key, mode, window, delay, ttl, tries, group, job_id)

    @rule(
        fault=faults,
        q=st.sampled_from(QUEUES),
        key=dedup_keys,
        mode=dedup_modes,
        window=windows,
        delay=delays,
        tries=st.integers(1, 3),
        job_id=keyed_ids,
    )
    def publish_deduplicated_under_a_fault(
        self,
        fault: tuple[str, int],
        q: str,
        key: str,
        mode: str,
        window: int,
        delay: int,
        tries: int,
        job_id: str | None,
    ) -> None:
        self.arm(fault)
        self.publish_deduplicated(q, key, mode, window, delay, 0, tries, None, job_id)

    @rule(
        q=st.sampled_from(QUEUES),
        key=dedup_keys,
        mode=dedup_modes,
        window=windows,
        delay=st.sampled_from([0, 0, 0, 40, 900]),
        job_id=keyed_ids,
        ikey=st.sampled_from([None, None, "i1"]),
        moves=moves_between,
    )
    def publish_deduplicated_repeated_after_other_moves(
        self,
        q: str,
        key: str,
        mode: str,
        window: int,
        delay: int,
        job_id: str | None,
        ikey: str | None,
        moves: list[tuple[str, Any]],
    ) -> None:
        """A publish under a dedup key (with an Idempotency-Key now and then) whose reply is
        lost, other clients moving before the engine's repeat: SPEC §2.7's lost reply with the
        world changing in between (KeyedPublishRules.keyed_publish_held)."""
        spec = JobSpec(b"x", delay_ms=delay, job_id=job_id)
        request = ([spec], Dedup(key, mode, window if mode == "throttle" else 0))
        idem = Idempotency(ikey, fingerprint(request)) if ikey is not None else None
        self.keyed_publish_held("publish deduplicated, repeat held", q, request, idem, moves)

    @rule(
        q=st.sampled_from(QUEUES),
        ikey=idem_keys,
        again=st.sampled_from([True, True, False]),
        raw=bulks,
        key=st.sampled_from([None, None, "k1", "k2"]),
        mode=dedup_modes,
        window=windows,
    )
    def publish_idempotent_again(
        self,
        q: str,
        ikey: str,
        again: bool,
        raw: list[tuple[str | None, int, int, int, int, str | None]],
        key: str | None,
        mode: str,
        window: int,
    ) -> None:
        self.publish_idempotent(q, ikey, again, raw, key, mode, window)

    @rule(
        fault=faults,
        q=st.sampled_from(QUEUES),
        ikey=idem_keys,
        again=st.sampled_from([True, True, False]),
        raw=bulks,
        key=st.sampled_from([None, None, "k1", "k2"]),
        mode=dedup_modes,
        window=windows,
    )
    def publish_idempotent_under_a_fault(
        self,
        fault: tuple[str, int],
        q: str,
        ikey: str,
        again: bool,
        raw: list[tuple[str | None, int, int, int, int, str | None]],
        key: str | None,
        mode: str,
        window: int,
    ) -> None:
        self.arm(fault)
        self.publish_idempotent(q, ikey, again, raw, key, mode, window)

    @rule(i=st.integers(0, 100), what=st.sampled_from(["consume", "ack", "bury", "bury"]))
    def settle_a_keys_job(self, i: int, what: str) -> None:
        """A job a key names (a throttle window's, a simple or debounce key's) consumed, acked
        or buried, so that keys are found with their jobs reserved, gone or dead."""
        named = sorted(
            {(q, k.ids[0]) for (q, f), k in self.model.keyed.items() if f.startswith("t:")}
            | {(q, job_id) for (q, _), job_id in self.model.dedup.items()}
        )
        if not named:
            return
        q, job_id = named[i % len(named)]
        if what == "consume":
            self.consume([q], 20_000, 3)
        elif what == "ack":
            self.ack_many(q, [job_id])
        else:
            self.bury_one(q, job_id)

    @rule(offset=st.sampled_from([-1, 0, 0, 1, 30]))
    def advance_to_a_windows_end(self, offset: int) -> None:
        """The clock to the end of the next throttle window or kept answer, give or take
        ``offset`` ms (-1: its last moment; 0: it has just ended)."""
        ends = sorted(k.until for k in self.model.keyed.values() if k.until > self.clock.now)
        target = ends[0] + offset if ends else self.clock.now + 1
        self.advance(max(1, target - self.clock.now))


def test_keyed_publishes_match_the_model(deployment_for_model: Any) -> None:
    KeyedModel.deployment = deployment_for_model
    STATS.clear()
    EVENTS.clear()
    # a fifth of the examples (tests/engine/test_model.py and test_model_groups.py the rest)
    run_state_machine_as_test(KeyedModel, settings=machine_settings(max(2, EXAMPLES // 5)))


def test_a_history_written_out_reaches_every_keyed_outcome(deployment_for_model: Any) -> None:
    """Every outcome of a throttle window and of an Idempotency-Key, in one history the model
    checks step by step as the machine does (random histories reach them too; this one does in
    every run): a window found with its job ready, reserved or dead (a debounce refused), gone (a
    simple and a debounce publish answered its id, with no state); the window's end to the
    millisecond; a simple key's job holding before a window; a lost reply and a refusal on the
    script; an answer replayed (after its jobs were acked too), another request refused, a
    replay after a lost reply, a refusal kept for nothing, and the answer's window ended."""
    KeyedModel.deployment = deployment_for_model
    before = STATS.copy()
    m = KeyedModel()

    def dedup(q: str, key: str, mode: str, window: int = 0, delay: int = 0) -> None:
        m.publish_deduplicated(q, key, mode, window, delay, 0, 1, None, None)
        m.engine_agrees()

    def idem(q: str, key: str, again: bool, n: int = 2) -> None:
        m.publish_idempotent(q, key, again, [(None, 0, 0, 1, 0, None)] * n, None, "simple", 0)
        m.engine_agrees()

    def only(q: str) -> str:
        (job_id,) = [k[1] for k, j in m.model.jobs.items() if j is not None and k[0] == q]
        return job_id

    try:
        dedup("a", "k1", "throttle", 5_000)  # new: a window of 5 s
        dedup("a", "k1", "throttle", 5_000)  # existing: the window's job, ready
        m.consume(["a"], 30_000, 1)
        m.engine_agrees()
        dedup("a", "k1", "debounce")  # refused: the window's job is reserved
        m.bury_one("a", only("a"))
        m.engine_agrees()
        dedup("a", "k1", "debounce")  # refused: the window's job is dead
        dedup("a", "k1", "simple")  # existing: the window's job, dead
        m.dead_letters("a", 1, 0, True)  # (deleted)
        m.engine_agrees()
        dedup("a", "k1", "simple")  # existing: the window's job, gone
        dedup("a", "k1", "debounce")  # existing too
        m.advance_to_a_windows_end(-1)
        dedup("a", "k1", "throttle", 40)  # its last millisecond: existing
        m.advance_to_a_windows_end(0)
        dedup("a", "k1", "throttle", 40)  # ended: new
        dedup("a", "k2", "simple", delay=9_000)  # a simple key's job holds before a window
        dedup("a", "k2", "throttle", 900)
        m.fault("lost", 0, 0)  # (its repeat told as a replay: idem-repeat-replayed, tolerated)
        m.publish_idempotent("a", "i2", False, [(None, 0, 0, 1, 0, None)], "k2", "debounce", 0)
        m.engine_agrees()
        m.fault("lost", 0, 0)
        dedup("b", "k1", "throttle", 900)  # run twice: one job, told new
        m.fault("noreplicas", 0, 600)
        dedup("b", "k2", "throttle", 900)  # refused, then done 600 ms later
        idem("b", "i1", False)  # the first answer kept
        idem("b", "i1", True)  # replayed
        m.consume(["b"], 30_000, 3)
        m.engine_agrees()
        m.ack_many("b", [k[1] for k, j in m.model.jobs.items() if j is not None and k[0] == "b"])
        m.engine_agrees()
        idem("b", "i1", True)  # replayed, its jobs acked
        idem("b", "i1", False)  # another request: refused
        m.fault("lost", 0, 0)
        idem("b", "i1", True)  # replayed, run twice
        m.configure("b", ("max_size", "4"))
        m.engine_agrees()
        idem("b", "i2", False, 5)  # full: refused, nothing kept
        m.configure("b", ("max_size", ""))
        m.engine_agrees()
        idem("b", "i2", True, 5)  # so the same request is done now
        m.advance(IDEM_MS)
        idem("b", "i1", True)  # the answer's window ended: done afresh
    finally:
        m.teardown()
    reached = {k for k, v in (STATS - before).items() if v}
    for outcome in [
        "dedup throttle: free -> new",
        "dedup throttle: held by a window (ready) -> existing",
        "dedup debounce: held by a window (reserved) -> refused: debounce of a job not waiting",
        "dedup debounce: held by a window (dead) -> refused: debounce of a job not waiting",
        "dedup simple: held by a window (dead) -> existing",
        "dedup simple: held by a window -> existing",
        "dedup debounce: held by a window -> existing",
        "dedup throttle: held by a window -> existing",
        "dedup throttle: free (its throttle window ended) -> new",
        "dedup throttle: held by a job (delayed) -> existing",
        "keyed fault: reply lost: run twice -> new",
        "keyed fault: refused (nothing written): repeated -> new",
        "keyed fault: reply lost: run twice -> replay",
        "keyed fault: reply lost: run twice -> replaced (the repeat found its answer)",
        "idem: first answer",
        "idem: replay",
        "idem: mismatch",
        "idem: refused (nothing kept)",
        "idem: window ended: first answer",
    ]:
        assert outcome in reached, f"{outcome!r} not reached: {sorted(reached)}"


def test_a_history_written_out_moves_between_a_lost_reply_and_its_repeat(
    deployment_for_model: Any,
) -> None:
    """Each mode's publish whose reply is lost, other clients moving before the engine's
    repeat (random histories reach these too; this one does in every run): a debounce's job
    taken, acked and another made under the key; a debounce's replacement taken; a simple
    key's job acked and another made; a throttle window ended and another opened; an answer
    kept under an Idempotency-Key, its job taken and acked."""
    KeyedModel.deployment = deployment_for_model
    before = STATS.copy()
    m = KeyedModel()

    def held(
        q: str, key: str, mode: str, moves: list[tuple[str, Any]], ikey: str = "", tries: int = 1
    ) -> None:
        request = ([JobSpec(b"x", tries=tries)], Dedup(key, mode, 40 if mode == "throttle" else 0))
        idem = Idempotency(ikey, fingerprint(request)) if ikey else None
        m.keyed_publish_held("publish, repeat held", q, request, idem, moves)
        m.engine_agrees()

    try:
        held("a", "k1", "debounce", [("take", None), ("ack", None), ("publish", "debounce")])
        held("a", "k3", "debounce", [("publish", "debounce")])  # its own job, replaced since
        held("a", "k4", "debounce", [("take", None), ("nack", 6_000)], tries=3)  # taken, nacked
        m.ack_many("a", [k[1] for k, j in m.model.jobs.items() if j is not None and k[0] == "a"])
        m.publish_deduplicated("a", "k2", "debounce", 0, 9_000, 0, 1, None, None)
        held("a", "k2", "debounce", [("advance", 9_000), ("take", None)])  # its replacement
        held("b", "k1", "simple", [("take", None), ("ack", None), ("publish", "simple")])
        held("b", "k2", "throttle", [("advance", 40), ("publish", "throttle")])
        held("b", "k3", "simple", [("take", None), ("ack", None)], ikey="i1")
    finally:
        m.teardown()
    reached = {k for k, v in (STATS - before).items() if v}
    for outcome in [
        "keyed repeat after take+ack+publish: debounce: free -> debounce: held by another since "
        "this call made its job (ready)",
        "keyed repeat after advance+take: debounce: held by a job (delayed) -> debounce: held by "
        "a job (reserved)",
        "keyed repeat after take+ack+publish: simple: free -> simple: held by another since this "
        "call made its job (ready)",
        "keyed repeat after advance+publish: throttle: free -> throttle: held by another since "
        "this call made its job (ready)",
        "keyed repeat after take+ack: simple: free -> replay",
        "keyed repeat after publish: debounce: free -> debounce: held by a job (ready)",
        "keyed repeat after take+nack: debounce: free -> debounce: held by a job (delayed)",
    ]:
        assert outcome in reached, f"{outcome!r} not reached: {sorted(reached)}"


# -- defects the model found, each shown alone ------------------------------------------------


async def _lose_the_first_reply(engine: AsyncEngine, op: Any) -> Any:
    """Runs ``op`` as the service does, its keyed publish's first reply lost."""
    with first_reply_lost(engine, "publish_keyed") as lost:
        got = await engine.run(op, idempotent=True)
    assert lost
    return got


@pytest.mark.parametrize("mode", ["simple", "debounce"])
async def test_the_services_own_repeat_of_an_idempotent_publish_is_told_as_the_first(
    engine: AsyncEngine, mode: str
) -> None:
    """docs/api.md: "The service's own repeat of a request whose job ids it made finds its own
    answer and tells it as the first (no Idempotent-Replayed)". A publish with an
    Idempotency-Key under a dedup key another job holds: its first answer is that job
    (existing; replaced for a debounce); the reply is lost, the engine repeats the call, which
    finds that answer kept under the key. It was told as a replay: the answer names the
    holder, not the ids the call made up. The kept answer now names the ids of the call that
    made it (lua/publish_keyed.lua ``own_ids``)."""
    t = now_ms()
    cfg = engine.config
    first = await engine.run(
        ops.publish_keyed(cfg, "ns", "q", [JobSpec(b"a")], t, Dedup("k"), None), idempotent=True
    )
    op = ops.publish_keyed(
        cfg, "ns", "q", [JobSpec(b"b")], t + 1, Dedup("k", mode), Idempotency("i", bytes(16))
    )
    got = await _lose_the_first_reply(engine, op)
    assert got.published[0].job_id == first.published[0].job_id
    assert got.dedup == ("existing" if mode == "simple" else "replaced")
    assert not got.replayed, "its first answer, told as a replay"


async def test_a_dead_jobs_key_taken_over_by_a_throttle_publish_is_not_held_again(
    engine: AsyncEngine,
) -> None:
    """docs/api.md, on a dead job and its simple or debounce key: "The next publish under the
    key takes it over [...] Revived after that, the old job comes back beside the new one
    [...] only the new one holds it". When that next publish is a throttle one, it makes a new
    job and a window on it; it left the key's `k:` field naming the dead job, so that job,
    revived, held the key again and a publish under the key answered it. The throttle publish
    now drops that field."""
    t = now_ms()
    cfg = engine.config

    async def publish(mode: str, at: int, ttl: int = 0) -> str:
        op = ops.publish_keyed(cfg, "ns", "q", [JobSpec(b"a")], t + at, Dedup("k", mode, ttl), None)
        return str((await engine.run(op, idempotent=True)).published[0].job_id)

    old = await publish("simple", 0)
    await engine.run(control.bury("ns", "q", old, "why", t + 1))
    new = await publish("throttle", 2, 60_000)  # the next publish under the key: a new job
    assert new != old
    await engine.run(control.kick(cfg, "ns", "q", old, 0, 1, 0, t + 3))  # revived
    assert await publish("simple", 4) == new, "the revived job holds the key again"
