"""The model-based test's groups (tests/engine/test_model.py): ``GroupsModel``, the same machine
with the groups' rules weighted up, on a fifth of the examples; a history written out that loses
a group change's reply; and each rule of groups shown alone, on small cases that fail plainly.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule, run_state_machine_as_test

from cluster_dq.engine import commands as ops
from cluster_dq.engine import control
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import Group, GroupChanges, Rate
from cluster_dq.models import JobSpec
from tests.support.model_harness import (
    EXAMPLES,
    NS,
    STATS,
    grouped_jobs,
    machine_settings,
    picks,
    ttrs,
)
from tests.support.model_ref import EVENTS
from tests.support.model_rules import EngineModel


class GroupsModel(EngineModel):
    """The same machine, its groups' rules weighted up (a share of the examples): grouped jobs
    ready at once in bulk, consumes of several jobs, acks and group settings twice as often,
    so that jobs are held back and brought back, wait for their rate's turns and go on them, in
    a history of 40 steps."""

    @initialize(
        conc=st.sampled_from([1, 1, 2]),
        rate=st.sampled_from([(2, 300), (1, 1_000), (3, 1_000), (5, 2)]),
    )
    def limits(self, conc: int, rate: tuple[int, int]) -> None:
        """Group g2 of queue a under a rate (5/2 ms: several turns a millisecond), beside g1
        (maybe limited: first_group_settings) and g3; g1 of queue b at a concurrency limit."""
        self.configure_group("a", "g2", None, None, rate)
        self.configure_group("b", "g1", None, conc, None)

    @rule(q=st.sampled_from(["a", "a", "b"]), raw=grouped_jobs)
    def publish_grouped(self, q: str, raw: list[tuple[str, int]]) -> None:
        """Grouped jobs, most of them ready at once: groups matter once their jobs are
        consumed (fair turns, holding back, rate turns), and most of the other publishes'
        jobs wait."""
        self.publish_bulk(q, [(None, d, 0, 2, 0, g) for g, d in raw])

    @rule(q=st.sampled_from(["a", "a", "b"]), raw=grouped_jobs)
    def publish_grouped_again(self, q: str, raw: list[tuple[str, int]]) -> None:
        self.publish_grouped(q, raw)

    @rule(queues=st.sampled_from([["a"], ["a"], ["a", "b"]]), ttr=ttrs, count=st.integers(2, 3))
    def consume_several(self, queues: list[str], ttr: int, count: int) -> None:
        self.consume(queues, ttr, count)

    @rule(q=st.sampled_from(["a", "a", "b"]), raw=grouped_jobs)
    def publish_grouped_3(self, q: str, raw: list[tuple[str, int]]) -> None:
        self.publish_grouped(q, raw)

    @rule(queues=st.sampled_from([["a"], ["a"], ["a", "b"]]), ttr=ttrs, count=st.integers(2, 3))
    def consume_several_2(self, queues: list[str], ttr: int, count: int) -> None:
        self.consume(queues, ttr, count)

    @rule(queues=st.sampled_from([["a"], ["b"], ["a", "b"]]), ttr=ttrs, count=st.integers(1, 3))
    def consume_3(self, queues: list[str], ttr: int, count: int) -> None:
        self.consume(queues, ttr, count)

    @rule(i=picks, leased=st.booleans())
    def ack_again(self, i: int, leased: bool) -> None:
        self.ack(i, leased)

    @rule(i=picks, leased=st.booleans())
    def ack_3(self, i: int, leased: bool) -> None:
        self.ack(i, leased)

    @rule(i=picks, delay=st.sampled_from([0, 0, 20]), leased=st.booleans())
    def release_again(self, i: int, delay: int, leased: bool) -> None:
        self.release(i, delay, leased, "")

    @rule(ms=st.sampled_from([150, 334, 500, 1_000]))
    def advance_a_turn(self, ms: int) -> None:
        self.advance(ms)  # (a rate's turns: 2/300 ms, 3/s, 1/s)

    @rule(
        q=st.sampled_from(["a", "b"]),
        group=st.sampled_from(["g1", "g1", "g2"]),
        paused=st.sampled_from([None, None, True, False, False]),
        conc=st.sampled_from([None, 1, 2, 2, 0]),
        rate=st.sampled_from([None, None, None, (2, 300), (3, 1_000), (5, 2), 0]),
    )
    def configure_group_again(
        self,
        q: str,
        group: str,
        paused: bool | None,
        conc: int | None,
        rate: tuple[int, int] | int | None,
    ) -> None:
        self.configure_group(q, group, paused, conc, rate)


def test_groups_match_the_model(deployment_for_model: Any) -> None:
    GroupsModel.deployment = deployment_for_model
    STATS.clear()
    EVENTS.clear()
    # a fifth of the examples (tests/engine/test_model.py has the rest)
    run_state_machine_as_test(GroupsModel, settings=machine_settings(max(2, EXAMPLES // 5)))


def test_the_model_agrees_when_a_group_changes_reply_is_lost(
    deployment_for_model: Any,
) -> None:
    """A history written out (random ones seldom lose this reply while a group holds jobs back
    with room to run them): group g1 of queue a at its limit of 1, two of its jobs held back;
    the reply of a change to a limit of 2 lost, then of a change of its rate, then of a
    resume; the model checks each step as the machine does (a repeat of a change after a lost
    reply finds the same settings: it brings nothing more back)."""
    GroupsModel.deployment = deployment_for_model
    m = GroupsModel()
    try:
        m.configure_group("a", "g1", None, 1, None)
        m.engine_agrees()
        m.publish_grouped("a", [("g1", 0)] * 3)
        m.engine_agrees()
        m.consume(["a"], 20_000, 3)  # one reserved, two held back
        m.engine_agrees()
        assert m.model.group_view("a", "g1")[1:3] == (1, 2)
        for change in [(None, 2, None), (True, None, (2, 300)), (False, None, None)]:
            m.fault("lost", 0, 0)
            m.configure_group("a", "g1", *change)
            assert m.fired() is not None and m.fired().step == "group_configure"
            m.engine_agrees()
    finally:
        m.teardown()


# -- groups, each rule shown alone -------------------------------------------------------------
# What the model checks in passing, on small cases that fail plainly: each test below failed on
# an earlier version of groups (fixed in 7793940 and after).

GQ = "gd"  # the queue of these tests
T0 = 1_800_000_000_000


async def _publish(
    engine: AsyncEngine, now: int, group: str | None, n: int = 1, **kw: Any
) -> list[str]:
    specs = [JobSpec(b"x", group=group, **kw) for _ in range(n)]
    return [p.job_id for p in await engine.run(ops.publish(engine.config, NS, GQ, specs, now))]


async def _take(engine: AsyncEngine, now: int, count: int = 1) -> list[Any]:
    return await engine.run(ops.consume(engine.config, NS, (GQ,), 60_000, count, now))


async def _configure(engine: AsyncEngine, now: int, group: str, **kw: Any) -> Group:
    changes = GroupChanges(**kw)
    return await engine.run(ops.configure_group(engine.config, NS, GQ, group, changes, now))


async def test_a_group_entering_before_any_delivery_waits_one_round(engine: AsyncEngine) -> None:
    await _publish(engine, T0, "heavy", 30)
    (light,) = await _publish(engine, T0 + 20, "light")  # 20 ms later, before any consume
    order = [j.job_id for j in await _take(engine, T0 + 30, count=30)]
    assert order.index(light) <= 1, f"the light group's job came {order.index(light) + 1}th"


async def test_a_held_job_comes_back_within_a_round(engine: AsyncEngine) -> None:
    """A job held back comes back just behind READY's head (one round at most), not behind
    its group's backlog. (Its group's younger jobs at the head may go before it: the order
    within a limited group is not kept, so that a job waiting at the head is not passed.)"""
    await _configure(engine, T0, "one", concurrency=1)
    mine = await _publish(engine, T0, "one", 10)
    await _publish(engine, T0, "many", 10)
    first = await _take(engine, T0 + 1, count=2)  # one of each
    assert sorted(j.group for j in first) == ["many", "one"]
    await _take(engine, T0 + 1, count=2)  # one's 2nd, 3rd held back, many's 2nd, 3rd reserved
    done = next(j for j in first if j.group == "one")
    await engine.run(ops.ack(NS, GQ, [done.job_id], T0 + 2))  # its slot freed: the 2nd is back
    order = [j.job_id for j in await _take(engine, T0 + 3, count=4)]
    assert mine[1] in order[:3] or mine[3] in order[:2], order  # within a round"


async def test_an_ungrouped_job_is_not_passed_by_later_grouped_jobs(engine: AsyncEngine) -> None:
    await _publish(engine, T0, "g1")
    await _take(engine, T0)
    (plain,) = await _publish(engine, T0 + 1_000, None)
    await _publish(engine, T0 + 2_000, "g2", 20)  # a second later
    order = [j.job_id for j in await _take(engine, T0 + 2_001, count=21)]
    assert order.index(plain) <= 1, f"the ungrouped job came {order.index(plain) + 1}th"


async def test_a_rescheduled_job_does_not_pass_its_groups_rate(engine: AsyncEngine) -> None:
    await _configure(engine, T0, "r", rate=Rate(1, 10_000))
    a, b = await _publish(engine, T0, "r", 2)
    assert [j.job_id for j in await _take(engine, T0, count=2)] == [a]  # b's turn: T0 + 10 s
    await engine.run(control.reschedule_job(engine.config, NS, GQ, b, T0 + 1, T0 + 1))
    assert await _take(engine, T0 + 1, count=2) == [], "a second job within the rate's 10 s"


async def test_the_dead_letter_lists_a_dead_grouped_job(engine: AsyncEngine) -> None:
    (plain,) = await _publish(engine, T0, "g1")
    (rich,) = await _publish(engine, T0, "g1", attributes={"a": "b"})
    for job_id in (plain, rich):
        await engine.run(control.bury(NS, GQ, job_id, "why", T0 + 1))
    page, _ = await engine.run(control.dead_page(NS, GQ, None, 10))
    assert sorted(d.job_id for d in page) == sorted([plain, rich])


async def test_the_same_group_change_twice_brings_back_no_more(engine: AsyncEngine) -> None:
    await _configure(engine, T0, "g1", concurrency=1)
    await _publish(engine, T0, "g1", 4)
    assert len(await _take(engine, T0, count=10)) == 1  # 1 reserved, 3 held back
    g = await _configure(engine, T0 + 1, "g1", concurrency=2)
    assert (g.reserved, g.held) == (1, 2)  # room for one more: one back
    g = await _configure(engine, T0 + 2, "g1", concurrency=2)  # (a repeat after a lost reply)
    assert (g.reserved, g.held) == (1, 2), "the same change again brought back another job"


async def test_a_group_entering_under_a_priority_job_waits_one_round(engine: AsyncEngine) -> None:
    await _publish(engine, T0, "heavy", 10)
    await _publish(engine, T0 + 1_000, None, priority=9)  # READY's head while it waits
    (light,) = await _publish(engine, T0 + 1_001, "light")
    order = [j.job_id for j in await _take(engine, T0 + 1_002, count=12)]
    assert order.index(light) <= 2, f"the light group's job came {order.index(light) + 1}th"


async def test_a_resumed_group_takes_turns_with_the_others(engine: AsyncEngine) -> None:
    await _configure(engine, T0, "p", paused=True)
    await _publish(engine, T0, "p", 10)
    assert await _take(engine, T0 + 1) == []  # all ten held back
    await _publish(engine, T0 + 2, "b", 10)
    await _configure(engine, T0 + 3, "p", paused=False)  # all ten back at READY's head
    order = [j.group for j in await _take(engine, T0 + 4, count=20)]
    assert "b" in order[:3], order


async def test_a_group_at_its_limit_does_not_pass_a_waiting_job_again_and_again(
    engine: AsyncEngine,
) -> None:
    await _configure(engine, T0, "heavy", concurrency=1)
    await _publish(engine, T0, "heavy", 10)
    (running,) = await _take(engine, T0 + 1, count=10)  # one reserved, nine held back
    (light,) = await _publish(engine, T0 + 2, "light")  # waits in READY
    order = []
    for i in range(4):  # one consumer, one job at a time: its job done, it asks for the next
        await engine.run(ops.ack(NS, GQ, [running.job_id], T0 + 3 + i))
        (running,) = await _take(engine, T0 + 3 + i)
        order.append(running.group)
        if running.job_id == light:
            break
    assert "light" in order[:2], order


def test_the_model_agrees_when_a_busy_periods_first_reply_is_lost(
    deployment_for_model: Any,
) -> None:
    """A history written out: group g1 of queue a publishes, is served and acked while g3 keeps
    a job waiting (its last tag stays); the next grouped publish into the empty ready set
    begins a busy period, and its reply is lost, then the same again: the engine repeats the
    call (one period, not two: the repeat finds its jobs) and the model checks the groups' last
    tags, their periods and GROUPS `e` as the machine does."""
    GroupsModel.deployment = deployment_for_model
    m = GroupsModel()
    try:
        m.publish_grouped("a", [("g1", 0)] * 3 + [("g3", 60_000)])
        m.engine_agrees()
        m.consume(["a"], 20_000, 3)
        m.engine_agrees()
        for i in range(3):
            m.ack(i, True)
        m.engine_agrees()
        for _ in range(2):
            m.fault("lost", 0, 0)
            m.publish_grouped("a", [("g2", 0), ("g1", 0)])
            assert m.fired() is not None and m.fired().step == "publish"
            m.engine_agrees()
            m.consume(["a"], 20_000, 2)
            m.engine_agrees()
        assert m.model.tags.get(("a", "")) == 3  # three periods begun, each once
    finally:
        m.teardown()
