"""Consumers ride over a Redis outage shorter than their own deadline: a long-poll consume
keeps waiting while Redis cannot be reached (and answers 503 "nothing reserved" at its
timeout if it still cannot) and an ack is repeated within the retry budget, with nothing lost
or delivered twice. A consume whose reply was lost is not repeated: it answers "no job" and
what it may have reserved comes back after its ttr. While Redis is down, every 503 says
whether anything may have been written, and a request's steps share one retry budget. Redis is real: a server of the test's own, killed and
restarted on its port (its data kept by a SAVE just before), or a reply dropped after the
script ran."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from cluster_dq.client._async.client import AsyncClient
from cluster_dq.client.errors import Unavailable
from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig, Eval
from cluster_dq.errors import PoolUnavailable
from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import SentinelGroup, Server, free_port, start_server
from cluster_dq.models import JobSpec, JobState
from cluster_dq.pools import RedisPool, close_client, make_client
from cluster_dq.server import Runtime
from cluster_dq.service import Service
from cluster_dq.settings import load

NS = "out"


@pytest.fixture
def server() -> Iterator[Server]:
    # The test's own, killed and restarted: on a port outside the range other tests pick
    # from, so that no server started meanwhile takes it while this one is down.
    s = start_server(free_port(20000, 21000))
    yield s
    s.stop()


@pytest.fixture
async def service(server: Server) -> AsyncIterator[Service]:
    settings = load(None, {"CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{server.port}"})
    pool = RedisPool.create(settings.Pool["default"], EngineConfig())
    await pool.start(run_pump=False)
    yield Service(settings, {"default": pool})
    await pool.close()


async def outage(server: Server, seconds: float) -> None:
    """Redis down for ``seconds`` (connections refused), then back with the data it had."""
    with server.client() as r:
        r.save()
    server.kill(signal.SIGKILL)
    await asyncio.sleep(seconds)
    await asyncio.to_thread(server.restart)


async def test_a_long_poll_consume_waits_out_an_outage_and_gets_the_job(
    service: Service, server: Server
) -> None:
    """Redis is down when the consume arrives and for 1.5 s of its 6-s long poll; a job
    published once it is back is delivered to it: no 503, no job twice."""
    route = service.route("default")
    down = asyncio.create_task(outage(server, 1.5))
    await asyncio.sleep(0.2)  # the consume meets a refused connection
    started = time.monotonic()
    consume = asyncio.create_task(service.consume(route, NS, ["q"], 30_000, 1, 6_000))
    await down
    (published,) = await service.publish(route, NS, "q", [JobSpec(b"after")])
    jobs = await consume
    assert [j.job_id for j in jobs] == [published.job_id]
    assert time.monotonic() - started < 6  # delivered as it was published, not at the deadline
    assert await service.consume(route, NS, ["q"], 30_000, 1, 0) == []


async def test_a_consume_answers_503_at_its_timeout_when_the_outage_outlasts_it(
    service: Service, server: Server
) -> None:
    """An outage longer than the long poll: at the timeout, a 503 saying nothing was reserved
    and that repeating is safe (the queue could not be looked at: "no job" would not be
    true), and the job published before is still there afterwards, its delivery unspent."""
    route = service.route("default")
    (published,) = await service.publish(route, NS, "q", [JobSpec(b"kept")])
    await service.consume(route, NS, ["q"], 30_000, 1, 0)  # reserved: the queue is empty now
    with server.client() as r:
        r.save()
    server.kill(signal.SIGKILL)
    try:
        # No long poll: the pooled connection's first use may find it closed (the step may
        # have been sent: "no job", what it reserved comes back after its ttr) or the
        # connection is refused (nothing reserved: a 503 that says so).
        with contextlib.suppress(PoolUnavailable):
            assert await service.consume(route, NS, ["q"], 30_000, 1, 0) == []
        started = time.monotonic()
        with pytest.raises(PoolUnavailable) as e:
            await service.consume(route, NS, ["q"], 30_000, 1, 1_000)
        assert "no job was reserved" in str(e.value) and "repeating it is safe" in str(e.value)
        assert 0.9 < time.monotonic() - started < 3  # waited out its long poll, no longer
    finally:
        await asyncio.to_thread(server.restart)
    job = await service.peek_job(route, NS, "q", published.job_id)
    assert job.deliveries == 1  # held by the first consume still: nothing lost, none spent


async def test_an_ack_rides_over_an_outage_within_its_budget(
    service: Service, server: Server
) -> None:
    """A job consumed before the outage is acked during it: the ack is repeated until Redis
    is back (1.5 s, inside the retry budget) and the job is gone: never delivered again."""
    route = service.route("default")
    (published,) = await service.publish(route, NS, "q", [JobSpec(b"x", tries=3)])
    (job,) = await service.consume(route, NS, ["q"], 1_000, 1, 0)  # ttr 1 s
    down = asyncio.create_task(outage(server, 1.5))
    await asyncio.sleep(0.2)
    (state,) = await service.ack(route, NS, "q", [job.job_id])
    await down
    assert state is not None
    await asyncio.sleep(1.2)  # past the ttr: an unacked job would be back
    assert await service.consume(route, NS, ["q"], 1_000, 1, 300) == []
    sizes = await service.sizes(route, NS, "q")
    assert (sizes.ready, sizes.reserved, sizes.delayed) == (0, 0, 0)
    assert published.job_id == job.job_id


async def test_a_consume_whose_reply_was_lost_is_not_repeated(service: Service) -> None:
    """The consume script ran (the job is reserved) and its reply was lost: the request
    answers "no job" instead of a 503 and is not repeated (a repeat would reserve more than
    the consumer will ever get); the job comes back after its ttr, one try spent."""
    route = service.route("default")
    engine = service.pools["default"].engine
    (published,) = await service.publish(route, NS, "q", [JobSpec(b"x", tries=3)])
    sent: list[str] = []
    real_step = engine._step

    async def lose_the_consume_reply(step: Any) -> Any:
        reply = await real_step(step)
        if isinstance(step, Eval) and step.script == "consume":
            sent.append(step.script)
            raise RedisConnectionError("reply lost")
        return reply

    engine._step = lose_the_consume_reply  # type: ignore[method-assign]
    try:
        assert await service.consume(route, NS, ["q"], 1_000, 1, 3_000) == []
    finally:
        del engine._step
    assert sent == ["consume"]  # sent once: not repeated
    sizes = await service.sizes(route, NS, "q")
    assert (sizes.ready, sizes.reserved) == (0, 1)
    (again,) = await service.consume(route, NS, ["q"], 30_000, 1, 3_000)  # after the ttr
    assert again.job_id == published.job_id and again.deliveries == 2


async def test_a_consume_refused_before_sending_is_repeated_until_its_deadline(
    service: Service,
) -> None:
    """A connection that failed before anything was sent (no connection to the master yet):
    nothing can have run, so the consume is repeated, within its long poll, and delivers."""
    route = service.route("default")
    engine = service.pools["default"].engine
    (published,) = await service.publish(route, NS, "q", [JobSpec(b"x")])
    failures: list[int] = []
    real_step = engine._step

    async def refuse_twice(step: Any) -> Any:
        if isinstance(step, Eval) and step.script == "consume" and len(failures) < 2:
            failures.append(1)
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
        return await real_step(step)

    engine._step = refuse_twice  # type: ignore[method-assign]
    try:
        (job,) = await service.consume(route, NS, ["q"], 30_000, 1, 3_000)
    finally:
        del engine._step
    assert job.job_id == published.job_id and job.deliveries == 1 and len(failures) == 2


async def test_an_ack_that_no_replica_confirms_yet_is_confirmed_once_one_does(
    redis_sentinel: SentinelGroup,
) -> None:
    """A durable ack (both replicas asked for) while one replica is stopped for 1.5 s (as a
    Cluster shard's promoted master is without a replica until the old one rejoins): the ack
    is sent again until both confirm it, within the budget, and answers what it found the
    first time (reserved), not the "not found" of its repeats; no error."""
    client = make_client(redis_sentinel.pool_settings())
    engine = AsyncEngine(client, wait_replicas=2, wait_timeout_ms=300)
    cfg = engine.config
    master = redis_sentinel.master()
    replica = next(s for s in redis_sentinel.servers if s is not master)
    try:
        (p,) = await engine.run(
            ops.publish(cfg, NS, "dur", [JobSpec(b"x")], now_ms()), idempotent=True, durable=True
        )
        await engine.run(ops.consume(cfg, NS, ["dur"], 30_000, 1, now_ms()))
        os.kill(replica.process.pid, signal.SIGSTOP)
        resume = asyncio.get_running_loop().call_later(
            1.5, os.kill, replica.process.pid, signal.SIGCONT
        )
        try:
            (state,) = await engine.run(
                ops.ack(NS, "dur", [p.job_id], now_ms(), 60_000), idempotent=True, durable=True
            )
        finally:
            resume.cancel()
            os.kill(replica.process.pid, signal.SIGCONT)
        assert state is JobState.RESERVED
        assert await engine.run(ops.peek_job(NS, "dur", p.job_id)) is None  # acked
    finally:
        await engine.run(ops.destroy(cfg, NS, "dur"), idempotent=True)
        await close_client(client)


# -- what a client is told while Redis is down (its redis-server killed) -----------------------

NOT_APPLIED = "nothing was written"
SAFE = "repeating it is safe"
# The retry budget (RetryBudgetSecond) of the runtimes below, whose requests each spend it
# whole; the tests above ride outages within the default's 5 s.
BUDGET_S = 1.5


@pytest.fixture
async def runtime(server: Server) -> AsyncIterator[tuple[Runtime, str]]:
    """The worker's pools, service and apps in-process (no pump), against the test's own
    server, with a token created while Redis is up; the caches short, so that an outage
    longer than a second meets them expired, as any outage longer than the defaults does."""
    settings = load(
        None,
        {
            "CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{server.port}",
            "CLUSTER_DQ_TOKENCACHESECOND": "0.2",
            "CLUSTER_DQ_QUEUESETTINGSCACHESECOND": "0.2",
            "CLUSTER_DQ_RETRYBUDGETSECOND": str(BUDGET_S),
        },
    )
    rt = Runtime(settings, run_pump=False)
    await rt.start()
    token = await rt.service.create_token("default", NS, "outage", None)
    try:
        yield rt, token
    finally:
        await rt.close()


def http(rt: Runtime, token: str, transport: httpx.AsyncBaseTransport | None = None) -> Any:
    return httpx.AsyncClient(
        transport=transport or httpx.ASGITransport(app=rt.data_app),
        base_url="http://dq",
        headers={"X-Token": token},
        timeout=60,
    )


async def down(server: Server) -> None:
    """Redis killed; the caches (0.2 s) expire: every request meets the refused connection."""
    server.kill(signal.SIGKILL)
    await asyncio.sleep(0.5)


async def test_every_verb_refused_at_connect_says_nothing_was_written(
    runtime: tuple[Runtime, str], server: Server
) -> None:
    """Redis down (connections refused at connect: nothing can reach it): each verb's 503 says
    nothing was written and that repeating is safe, writes and reads alike; none says "may have
    been applied" (the client would then not repeat a once-only call it safely could)."""
    rt, token = runtime
    async with http(rt, token) as c:
        r = await c.put("/api/out/q", content=b"x")
        job = r.json()["job_id"]
        r = await c.get("/api/out/q", params={"ttr": 60, "timeout": 0})
        lease = r.headers["X-Lease"]
        await down(server)
        calls = {
            "publish": ("PUT", "/api/out/q", {}),
            "bulk publish": ("PUT", "/api/out/q/bulk", {}),
            "ack": ("DELETE", f"/api/out/q/job/{job}", {}),
            "release": ("POST", f"/api/out/q/job/{job}/release", {"lease": lease}),
            "peek": ("GET", f"/api/out/q/job/{job}", {}),
            "size": ("GET", "/api/out/q/size", {}),
            "consume": ("GET", "/api/out/q", {"timeout": 0}),
        }

        async def send(method: str, path: str, params: dict[str, Any]) -> httpx.Response:
            body = b'["a"]' if "bulk" in path else b"x" if method == "PUT" else None
            return await c.request(method, path, params=params, content=body)

        # at once: each rides its own retry budget before its 503
        answers = await asyncio.gather(*(send(*call) for call in calls.values()))
        for verb, r in zip(calls, answers, strict=True):
            assert r.status_code == 503, (verb, r.status_code, r.text)
            said = r.json()["error"]
            assert NOT_APPLIED in said and SAFE in said, (verb, said)
            assert "may have been applied" not in said, (verb, said)


async def test_a_long_poll_answers_at_its_timeout_while_redis_is_down(
    runtime: tuple[Runtime, str], server: Server
) -> None:
    """A consume with timeout=2 while Redis is down answers at its timeout (before: a 503
    after 15 s): a 503 saying nothing was reserved and that repeating is safe, since the
    service could not look (a 404 would claim the queue was looked at and found empty).
    The bound (timeout + 3 s) is generous on purpose: it checks the promise "answered at
    its timeout", not a performance figure, on a shared and busy machine."""
    rt, token = runtime
    async with http(rt, token) as c:
        await down(server)
        for timeout in (2, 0):
            started = time.monotonic()
            r = await c.get("/api/out/q", params={"timeout": timeout})
            took = time.monotonic() - started
            assert r.status_code == 503, r.text
            said = r.json()["error"]
            assert (
                NOT_APPLIED in said and SAFE in said and "reserved" in said or "written" in said
            ), said
            bound = timeout if timeout else BUDGET_S
            assert took < bound + 3, (timeout, took)
            if timeout:
                assert took >= timeout - 0.1  # it did wait its long poll out


async def test_a_request_gets_one_retry_budget_during_an_outage(
    runtime: tuple[Runtime, str], server: Server
) -> None:
    """A request's Redis steps (token, rate limits, queue settings, the operation) share one
    retry budget, ``RetryBudgetSecond`` (1.5 s here; 5 s by default, as docs/operations.md
    says): a publish during an outage answers 503 once it is spent, not before (it repeated
    the refused step meanwhile) and not one budget per step later (before: 10-15 s).
    Generous upper bound, as above: a promise, not a figure."""
    rt, token = runtime
    async with http(rt, token) as c:
        assert (await c.get("/api/out/q/size")).status_code == 200  # the token known
        await down(server)
        for method, path in (("PUT", "/api/out/q"), ("GET", "/api/out/q/size")):
            started = time.monotonic()
            r = await c.request(method, path, content=b"x" if method == "PUT" else None)
            took = time.monotonic() - started
            assert r.status_code == 503
            assert BUDGET_S * 0.9 <= took < BUDGET_S + 2, (path, took)


async def test_the_client_repeats_a_once_only_call_that_was_not_applied(
    runtime: tuple[Runtime, str], server: Server
) -> None:
    """A publish without a job_id is once-only: the client repeats it only when the service
    says nothing was written, as it does while Redis refuses connections (before: "may have
    been applied", and the client gave up at the first 503)."""
    rt, token = runtime
    seen: list[httpx.Request] = []
    asgi = httpx.ASGITransport(app=rt.data_app)

    class Counting(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return await asgi.handle_async_request(request)

    await down(server)
    async with AsyncClient("http://dq", token, NS, retries=2, transport=Counting()) as client:
        with pytest.raises(Unavailable) as e:
            await client.publish("q", b"x")
    assert e.value.safe_to_repeat and not e.value.maybe_applied
    assert len(seen) == 3  # the first try and two repeats


async def test_a_dashboard_page_during_an_outage_says_nothing_was_written(
    runtime: tuple[Runtime, str], server: Server
) -> None:
    """A dashboard page (a GET: it reads) while Redis is down: a 503 page that says nothing
    was written and that trying again is safe (before: "may have been applied")."""
    rt, token = runtime
    async with http(rt, token) as c:
        job = (await c.put("/api/out/q", content=b"x")).json()["job_id"]
    await down(server)
    transport = httpx.ASGITransport(app=rt.admin_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as ui:
        for path in (f"/ui/job/{NS}/q/{job}", f"/ui/queue/{NS}/q"):
            r = await ui.get(path)
            assert r.status_code == 503, (path, r.status_code)
            assert NOT_APPLIED in r.text and "may have been applied" not in r.text, path


async def test_a_respawn_written_on_one_pool_of_a_migration_is_not_said_unwritten(
    server: Server,
) -> None:
    """A queue moving between pools: a respawn revives the old pool's dead job, then finds the
    new pool down (refused at connect). Its 503 must not say "nothing was written; repeating it
    is safe" (a repeat revives more dead jobs): the old pool's part was written."""
    old = start_server()
    try:
        env = {
            "CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{old.port}",
            "CLUSTER_DQ_RETRYBUDGETSECOND": str(BUDGET_S),
        }
        rt = Runtime(load(None, env), run_pump=False)
        await rt.start()
        try:
            token = await rt.service.create_token("default", NS, "outage", None)
            async with http(rt, token) as c:
                job = (await c.put("/api/out/q", content=b"x")).json()["job_id"]
                assert (await c.post(f"/api/out/q/job/{job}/bury")).status_code == 200
        finally:
            await rt.close()
        moving = {
            **env,
            "CLUSTER_DQ_POOL__DEFAULT__MIGRATETO": "new",
            "CLUSTER_DQ_POOL__NEW__ADDR": f"127.0.0.1:{server.port}",
        }
        rt = Runtime(load(None, moving), run_pump=False)
        await rt.start()
        try:
            async with http(rt, token) as c:
                await down(server)  # the new pool
                r = await c.put("/api/out/q/deadletter", params={"limit": 10})
                assert r.status_code == 503, r.text
                with old.client() as o:
                    assert o.zcard(QueueKeys(NS, "q").ready) == 1  # revived in the old pool
                said = r.json()["error"]
                assert NOT_APPLIED not in said and SAFE not in said, said
        finally:
            await rt.close()
    finally:
        old.stop()


async def test_a_republish_written_on_the_new_pool_is_not_said_unwritten(
    server: Server,
) -> None:
    """A queue moving between pools: a republish publishes the new job on the new pool, then
    acks the old one where it lives, the old pool, which is down. The new job was written:
    the 503 may say repeating is safe (the ids are fixed), not that nothing was written."""
    new = start_server()
    try:
        env = {
            "CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{server.port}",
            "CLUSTER_DQ_RETRYBUDGETSECOND": str(BUDGET_S),
        }
        rt = Runtime(load(None, env), run_pump=False)
        await rt.start()
        try:
            token = await rt.service.create_token("default", NS, "outage", None)
            async with http(rt, token) as c:
                job = (await c.put("/api/out/q", content=b"x")).json()["job_id"]
        finally:
            await rt.close()
        moving = {
            **env,
            "CLUSTER_DQ_POOL__DEFAULT__MIGRATETO": "new",
            "CLUSTER_DQ_POOL__NEW__ADDR": f"127.0.0.1:{new.port}",
            "CLUSTER_DQ_TOKENCACHESECOND": "60",
            "CLUSTER_DQ_QUEUESETTINGSCACHESECOND": "60",
        }
        rt = Runtime(load(None, moving), run_pump=False)
        await rt.start()
        try:
            async with http(rt, token) as c:
                # the token and the queue's settings known (read and carried over)
                assert (await c.put("/api/out/q", content=b"w")).status_code == 201
                await down(server)  # the old pool (and the token store: its answer cached)
                r = await c.put(f"/api/out/q/job/{job}", content=b"y")
                assert r.status_code == 503, r.text
                with new.client() as n:
                    assert n.zcard(QueueKeys(NS, "q").ready) == 2  # published on the new pool
                said = r.json()["error"]
                assert NOT_APPLIED not in said and SAFE in said, said
        finally:
            await rt.close()
    finally:
        new.stop()
