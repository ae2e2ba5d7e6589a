"""cluster_dq.client against a real `cluster-dq serve` on every topology: each verb's round
trip decodes into its type, each error status into its class (provoked for real), the retry
rule (a table over the pure decision, and replies really lost by a transport around the real
one), configuration from the environment. Both the sync and the async client."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from typing import Any

import httpx
import pytest
import redis

from cluster_dq.client import (
    AdminClient,
    AsyncAdminClient,
    AsyncClient,
    Backoff,
    BadRequest,
    Client,
    Conflict,
    Contended,
    DeadJob,
    DeadPage,
    DQError,
    Job,
    LeaseLost,
    NotFound,
    QueueFull,
    QueueInfo,
    QueuePage,
    QueueSettings,
    RateLimited,
    Schedule,
    SchedulePage,
    Sizes,
    Sweep,
    TokenLimit,
    TooLarge,
    TransportError,
    Unauthorized,
    Unavailable,
    WrongState,
)
from cluster_dq.client._core import Reply, Safety, error_from
from cluster_dq.client._retry import policy, repeatable, wait
from cluster_dq.localredis import free_port, start_server
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, ROOT
from tests.support.clients import (
    NS,
    FAULTY_KINDS,
    LoseReplies,
    Sync,
    close,
    faulty,
    make,
    new_token,
)

# -- round trips ------------------------------------------------------------------------------


async def test_publish_consume_ack_round_trip(dq: Any) -> None:
    jid = await dq.publish("q", b"hello \x00", ttl=100, tries=3, attributes={"tenant": "acme"})
    assert isinstance(jid, str) and jid
    assert await dq.size("q") == Sizes(ready=1, delayed=0, reserved=0, dead=0)
    peeked = await dq.peek("q")
    assert isinstance(peeked, Job) and peeked.id == jid and peeked.lease is None
    job = await dq.consume("q", ttr=30)
    assert isinstance(job, Job)
    assert (job.namespace, job.queue, job.id, job.body) == (NS, "q", jid, b"hello \x00")
    assert job.remain_tries == 2 and job.deliveries == 1 and job.state == "reserved"
    assert job.attributes == {"tenant": "acme"} and isinstance(job.lease, str)
    assert 98 <= job.ttl <= 100 and isinstance(job.elapsed_ms, int)
    assert job in {job} and job == dataclasses.replace(job)  # hashable, though it holds a dict
    assert await dq.consume("q") is None  # nothing else ready
    await dq.ack("q", job.id, lease=job.lease)
    assert await dq.get_job("q", jid) is None
    assert (await dq.size("q")).total == 0


async def test_text_json_delay_and_result(dq: Any) -> None:
    await dq.publish("q", '{"order": 42}', delay=0.05)
    assert (await dq.size("q")).delayed + (await dq.size("q")).ready == 1
    job = await dq.consume("q", timeout=5)
    assert job is not None and job.json() == {"order": 42} and job.text == '{"order": 42}'
    await dq.ack("q", job.id, result={"total": 1})
    done = await dq.get_job("q", job.id)
    assert done is not None and done.state == "acked" and done.result == {"total": 1}


async def test_a_result_is_sent_as_the_service_measures_and_reads_it(dq: Any) -> None:
    """The client sent JSON with every non-ASCII character escaped (``\\u00e9``, 6 bytes
    for 2): a result the service stores (2,000 "é": 4,002 bytes of UTF-8) was refused as too
    large. And a lone surrogate (a str from ``surrogateescape``), which the service refuses,
    was sent: it is the client's ValueError, before anything is sent."""
    text = "\u00e9" * 2000
    await dq.publish("q", b"x")
    job = await dq.consume("q", ttr=30)
    await dq.ack("q", job.id, result=text, lease=job.lease)
    done = await dq.get_job("q", job.id)
    assert done is not None and done.result == text
    await dq.publish("q", b"y")
    job = await dq.consume("q", ttr=30)
    with pytest.raises(ValueError):
        await dq.progress("q", job.id, {"file": "a\udcff"}, lease=job.lease)
    with pytest.raises(ValueError):
        await dq.ack("q", job.id, result="a\udcff", lease=job.lease)
    assert (await dq.get_job("q", job.id)).state == "reserved"


async def test_republish(dq: Any) -> None:
    jid = await dq.publish("q", b"step 1")
    job = await dq.consume("q", ttr=30)
    new = await dq.republish("q", jid, b"step 2", lease=job.lease, delay=60)
    assert new != jid and await dq.get_job("q", jid) is None
    assert (await dq.get_job("q", new)).state == "delayed"
    assert await dq.republish("q", new, "step 3", new_job_id="step-3") == "step-3"
    assert (await dq.get_job("q", "step-3")).body == b"step 3"
    with pytest.raises(LeaseLost):
        await dq.republish("q", "step-3", b"x", lease=job.lease)


async def test_publish_with_job_id_is_idempotent(dq: Any) -> None:
    assert await dq.publish("q", b"a", job_id="order-42") == "order-42"
    assert await dq.publish("q", b"a", job_id="order-42") == "order-42"
    assert (await dq.size("q")).ready == 1


async def test_bulk_consume_many_ack_many(dq: Any) -> None:
    ids = await dq.publish_many("q", [b'"one"', "2", b'{"three": 3}'], tries=2)
    assert len(ids) == 3 and all(isinstance(i, str) for i in ids)
    jobs = await dq.consume_many("q", 10, ttr=30)
    assert sorted(j.id for j in jobs) == sorted(ids)
    assert {j.body for j in jobs} == {b'"one"', b"2", b'{"three": 3}'}
    await dq.ack_many("q", [jobs[0], (jobs[1].id, jobs[1].lease), (jobs[2].id, None)])
    assert (await dq.size("q")).total == 0
    assert await dq.consume_many("q", 5) == []
    assert await dq.consume_many(["empty", "q"], 1) == []


