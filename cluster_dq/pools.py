"""Pools: one Redis deployment each (standalone, Sentinel or Cluster), its engine, its
long-poll hub and its pump; the start-up checks that refuse an unsafe Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from cluster_dq.engine import wire
from cluster_dq.engine.aio import AsyncClient, AsyncEngine
from cluster_dq.engine.steps import EngineConfig, MoveSink
from cluster_dq.errors import ConfigError, RedisFailure
from cluster_dq.metrics import Metrics, PoolMetrics, SizeBoard
from cluster_dq.pump import Pump
from cluster_dq.settings import PoolSettings
from cluster_dq.waiters import WaiterHub

log = logging.getLogger(__name__)

SOCKET_TIMEOUT = 5.0


class _Sentinel(Sentinel):
    """redis-py's asyncio Sentinel, asking the sentinels one discovery at a time.

    Every new master connection asks ``discover_master``, which (redis-py 8.1) walks
    ``self.sentinels`` and, after the awaited answer, swaps ``sentinels[0]`` with
    ``sentinels[i]``, ``i`` read before the await. Concurrent discoveries (a burst of new
    connections; past 100 of them the first sentinel's pool is full and they move on to the
    next) swap with indexes another one made stale: one sentinel ends up in the list twice and
    another out of it, never asked again, its connections never closed. Here the callers that
    come while a discovery is under way share its answer (one round trip for a burst, not
    one each, and no queue behind an unreachable sentinel), so the list stays an ordering of
    the configured sentinels. One service per client (``make_client``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.configured = tuple(self.sentinels)  # what close_client closes, whatever the order
        self._asking: dict[str, asyncio.Future[Any]] = {}

    async def discover_master(self, service_name: str) -> Any:
        asking = self._asking.get(service_name)
        if asking is None or asking.done():  # (the last answer is kept, never reused)
            asking = asyncio.ensure_future(super().discover_master(service_name))
            self._asking[service_name] = asking
        # shielded: a caller cancelled (its request gone) does not cancel the others' answer
        return await asyncio.shield(asking)


def make_client(p: PoolSettings) -> AsyncClient:
    """The pool's asyncio client, its connections ``engine/wire.py``'s on every topology."""
    addrs = p.addresses()
    # redis-py's own retries (3, exponential backoff from 1 s) are off: engine/retry.py is the
    # one policy, applied only where repeating is safe, with one bounded budget.
    common = dict(
        password=p.Password or None,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
    )
    if p.kind == "cluster":
        # One immediate retry inside redis-py lets it re-learn the slots after a failover.
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, port) for h, port in addrs],
            max_connections=p.PoolSize,
            **{**common, "retry": Retry(NoBackoff(), 1)},  # type: ignore[arg-type]
        )
        wire.use_on_cluster(cluster)
        return cluster
    if p.kind == "sentinel":
        sentinel = _Sentinel(
            addrs,
            # the sentinels' clients too: one unreachable sentinel is skipped at once
            sentinel_kwargs={
                "password": p.SentinelPassword or None,
                "socket_timeout": 1.0,
                "retry": Retry(NoBackoff(), 0),
            },
            **common,
        )
        master: AsyncClient = sentinel.master_for(
            p.MasterName,
            db=p.DB,
            max_connections=p.PoolSize,
            connection_class=wire.SentinelConnection,
        )
        return master
    host, port = addrs[0]
    pool = ConnectionPool(
        connection_class=wire.Connection,
        host=host,
        port=port,
        db=p.DB,
        max_connections=p.PoolSize,
        **common,  # type: ignore[arg-type]
    )
    return Redis.from_pool(pool)


def make_sync_client(p: PoolSettings) -> Any:
    """The blocking client of a pool (bulk tools, Spark partitions), same topologies."""
    import redis
    from redis.backoff import NoBackoff as SyncNoBackoff
    from redis.retry import Retry as SyncRetry
    from redis.sentinel import Sentinel as SyncSentinel

    addrs = p.addresses()
    common: dict[str, Any] = dict(
        password=p.Password or None, socket_timeout=30.0, socket_connect_timeout=2.0
    )
    if p.kind == "cluster":
        return redis.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(h, port) for h, port in addrs],  # type: ignore[no-untyped-call]
            retry=SyncRetry(SyncNoBackoff(), 1),
            **common,
        )
    if p.kind == "sentinel":
        sentinel = SyncSentinel(
            addrs,
            sentinel_kwargs={
                "password": p.SentinelPassword or None,  # type: ignore[no-untyped-call]
                "socket_timeout": 1.0,
                "retry": SyncRetry(SyncNoBackoff(), 0),
            },
        )
        return sentinel.master_for(
            p.MasterName, db=p.DB, retry=SyncRetry(SyncNoBackoff(), 0), **common
        )  # type: ignore[no-untyped-call]
    host, port = addrs[0]
    return redis.Redis(host=host, port=port, db=p.DB, retry=SyncRetry(SyncNoBackoff(), 0), **common)


