"""Typed, frozen settings from one TOML file (lmstfy's keys where they exist), overridden by
``CLUSTER_DQ_*`` environment variables; every bad key or value is refused by name.

Environment names: the TOML path in upper case joined by ``__`` for nesting, e.g.
``CLUSTER_DQ_PORT=7777``, ``CLUSTER_DQ_POOL__DEFAULT__ADDR=127.0.0.1:7000``.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cluster_dq import envvars, tracing
from cluster_dq.errors import ConfigError
from cluster_dq.models import MAX_BODY, MAX_SECONDS, MAX_TRIES

# A pool or ring name: what a token ``name:token`` may carry before its ':'.
from cluster_dq.names import ROUTE_NAME_RE

ENV_PREFIX = "CLUSTER_DQ_"
# An ``AllowedHosts`` entry (lower-cased): *, [*.]name[:port] or [v6addr][:port]; see http/hosts.py
HOST_ENTRY_RE = re.compile(
    r"\*|(\*\.)?[-_a-z0-9]+(\.[-_a-z0-9]+)*\.?(:[0-9]{1,5})?|\[[0-9a-f:.]+\](:[0-9]{1,5})?"
)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    name: str
    Addr: str = ""  # host:port; Sentinel: sentinel addresses (comma); Cluster: seed nodes
    Password: str = ""
    DB: int = 0
    MasterName: str = ""  # enables Sentinel
    SentinelPassword: str = ""
    Cluster: bool = False
    PoolSize: int = 256
    MigrateTo: str = ""  # migration mode: new jobs go to that pool, this one is drained
    # Durable publish: a 2xx only once this many replicas confirmed the write (Redis WAIT),
    # else 503 naming the job ids (safe to publish again with the same job_id). 0: off.
    WaitReplicas: int = 0
    WaitTimeoutMs: int = 500

    @property
    def kind(self) -> str:
        if self.Cluster:
            return "cluster"
        return "sentinel" if self.MasterName else "standalone"

    def addresses(self) -> list[tuple[str, int]]:
        out = []
        for part in self.Addr.split(","):
            part = part.strip().removeprefix("redis://").rstrip("/")
            if not part:
                continue
            host, _, port = part.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"Pool.{self.name}.Addr: bad address {part!r} (want host:port)")
            out.append((host, int(port)))
        if not out:
            raise ConfigError(f"Pool.{self.name}.Addr is required")
        return out


@dataclass(frozen=True, slots=True)
class RingSettings:
    """``[Ring.<name>]``: a namespace whose token names the ring is spread over ``Pools`` by
    consistent hashing of ``ns/q``. ``PreviousPools`` is the membership before the last change:
    queues that moved are drained from their old member until it is removed."""

    name: str
    Pools: tuple[str, ...] = ()
    PreviousPools: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Settings:
    Host: str = "127.0.0.1"
    Port: int = 7777
    AdminHost: str = "127.0.0.1"
    AdminPort: int = 7778
    # Embedded mode (no pool configured): the port of the redis-server ``serve`` starts on
    # 127.0.0.1. 0: a free port of 17000-17999.
    EmbeddedRedisPort: int = 0
    Workers: int = 1
    LogLevel: str = "info"
    LogFormat: str = "json"
    EnableAccessLog: bool = False
    MaxBodyBytes: int = 1024 * 1024
    TTLSecond: int = 86_400
    DelaySecond: int = 0
    TriesNum: int = 1
    TTRSecond: int = 120
    TimeoutSecond: int = 0
    MaxTimeoutSecond: int = 600
    Shards: int = 16
    # A publish of a job id acked this recently is a duplicate, not a new job: a publish retried
    # after its reply was lost in a failover cannot bring back a job already done. 0: off.
    AckedIdMemorySecond: int = 60
    # How long the result a consumer gave on ack stays visible (peek by id) after the ack.
    ResultSecond: int = 3600
    # How long a publish's answer is kept under its Idempotency-Key: a repeat within it gets
    # that answer and writes nothing (docs/api.md).
    IdempotencyKeySecond: int = 86_400
    TokenCacheSecond: float = 2.0
    # How long an instance keeps a queue's default ttr and tries (its settings) before it reads
    # them again: a change made through another instance applies within this. 0: every request.
    QueueSettingsCacheSecond: float = 1.0
    LifecycleDir: str = ""  # record job lifecycle events here (JSON lines) for analysis; "" = off
    EnableMetrics: bool = True  # off only to measure what the metrics cost
    # OpenTelemetry spans of the data port's messaging requests (docs/observability.md): needs
    # the otel extra and the exporter OTEL_TRACES_EXPORTER names (otlp by default, or console).
    EnableTracing: bool = False
    SizeIntervalSecond: float = 10.0  # how often shard leaders measure their queues (metrics)
    # How often one instance (shard 0's pump leader) sweeps the pool for queues whose shard
    # signal was lost (a publisher killed between its two steps). 0: never.
    ReconcileSecond: float = 60.0
    # On SIGTERM a worker answers its long-polls at once, then lets requests in flight finish
    # for at most this long (the supervisor waits this + 15 s before it kills a worker).
    ShutdownGraceSecond: float = 10.0
    # How long a request (and each pump step) keeps repeating a Redis step that failed and is
    # safe to repeat, before it answers 503: long enough to ride over a failover (a Sentinel
    # one measured ~2.4 s, a Cluster one up to ~4.5 s), short enough for a client's timeout.
    RetryBudgetSecond: float = 5.0
    MaxWaiters: int = 10_000  # long-polls waiting at once per worker; beyond: 429, Retry-After
    # Of those, at most this many for any one namespace (a tenant's share: one namespace's
    # long-polls cannot lock the others out); beyond: 429. At least MaxWaiters: no share.
    MaxWaitersPerNamespace: int = 2_500
    # Distinct (namespace, queue) label pairs of the per-queue metrics per worker; the
    # queues beyond it are counted under queue="_other".
    MetricsMaxQueues: int = 1_000
    # How often each worker adds what it counted per queue to the queues' 24-h history in
    # Redis (the dashboard's charts): a divisor of its 5-minute buckets. 0: no history kept.
    HistoryFlushSecond: float = 60.0
    # The admin port (admin API and dashboard) shows and changes nothing it should not: every
    # state-changing request is a 403, the dashboard hides its actions, no token value is
    # listed. ``DashboardReadOnly`` is its old name (either turns it on).
    AdminReadOnly: bool = False
    DashboardReadOnly: bool = False
    # The Host header values both ports answer (DNS rebinding); anything else: 400 before any
    # routing. Empty: the loopback names and Host/AdminHost unless they are wildcard
    # addresses. Behind a load balancer: the names clients use. "*": any (no check).
    AllowedHosts: tuple[str, ...] = ()
    # Slow and idle connections (per connection): a request head must arrive within
    # HeaderTimeoutSecond (from the connection, or from a request's first byte); a body may
    # pause at most BodyTimeoutSecond between two reads; an idle keep-alive connection is
    # closed after KeepAliveTimeoutSecond. A request whose head is complete (a long-poll) has
    # no timeout but its own. Each port of a worker holds at most MaxConnections open
    # connections; one more is answered 503 and closed.
    HeaderTimeoutSecond: float = 10.0
    BodyTimeoutSecond: float = 30.0
    KeepAliveTimeoutSecond: int = 75
    MaxConnections: int = 12_000
    Accounts: dict[str, str] = field(default_factory=dict)
    Pool: dict[str, PoolSettings] = field(default_factory=dict)
    Ring: dict[str, RingSettings] = field(default_factory=dict)

    @property
    def read_only(self) -> bool:
        """``AdminReadOnly``, or its old name ``DashboardReadOnly``."""
        return self.AdminReadOnly or self.DashboardReadOnly

    @property
    def embedded(self) -> bool:
        """No pool configured: ``serve`` starts its own local redis-server."""
        return not self.Pool


_TYPES = {"int": int, "str": str, "bool": bool, "float": float}
NAMES = "tuple[str, ...]"  # a TOML array of names, or (environment) a comma-separated string


def _coerce(where: str, kind: str, value: Any) -> Any:
    if kind == NAMES:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
            raise ConfigError(f"{where}: expected a list of names, got {value!r}")
        return tuple(i.strip() for i in items if i.strip())
    want = _TYPES[kind]
    if isinstance(value, str) and want is not str:
        text = value.strip().lower()
        try:
            if want is bool:
                if text not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(text)
                return text in ("1", "true", "yes")
            return want(text)
        except ValueError:
            raise ConfigError(f"{where}: expected {kind}, got {value!r}") from None
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {kind}, got {value!r}")
    return value


TABLES = ("Accounts", "Pool", "Ring")


def _build(cls: type, data: dict[str, Any], where: str, **extra: Any) -> Any:
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = dict(extra)
    for key, value in data.items():
        f = known.get(key)
        if f is None or key in extra or key in TABLES:
            if key not in TABLES or cls is not Settings:
                raise ConfigError(f"unknown setting {where}{key}")
            continue
        kwargs[key] = _coerce(f"{where}{key}", str(f.type), value)
    return cls(**kwargs)


def _env_overrides(data: dict[str, Any], environ: dict[str, str]) -> None:
    top = {f.name.upper(): f.name for f in fields(Settings)}
    tables = {
        "POOL": {f.name.upper(): f.name for f in fields(PoolSettings) if f.name != "name"},
        "RING": {f.name.upper(): f.name for f in fields(RingSettings) if f.name != "name"},
    }
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        if name in envvars.NOT_SETTINGS:  # the client's (the README has users export them)
            continue
        path = name[len(ENV_PREFIX) :].split("__")
        if len(path) == 1 and path[0] in top:
            data[top[path[0]]] = value
        elif len(path) == 3 and path[0] in tables and path[2] in tables[path[0]]:
            table = data.setdefault(path[0].title(), {})
            entry = next((p for p in table if p.upper() == path[1]), path[1].lower())
            table.setdefault(entry, {})[tables[path[0]][path[2]]] = value
        elif len(path) == 2 and path[0] == "ACCOUNTS":
            data.setdefault("Accounts", {})[path[1].lower()] = value
        else:
            raise ConfigError(f"unknown environment setting {name}")


def _tables(data: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    raw = data.get(kind, {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{kind}: expected tables [{kind}.<name>]")
    for name, body in raw.items():
        if not isinstance(body, dict):
            raise ConfigError(f"{kind}.{name}: expected a table")
    return raw


def load(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Settings:
    environ = dict(os.environ if environ is None else environ)
    path = path or environ.get(ENV_PREFIX + "CONFIG")
    data: dict[str, Any] = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: {e}") from None
    _env_overrides(data, environ)
    accounts = data.get("Accounts", {})
    if not isinstance(accounts, dict) or not all(isinstance(v, str) for v in accounts.values()):
        raise ConfigError('Accounts: expected a table of user = "password"')
    pools = {}
    for name, body in _tables(data, "Pool").items():
        pools[name] = _build(PoolSettings, body, f"Pool.{name}.", name=name)
        pools[name].addresses()
    if pools and "default" not in pools:
        raise ConfigError("Pool.default is required when pools are configured")
    rings = {}
    for name, body in _tables(data, "Ring").items():
        rings[name] = _build(RingSettings, body, f"Ring.{name}.", name=name)
    settings: Settings = _build(Settings, data, "", Accounts=dict(accounts), Pool=pools, Ring=rings)
    _validate(settings)
    problem = tracing.missing(environ) if settings.EnableTracing else None
    if problem:  # (the exporter is named by the SDK's own variable, OTEL_TRACES_EXPORTER)
        raise ConfigError(f"EnableTracing: {problem}")
    return settings


MAX_LONG_POLL_SECOND = 3600  # a long-poll holds a connection; an hour is already generous


def _within(where: str, value: float, low: float, high: float, note: str = "") -> None:
    """``value`` finite and in ``low..high``, else a ConfigError naming the key."""
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"{where}: {low}..{high}{note}, got {value!r}")


def _validate(s: Settings) -> None:
    """Every setting against the bounds the API applies to the same value: a default the API
    would refuse as a parameter (a negative ttr, a timeout above the maximum) is refused here."""
    for key in ("Port", "AdminPort", "EmbeddedRedisPort"):
        port = getattr(s, key)
        if not 0 <= port <= 65535:
            raise ConfigError(f"{key}: {port} is not a port")
    if s.EmbeddedRedisPort and s.Pool:
        raise ConfigError("EmbeddedRedisPort: only in embedded mode (no pool configured)")
    _within("Workers", s.Workers, 1, 256)
    if s.LogFormat not in ("json", "text"):
        raise ConfigError(f"LogFormat: 'json' or 'text', got {s.LogFormat!r}")
    if s.LogLevel.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"LogLevel: debug, info, warning or error, got {s.LogLevel!r}")
    _within("TriesNum", s.TriesNum, 1, MAX_TRIES)
    _within("TTLSecond", s.TTLSecond, 0, MAX_SECONDS, " (0: forever)")
    _within("DelaySecond", s.DelaySecond, 0, MAX_SECONDS)
    if s.TTLSecond and s.TTLSecond <= s.DelaySecond:  # as the API: ttl must be longer than delay
        raise ConfigError(f"TTLSecond: must be longer than DelaySecond ({s.DelaySecond}), or 0")
    _within("TTRSecond", s.TTRSecond, 1, MAX_SECONDS)
    _within("MaxTimeoutSecond", s.MaxTimeoutSecond, 0, MAX_LONG_POLL_SECOND)
    _within("TimeoutSecond", s.TimeoutSecond, 0, s.MaxTimeoutSecond, " (MaxTimeoutSecond)")
    _within("MaxBodyBytes", s.MaxBodyBytes, 1, MAX_BODY, " (the largest job body)")
    _within("TokenCacheSecond", s.TokenCacheSecond, 0, 3600)
    _within("QueueSettingsCacheSecond", s.QueueSettingsCacheSecond, 0, 3600)
    _within("Shards", s.Shards, 1, 4096)
    _within("AckedIdMemorySecond", s.AckedIdMemorySecond, 0, 86_400)
    _within("ResultSecond", s.ResultSecond, 1, 604_800)
    _within("IdempotencyKeySecond", s.IdempotencyKeySecond, 1, 604_800)
    if s.SizeIntervalSecond <= 0:
        raise ConfigError(f"SizeIntervalSecond: must be positive, got {s.SizeIntervalSecond}")
    _within("SizeIntervalSecond", s.SizeIntervalSecond, 0, 86_400)
    _within("ReconcileSecond", s.ReconcileSecond, 0, 86_400, " (0: off)")
    if not 0 < s.ShutdownGraceSecond <= 600:
        raise ConfigError(
            f"ShutdownGraceSecond: more than 0, at most 600, got {s.ShutdownGraceSecond}"
        )
    _within("RetryBudgetSecond", s.RetryBudgetSecond, 0.1, 600)
    _within("MaxWaiters", s.MaxWaiters, 0, 10_000_000, " (0: no long-polls)")
    _within("MaxWaitersPerNamespace", s.MaxWaitersPerNamespace, 1, 10_000_000)
    _within("MetricsMaxQueues", s.MetricsMaxQueues, 0, 1_000_000, " (0: no per-queue series)")
    if s.HistoryFlushSecond and (
        not 0 < s.HistoryFlushSecond <= 300 or (300 / s.HistoryFlushSecond) % 1
    ):
        raise ConfigError(
            "HistoryFlushSecond: 0 (off) or a divisor of 300 (the 5-minute buckets), "
            f"got {s.HistoryFlushSecond}"
        )
    _within("HeaderTimeoutSecond", s.HeaderTimeoutSecond, 0.01, 3600)
    _within("BodyTimeoutSecond", s.BodyTimeoutSecond, 0.01, 3600)
    _within("KeepAliveTimeoutSecond", s.KeepAliveTimeoutSecond, 1, 3600)
    _within("MaxConnections", s.MaxConnections, 1, 1_000_000)
    for entry in s.AllowedHosts:
        if not HOST_ENTRY_RE.fullmatch(entry.lower()):
            raise ConfigError(
                f"AllowedHosts: {entry!r} is not a host, host:port, [v6addr], *.domain or *"
            )
    for kind, names in (("Pool", s.Pool), ("Ring", s.Ring)):
        for name in names:  # a token names it before its ':'
            if not ROUTE_NAME_RE.fullmatch(name):
                raise ConfigError(
                    f"{kind}.{name}: a name is 1-64 of [-_A-Za-z0-9] (tokens carry it)"
                )
    for name, pool in s.Pool.items():
        _within(f"Pool.{name}.PoolSize", pool.PoolSize, 1, 65_535)
        _within(f"Pool.{name}.DB", pool.DB, 0, 65_535)
        _within(f"Pool.{name}.WaitReplicas", pool.WaitReplicas, 0, 64)
        # 0 would make WAIT block until the replicas answer, and from the 5-s socket timeout
        # (pools.SOCKET_TIMEOUT) on, the socket gives up before the WAIT does
        _within(f"Pool.{name}.WaitTimeoutMs", pool.WaitTimeoutMs, 1, 4_000)
        target = s.Pool.get(pool.MigrateTo) if pool.MigrateTo else None
        if pool.MigrateTo and (target is None or pool.MigrateTo == name):
            raise ConfigError(f"Pool.{name}.MigrateTo: unknown pool {pool.MigrateTo!r}")
        if target is not None and target.MigrateTo:
            raise ConfigError(
                f"Pool.{name}.MigrateTo: {target.name} migrates itself; finish that first"
            )
    for name, ring in s.Ring.items():
        if name in s.Pool:
            raise ConfigError(f"Ring.{name}: a pool has that name; tokens name one or the other")
        if not ring.Pools:
            raise ConfigError(f"Ring.{name}.Pools: at least one pool is required")
        for key, members in (("Pools", ring.Pools), ("PreviousPools", ring.PreviousPools)):
            if len(set(members)) != len(members):
                raise ConfigError(f"Ring.{name}.{key}: a pool is listed twice")
            for m in members:
                if m not in s.Pool:
                    raise ConfigError(f"Ring.{name}.{key}: unknown pool {m!r}")
