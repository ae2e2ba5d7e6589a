"""Group commit (``cluster_dq/coalesce.py``): concurrent one-job publishes and acks of a queue
share a script call. What must hold: every request gets its own job's outcome, nothing is lost
or doubled (a client id published twice in one batch is one job and one duplicate), an error
reaches exactly the requests of the failed call, and an idle service runs a request at once.
The service tests run on every topology, with a reply lost after Redis ran a grouped call."""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from cluster_dq.coalesce import GROUP_MAX, GroupCommit
from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import EngineConfig, Eval
from cluster_dq.engine.signatures import SIGNATURES
from cluster_dq.models import JobSpec, JobState
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load
from cluster_dq.testing.service_process import pool_env
from tests.support import Deployment

ULID_RE = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")

# -- the primitive ----------------------------------------------------------------------------


class Recorder:
    """A ``run`` that records its calls and holds each until released."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.gate = asyncio.Event()
        self.fail_on: set[int] = set()

    async def __call__(self, key: str, items: list[int]) -> list[int]:
        self.calls.append((key, list(items)))
        await self.gate.wait()
        if self.fail_on & set(items):
            raise ValueError(f"batch {items} failed")
        return [i * 10 for i in items]


async def test_an_idle_key_runs_at_once_and_arrivals_during_its_call_go_together() -> None:
    run = Recorder()
    group: GroupCommit[str, int, int] = GroupCommit(run, max_items=3)
    first = asyncio.create_task(group.submit("q", 1))
    await asyncio.sleep(0)
    assert run.calls == [("q", [1])]  # no waiting for company
    rest = [asyncio.create_task(group.submit("q", i)) for i in range(2, 8)]
    other = asyncio.create_task(group.submit("other", 99))  # another key is not held up
    await asyncio.sleep(0)
    assert run.calls == [("q", [1]), ("other", [99])]
    run.gate.set()
    assert await asyncio.gather(first, *rest, other) == [10, 20, 30, 40, 50, 60, 70, 990]
    # one call in flight per key; the waiting ones in batches of at most 3, in arrival order
    assert [c for c in run.calls if c[0] == "q"] == [
        ("q", [1]),
        ("q", [2, 3, 4]),
        ("q", [5, 6, 7]),
    ]
    assert group.busy() == 0


async def test_an_error_reaches_exactly_the_requests_of_the_failed_call() -> None:
    run = Recorder()
    run.fail_on = {3}
    group: GroupCommit[str, int, int] = GroupCommit(run, max_items=2)
    tasks = [asyncio.create_task(group.submit("q", i)) for i in range(1, 6)]
    await asyncio.sleep(0)
    run.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] == 10 and results[3:] == [40, 50]
    assert all(isinstance(r, ValueError) for r in results[1:3])  # the batch [2, 3]
    assert group.busy() == 0


async def test_a_member_that_goes_away_does_not_cancel_its_batch() -> None:
    run = Recorder()
    group: GroupCommit[str, int, int] = GroupCommit(run, max_items=8)
    first = asyncio.create_task(group.submit("q", 1))
    await asyncio.sleep(0)
    leaving, staying = (asyncio.create_task(group.submit("q", i)) for i in (2, 3))
    await asyncio.sleep(0)
    leaving.cancel()
    first.cancel()  # the one running its own call goes too: the next batch still runs
    await asyncio.sleep(0)
    run.gate.set()
    assert await staying == 30
    assert run.calls == [("q", [1]), ("q", [2, 3])]
    assert group.busy() == 0


async def test_with_orphan_the_result_of_a_member_that_left_is_handed_over() -> None:
    """Consume's case: jobs reserved for a consumer who left must be given back. Whether the
    member left while its call was in flight or before its batch ran, its result reaches
    ``orphan``; the others get theirs."""
    run = Recorder()
    orphans: list[int] = []
    group: GroupCommit[str, int, int] = GroupCommit(
        run, max_items=8, orphan=lambda key, r: orphans.append(r)
    )
    lead = asyncio.create_task(group.submit("q", 1))  # runs as a task of its own
    await asyncio.sleep(0)
    queued = [asyncio.create_task(group.submit("q", i)) for i in (2, 3)]
    await asyncio.sleep(0)
    lead.cancel()  # while its call is in flight
    queued[0].cancel()  # before its batch ran
    await asyncio.sleep(0)
    run.gate.set()
    assert await queued[1] == 30
    assert sorted(orphans) == [10, 20]
    assert run.calls == [("q", [1]), ("q", [2, 3])]
    assert group.busy() == 0


# -- the service, on every topology -----------------------------------------------------------


@pytest.fixture
async def service(sync_redis: redis.Redis, deployment: Deployment) -> AsyncIterator[Service]:
    settings = load(None, pool_env(deployment.pool_settings()))
    pool = RedisPool.create(settings.Pool["default"], EngineConfig())
    await pool.start(run_pump=False)
    yield Service(settings, {"default": pool})
    await pool.close()


async def test_concurrent_single_publishes_and_acks_each_get_their_own_outcome(
    service: Service,
) -> None:
    """300 concurrent publishes (a third with client ids drawn from 40, so ids repeat inside
    batches), then concurrent acks of every id, each id more than once: each request's answer
    is its job's, and the queue holds exactly the jobs answered as new."""
    route = service.route("default")
    rng = random.Random(7)
    specs = [
        JobSpec(f"body {i}".encode(), job_id=f"client-{rng.randrange(40)}" if i % 3 == 0 else None)
        for i in range(300)
    ]
    out = await asyncio.gather(*(service.publish(route, "gc", "q", [s]) for s in specs))
    assert service._publishes.calls < len(specs)  # they did share calls
    assert service._publishes.items == len(specs)
    new = Counter(p.job_id for (p,) in out if not p.duplicate)
    client_ids = {s.job_id for s in specs if s.job_id}
    assert set(new) >= client_ids and all(n == 1 for n in new.values())
    for spec, (p,) in zip(specs, out):
        if spec.job_id:
            assert p.job_id == spec.job_id
    sizes = await service.sizes(route, "gc", "q")
    assert sizes.ready == len(new)
    for job_id in rng.sample(sorted(new), 20):
        job = await service.peek_job(route, "gc", "q", job_id)
        assert job.body.startswith(b"body ")
    ids = [*new, *rng.sample(sorted(new), 50)]  # 50 acked twice, concurrently
    rng.shuffle(ids)
    states = await asyncio.gather(*(service.ack(route, "gc", "q", [i]) for i in ids))
    found = Counter(i for i, (s,) in zip(ids, states) if s is not None)
    assert found == Counter(new)  # each job acked once; the repeat finds it gone
    assert all(s in (JobState.READY, None) for (s,) in states)
    assert (await service.sizes(route, "gc", "q")).ready == 0