async def close_client(client: AsyncClient) -> None:
    """Closes a client and, for Sentinel, the connections to the sentinels too (a discovery
    still under way for callers that left is cancelled first: it would open one again); for a
    Cluster, the nodes it dropped (``wire.use_on_cluster``) too. Each part is closed even when
    another fails (a stalled peer's close times out); the first failure is raised at the end."""
    try:
        await client.aclose()
    finally:
        if isinstance(client, RedisCluster):
            tasks = list(client.nodes_manager._background_tasks)
            for task in tasks:
                if task.get_name() == wire.CLOSING_DROPPED:
                    task.cancel()  # it closes them as it ends
            await asyncio.gather(*tasks, return_exceptions=True)
            await wire.close_all(client)
        manager = (
            getattr(client.connection_pool, "sentinel_manager", None)
            if isinstance(client, Redis)
            else None
        )
        if manager is not None:
            asking = list(getattr(manager, "_asking", {}).values())
            for future in asking:
                future.cancel()
            await asyncio.gather(*asking, return_exceptions=True)
            sentinels = getattr(manager, "configured", getattr(manager, "sentinels", []))
            closed = await asyncio.gather(*(s.aclose() for s in sentinels), return_exceptions=True)
            for outcome in closed:
                if isinstance(outcome, BaseException):
                    raise outcome


def _listpack_limit(cfg: dict[str, str], which: str) -> int:
    """``hash-max-listpack-<which>`` (``ziplist`` before Redis 7) of one server's CONFIG."""
    return int(cfg.get(f"hash-max-listpack-{which}", cfg.get(f"hash-max-ziplist-{which}")) or 0)


async def check_redis(name: str, client: AsyncClient) -> list[str]:
    """Refuses an evicting Redis (it silently loses jobs); returns warnings for the rest."""
    warnings: list[str] = []
    configs: list[dict[str, str]]
    sentinel = isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool)
    try:
        if isinstance(client, RedisCluster):
            replies: Any = await client.config_get("*", target_nodes=RedisCluster.PRIMARIES)
            configs = (
                list(replies.values())
                if isinstance(replies, dict) and all(isinstance(v, dict) for v in replies.values())
                else [replies]
            )
        else:
            configs = [cast(dict[str, str], await client.config_get("*"))]
    except ResponseError as e:  # CONFIG disabled (managed Redis): cannot check, say so
        return [f"pool {name}: cannot read CONFIG ({e}); make sure maxmemory-policy is noeviction"]
    for cfg in configs:
        policy = cfg.get("maxmemory-policy")
        if policy is not None and policy != "noeviction":
            raise ConfigError(
                f"pool {name}: maxmemory-policy is {policy!r}; cluster_dq needs 'noeviction' "
                "(an evicting Redis silently deletes jobs)"
            )
        if cfg.get("appendonly") == "no" and cfg.get("save", "") == "":
            warnings.append(
                f"pool {name}: persistence is OFF (no AOF, no RDB): a restart loses every job"
            )
        if sentinel and cfg.get("min-replicas-to-write") == "0":
            warnings.append(
                f"pool {name}: min-replicas-to-write is 0; set it to 1 on every server of the group, "
                "or a master paused past a failover takes writes (and reservations) it then loses"
            )
        value = _listpack_limit(cfg, "value")
        if value < 128:
            warnings.append(
                f"pool {name}: hash-max-listpack-value is {value}; set it to 128 or more so "
                "delayed jobs stay compact (~110 B/job instead of ~300)"
            )
        entries = _listpack_limit(cfg, "entries")
        if entries < (lanes := EngineConfig().lane_capacity):
            warnings.append(
                f"pool {name}: hash-max-listpack-entries is {entries}; set it to {lanes} or more "
                f"so a wheel bucket of {lanes} delayed jobs stays compact (~110 B/job instead of ~160)"
            )
    return warnings


class _Both:
    """Tells every sink (metrics, lifecycle log) of the jobs the scripts moved."""

    def __init__(self, sinks: list[MoveSink]) -> None:
        self.sinks = sinks

    def moved(self, ns: str, q: str, promoted: int, retried: int, dead: int, expired: int) -> None:
        for s in self.sinks:
            s.moved(ns, q, promoted, retried, dead, expired)