async def test_touch_release_progress(dq: Any) -> None:
    jid = await dq.publish("q", b"x", tries=3)
    job = await dq.consume("q", ttr=30)
    await dq.touch("q", jid, lease=job.lease, ttr=60)
    await dq.progress("q", jid, {"done": 1}, lease=job.lease)
    seen = await dq.get_job("q", jid)
    assert seen is not None and seen.progress == {"done": 1} and seen.state == "reserved"
    assert await dq.release("q", jid, lease=job.lease, delay=30, error="boom") == "delayed"
    seen = await dq.get_job("q", jid)
    assert seen is not None and seen.last_error == "boom" and seen.next_attempt_at is not None
    assert seen.next_attempt_at > time.time() + 20
    job = await dq.reschedule("q", jid, delay=0)
    assert job.state == "ready"
    job = await dq.consume("q", ttr=30)
    assert await dq.release("q", jid, lease=job.lease, keep_try=True) == "ready"


async def test_priority_backoff_and_queue_order(dq: Any) -> None:
    low = await dq.publish("p", b"low")
    high = await dq.publish("p", b"high", priority=5, tries=2, backoff=Backoff("fixed", 30))
    await dq.publish("first", b"x")
    got = await dq.consume(["first", "p"], ttr=30)
    assert got.queue == "first"  # the listed order is the priority
    job = await dq.consume(["first", "p"], ttr=30)
    assert job.id == high  # a higher priority is delivered first within a queue
    assert await dq.release("p", high, lease=job.lease) == "delayed"  # its own backoff
    seen = await dq.get_job("p", high)
    assert seen.next_attempt_at is not None and 20 < seen.next_attempt_at - time.time() <= 30
    none = await dq.publish("p", b"none", tries=2, backoff=Backoff("none"))
    assert (await dq.consume("p", ttr=30)).id == low
    job = await dq.consume("p", ttr=30)
    assert job.id == none and await dq.release("p", none, lease=job.lease) == "ready"
    expo = Backoff("exponential", 1.5, cap=60, jitter=0.25)
    jid = await dq.publish("p", b"e", tries=3, backoff=expo)  # every field as the service takes it
    with pytest.raises(BadRequest):
        await dq.publish("p", b"e", backoff=Backoff("exponential", 1, jitter=2))
    assert (await dq.get_job("p", jid)).state == "ready"


async def test_bury_kick_reschedule_cancel(dq: Any) -> None:
    jid = await dq.publish("q", b"x")
    dead = await dq.bury("q", jid, reason="malformed")
    assert dead.state == "dead" and dead.reason == "buried" and dead.last_error == "malformed"
    assert dead.died_at is not None and abs(dead.died_at - time.time()) < 60
    back = await dq.kick("q", jid, delay=60, tries=2)
    assert back.state == "delayed" and back.remain_tries == 2
    at = time.time() + 120
    moved = await dq.reschedule("q", jid, at=at)
    assert moved.state == "delayed"
    assert await dq.cancel("q", jid) == "delayed"
    assert await dq.cancel("q", jid) is None
    await dq.destroy("q")


async def drain(dq: Any, name: str, *args: Any, **kwargs: Any) -> list[Any]:
    """Everything an iter_* verb yields, from either client."""
    if isinstance(dq, Sync):
        return list(await getattr(dq, name)(*args, **kwargs))
    return [x async for x in getattr(dq, name)(*args, **kwargs)]


async def test_dead_letters(dq: Any) -> None:
    ids = [await dq.publish("dl", f"{i}", job_id=f"dl-{i}") for i in range(5)]
    before = time.time()
    for i, jid in enumerate(ids):
        await dq.bury("dl", jid, reason=f"bad {i}")
    assert await dq.dead_size("dl") == 5
    assert await dq.dead_peek("dl") == (5, ids[0])
    page = await dq.dead_jobs("dl", limit=2)
    assert isinstance(page, DeadPage) and page.more and page.cursor is not None
    first = page.jobs[0]
    assert isinstance(first, DeadJob) and (first.id, first.reason) == (ids[0], "buried")
    assert first.last_error == "bad 0" and first.size > 0 and first.died_at is not None
    assert first.died_at >= before - 5 and first.published_at is not None
    assert [j.id for j in await drain(dq, "iter_dead", "dl", limit=2)] == ids
    swept = await dq.redrive("dl", reason="buried", limit=2)
    assert isinstance(swept, Sweep) and swept.count == 2 and swept.more
    rest = await dq.redrive("dl", reason="buried", limit=2, cursor=swept.cursor)
    assert rest.count == 2
    assert (await dq.size("dl")).ready == 4 and await dq.dead_size("dl") == 1
    nothing = await dq.purge("dl", reason="ttr_expired")
    assert (nothing.count, nothing.more, nothing.cursor) == (0, False, None)
    assert (await dq.purge("dl", since=before - 60, until=time.time() + 60)).count == 1
    for jid in ids[:2]:
        await dq.bury("dl", jid)
    assert await dq.respawn("dl", limit=1, ttl=60) == 1
    await dq.dead_delete("dl", limit=5)
    assert await dq.dead_peek("dl") == (0, None)
    assert (await dq.size("dl")).ready == 3


