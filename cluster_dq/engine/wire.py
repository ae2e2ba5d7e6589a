"""Commands packed into the Redis protocol by hiredis (C) rather than redis-py's Python packer.

redis-py's blocking client packs with hiredis when it is installed; its asyncio connections
pack in Python, argument by argument. A grouped publish of a dozen jobs is a hundred arguments,
and packing them took a tenth of a request's CPU. These connection classes differ from
redis-py's only in ``pack_command`` (pipelines pack through it too); ``use_hiredis`` points a
client's pools at them before any connection is made, on every topology.
``tests/test_wire.py`` checks the bytes are redis-py's own.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection, ConnectionPool
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.exceptions import DataError


class _HiredisPacking:
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


class HiredisConnection(_HiredisPacking, Connection):
    pass


class HiredisSentinelConnection(_HiredisPacking, SentinelManagedConnection):
    pass


def use_hiredis(client: Any) -> None:
    """Makes ``client`` (standalone, Sentinel-managed or Cluster; not connected yet) open its
    connections with the classes above."""
    if isinstance(client, RedisCluster):
        manager = client.nodes_manager
        manager.connection_kwargs["connection_class"] = HiredisConnection
        for node in (*manager.startup_nodes.values(), *manager.nodes_cache.values()):
            node.connection_class = HiredisConnection
        return
    pool: ConnectionPool = client.connection_pool
    if pool.connection_class is SentinelManagedConnection:
        pool.connection_class = HiredisSentinelConnection
    elif pool.connection_class is Connection:
        pool.connection_class = HiredisConnection
