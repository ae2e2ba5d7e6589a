"""The connections of ``cluster_dq/engine/wire.py``: commands packed by hiredis are the bytes
redis-py packs, whatever the arguments; every topology's client opens its connections with
these classes and works through them; a Sentinel client keeps asking, and closes, every
sentinel. (What they say about a step being sent is
tests/system/test_outages.py's.)"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import signal
import time
import warnings
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.wire import Connection as WireConnection
from cluster_dq.engine.wire import SentinelConnection
from cluster_dq.localredis import Cluster, SentinelGroup, Server, free_port
from cluster_dq.pools import close_client, make_client
from tests.support import Deployment

argument = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=32),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: repr(f) == str(f)),
)


@given(
    name=st.sampled_from(["EVALSHA", "SCRIPT LOAD", b"CLIENT KILL", "GET", b"HSET"]),
    args=st.lists(argument, max_size=40),
)
def test_hiredis_packs_what_redis_py_packs(name: str | bytes, args: list[Any]) -> None:
    ours = b"".join(WireConnection().pack_command(name, *args))
    theirs = b"".join(Connection().pack_command(name, *args))
    if any(isinstance(a, float) for a in args):  # hiredis spells floats its own way
        assert ours.count(b"\r\n") == theirs.count(b"\r\n")
    else:
        assert ours == theirs


def test_an_argument_redis_cannot_take_is_refused_as_redis_py_refuses_it() -> None:
    with pytest.raises(DataError):
        WireConnection().pack_command("SET", "k", None)


async def test_a_cancellation_during_a_write_is_honoured_once(
    redis_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task is cancelled while its command is being written and redis-py's write returns
    normally anyway (Python 3.11's wait_for swallows a cancellation that arrives as it ends):
    the call raises CancelledError and drops the connection (its reply will not be read),
    instead of waiting the whole socket timeout for it. A task that swallowed a cancellation
    earlier (its count stays raised) is not failed by it on every later write."""
    original = Connection.send_packed_command

    async def cancelled_as_it_ends(self: Any, command: Any, check_health: bool = True) -> None:
        await original(self, command, check_health)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # as a cancellation that the write's wait_for swallowed

    conn = WireConnection(host="127.0.0.1", port=redis_server.port)
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
        with monkeypatch.context() as m:
            m.setattr(Connection, "send_packed_command", cancelled_as_it_ends)

            async def write() -> None:
                await conn.send_packed_command(conn.pack_command("PING"))
                await asyncio.sleep(3600)  # not cancelled: waits here (the bug)

            writer = asyncio.create_task(write())
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(5):  # a TimeoutError here: the write went on
                    await writer
            assert not conn.is_connected

        async def after_a_swallowed_cancellation() -> bytes:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)  # swallowed: task.cancelling() stays 1
            await conn.send_packed_command(conn.pack_command("PING"))
            reply: bytes = await conn.read_response()
            return reply

        assert await asyncio.create_task(after_a_swallowed_cancellation()) in (b"PONG", "PONG")
    finally:
        await conn.disconnect()


async def test_every_topology_connects_with_the_hiredis_classes(deployment: Deployment) -> None:
    client = make_client(deployment.pool_settings())
    try:
        if isinstance(client, RedisCluster):
            await client.initialize()
            nodes = client.get_nodes()
            # (a class of the client's own: it keeps track of every connection it opens)
            assert nodes and all(issubclass(n.connection_class, WireConnection) for n in nodes)
        else:
            assert client.connection_pool.connection_class in (
                WireConnection,
                SentinelConnection,
            )
        engine = AsyncEngine(client)
        assert await engine.client.set("{wire}k", "v" * 10_000) is True
        assert await engine.client.get("{wire}k") == b"v" * 10_000
    finally:
        await close_client(client)


async def test_a_burst_of_new_connections_keeps_every_sentinel_asked_and_closed(
    redis_sentinel: SentinelGroup,
) -> None:
    """Each new master connection asks the sentinels where the master is. 150 at once on a
    fresh client (more than a sentinel client's 100 connections, so some move on to the next
    sentinel): the client still knows the 3 sentinels, once each, and closing it leaves no
    connection for the garbage collector to find open."""
    gc.collect()  # what earlier tests left is not this test's
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        client = make_client(redis_sentinel.pool_settings())
        try:
            await asyncio.gather(*(client.ping() for _ in range(150)))
            manager = client.connection_pool.sentinel_manager  # type: ignore[union-attr]
            asked = [s.connection_pool.connection_kwargs["port"] for s in manager.sentinels]
            del manager
        finally:
            await close_client(client)
        del client
        gc.collect()
    assert sorted(asked) == sorted(port for _, port in redis_sentinel.sentinel_addrs)
    assert [str(w.message) for w in got if issubclass(w.category, ResourceWarning)] == []