async def test_a_grouped_publish_whose_reply_is_lost_is_repeated_without_doubling(
    service: Service,
) -> None:
    """The reply of a grouped publish is lost after Redis ran it: the engine repeats the call
    (the ids were fixed before it), every member gets its job, none is published twice."""
    route = service.route("default")
    engine = service.pools["default"].engine
    real_step = engine._step
    lost: list[int] = []

    async def lose_a_grouped_reply(step: Any) -> Any:
        reply = await real_step(step)
        if isinstance(step, Eval) and step.script == "publish" and not lost:
            n = int(step.args[SIGNATURES["publish"].argv.index("n")])  # ARGV n
            if n > 1:
                lost.append(n)
                raise RedisConnectionError("reply lost")
        return reply

    engine._step = lose_a_grouped_reply  # type: ignore[method-assign]
    try:
        out = await asyncio.gather(
            *(service.publish(route, "gc", "lost", [JobSpec(b"x")]) for _ in range(100))
        )
    finally:
        engine._step = real_step  # type: ignore[method-assign]
    assert lost, "no grouped publish was sent"
    ids = [p.job_id for (p,) in out]
    assert len(set(ids)) == 100 and not any(p.duplicate for (p,) in out)
    assert (await service.sizes(route, "gc", "lost")).ready == 100
    for job_id in ids[::10]:
        await service.peek_job(route, "gc", "lost", job_id)


async def test_concurrent_one_job_consumes_share_calls_and_nothing_is_lost_or_doubled(
    service: Service,
) -> None:
    """200 jobs, 260 concurrent one-job consumes (timeout 0), a fifth of them cancelled as
    they run (their clients left): every job is delivered to exactly one consumer that stayed,
    or back in the ready set (given back, not left reserved to its ttr); nothing is lost."""
    route = service.route("default")
    published = await service.publish(route, "gc", "c", [JobSpec(b"j")] * 200)
    ids = {p.job_id for p in published}
    hub = service.pools["default"].hub
    tasks = [
        asyncio.create_task(service.consume(route, "gc", ["c"], 60_000, 1, 0)) for _ in range(260)
    ]
    await asyncio.sleep(0)
    for t in tasks[::5]:
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    got = [j.job_id for r in results if isinstance(r, list) for j in r]
    assert len(got) == len(set(got)) and set(got) <= ids
    assert hub._reserves.calls < 260 - 52  # they did share calls
    for _ in range(100):  # the give-backs run in the background
        await asyncio.sleep(0.02)
        sizes = await service.sizes(route, "gc", "c")
        if sizes.reserved == len(got):
            break
    assert sizes.reserved == len(got) and sizes.ready == 200 - len(got)


def test_the_group_limit_matches_the_bulk_limit() -> None:
    assert GROUP_MAX <= ops.MAX_CONSUME and GROUP_MAX == 64


async def test_an_unconfirmed_grouped_publish_tells_each_request_only_of_its_own_job(
    service: Service,
) -> None:
    """A grouped publish written on the master but confirmed by too few replicas: each request
    gets a 503 naming its own job, never the ids of the other clients in its batch."""
    from cluster_dq.errors import NotReplicated, PoolUnavailable

    route = service.route("default")
    engine = service.pools["default"].engine
    real_run = engine.run

    async def unconfirmed(op: Any, **kw: Any) -> Any:
        result = await real_run(op, **kw)
        if isinstance(result, list) and len(result) > 1 and kw.get("durable"):
            raise NotReplicated(0, 1, 100, result)
        return result

    engine.run = unconfirmed  # type: ignore[method-assign]
    try:
        out = await asyncio.gather(
            *(service.publish(route, "gc", "unconfirmed", [JobSpec(b"u")]) for _ in range(60)),
            return_exceptions=True,
        )
    finally:
        engine.run = real_run  # type: ignore[method-assign]
    failed = [e for e in out if isinstance(e, PoolUnavailable)]
    assert failed, ("no grouped publish", [type(e).__name__ for e in out][:5])
    named = [ULID_RE.findall(str(e)) for e in failed]
    assert all(len(ids) == 1 for ids in named), named[:3]
    assert len({ids[0] for ids in named}) == len(failed)  # each its own
    assert all(not isinstance(e, BaseException) or isinstance(e, PoolUnavailable) for e in out)
