"""Hostile and careless use of cluster_dq.client against a real `cluster-dq serve`: every
misuse is a clear exception before sending, or the service's clear error, and changes nothing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from cluster_dq.client import AdminClient, AsyncClient, BadRequest, Client, Sizes
from cluster_dq.testing.service_process import ServiceProcess
from tests.support.clients import FAULTY_KINDS, NS, LoseReplies, close, faulty


async def test_dot_segments_never_reach_another_route(dq: Any) -> None:
    """A job id (or queue) "." / ".." would be folded by the URL into the parent route:
    ack("q", "..") became DELETE /api/ns/q (destroy the queue)."""
    await dq.publish("q", b"keep")
    for bad in (
        lambda: dq.ack("q", ".."),
        lambda: dq.cancel("q", ".."),
        lambda: dq.touch("q", "."),
        lambda: dq.get_job("q", ".."),
        lambda: dq.size(".."),
        lambda: dq.destroy("."),
        lambda: dq.publish("..", b"x"),
        lambda: dq.bury("q", "."),
        lambda: dq.delete_schedule("q", ".."),  # DELETE /api/ns/q/schedules/.. -> the queue
        lambda: dq.get_schedule("q", "."),
    ):
        with pytest.raises(ValueError, match="not a name"):
            await bad()
    assert await dq.size("q") == Sizes(ready=1, delayed=0, reserved=0, dead=0)


async def test_ack_many_refuses_jobs_of_another_queue_and_malformed_items(dq: Any) -> None:
    """A Job of another queue was sent by id to ``queue``: 204, nothing acked, the job still
    reserved; a malformed item was a bare unpacking TypeError."""
    await dq.publish("other", b"x")
    got = await dq.consume("other", ttr=60)
    with pytest.raises(ValueError, match="of queue cns/other, not cns/q"):
        await dq.ack_many("q", [got])
    for bad in ([("id",)], [1], ["abc"], [None], [(1, None)], [("id", 5)], [("..", None)]):
        with pytest.raises(ValueError, match=r"jobs\[0\]"):
            await dq.ack_many("q", bad)
    assert await dq.size("other") == Sizes(ready=0, delayed=0, reserved=1, dead=0)
    await dq.ack_many("other", [got])
    assert await dq.size("other") == Sizes(ready=0, delayed=0, reserved=0, dead=0)


async def test_a_long_poll_beyond_the_services_limit_is_its_400(dq: Any) -> None:
    """The sync client added 1e12 s to its socket timeout: OverflowError before sending."""
    for timeout in (1e12, 3601):
        with pytest.raises(BadRequest, match="timeout"):
            await dq.consume("q", timeout=timeout)
        with pytest.raises(BadRequest, match="timeout"):
            await dq.consume_many("q", 3, timeout=timeout)


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_a_token_or_url_that_cannot_be_sent_is_refused_at_construction(cls: type) -> None:
    """A token with a line break was sent (a header injection, or h11's protocol error seen
    as a reply lost, ``sent=True``); a non-ASCII one was a bare UnicodeEncodeError; a
    malformed url was httpx's InvalidURL (not a ValueError)."""
    url = "http://127.0.0.1:1"
    for bad in ("a\r\nX-Evil: 1", "a\nb", "t\u00f8ken", "tab\there"):
        with pytest.raises(ValueError, match="token must be printable ASCII") as e:
            cls(url, bad, NS)
        assert bad not in str(e.value)  # a token is a secret: not echoed into logs
    for bad_url in ("http://[::1", "http://host:port", "http://", "http://a b/"):
        with pytest.raises(ValueError, match="service url"):
            cls(bad_url, "t" * 24, NS)
    with pytest.raises(ValueError, match="admin url"):
        AdminClient("http://:99")


async def test_a_time_above_zero_is_never_sent_as_zero(dq: Any) -> None:
    """``ttl=0.0004`` was rounded to ``ttl_ms=0``, which the service reads as "never
    expires": the job outlived the ttl asked for by forever. A time above 0 is at least 1 ms."""
    for ttl in (0.0004, 1e-9):
        jid = await dq.publish("tiny", b"x", ttl=ttl)
        job = await dq.get_job("tiny", jid)
        assert job is None or job.ttl > 0  # (ttl: whole seconds left, 0 for never)
    jid = await dq.publish("tiny", b"x", ttl=0)  # 0: never expires
    job = await dq.get_job("tiny", jid)
    assert job is not None and job.ttl == 0


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_an_attribute_the_service_would_not_keep_as_given_is_refused_before_sending(
    cls: type,
) -> None:
    """An attribute value with a space at either end: the sync client sent nothing (h11
    refused the header) but raised TransportError(sent=True), "maybe applied"; the async one
    sent it and the service kept it stripped. A list of pairs was an AttributeError."""
    c = cls("http://127.0.0.1:1", "t" * 24, NS)
    bad: list[Any] = [{"k": " 1"}, {"k": "1 "}, {"k": "\t1"}, [("a", "b")]]
    for attributes in bad:
        with pytest.raises(ValueError, match="attribute"):
            result = c.publish("q", b"x", attributes=attributes)
            if asyncio.iscoroutine(result):
                asyncio.run(result)