async def test_an_unreachable_sentinel_costs_one_refused_connection(
    redis_sentinel: SentinelGroup,
) -> None:
    """The sentinel listed first is down (its host is often the failed master's): the client
    asks the next one at once. The sentinels' clients had redis-py's default retries (3, with
    backoff from 1 s): every new master connection, in a failover above all, waited ~3 s
    before asking a sentinel that answers. (The bound is loose: it is a promise, not a
    figure.)"""
    settings = redis_sentinel.pool_settings()
    dead = free_port(19500, 20000)
    client = make_client(dataclasses.replace(settings, Addr=f"127.0.0.1:{dead},{settings.Addr}"))
    try:
        started = time.monotonic()
        assert await client.ping()
        took = time.monotonic() - started
        assert took < 1.5, f"the first command took {took:.1f} s"
    finally:
        await close_client(client)


async def test_closing_a_client_ends_a_discovery_its_callers_left(
    redis_sentinel: SentinelGroup,
) -> None:
    """A master discovery under way (the first sentinel stalled: it accepts and never
    answers), its caller gone (a request that left, a pump stopped in a failover), then the
    client closed: nothing of the client runs on. The discovery used to carry on (it is shared,
    so shielded from its callers), to time out and ask the next sentinel on a closed client."""
    stalled = redis_sentinel.sentinels[0]
    client = make_client(redis_sentinel.pool_settings())  # the stalled one listed first
    os.kill(stalled.process.pid, signal.SIGSTOP)
    try:
        before = asyncio.all_tasks()
        caller = asyncio.ensure_future(client.ping())
        await asyncio.sleep(0.3)  # connected to the stalled sentinel, waiting for its answer
        assert not caller.done()
        caller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        await close_client(client)
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() - before if not t.done()]
        assert left == [], left
    finally:
        os.kill(stalled.process.pid, signal.SIGCONT)


async def test_a_node_the_cluster_no_longer_lists_has_every_connection_closed(
    redis_cluster: Cluster,
) -> None:
    """A topology refresh that drops a node (a failed master, once its replica is promoted)
    while a command is in flight on it: the command may finish, and when the client closes
    every connection of the dropped node is closed with it (a connection of a node the client
    no longer lists stayed open until the garbage collector found it: a ResourceWarning in
    whatever test ran then)."""
    client = make_client(redis_cluster.pool_settings())
    try:
        assert isinstance(client, RedisCluster)
        await client.ping(target_nodes=RedisCluster.ALL_NODES)
        manager = client.nodes_manager
        node = next(iter(manager.nodes_cache.values()))
        busy = node.acquire_connection()  # a command in flight on it
        await busy.connect()  # type: ignore[no-untyped-call]
        kept = {name: n for name, n in manager.nodes_cache.items() if n is not node}
        manager.set_nodes(manager.nodes_cache, kept, remove_old=True)
        await asyncio.sleep(0.3)
        assert busy.is_connected  # not cut under its command
    finally:
        await close_client(client)
    assert not busy.is_connected


async def test_every_connection_a_cluster_client_opened_is_closed_with_it(
    redis_cluster: Cluster,
) -> None:
    """A topology refresh after a node could not be reached replaces node objects, and redis-py
    does not close every connection of the ones it replaced (the kill drills of a Cluster
    master left their sockets to the garbage collector). Closing the client closes them too."""
    client = make_client(redis_cluster.pool_settings())
    try:
        assert isinstance(client, RedisCluster)
        await client.ping(target_nodes=RedisCluster.ALL_NODES)
        manager = client.nodes_manager
        name, node = next(iter(manager.nodes_cache.items()))
        kept = node.acquire_connection()
        await kept.connect()  # type: ignore[no-untyped-call]
        del manager.nodes_cache[name]  # replaced, its connection neither released nor closed
    finally:
        await close_client(client)
    assert not kept.is_connected