async def test_queue_settings_pause_and_listing(dq: Any) -> None:
    backoff = Backoff("exponential", base=0.5, cap=30, jitter=0.2)
    got = await dq.update_settings("s1", ttr=2.5, tries=3, max_size=10, backoff=backoff)
    assert isinstance(got, QueueSettings) and (got.namespace, got.queue) == (NS, "s1")
    assert (got.ttr, got.tries, got.max_size, got.backoff) == (2.5, 3, 10, backoff)
    assert await dq.settings("s1") == got
    cleared = await dq.update_settings("s1", backoff=None, max_size=None)
    assert cleared.backoff is None and cleared.max_size is None and cleared.tries == 3
    assert (await dq.pause("s1")).paused
    await dq.publish("s1", b"x")
    assert await dq.consume("s1") is None  # paused: nothing delivered
    assert not (await dq.resume("s1")).paused
    job = await dq.consume("s1")
    assert job is not None and job.remain_tries == 2  # the queue's tries
    with pytest.raises(ValueError, match="unknown setting"):
        await dq.update_settings("s1", colour="red")
    with pytest.raises(BadRequest):
        await dq.update_settings("s1", tries=0)
    await dq.publish("s2", b"x")
    await dq.publish("s3", b"x", delay=60)
    page = await dq.queues(limit=1)
    assert isinstance(page, QueuePage) and len(page.queues) == 1 and page.cursor
    infos = {q.name: q for q in await drain(dq, "iter_queues", limit=1)}
    assert set(infos) == {"s1", "s2", "s3"}
    s2 = infos["s2"]
    assert isinstance(s2, QueueInfo) and (s2.ready, s2.paused) == (1, False)
    assert s2.lateness is not None and s2.oldest_due_at is not None
    assert infos["s3"].delayed == 1 and infos["s3"].lateness is None


async def test_schedules(dq: Any) -> None:
    every = await dq.put_schedule("r", "beat", every=3600, body="tick", tries=2, ttl=600)
    assert isinstance(every, Schedule) and (every.every, every.cron) == (3600.0, None)
    assert every.job.body == "tick" and every.job.tries == 2 and every.job.ttl == 600.0
    assert every.next_at is not None and every.next_at > time.time() - 5
    cron = await dq.put_schedule("r", "nightly", cron="0 3 * * *", tz="Europe/Paris", paused=True)
    assert (cron.cron, cron.tz, cron.paused, cron.next_at) == (
        "0 3 * * *",
        "Europe/Paris",
        True,
        None,
    )
    assert await dq.get_schedule("r", "beat") == every
    page = await dq.list_schedules("r")
    assert isinstance(page, SchedulePage) and page.cursor is None
    assert {x.name for x in page.schedules} == {"beat", "nightly"}
    assert (await dq.pause_schedule("r", "beat")).paused
    assert not (await dq.resume_schedule("r", "beat")).paused
    await dq.delete_schedule("r", "beat")
    assert await dq.get_schedule("r", "beat") is None
    with pytest.raises(BadRequest):
        await dq.put_schedule("r", "bad", cron="not a cron")
    with pytest.raises(NotFound):
        await dq.pause_schedule("r", "beat")
    with pytest.raises(ValueError):
        await dq.put_schedule("r", "both", cron="* * * * *", every=60)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_admin_client(kind: str, served: ServiceProcess, sync_redis: redis.Redis) -> None:
    if kind == "sync":
        admin: Any = Sync(AdminClient(served.admin, ADMIN_AUTH))
    else:
        admin = AsyncAdminClient(served.admin, ADMIN_AUTH)
    assert await admin.healthz() is True
    assert (await admin.readyz())["status"] == "ok"
    assert isinstance(await admin.version(), str)
    assert await admin.pools() == ["default"]
    token = await admin.create_token(NS, "from the client")
    assert (await admin.tokens(NS))[token] == "from the client"
    lim = await admin.set_limit(NS, token, read=10, write=5, interval=2)
    assert lim == TokenLimit(NS, token, 10, 5, 2)
    assert lim in await admin.limits()
    await admin.delete_limit(NS, token)
    async with AsyncClient(served.base, token, NS) as c:
        await c.publish("adm", b"x")
    assert "adm" in (await admin.info()).get(NS, [])
    assert "cluster_dq_" in await admin.metrics_text()
    await admin.delete_token(NS, token)
    assert token not in await admin.tokens(NS)
    if kind == "sync":
        admin.client.close()
        wrong: Any = Sync(AdminClient(served.admin, ("admin", "wrong")))
    else:
        await admin.aclose()
        wrong = AsyncAdminClient(served.admin, ("admin", "wrong"))
    with pytest.raises(Unauthorized):
        await wrong.create_token(NS, "x")
    await close(wrong)


async def test_one_client_shared_by_threads_and_tasks(served: ServiceProcess, token: str) -> None:
    """A Client shared by threads, an AsyncClient by tasks, each with fewer connections than
    callers: every job is published once, consumed once and acked."""
    from concurrent.futures import ThreadPoolExecutor

    with Client(served.base, token, NS, max_connections=3) as c:
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda i: c.publish("shared", f"{i}", job_id=f"t-{i}"), range(40)))
        assert ids == [f"t-{i}" for i in range(40)]
    async with AsyncClient(served.base, token, NS, max_connections=3) as ac:
        more = await asyncio.gather(*(ac.publish("shared", f"a{i}") for i in range(40)))
        assert len(set(more)) == 40
        got = await asyncio.gather(*(ac.consume_many("shared", 10, ttr=60) for _ in range(8)))
        jobs = [j for batch in got for j in batch]
        assert sorted(j.id for j in jobs) == sorted(ids + more)
        await asyncio.gather(*(ac.ack_many("shared", b) for b in got if b))
        assert (await ac.size("shared")).total == 0


