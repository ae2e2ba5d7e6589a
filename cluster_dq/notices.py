"""The queues' notices to the long-polls waiting on them, over sharded pub/sub.

The scripts ``SPUBLISH`` on a queue's notify channel (``{ns/q}:notify``, in the queue's own slot:
``lua/lib/notify.lua``) when its ready set stops being empty or a job is put off to a
time its long-polls may not know of. A plain ``PUBLISH`` on a Cluster goes over the cluster bus
to every node, each of which reads every notice of every queue: a cost that grows with the
number of nodes, not with the work. ``SPUBLISH`` stays on the shard that holds the slot, and a
process listens there: one connection per node it has channels on (redis-py's
``ClusterPubSub``), each read by a task of its own. On standalone and Sentinel it is one
connection (after a Sentinel failover redis-py connects to the new master and subscribes
again; on a Cluster it moves the channels of a slot that changed hands).

A notice lost meanwhile costs latency, never a job: the watchers look at their queues on their
due times and at least once a second whatever they hear (``waiters.SAFETY_POLL_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import ClusterPubSub

from cluster_dq.engine import retry
from cluster_dq.engine.core import cancelling, end_if_cancelled

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 1.0  # a reader's wait for a message, between looks at what it should read


class Notices:
    """One process's (one pool's) subscriptions to queue notify channels. ``heard(channel,
    data)`` is called for each notice, on the event loop."""

    def __init__(self, client: Any, heard: Callable[[bytes, bytes], None]) -> None:
        self._client = client
        self._pubsub = client.pubsub()
        self._heard = heard
        self._subscribing = asyncio.Lock()  # one subscription change at a time
        self._reader: asyncio.Task[None] | None = None
        self._nodes: dict[str, asyncio.Task[None]] = {}  # a Cluster's: a reader per node
        self._changed = asyncio.Event()  # a channel was added: maybe on a node not read yet
        self._follow_backoff, self._follow_after = 0.0, 0.0  # after a failed move of channels

    @property
    def channels(self) -> set[bytes]:
        """The channels listened to (those whose subscription was confirmed or is under way)."""
        return {c if isinstance(c, bytes) else c.encode() for c in self._pubsub.shard_channels}

    async def listen(self, channel: bytes) -> None:
        async with self._subscribing:
            await self._pubsub.ssubscribe(channel)
        self._changed.set()
        if self._reader is None or self._reader.done():
            read = self._read_nodes() if isinstance(self._pubsub, ClusterPubSub) else self._read()
            self._reader = asyncio.create_task(read, context=retry.detached())

    async def leave(self, channel: bytes) -> None:
        async with self._subscribing:
            await self._pubsub.sunsubscribe(channel)

    async def close(self) -> None:
        tasks = [t for t in (self._reader, *self._nodes.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()

    async def _read(self, node: str | None = None) -> None:
        """Reads one connection: the only one, or a Cluster node's (until it holds no channel
        any more, or the node has left the Cluster)."""
        failing = False
        while True:
            end_if_cancelled()
            try:
                if node is None:
                    msg = await self._pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=READ_TIMEOUT_S
                    )
                else:
                    target = self._client.get_node(node_name=node)
                    pubsub = self._pubsub.node_pubsub_mapping.get(node)
                    if target is None or pubsub is None:
                        return
                    if pubsub.connection is None:  # its first subscription is under way
                        await asyncio.sleep(0.1)
                        continue
                    msg = await self._pubsub.get_sharded_message(
                        ignore_subscribe_messages=True, timeout=READ_TIMEOUT_S, target_node=target
                    )
            except asyncio.CancelledError:
                raise
            except Exception as e:  # redis-py can leak transport races as other errors
                if cancelling():
                    raise asyncio.CancelledError() from e
                if not failing:  # once per outage: the safety poll covers it meanwhile
                    log.warning("notices from %s: %s: %s", node or "redis", type(e).__name__, e)
                failing = True
                # soon again: redis-py reconnects (to the new master) and subscribes again
                await asyncio.sleep(0.1)
                continue
            failing = False
            if msg and msg.get("type") == "smessage":
                self._heard(msg["channel"], msg["data"])

    def _misplaced(self) -> bool:
        """Whether a channel is listened to on a node that no longer holds its slot, by this
        process's slot map. redis-py moves the channels when it learns a new map, and tries a
        failed move again only when the map changes once more: here, every pass."""
        mapping = self._pubsub.node_pubsub_mapping
        for channel in list(self._pubsub.shard_channels):
            try:
                node = self._client.get_node_from_key(channel)
            except Exception:  # the slot not covered for now (a failover under way)
                continue
            pubsub = mapping.get(node.name)
            if pubsub is None or channel not in pubsub.shard_channels:
                return True
        return False

    async def _follow(self) -> None:
        """Moves misplaced channels; after a failure, not again for 1, 2, 4... up to 30 s (each
        try holds the subscriptions of every node while it waits on the unreachable one)."""
        now = asyncio.get_running_loop().time()
        if now < self._follow_after:
            return
        try:
            async with self._subscribing:
                await self._pubsub.reinitialize_shard_subscriptions()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not self._follow_backoff:  # once per outage
                log.warning("notices: moving channels: %s: %s", type(e).__name__, e)
            self._follow_backoff = min(max(self._follow_backoff * 2, 1.0), 30.0)
            self._follow_after = now + self._follow_backoff
        else:
            self._follow_backoff = 0.0

    async def _read_nodes(self) -> None:
        """A Cluster: a reader for each node that holds channels of this process (redis-py
        adds one when a channel lands on a new node or its slot moves there)."""
        try:
            loop = asyncio.get_running_loop()
            checked = loop.time()
            while True:
                self._start_readers()
                if loop.time() - checked >= READ_TIMEOUT_S:  # once a second, not per channel
                    checked = loop.time()
                    if self._misplaced():
                        await self._follow()
                        self._start_readers()
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(READ_TIMEOUT_S):
                        await self._changed.wait()
        finally:
            readers = list(self._nodes.values())
            for t in readers:
                t.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    def _start_readers(self) -> None:
        for name in list(self._pubsub.node_pubsub_mapping):
            task = self._nodes.get(name)
            if task is None or task.done():
                self._nodes[name] = asyncio.create_task(self._read(name), context=retry.detached())
        for name in [n for n, t in self._nodes.items() if t.done()]:
            del self._nodes[name]
