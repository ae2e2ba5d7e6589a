"""Every Lua script, run on a real 3-master Redis Cluster (with replicas).

Standalone Redis checks nothing about keys; a Cluster node refuses a script that touches a key
of another slot, and redis-py refuses to send one whose declared keys span slots. So this is
the test that proves every script declares its keys under one hash tag.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine import control
from cluster_dq.engine import schedules as schedule_ops
from cluster_dq.engine.control import DeadFilter
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import Call, Eval
from cluster_dq.engine.scripts import load_all
from cluster_dq.keys import BUCKET_WIDTH_MS, shard_of
from cluster_dq.models import JobSpec, JobState
from cluster_dq.pump import Pump
from cluster_dq.schedules import Schedule, Template
from cluster_dq.waiters import WaiterHub

MIN = 60_000


class RecordingEngine(AsyncEngine):
    seen: set[str]

    async def _call(self, call: Call) -> Any:
        if isinstance(call, Eval):
            self.seen.add(call.script)
        return await super()._call(call)

    async def _pipeline(self, calls: tuple[Call, ...]) -> list[Any]:
        self.seen.update(c.script for c in calls if isinstance(c, Eval))
        return await super()._pipeline(calls)


async def test_every_script_runs_on_a_cluster(cluster_engine: AsyncEngine) -> None:
    engine = RecordingEngine(cluster_engine.client, cluster_engine.config)
    engine.seen = set()
    cfg = engine.config
    run = engine.run
    t = now_ms()
    # queues whose tags hash to different slots / masters
    for q in ("alpha", "beta", "gamma"):
        published = await run(
            ops.publish(
                cfg,
                "ns",
                q,
                [
                    JobSpec(b"ready"),
                    JobSpec(b"near", delay_ms=1_000),
                    JobSpec(b"wheel", delay_ms=10 * MIN),
                    JobSpec(b"mine", job_id=f"id-{q}"),
                ],
                t,
            )
        )
        assert [p.state for p in published] == [
            JobState.READY,
            JobState.DELAYED,
            JobState.DELAYED,
            JobState.READY,
        ]
        wheel_id = published[2].job_id
        assert (await run(ops.peek_job("ns", q, wheel_id))).state is JobState.DELAYED  # type: ignore[union-attr]
        assert (await run(ops.peek(cfg, "ns", q, "ready", t))) is not None
        jobs = await run(ops.consume(cfg, "ns", [q], 1_000, 2, t))
        assert len(jobs) == 2
        assert await run(ops.touch(cfg, "ns", q, jobs[1].job_id, 60_000, t)) is True
        assert await run(ops.progress("ns", q, jobs[1].job_id, b'{"step":1}', t, jobs[1].lease))
        assert await run(ops.release(cfg, "ns", q, [jobs[1].job_id], 0, t)) == [JobState.READY]
        acked = await run(ops.ack("ns", q, [jobs[0].job_id, wheel_id], t, results=[b'"ok"', None]))
        assert acked == [JobState.RESERVED, JobState.DELAYED]
        await run(ops.configure(cfg, "ns", q, [("paused", "1"), ("max_size", "100")]))
        assert await run(ops.consume(cfg, "ns", [q], 1_000, 1, t)) == []  # paused
        await run(ops.configure(cfg, "ns", q, [("paused", ""), ("max_size", "")]))
        await run(ops.configure_group(cfg, "ns", q, "g", ops.GroupChanges(rate=ops.Rate(1, 10)), t))
        old, new = await run(
            ops.republish(cfg, "ns", q, f"id-{q}", JobSpec(b"v2", delay_ms=10 * MIN), t)
        )
        assert old is JobState.READY and not new.duplicate
        dedup, idem = ops.Dedup("dk", "throttle", MIN), ops.Idempotency("ik", bytes(16))
        keyed = await run(ops.publish_keyed(cfg, "ns", q, [JobSpec(b"k")], t, dedup, idem))
        assert keyed.dedup == "new" and not keyed.replayed
        s = await run(ops.tick(cfg, "ns", q, t + 10 * MIN - cfg.open_lead_ms))  # opens the bucket
        assert s.delayed == 1 or s.ready >= 1
        await run(ops.consume(cfg, "ns", [q], 10, 10, t + 10 * MIN))
        s = await run(ops.tick(cfg, "ns", q, t + 10 * MIN + 20))  # ttr passed: tries exhausted
        assert s.dead >= 1
        assert await run(ops.respawn(cfg, "ns", q, 1, 0, t)) == 1
        assert await run(ops.delete_dead("ns", q, 100)) >= 0
        a, b = await run(
            ops.publish(cfg, "ns", q, [JobSpec(b"a", delay_ms=10 * MIN), JobSpec(b"b")], t)
        )
        moved = await run(control.reschedule_job(cfg, "ns", q, a.job_id, t + 5_000, t))
        assert moved is not None and moved.state is JobState.DELAYED
        for jid in (a.job_id, b.job_id):
            buried = await run(control.bury("ns", q, jid, "why", t))
            assert buried is not None and buried.state is JobState.DEAD
        page, _ = await run(control.dead_page("ns", q, None, 10))
        assert {d.job_id for d in page} >= {a.job_id, b.job_id}
        kicked = await run(control.kick(cfg, "ns", q, a.job_id, 0, 1, 0, t))
        assert kicked is not None and kicked.state is JobState.READY
        redriven = await run(
            control.redrive_dead(cfg, "ns", q, DeadFilter("buried"), None, 10, 0, 1, 0, t)
        )
        assert redriven.count == 1
        await run(control.bury("ns", q, b.job_id, "", t))
        assert (await run(control.purge_dead("ns", q, DeadFilter(), None, 10))).count >= 1
        await run(ops.publish(cfg, "ns", q, [JobSpec(b"late", delay_ms=MIN + BUCKET_WIDTH_MS)], t))
        await run(ops.publish(cfg, "ns", q, [JobSpec(b"far", delay_ms=10 * MIN)], t))
        assert await run(control.widen_wheel(cfg, "ns", q)) >= 1
        assert await run(ops.destroy(cfg, "ns", q)) >= 1
        assert await run(ops.sizes(cfg, "ns", q)) == ops.Sizes(0, 0, 0, 0, None)
    epoch = await run(ops.lead(3, "me", 1_000))
    assert epoch > 0
    await run(ops.claim(3, t, 10, 1_000, epoch))
    assert await run(ops.rate_limit("dq:{admin}:rl:x", 1, 1_000))
    assert not await run(ops.rate_limit("dq:{admin}:rl:x", 1, 1_000))
    await run(ops.reschedule(3, "ns/x", None, epoch))
    await run(ops.publish(cfg, "ns", "ttl", [JobSpec(b"x", ttl_ms=5)], t))
    await run(ops.tick(cfg, "ns", "ttl", t + 10))
    every = Schedule("c", Template("b"), every_ms=1_000)
    await run(schedule_ops.put(cfg, "ns", "sched", every, False, t))
    shard = shard_of("ns/sched", cfg.shards)
    fired = 0
    for member, lease in await run(schedule_ops.due(shard, t + 5_000, 10)):
        fired += (await run(schedule_ops.fire(cfg, shard, member, lease, t + 5_000))).published
    assert fired >= 1
    await run(schedule_ops.set_paused(cfg, "ns", "sched", "c", True, t + 5_000))
    for member, lease in await run(schedule_ops.due(shard, t + 60_000, 10)):  # found paused:
        await run(schedule_ops.fire(cfg, shard, member, lease, t + 60_000))  # out of the timers
    await run(schedule_ops.delete(cfg, "ns", "sched", "c"))
    assert engine.seen == set(load_all()), (
        f"not run on the cluster: {set(load_all()) - engine.seen}"
    )


async def test_pump_and_long_poll_on_a_cluster(cluster_engine: AsyncEngine) -> None:
    engine = cluster_engine
    pump = Pump(engine, poll_ms=50)
    hub = WaiterHub(engine)
    pump.start()
    try:
        t = now_ms()
        waiting = asyncio.create_task(hub.consume("c", ["later", "now"], 5_000, 1, 5_000))
        await asyncio.sleep(0.1)
        await engine.run(ops.publish(engine.config, "c", "later", [JobSpec(b"d", delay_ms=300)], t))
        got = await waiting
        assert [j.body for j in got] == [b"d"] and got[0].extra["reserved_ms"] >= t + 300
        waiting = asyncio.create_task(hub.consume("c", ["now"], 5_000, 1, 5_000))
        await asyncio.sleep(0.1)
        await engine.run(ops.publish(engine.config, "c", "now", [JobSpec(b"n")], now_ms()))
        assert [j.body for j in await waiting] == [b"n"]
    finally:
        await hub.close()
        await pump.stop()