# -- the error tree, provoked for real --------------------------------------------------------


async def test_a_stale_lease_is_lease_lost(dq: Any) -> None:
    jid = await dq.publish("q", b"x", tries=2)
    first = await dq.consume("q", ttr=0.05)
    await asyncio.sleep(0.3)
    second = await dq.consume("q", ttr=30, timeout=5)
    assert second is not None and second.id == jid
    with pytest.raises(LeaseLost) as e:
        await dq.ack("q", jid, lease=first.lease)
    assert e.value.status == 409 and e.value.state == "reserved"
    with pytest.raises(LeaseLost):
        await dq.release("q", jid, lease=first.lease)
    await dq.ack("q", jid, lease=second.lease)


async def test_a_bury_of_a_dead_job_is_wrong_state(dq: Any) -> None:
    jid = await dq.publish("q", b"x")
    await dq.bury("q", jid)
    with pytest.raises(WrongState) as e:
        await dq.bury("q", jid)
    assert e.value.state == "dead" and isinstance(e.value, Conflict)
    with pytest.raises(WrongState) as e:
        await dq.reschedule("q", jid, delay=1)
    assert e.value.state == "dead"
    with pytest.raises(NotFound):
        await dq.bury("q", "no-such-job")


async def test_bad_input_is_bad_request_or_value_error(dq: Any) -> None:
    with pytest.raises(BadRequest) as e:
        await dq.publish("q", b"x", delay=10, ttl=5)
    assert "ttl" in e.value.message and e.value.status == 400
    with pytest.raises(BadRequest):
        await dq.publish("_q", b"x")
    with pytest.raises(BadRequest) as e:
        await dq.publish("q", b"x", job_id="no/slash")
    assert "job id" in e.value.message
    for bad in (
        lambda: dq.publish("q", b"x", delay=-1),
        lambda: dq.publish("q", 42),
        lambda: dq.consume_many("q", 0),
        lambda: dq.consume([]),
        lambda: dq.publish_many("q", [b"not json"]),
        lambda: dq.publish_many("q", b'["one body"]'),
        lambda: dq.publish("q", b"x", job_id=""),
        lambda: dq.reschedule("q", "id"),
        lambda: dq.ack_many("q", []),
        lambda: dq.progress("q", "id", {1, 2}),
        lambda: dq.ack("q", "id", result=float("nan")),
    ):
        with pytest.raises(ValueError):
            await bad()
    with pytest.raises(TooLarge):
        await dq.publish("q", b"x" * (1024 * 1024 + 1))


async def test_unknown_token_and_pool(served: ServiceProcess, token: str) -> None:
    for kind in ("sync", "async"):
        c = make(kind, served.base, "A" * 24)
        with pytest.raises(Unauthorized):
            await c.publish("q", b"x")
        await close(c)
        c = make(kind, served.base, f"nopool:{token}")
        with pytest.raises(NotFound) as e:
            await c.size("q")
        assert "pool" in e.value.message
        await close(c)


async def test_a_full_queue_is_queue_full_and_not_retried(
    served: ServiceProcess, token: str
) -> None:
    httpx.patch(
        f"{served.base}/api/{NS}/full/settings", json={"max_size": 1}, headers={"X-Token": token}
    ).raise_for_status()
    for kind in ("sync", "async"):
        c = make(kind, served.base, token)
        await c.publish("full", b"x", job_id=f"first-{kind}")
        with pytest.raises(QueueFull) as e:
            await c.publish("full", b"x")
        assert e.value.status == 429 and not isinstance(e.value, RateLimited)
        await c.destroy("full")
        await close(c)


async def test_a_token_rate_limit_is_rate_limited(served: ServiceProcess, token: str) -> None:
    r = httpx.post(
        f"{served.admin}/token/{NS}/{token}/limit",
        json={"read": 0, "write": 1, "interval": 60},
        auth=ADMIN_AUTH,
    )
    assert r.status_code == 201, r.text
    time.sleep(1.2)  # limits are cached for TokenCacheSecond
    for kind in ("sync", "async"):
        c = make(kind, served.base, token, retries=1)
        if kind == "sync":
            await c.publish("q", b"x")  # the one write of the interval
        with pytest.raises(RateLimited) as e:
            await c.publish("q", b"x")
        assert e.value.status == 429 and e.value.retry_after is None
        await close(c)


# -- the retry rule ---------------------------------------------------------------------------

IDEM, ONCE = Safety.IDEMPOTENT, Safety.ONCE


def unavailable(advice: str) -> Unavailable:
    """A 503 as the service words it (cluster_dq/service/failures.py), decoded by the client."""
    from cluster_dq.errors import PoolUnavailable

    msg = str(PoolUnavailable("default", "detail", advice))
    err = error_from(Reply(503, {}, httpx.Response(503, json={"error": msg}).content))
    assert isinstance(err, Unavailable)
    return err


def service_advice() -> dict[str, str]:
    """The service's own 503 advice texts, from its own code."""
    from cluster_dq.errors import Refused, Transient
    from cluster_dq.service.failures import UNKNOWN, outcome

    return {
        "refused": outcome(Refused("x"), False, UNKNOWN),
        "idempotent": outcome(Transient("x"), True, UNKNOWN),
        "unknown": outcome(Transient("x"), False, UNKNOWN),
        "release": "the release may have been applied: look the job up (GET …) before repeating it",
    }