async def test_a_sweeps_sub_millisecond_bounds_never_widen_it(dq: Any) -> None:
    """``from``/``to`` are inclusive whole ms: ``since`` must round up, ``until`` down. Rounded
    to the nearest, ``purge(until=died_at - 0.0004)`` purged the job that died 0.4 ms after
    ``until``, and ``redrive(since=died_at + 0.0004)`` redrove one that died before."""
    jid = await dq.publish("sweep", b"x")
    await dq.bury("sweep", jid, reason="boom")
    (dead,) = (await dq.dead_jobs("sweep")).jobs
    assert dead.died_at is not None
    assert (await dq.purge("sweep", until=dead.died_at - 0.0004)).count == 0
    assert (await dq.redrive("sweep", since=dead.died_at + 0.0004)).count == 0
    assert await dq.dead_size("sweep") == 1
    assert (await dq.redrive("sweep", since=dead.died_at, until=dead.died_at)).count == 1


def test_an_async_client_used_in_a_second_event_loop_says_so(
    served: ServiceProcess, token: str
) -> None:
    """docs/client.md: an AsyncClient lives in one event loop. Its pooled connections belong
    to that loop: used from another one it raised "Event loop is closed" (or, with the first
    loop still running in another thread, worked on another loop's sockets)."""
    # no connection kept: none is left behind in the closed loop
    once = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
    c = AsyncClient(served.base, token, NS, transport=once)
    assert asyncio.run(c.size("q")).ready == 0
    with pytest.raises(RuntimeError, match="one AsyncClient per event loop"):
        asyncio.run(c.size("q"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        d = AsyncClient(served.base, token, NS)
        asyncio.run_coroutine_threadsafe(d.size("q"), loop).result(30)
        with pytest.raises(RuntimeError, match="one AsyncClient per event loop"):
            asyncio.run(asyncio.wait_for(d.size("q"), 30))
        asyncio.run_coroutine_threadsafe(d.aclose(), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.parametrize("timeout", [float("inf"), 1e12, float("nan"), -1.0])
def test_an_unusable_client_timeout_is_refused_at_construction(timeout: float) -> None:
    """timeout=inf (or 1e12) was taken, then every request of the blocking client raised
    OverflowError from the socket ("timestamp out of range"); None is the way to no limit."""
    url = "http://127.0.0.1:1"
    for make_one in (
        lambda: Client(url, "t" * 24, NS, timeout=timeout),
        lambda: AsyncClient(url, "t" * 24, NS, timeout=timeout),
        lambda: AdminClient(url, timeout=timeout),
    ):
        with pytest.raises(ValueError, match="timeout"):
            make_one()


def test_a_time_too_large_for_a_float_is_a_value_error() -> None:
    """delay=10**400 (an int no float holds) raised OverflowError from math.isfinite."""
    with Client("http://127.0.0.1:1", "t" * 24, NS) as c:
        for call in (
            lambda: c.publish("q", b"x", delay=10**400),
            lambda: c.publish("q", b"x", ttl=-(10**400)),
            lambda: c.consume("q", timeout=10**400),
            lambda: c.purge("q", since=10**400),
        ):
            with pytest.raises(ValueError, match="finite number of seconds"):
                call()


@pytest.mark.parametrize("kind", FAULTY_KINDS)
async def test_a_lost_republish_reply_with_a_new_job_id_is_repeated_to_its_answer(
    kind: str, served: ServiceProcess, token: str
) -> None:
    """docs/client.md: a republish with ``new_job_id`` and no lease is safe to repeat."""
    faults = LoseReplies(lambda r: r.method == "PUT" and "/job/" in r.url.path)
    c = await faulty(kind, served, token, faults)
    old = await c.publish("rp", b"old")
    assert await c.republish("rp", old, b"new", new_job_id="rp-new-1") == "rp-new-1"
    assert len(faults.seen) == 3  # the publish, the republish whose reply was lost, its repeat
    assert await c.size("rp") == Sizes(1, 0, 0, 0)
    got = await c.get_job("rp", "rp-new-1")
    assert got is not None and got.body == b"new"
    await close(c)