@dataclass
class RedisPool:
    name: str
    settings: PoolSettings
    engine: AsyncEngine
    hub: WaiterHub
    metrics: PoolMetrics
    pump: Pump | None = None

    @classmethod
    def create(
        cls,
        settings: PoolSettings,
        config: EngineConfig,
        events: MoveSink | None = None,
        recorder: Metrics | None = None,
    ) -> RedisPool:
        recorder = recorder or Metrics()
        metrics = recorder.pool(settings.name)
        on = recorder.enabled
        sinks = [s for s in (metrics if on else None, events) if s is not None]
        moves = sinks[0] if len(sinks) == 1 else _Both(sinks) if sinks else None
        config = dataclasses.replace(config, moves=moves, lane_hints={})
        engine = AsyncEngine(
            make_client(settings),
            config,
            observer=metrics.redis_call if on else None,
            wait_replicas=settings.WaitReplicas,
            wait_timeout_ms=settings.WaitTimeoutMs,
        )
        return cls(settings.name, settings, engine, WaiterHub(engine), metrics)

    async def start(
        self,
        run_pump: bool = True,
        board: SizeBoard | None = None,
        sizes_every_s: float = 10.0,
        reconcile_every_s: float = 60.0,
        migrate_to: RedisPool | None = None,
    ) -> None:
        """``migrate_to``: the pool this one migrates to (``MigrateTo``), where its pump
        moves the schedules it holds instead of firing them."""
        # The supervisor checked the Redis settings (supervisor._preflight); a pool that is down
        # now answers 503 and /readyz says so until it is back.
        if isinstance(self.engine.client, RedisCluster):
            try:  # learn the slots once, before 16 pump shards and the first requests race to
                await self.engine.client.initialize()
            except (RedisError, OSError) as e:
                log.warning("pool %s: cluster not reachable yet: %s", self.name, e)
        if run_pump:
            self.pump = Pump(
                self.engine,
                metrics=self.metrics,
                board=board,
                sizes_every_s=sizes_every_s,
                reconcile_every_s=reconcile_every_s,
                move_schedules_to=migrate_to.engine if migrate_to is not None else None,
            )
            self.pump.start()

    async def ready(self) -> dict[str, bool | str]:
        """For /readyz: Redis answers, and every script is loaded (loading what is missing)."""
        try:
            await self.engine.ping()
        except RedisFailure as e:
            return {"redis": False, "scripts": False, "error": _said(e)}
        try:
            return {"redis": True, "scripts": await self.engine.ensure_scripts()}
        except RedisFailure as e:
            return {"redis": True, "scripts": False, "error": _said(e)}

    async def close(self) -> bool:
        """Stops the pump and the hub (long-polls answered, jobs of gone consumers given
        back) before the client goes, each whatever the one before it raised. True when
        nothing had to be cut short."""
        try:
            if self.pump:
                await self.pump.stop()
        finally:
            try:
                clean = await self.hub.close()
            finally:
                await close_client(self.engine.client)
        return clean


@dataclass(frozen=True, slots=True)
class ClusterShard:
    """A Cluster master as this instance's client sees it: its address, replicas, slots."""

    primary: str
    replicas: tuple[str, ...]
    slots: tuple[tuple[int, int], ...]  # inclusive ranges


@dataclass(frozen=True, slots=True)
class Topology:
    """What a pool is made of, as this instance's client sees it (no extra round trip for a
    Cluster: its slot map; one question to the sentinels for a Sentinel group)."""

    name: str
    kind: str  # standalone, sentinel, cluster
    addresses: tuple[str, ...]  # as configured (sentinels, seeds)
    master: str = ""  # standalone: the server; sentinel: the current master
    shards: tuple[ClusterShard, ...] = ()
    error: str = ""  # the sentinels could not be asked

    def owner(self, slot: int) -> str:
        """The Cluster master serving ``slot`` ('' when none, or not a Cluster)."""
        for shard in self.shards:
            if any(lo <= slot <= hi for lo, hi in shard.slots):
                return shard.primary
        return ""


async def describe(pool: RedisPool) -> Topology:
    p = pool.settings
    addrs = tuple(f"{h}:{port}" for h, port in p.addresses())
    client = pool.engine.client
    if isinstance(client, RedisCluster):
        try:  # one node's CLUSTER SLOTS (replicas included; the client's own map has none)
            reply: Any = await client.cluster_slots(target_nodes=RedisCluster.RANDOM)
        except (RedisError, OSError) as e:
            return Topology(pool.name, "cluster", addrs, error=f"{type(e).__name__}: {e}")
        ranges: dict[str, list[tuple[int, int]]] = {}
        replicas: dict[str, tuple[str, ...]] = {}
        for (lo, hi), nodes in sorted(reply.items()):
            primary = _address(nodes["primary"])
            replicas[primary] = tuple(sorted(_address(r) for r in nodes.get("replicas", [])))
            ranges.setdefault(primary, []).append((int(lo), int(hi)))
        shards = tuple(
            ClusterShard(name, replicas[name], tuple(spans))
            for name, spans in sorted(ranges.items(), key=lambda kv: kv[1][0][0])
        )
        return Topology(pool.name, "cluster", addrs, shards=shards)
    if p.kind == "sentinel":
        try:
            host, port = await client.connection_pool.get_master_address()  # type: ignore[attr-defined]
        except (RedisError, OSError) as e:
            return Topology(pool.name, "sentinel", addrs, error=f"{type(e).__name__}: {e}")
        return Topology(pool.name, "sentinel", addrs, master=f"{host}:{port}")
    return Topology(pool.name, "standalone", addrs, master=addrs[0])


def _address(node: Any) -> str:
    host, port = node[0], node[1]
    return f"{host.decode() if isinstance(host, bytes) else host}:{port}"


def _said(e: RedisFailure) -> str:
    """What Redis said (the error the engine translated), for /readyz."""
    cause = e.__cause__ or e
    return f"{type(cause).__name__}: {cause}"