def test_503_bodies_decode_into_safe_to_repeat_and_maybe_applied() -> None:
    advice = service_advice()
    refused, idem, unknown = (unavailable(advice[k]) for k in ("refused", "idempotent", "unknown"))
    assert (refused.safe_to_repeat, refused.maybe_applied) == (True, False)
    assert (idem.safe_to_repeat, idem.maybe_applied) == (True, True)
    assert (unknown.safe_to_repeat, unknown.maybe_applied) == (False, True)
    release = unavailable(advice["release"])
    assert (release.safe_to_repeat, release.maybe_applied) == (False, True)
    bare = error_from(Reply(503, {}, b'{"error": "redis unavailable; the outcome is unknown"}'))
    assert isinstance(bare, Unavailable) and bare.maybe_applied and not bare.safe_to_repeat


def test_every_503_of_the_service_decodes_to_what_happened() -> None:
    """Over every Redis failure the service may meet, for idempotent and other requests, the
    503 it writes (its own ``unavailable``) decodes so that the client repeats a once-only
    call only when nothing ran on Redis, and reads `safe` only where the service said so."""
    from cluster_dq import errors as server
    from cluster_dq.service.failures import unavailable as service_unavailable

    failures = [
        server.Transient("reset"),
        server.Refused("TRYAGAIN"),
        server.StaleMaster("NOREPLICAS"),
        server.Unsent("refused"),
        server.MovedDuringWait("moved"),
        server.ServerError("OOM", "OOM"),
        server.RedisFailure("?"),
        server.NotReplicated(0, 1, 100, None),
    ]
    for failure in failures:
        for idempotent in (True, False):
            for unknown in ("the request may or may not have been applied", None):
                try:
                    with service_unavailable("default", idempotent=idempotent, unknown=unknown):
                        raise failure
                except server.PoolUnavailable as e:
                    got = unavailable(e.advice)
                nothing_ran = isinstance(failure, server.Refused)
                assert got.maybe_applied or nothing_ran, (failure, idempotent, unknown)
                assert not got.safe_to_repeat or idempotent or nothing_ran, (failure, idempotent)
                if repeatable(ONCE, got):
                    assert nothing_ran, (failure, idempotent, unknown)


def test_the_retry_table() -> None:
    """Each failure against each safety: repeated only when a repeat can do no harm."""
    advice = service_advice()
    table: list[tuple[BaseException, bool, bool]] = [
        # failure,                                   IDEMPOTENT, ONCE
        (TransportError("refused", sent=False), True, True),
        (TransportError("reply lost", sent=True), True, False),
        (unavailable(advice["refused"]), True, True),
        (unavailable(advice["idempotent"]), True, False),
        (unavailable(advice["unknown"]), True, False),
        (unavailable(advice["release"]), True, False),
        (RateLimited("slow down", retry_after=1.0), True, True),
        (RateLimited("slow down"), True, True),
        (Contended("lost to concurrent writers", 409), True, True),
        (QueueFull("full", 429), False, False),
        (BadRequest("bad", 400), False, False),
        (Unauthorized("no", 401), False, False),
        (NotFound("gone", 404), False, False),
        (LeaseLost("stale", state="reserved"), False, False),
        (WrongState("dead", state="dead"), False, False),
        (TooLarge("big", 413), False, False),
        (DQError("teapot", 418), False, False),
        (ValueError("a bug"), False, False),
    ]
    for exc, idem, once in table:
        assert (repeatable(IDEM, exc), repeatable(ONCE, exc)) == (idem, once), exc


def test_each_verb_is_classified_as_docs_client_md_says() -> None:
    from cluster_dq.client import _admin as a
    from cluster_dq.client import _control as ctl
    from cluster_dq.client import _verbs as v

    idempotent = [
        v.publish("n", "q", b"x", job_id="fixed"),
        v.republish("n", "q", "old", b"x", new_job_id="fixed"),
        v.consume("n", "q"),
        v.consume_many("n", ["q", "r"], 10),
        v.ack("n", "q", "j", lease="l"),
        v.ack_many("n", "q", [("j", "l")]),
        v.cancel("n", "q", "j"),
        v.touch("n", "q", "j", lease="l"),
        v.progress("n", "q", "j", 1, lease="l"),
        v.peek("n", "q"),
        v.get_job("n", "q", "j"),
        v.size("n", "q"),
        v.destroy("n", "q"),
        ctl.settings("n", "q"),
        ctl.update_settings("n", "q", tries=2),
        ctl.pause("n", "q"),
        ctl.put_schedule("n", "q", "s", every=60),
        ctl.delete_schedule("n", "q", "s"),
        ctl.dead_jobs("n", "q"),
        a.delete_token("n", "t"),
    ]
    once = [
        v.publish("n", "q", b"x"),
        v.publish_many("n", "q", [b"1"]),
        v.republish("n", "q", "old", b"x"),
        v.republish("n", "q", "old", b"x", lease="l", new_job_id="fixed"),
        v.release("n", "q", "j", lease="l"),
        v.bury("n", "q", "j"),
        v.kick("n", "q", "j"),
        v.reschedule("n", "q", "j", delay=1),
        ctl.respawn("n", "q"),
        ctl.dead_delete("n", "q"),
        ctl.redrive("n", "q"),
        ctl.purge("n", "q"),
        a.create_token("n", "d"),
    ]
    assert [c.path for c in idempotent if c.safety is not IDEM] == []
    assert [c.path for c in once if c.safety is not ONCE] == []


