"""The connections every pool's asyncio client opens: redis-py's, with two differences.

- **Commands are packed by hiredis (C).** redis-py's blocking client packs with hiredis when it
  is installed; its asyncio connections pack in Python, argument by argument, and a grouped
  publish of a dozen jobs is a hundred arguments (a tenth of a request's CPU). Pipelines pack
  through ``pack_command`` too. ``tests/engine/test_wire.py`` checks the bytes are redis-py's own.
- **They say when a step is about to be written** (``core.mark_sent``): an error before that
  (connecting, asking Sentinel for the master) means nothing of the step reached Redis, which
  the executor reports as ``Unsent``, safe to repeat whatever the step is.
- **A cancellation during the write is not lost** (Python 3.11's ``wait_for`` can swallow it).

``make_client`` (``pools.py``) builds each topology's client with them; a Cluster has no
constructor argument for its connection class, ``use_on_cluster`` sets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Any

import hiredis
from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster
from redis.asyncio.connection import Connection as RedisConnection
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.exceptions import DataError

from cluster_dq.engine import core


class _Wire:
    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        # A command name with a space ("SCRIPT LOAD", "CLIENT KILL") goes as several
        # arguments, as redis-py sends it.
        if isinstance(first, str) and " " in first:
            args = (*first.encode().split(), *args[1:])
        elif isinstance(first, bytes) and b" " in first:
            args = (*first.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as e:  # None, bool, a dict: what redis-py's encoder refuses too
            raise DataError(str(e)) from e

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        reader, writer = self._reader, self._writer  # type: ignore[attr-defined]
        if reader is not None and (
            reader.at_eof() or reader.exception() is not None or writer.is_closing()
        ):
            # The server closed this pooled connection (it died, or dropped the client): what
            # is written to it cannot reach Redis. Connect afresh instead, so that a server
            # that is down is a refused connection (``Unsent``: nothing sent), not a step sent
            # whose reply was lost (the client would be told it may have been applied).
            await self.disconnect()  # type: ignore[attr-defined]
        if not self.is_connected:  # type: ignore[attr-defined]
            await self.connect()  # type: ignore[attr-defined]
        core.mark_sent()
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        await super().send_packed_command(command, check_health)  # type: ignore[misc]
        if task is not None and task.cancelling() > cancels:
            # Cancelled during this write. redis-py writes through asyncio.wait_for, which on
            # Python 3.11 returns normally when the task is cancelled just as the write ends:
            # the reply would then be awaited for the whole socket timeout (a pump stopped
            # during a stall took 5 s). The reply will not be read: the connection goes.
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise asyncio.CancelledError()


class Connection(_Wire, RedisConnection):
    pass


class SentinelConnection(_Wire, SentinelManagedConnection):
    pass


def use_on_cluster(cluster: RedisCluster) -> None:
    """Makes a Cluster client (not connected yet) open its connections as ``Connection``, and
    close every connection of a node its topology refresh drops once its commands in flight
    are done, or when the client closes (``close_client``). redis-py 8.1 closes the idle ones
    at once and the busy ones on release in tasks of the node's own, which a client closed
    meanwhile never awaits: such a connection stayed open until the garbage collector found
    it, a ResourceWarning in whatever ran then (redis-py #3572, #4053)."""
    opened: weakref.WeakSet[RedisConnection] = weakref.WeakSet()

    class Tracked(Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.add(self)

    _OPENED[cluster] = opened
    cluster.connection_kwargs["connection_class"] = Tracked
    for node in cluster.nodes_manager.startup_nodes.values():
        node.connection_class = Tracked
    cluster.nodes_manager.__class__ = _NodesManager  # slotted: no attribute to patch


# Every connection a Cluster client made, for ``close_all``: a topology refresh after a node
# could not be reached replaces node objects, and redis-py does not close every connection of
# the ones it replaced (their sockets were left to the garbage collector).
_OPENED: weakref.WeakKeyDictionary[RedisCluster, weakref.WeakSet[RedisConnection]] = (
    weakref.WeakKeyDictionary()
)


async def close_all(cluster: RedisCluster) -> None:
    """Closes every connection ``cluster`` made that is still open (after ``aclose``), all at
    once: one to a stalled node can take its connect timeout to close."""
    open_ = [c for c in list(_OPENED.get(cluster, ())) if c.is_connected]
    await asyncio.gather(*(c.disconnect() for c in open_), return_exceptions=True)


class _NodesManager(NodesManager):
    __slots__ = ()

    def set_nodes(
        self, old: dict[str, ClusterNode], new: dict[str, ClusterNode], remove_old: bool = False
    ) -> None:
        dropped = [n for name, n in old.items() if remove_old and name not in new]
        super().set_nodes(old, new, remove_old)
        for node in dropped:
            task = asyncio.ensure_future(_close_when_idle(node))
            task.set_name(CLOSING_DROPPED)
            self._background_tasks.add(task)  # kept until done; close_client ends them
            task.add_done_callback(self._background_tasks.discard)


CLOSING_DROPPED = "cluster_dq: closing a dropped node"
IN_FLIGHT_S = 10.0  # beyond the socket timeout: a command still in use then is cut


async def _close_when_idle(node: ClusterNode) -> None:
    """Every connection of ``node`` closed once none is in use (cancelled: at once)."""
    try:
        deadline = time.monotonic() + IN_FLIGHT_S
        while len(node._free) < len(node._connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.gather(*node._background_tasks, return_exceptions=True)
    finally:
        with contextlib.suppress(Exception):  # at worst the collector closes them
            await node.disconnect()
