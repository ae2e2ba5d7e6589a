"""What a failure on the wire means to each sender (``cluster_dq/client/_transport.py``): the
asyncio client's own aiohttp, and httpx under a transport given to it. Each fault is a real
one, on a real connection to a real service: a reply held past the timeout, a pool with no
connection free, a port that refuses connections until it listens. ``sent`` must say whether
the request may have been applied, since the retry rule repeats a once-only call only when
it cannot have been."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from cluster_dq.client import AsyncClient, TransportError
from cluster_dq.localredis import free_port
from cluster_dq.testing.service_process import ServiceProcess
from tests.support.clients import NS, LoseReplies
from tests.support.faultproxy import FaultProxy

SENDERS = ["aiohttp", "httpx"]


def client(sender: str, base: str, token: str, **kw: Any) -> AsyncClient:
    if sender == "httpx":  # (a transport of one's own has its own pool)
        n = kw.get("max_connections", 100)
        kw["transport"] = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=n))
    return AsyncClient(base, token, NS, **kw)


@pytest.mark.parametrize("sender", SENDERS)
async def test_a_reply_held_past_the_timeout_may_have_been_applied(
    sender: str, served: ServiceProcess, token: str
) -> None:
    """The service answered; the answer did not come back in time. A once-only publish is
    not repeated (it was applied); a read is."""
    faults = LoseReplies(lambda r: r.method == "PUT", lose=1)
    proxy = await FaultProxy(served.base, faults, stall=1.5).start()
    c = client(sender, proxy.base, token, timeout=0.4)
    try:
        with pytest.raises(TransportError) as e:
            await c.publish("held", b"x")
        assert e.value.sent is True and len(faults.seen) == 1
        faults.which, faults.lose = (lambda r: r.url.path.endswith("/size")), 1
        assert (await c.size("held")).ready == 1  # the stalled read was asked again
        assert [r.url.path.endswith("/size") for r in faults.seen[1:]] == [True, True]
    finally:
        await c.aclose()
        await proxy.close()


@pytest.mark.parametrize("sender", SENDERS)
async def test_no_free_connection_in_time_is_a_failure_before_sending(
    sender: str, served: ServiceProcess, token: str
) -> None:
    """One connection, held by a long poll: a publish waiting for it gives up before anything
    was sent, so even a once-only call may be repeated."""
    c = client(sender, served.base, token, max_connections=1, timeout=0.3, retries=1)
    try:
        poll = asyncio.create_task(c.consume("pool", timeout=4))
        await asyncio.sleep(0.5)  # the poll holds the one connection
        with pytest.raises(TransportError) as e:
            await c.publish("pool", b"x")
        assert e.value.sent is False
        assert not poll.done()
        assert await poll is None  # the poll ran its course; nothing was published
        assert (await c.size("pool")).total == 0
    finally:
        await c.aclose()


@pytest.mark.parametrize("sender", SENDERS)
async def test_a_refused_connection_is_repeated_even_for_a_once_only_publish(
    sender: str, served: ServiceProcess, token: str
) -> None:
    """Nothing left the client while the port refused connections: the publish is repeated
    until the port listens, and makes one job."""
    port = free_port(23000, 24000)
    c = client(sender, f"http://127.0.0.1:{port}", token, retries=4)
    proxy = FaultProxy(served.base, LoseReplies(lambda r: False, lose=0), port=port)

    async def listen_late() -> None:
        await asyncio.sleep(0.25)  # after the first attempts were refused
        await proxy.start()

    try:
        started = time.monotonic()
        late = asyncio.create_task(listen_late())
        jid = await c.publish("late", b"x")
        await late
        assert time.monotonic() - started >= 0.25
        assert (await c.size("late")).ready == 1 and (await c.peek("late")).id == jid
        async with client(sender, "http://127.0.0.1:1", token, retries=0) as nowhere:
            with pytest.raises(TransportError) as e:
                await nowhere.size("late")
        assert e.value.sent is False
    finally:
        await c.aclose()
        await proxy.close()


@pytest.mark.parametrize("sender", SENDERS)
async def test_a_peer_that_stops_reading_a_big_body_times_out(sender: str, token: str) -> None:
    """A big publish to a peer that accepts the connection and never reads: httpx bounds
    each write by the timeout; aiohttp has no write timeout and waited for ever, so a big
    body's whole exchange is bounded instead. Sent (some of it left): not repeated."""
    stuck: list[asyncio.StreamWriter] = []

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stuck.append(writer)

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = client(sender, f"http://127.0.0.1:{port}", token, timeout=1.0, retries=0)
    try:
        started = time.monotonic()
        with pytest.raises(TransportError) as e:
            await asyncio.wait_for(c.publish("big", b"x" * (16 << 20)), 30)
        assert e.value.sent is True and time.monotonic() - started < 10
    finally:
        await c.aclose()
        for w in stuck:
            w.close()
        server.close()