def test_409_decoding() -> None:
    """Each 409 the service's own error table writes decodes into its class and state."""
    from cluster_dq.errors import ClusterDQError
    from cluster_dq.errors import Conflict as ServerConflict
    from cluster_dq.errors import Contended as ServerContended
    from cluster_dq.errors import WrongState as ServerWrongState
    from cluster_dq.http.errors import error_handlers

    async def answer(exc: Exception) -> Reply:
        response = await error_handlers()[ClusterDQError](None, exc)  # type: ignore[arg-type]
        return Reply(response.status_code, response.headers, bytes(response.body))

    for exc, cls, state in [
        (ServerConflict([("j", "reserved")]), LeaseLost, "reserved"),
        (ServerConflict([("j", None)]), LeaseLost, None),
        (ServerWrongState("j", "dead", "bury", "reserved"), WrongState, "dead"),
        (ServerContended("schedule changed meanwhile"), Contended, None),
    ]:
        got = error_from(asyncio.run(answer(exc)))
        assert type(got) is cls and got.status == 409, exc
        assert isinstance(got, Conflict) and got.state == state


def test_429_status_decoding() -> None:
    full = error_from(Reply(429, {}, b'{"error": "queue ns/q is full: x; nothing was published"}'))
    assert isinstance(full, QueueFull)
    busy = error_from(
        Reply(429, {"retry-after": "2"}, b'{"msg": "too many consumers waiting; retry later"}')
    )
    assert isinstance(busy, RateLimited) and busy.retry_after == 2.0


def test_waits_grow_capped_and_honour_retry_after() -> None:
    from tenacity import RetryCallState, Retrying

    def state(attempt: int, exc: BaseException) -> RetryCallState:
        s = RetryCallState(Retrying(), None, (), {})
        s.attempt_number = attempt
        s.set_exception((type(exc), exc, None))
        return s

    lost = TransportError("x", sent=False)
    for attempt in range(1, 30):
        w = wait(state(attempt, lost))
        low = min(0.1 * 2 ** (attempt - 1), 5.0)
        assert low <= w <= min(low + 0.1, 5.0)
    assert wait(state(1, RateLimited("x", retry_after=2.5))) == 2.5
    assert wait(state(1, RateLimited("x", retry_after=3600))) == 60.0
    assert policy(ONCE, 3)["stop"].max_attempt_number == 4


def publishes(r: httpx.Request) -> bool:
    return r.method == "PUT"


@pytest.mark.parametrize("kind", FAULTY_KINDS)
async def test_a_lost_publish_reply_with_job_id_is_repeated_once_applied(
    kind: str, served: ServiceProcess, token: str
) -> None:
    faults = LoseReplies(publishes)
    c = await faulty(kind, served, token, faults)
    assert await c.publish("q", b"x", job_id="pay-1") == "pay-1"
    assert len(faults.seen) == 2 and faults.lose == 0  # the repeat answered "duplicate"
    assert await c.size("q") == Sizes(1, 0, 0, 0)
    await close(c)


@pytest.mark.parametrize("kind", FAULTY_KINDS)
async def test_a_lost_publish_reply_without_job_id_is_not_repeated(
    kind: str, served: ServiceProcess, token: str
) -> None:
    faults = LoseReplies(publishes)
    c = await faulty(kind, served, token, faults)
    with pytest.raises(TransportError) as e:
        await c.publish("q", b"x")
    assert e.value.sent is True and len(faults.seen) == 1
    assert (await c.size("q")).ready == 1  # it was applied: a repeat would have made two
    faults.lose = 1
    with pytest.raises(TransportError):
        await c.publish_many("q", [b"1", b"2"])
    assert len(faults.seen) == 3 and (await c.size("q")).ready == 3
    await close(c)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_connection_refused_before_sending_is_repeated(
    kind: str, served: ServiceProcess, token: str
) -> None:
    faults = LoseReplies(publishes, lose=2, before_send=True)
    c = await faulty(kind, served, token, faults)
    jid = await c.publish("q", b"x")
    assert len(faults.seen) == 3 and faults.lose == 0
    assert (await c.size("q")).ready == 1 and (await c.peek("q")).id == jid
    await close(c)
    faults = LoseReplies(publishes, lose=5, before_send=True)
    c = make(kind, served.base, token, transport=faults, retries=2)
    with pytest.raises(TransportError) as e:
        await c.publish("q", b"y")
    assert e.value.sent is False and len(faults.seen) == 3  # retries=2: three attempts
    await close(c)


@pytest.mark.parametrize("kind", FAULTY_KINDS)
async def test_a_lost_release_reply_is_not_repeated_a_lost_ack_is(
    kind: str, served: ServiceProcess, token: str
) -> None:
    faults = LoseReplies(lambda r: r.url.path.endswith("/release"))
    c = await faulty(kind, served, token, faults)
    jid = await c.publish("q", b"x", tries=3)
    job = await c.consume("q", ttr=30)
    with pytest.raises(TransportError) as e:
        await c.release("q", jid, lease=job.lease)
    assert e.value.sent and sum(r.url.path.endswith("/release") for r in faults.seen) == 1
    seen = await c.get_job("q", jid)
    assert seen is not None and seen.state == "ready"  # applied once: look before repeating
    job = await c.consume("q", ttr=30)
    faults.which, faults.lose = (lambda r: r.method == "DELETE"), 1
    await c.ack("q", jid, lease=job.lease)  # repeated: the second ack finds it gone, 204
    assert sum(r.method == "DELETE" for r in faults.seen) == 2
    assert (await c.size("q")).total == 0
    await close(c)


@pytest.mark.parametrize("kind", FAULTY_KINDS)
async def test_a_lost_consume_reply_is_repeated(
    kind: str, served: ServiceProcess, token: str
) -> None:
    """The lost delivery's job stays reserved until its ttr, then comes back (a try spent);
    the repeat takes the next one."""
    faults = LoseReplies(lambda r: r.method == "GET" and "/size" not in r.url.path)
    c = await faulty(kind, served, token, faults)
    first = await c.publish("q", b"1", tries=2)
    second = await c.publish("q", b"2", tries=2)
    job = await c.consume("q", ttr=0.5)
    assert job is not None and job.id == second and len(faults.seen) == 4
    assert await c.size("q") == Sizes(0, 0, 2, 0)
    await c.ack("q", second)  # no lease: whatever a slow machine made of its ttr
    back = await c.consume("q", ttr=30, timeout=10)
    assert back is not None and back.id == first
    assert back.deliveries == 2 and back.remain_tries == 0
    await close(c)


async def test_a_real_503_says_what_is_safe_and_the_client_follows_it() -> None:
    """Redis dies under a running service (its token cached): each 503 is decoded from the
    service's own words, and only what is safe to repeat is repeated."""
    server = start_server(free_port(21000, 22000))
    env = {
        "CLUSTER_DQ_ACCOUNTS__ADMIN": ADMIN_AUTH[1],
        "CLUSTER_DQ_TOKENCACHESECOND": "60",
        "CLUSTER_DQ_MAXWAITERS": "0",  # every long-poll: 429 with Retry-After: 1
        "CLUSTER_DQ_RETRYBUDGETSECOND": "1",  # each 503 below after 1 s, not 5
    }
    svc = ServiceProcess.start(f"127.0.0.1:{server.port}", env=env, timeout=20)
    try:
        token = new_token(svc)
        async with AsyncClient(svc.base, token, NS) as c:
            jid = await c.publish("down", b"x", tries=2)
            job = await c.consume("down", ttr=60)
        busy = LoseReplies(lambda r: False, lose=0)
        with Client(svc.base, token, NS, retries=1, transport=busy) as sc:
            with pytest.raises(RateLimited) as limited:
                sc.consume("down", timeout=5)
        assert limited.value.retry_after == 1.0 and len(busy.seen) == 2  # waited, repeated
        server.kill()
        time.sleep(0.5)  # the service has seen its connections closed: each call is refused
        counted = {name: LoseReplies(lambda r: False, lose=0) for name in ("id", "anon", "rel")}

        async def attempt(name: str, retries: int, call: Any) -> tuple[BaseException, int]:
            async with AsyncClient(
                svc.base, token, NS, transport=counted[name], retries=retries
            ) as c:
                with pytest.raises(Unavailable) as e:
                    await call(c)
            return e.value, len(counted[name].seen)

        (fixed, n_fixed), (anon, n_anon), (rel, n_rel) = await asyncio.gather(
            attempt("id", 1, lambda c: c.publish("down", b"y", job_id="down-1")),
            attempt("anon", 2, lambda c: c.publish("down", b"z")),
            attempt("rel", 2, lambda c: c.release("down", jid, lease=job.lease)),
        )
        assert isinstance(fixed, Unavailable) and fixed.safe_to_repeat and n_fixed == 2
        # Once-only calls, repeated: the service says nothing was written (the connection to
        # Redis was refused). A release whose reply was lost says "look the job up" instead
        # (test_503_bodies_decode_into_safe_to_repeat_and_maybe_applied).
        assert isinstance(anon, Unavailable) and not anon.maybe_applied and n_anon == 3
        assert isinstance(rel, Unavailable) and not rel.maybe_applied and n_rel == 3
        assert rel.safe_to_repeat and "nothing was written" in rel.message
    finally:
        svc.stop(timeout=20)
        server.kill()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_long_poll_longer_than_the_client_timeout(
    kind: str, served: ServiceProcess, token: str
) -> None:
    """The client's timeout is per request on top of the long poll's own wait."""
    c = make(kind, served.base, token, timeout=0.3)
    assert await c.consume("idle", timeout=0.8) is None
    assert await c.consume_many("idle", 5, timeout=0.8) == []
    await close(c)


def test_an_unexpected_answer_is_a_dq_error() -> None:
    from cluster_dq.client import _verbs
    from cluster_dq.client._core import finish

    call = _verbs.size("ns", "q")
    with pytest.raises(DQError, match="unexpected answer to GET /api/ns/q/size"):
        finish(call, Reply(200, {}, b'{"queue": "q"}'))
    with pytest.raises(DQError, match="not JSON"):
        finish(call, Reply(200, {}, b"<html>proxy</html>"))
    bad_gateway = error_from(Reply(502, {}, b"<html>Bad Gateway</html>"))
    assert isinstance(bad_gateway, Unavailable) and "Bad Gateway" in bad_gateway.message
    assert bad_gateway.maybe_applied and not bad_gateway.safe_to_repeat


def test_options_and_arguments_are_checked_before_sending() -> None:
    url, tok = "http://127.0.0.1:1", "t" * 24
    for kwargs in ({"retries": -1}, {"timeout": 0}, {"max_connections": 0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            Client(url, tok, NS, **kwargs)
    with pytest.raises(ValueError, match="http://"):
        AsyncClient("127.0.0.1:7777", tok, NS)
    with Client(url, tok, NS) as c:
        for call in (
            lambda: c.publish("q", b"x", attributes={"bad key": "v"}),
            lambda: c.publish("q", b"x", attributes={"k": "line\nbreak"}),
            lambda: c.publish("q", b"x", ttl=float("nan")),
            lambda: c.consume("q", ttr=True),  # type: ignore[arg-type]
            lambda: c.publish("", b"x"),
            lambda: c.update_settings("q"),
            lambda: c.update_settings("q", backoff="fixed"),
        ):
            with pytest.raises(ValueError):
                call()


def test_a_refused_connection_surfaces_unsent_after_the_retries() -> None:
    with Client(f"http://127.0.0.1:{free_port(22000, 23000)}", "t" * 24, NS, retries=1) as c:
        with pytest.raises(TransportError) as e:
            c.size("q")
    assert e.value.sent is False and e.value.status == 0


# -- configuration and the two shells ---------------------------------------------------------


def test_configuration_from_the_environment(
    served: ServiceProcess, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("CLUSTER_DQ_URL", "CLUSTER_DQ_TOKEN", "CLUSTER_DQ_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="CLUSTER_DQ_URL"):
        Client()
    monkeypatch.setenv("CLUSTER_DQ_URL", served.base)
    monkeypatch.setenv("CLUSTER_DQ_NAMESPACE", NS)
    with pytest.raises(ValueError, match="CLUSTER_DQ_TOKEN"):
        AsyncClient()
    monkeypatch.setenv("CLUSTER_DQ_TOKEN", token)
    with Client() as c:
        assert c.namespace == NS
        jid = c.publish("env", b"x")
        assert c.cancel("env", jid) == "ready"
    with Client(namespace="other") as c:  # an argument wins over the environment
        with pytest.raises(Unauthorized):
            c.publish("env", b"x")


def test_admin_configuration_from_the_environment(
    served: ServiceProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLUSTER_DQ_ADMIN_URL", raising=False)
    with pytest.raises(ValueError, match="CLUSTER_DQ_ADMIN_URL"):
        AdminClient()
    monkeypatch.setenv("CLUSTER_DQ_ADMIN_URL", served.admin)
    monkeypatch.setenv("CLUSTER_DQ_ADMIN_AUTH", "no-colon")
    with pytest.raises(ValueError, match="user:password"):
        AdminClient()
    monkeypatch.setenv("CLUSTER_DQ_ADMIN_AUTH", ":".join(ADMIN_AUTH))
    with AdminClient() as admin:
        token = admin.create_token(NS, "from the environment")
        assert token in admin.tokens(NS)
        admin.delete_token(NS, token)
    monkeypatch.delenv("CLUSTER_DQ_ADMIN_AUTH")
    with AdminClient() as admin:  # no basic auth: the token routes refuse
        assert admin.healthz()
        with pytest.raises(Unauthorized):
            admin.tokens(NS)


async def test_async_context_manager(served: ServiceProcess, token: str) -> None:
    async with AsyncClient(served.base, token, NS) as c:
        assert await c.publish("ctx", b"x", job_id="ctx-1") == "ctx-1"
        assert await c.cancel("ctx", "ctx-1") == "ready"


@pytest.mark.parametrize(
    "sync_cls, async_cls", [(Client, AsyncClient), (AdminClient, AsyncAdminClient)]
)
def test_sync_and_async_clients_have_the_same_verbs(sync_cls: type, async_cls: type) -> None:
    def verbs(cls: type) -> dict[str, list[inspect.Parameter]]:
        return {
            n: list(inspect.signature(f).parameters.values())
            for n, f in inspect.getmembers(cls, inspect.isfunction)
            if not n.startswith("_") and n not in ("close", "aclose")
        }

    sync, aio = verbs(sync_cls), verbs(async_cls)
    assert sync.keys() == aio.keys() and len(sync) >= 10
    for name, params in sync.items():
        assert params == aio[name], name
        fn = getattr(async_cls, name)
        assert inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn), name


def test_the_blocking_clients_are_generated_from_the_async_ones(tmp_path: Any) -> None:
    """As httpcore's unasync: ``_sync/`` is ``_async/`` with async/await taken out, written by
    ``scripts/unasync.py`` (lint runs its ``--check``), so the shells cannot drift apart. The
    check fails on a blocking client edited by hand, and passes once the script rewrote it."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(ROOT / "cluster_dq" / "client", copy / "cluster_dq" / "client")
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    script = [sys.executable, str(copy / "scripts" / "unasync.py")]

    def check() -> int:
        return subprocess.run([*script, "--check"], capture_output=True, cwd=copy).returncode

    assert check() == 0
    sync = copy / "cluster_dq" / "client" / "_sync" / "client.py"
    sync.write_text(sync.read_text().replace("def consume(", "def consume_(", 1))
    assert check() == 1
    subprocess.run(script, check=True, capture_output=True, cwd=copy)
    assert check() == 0 and "def consume(" in sync.read_text()


def test_the_client_imports_nothing_of_the_service() -> None:
    """A producer process pays for httpx and tenacity, not for redis-py or Starlette. Of the
    service it imports only ``cluster_dq.names`` and ``cluster_dq.envvars`` (the names' rules
    and the client's variables, shared with the service; they import nothing) and
    ``cluster_dq.tracing`` (the spans; opentelemetry when it is installed)."""
    import subprocess
    import sys

    code = (
        "import sys, cluster_dq.client; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('redis', 'starlette', 'uvicorn', 'prometheus_client') "
        "or (m.startswith('cluster_dq.') and not m.startswith('cluster_dq.client') "
        "and m not in ('cluster_dq.names', 'cluster_dq.envvars', 'cluster_dq.tracing'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
