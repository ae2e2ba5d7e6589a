"""Failover drills: a bounded load through the HTTP service while something fails, then a report.

    python loadtest/drill.py sentinel-master      # (a) the Sentinel master is SIGKILLed
    python loadtest/drill.py sentinel-pause       # (a') it is paused past a failover, then resumed
    python loadtest/drill.py cluster-master       # (b) a Cluster master is SIGKILLed
    python loadtest/drill.py cluster-pause        # (b') it is paused past a failover, then resumed
    python loadtest/drill.py reshard              # (c) the slot of an active queue moves under load
    python loadtest/drill.py service-leader       # (d) a service instance leading pump shards is SIGKILLed
    options: --rate 800 (publishes/s) --seconds 30 --no-durable --queues 8
             --min-replicas 1 (the Sentinel servers' min-replicas-to-write; 0 shows Redis's default)

Each drill starts its own Redis topology and two `cluster-dq serve` instances on loopback
ports, publishes jobs with client-chosen ids (due 0-2 s later) at the given rate, round-robin
over both instances, while long-polling consumers ack everything they get. A third of the way
in, the event happens. After the load the consumers drain, and the report gives:
the unavailability window (longest run of failed publishes), client-visible errors by kind,
acknowledged (2xx) jobs never delivered (lost), jobs delivered again after their ack
succeeded (duplicates beyond at-least-once), and lateness (delivery - due) before/during the
event. With durable publish (the default; WaitReplicas=1) a lost acknowledged job is a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp  # not cluster_dq.client: its retries would hide the errors a drill counts
import httpx
import redis

from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import (
    Cluster,
    SentinelGroup,
    Server,
    start_cluster,
    start_sentinel,
    start_server,
)
from cluster_dq.testing.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
Deployment = Server | Cluster | SentinelGroup
SCENARIOS = (
    "sentinel-master",
    "sentinel-pause",
    "cluster-master",
    "cluster-pause",
    "reshard",
    "service-leader",
)


@dataclass
class Ledger:
    acked_publish: dict[str, float] = field(default_factory=dict)  # id -> due (monotonic s)
    publish_errors: Counter[str] = field(default_factory=Counter)
    consume_errors: Counter[str] = field(default_factory=Counter)  # "consume: HTTP 503", "ack: ..."
    outcomes: list[tuple[float, bool]] = field(default_factory=list)  # (t, publish ok)
    delivered: dict[str, list[float]] = field(default_factory=dict)
    ack_done: dict[str, float] = field(default_factory=dict)
    # (due t, lateness ms, queue)
    late_ms: list[tuple[float, float, str]] = field(default_factory=list)
    rerouted: int = 0  # requests a refused connection sent on to the other instance
    error_examples: dict[str, str] = field(default_factory=dict)  # kind -> one full message
    requests: int = 0  # every HTTP request sent (publish, consume, ack)


Instance = (
    ServiceProcess  # a `cluster-dq serve` in a process group of its own (kill: SIGKILL to all)
)


def start_instance(
    deployment: Deployment, durable: bool, ports: tuple[int, int] | None = None
) -> Instance:
    """A ``cluster-dq serve`` on ``ports`` (data, admin; by default free ones from 18000 on),
    once it is ready."""
    env = {"CLUSTER_DQ_LOGLEVEL": "error", "CLUSTER_DQ_TTRSECOND": "5"}
    if durable:
        env["CLUSTER_DQ_POOL__DEFAULT__WAITREPLICAS"] = "1"
        env["CLUSTER_DQ_POOL__DEFAULT__WAITTIMEOUTMS"] = "1000"
    return ServiceProcess.start(
        deployment.pool_settings(), env=env, ports=ports, ready="/readyz", session=True
    )


def kind_of(e: BaseException | int, body: str = "") -> str:
    if isinstance(e, int):
        return f"HTTP {e}" + (f" ({body[:60]})" if body else "")
    return type(e).__name__


async def publisher(
    instances: list[Instance],
    token: str,
    queues: list[str],
    rate: float,
    until: float,
    ledger: Ledger,
    t0: float,
) -> None:
    sem = asyncio.Semaphore(256)
    n = 0
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=256), timeout=timeout
    ) as client:

        async def put(i: int, q: str, jid: str, delay: int) -> tuple[int, Any]:
            # As a load balancer does (nginx proxy_next_upstream error): a refused connection
            # goes to the next instance; the job id makes the repeat safe.
            for k in range(len(instances)):
                inst = instances[(i + k) % len(instances)]
                ledger.requests += 1
                try:
                    async with client.put(
                        f"{inst.base}/api/drill/{q}",
                        params={"job_id": jid, "delay": delay, "tries": 5},
                        headers={"X-Token": token},
                        data=jid.encode(),
                    ) as r:
                        return r.status, await r.json(content_type=None)
                except aiohttp.ClientConnectorError:
                    ledger.rerouted += 1
                    if k == len(instances) - 1:
                        raise
            raise AssertionError("unreachable")

        async def one(i: int) -> None:
            q = queues[i % len(queues)]
            jid = f"drill-{i}"
            delay = random.randint(0, 2)
            try:
                status, body = await put(i, q, jid, delay)
                ok = status == 201
                if ok:
                    ledger.acked_publish.setdefault(jid, time.monotonic() - t0 + delay)
                else:
                    kind = kind_of(status, str(body.get("error", ""))[:40])
                    ledger.publish_errors[kind] += 1
                    ledger.error_examples.setdefault(kind, str(body.get("error", ""))[:300])
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                ok = False
                ledger.publish_errors[kind_of(e)] += 1
            ledger.outcomes.append((time.monotonic() - t0, ok))
            sem.release()

        tasks = set()
        start = time.monotonic()
        while time.monotonic() < until:
            target = start + n / rate
            if target > time.monotonic():
                await asyncio.sleep(target - time.monotonic())
            await sem.acquire()
            task = asyncio.create_task(one(n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        await asyncio.gather(*tasks)


async def consumer(
    instances: list[Instance],
    token: str,
    queues: list[str],
    until: float,
    ledger: Ledger,
    t0: float,
    k: int,
    ack_behind: int = 0,
) -> None:
    """Consumes (20 jobs at most, 1-s long-polls over every queue) and acks each job. By
    default a batch's acks end before the next consume is asked; with ``ack_behind`` N, up to
    N batches' acks may still be under way meanwhile (a worker whose slots go on while its acks
    travel)."""
    h = {"X-Token": token}
    acking: set[asyncio.Future[Any]] = set()
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=32), timeout=timeout
    ) as client:

        async def ack(base: str, job: dict[str, Any]) -> None:
            ledger.requests += 1
            try:
                async with client.delete(
                    f"{base}/api/drill/{job['queue']}/job/{job['job_id']}", headers=h
                ) as a:
                    body = (await a.read()).decode(errors="replace")
                    status = a.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                ledger.consume_errors[f"ack: {kind_of(e)}"] += 1
                return
            if status == 204:
                ledger.ack_done.setdefault(job["job_id"], time.monotonic() - t0)
            else:
                kind = f"ack: {kind_of(status)}"
                ledger.consume_errors[kind] += 1
                ledger.error_examples.setdefault(kind, body[:300])

        i = k
        while time.monotonic() < until:
            inst = instances[i % len(instances)]
            i += 1
            asked = time.monotonic() - t0  # a delivery counts from when it was asked for
            ledger.requests += 1
            try:
                async with client.get(
                    f"{inst.base}/api/drill/{','.join(queues)}",
                    params={"timeout": 1, "ttr": 5, "count": 20},
                    headers=h,
                ) as r:
                    status = r.status
                    body = await r.text()
                    jobs = json.loads(body) if status == 200 else None
            except aiohttp.ClientConnectorError:
                ledger.rerouted += 1  # the next round goes to the next instance
                continue
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                ledger.consume_errors[f"consume: {kind_of(e)}"] += 1
                await asyncio.sleep(0.05)
                continue
            if status == 404:
                continue
            if jobs is None:
                kind = f"consume: {kind_of(status)}"
                ledger.consume_errors[kind] += 1
                ledger.error_examples.setdefault(kind, body[:300])
                await asyncio.sleep(0.05)
                continue
            now = time.monotonic() - t0
            for job in jobs:
                jid = job["job_id"]
                ledger.delivered.setdefault(jid, []).append(asked)
                due = ledger.acked_publish.get(jid)
                if due is not None and len(ledger.delivered[jid]) == 1:
                    ledger.late_ms.append((due, max(now - due, 0) * 1000, job.get("queue", "")))
            acks = asyncio.gather(*(ack(inst.base, j) for j in jobs))
            if not ack_behind:
                await acks
                continue
            acking.add(acks)
            acks.add_done_callback(acking.discard)
            while len(acking) > ack_behind:
                await asyncio.wait(set(acking), return_when=asyncio.FIRST_COMPLETED)
        if acking:
            await asyncio.wait(set(acking))


def unavailability(outcomes: list[tuple[float, bool]]) -> tuple[float, float]:
    """(longest stretch between two successful publishes with only failures between, its start)."""
    best, start = 0.0, 0.0
    last_ok: float | None = None
    failed_since = False
    for t, ok in sorted(outcomes):
        if ok:
            if failed_since and last_ok is not None and t - last_ok > best:
                best, start = t - last_ok, last_ok
            last_ok, failed_since = t, False
        else:
            failed_since = True
    return best, start


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


# -- the events -------------------------------------------------------------------------------


def kill_sentinel_master(d: Deployment, instances: list[Instance]) -> str:
    assert isinstance(d, SentinelGroup)
    master = d.master()
    master.kill(signal.SIGKILL)
    return f"SIGKILL of the Sentinel master 127.0.0.1:{master.port}"


Window = tuple[float | None, float | None]


def failover_probe(d: Deployment, queue: QueueKeys) -> Callable[[], Window] | None:
    """For a Sentinel group or a Cluster: a probe to start as the event happens, which returns
    the seconds until a write in ``queue``'s slot is accepted by a master other than the one
    there now (promoted, and for Sentinel with its ``min-replicas-to-write`` met), and until
    such a write is confirmed by a replica too (``WAIT 1``: what a durable write needs); None
    for what did not happen within 30 s."""
    probe_key = f"{queue.meta.rsplit(':', 1)[0]}:failover-probe"
    if isinstance(d, SentinelGroup):
        old = d.master_port()

        def writable() -> int | None:
            port = d.master_port()
            if port == old:
                return None
            with redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5) as r:
                r.set(probe_key, 1)
                return int(r.execute_command("WAIT", 1, 50))

    elif isinstance(d, Cluster):
        with d.sync_client() as c:
            old = c.get_node_from_key(probe_key).port
        others = [s.port for s in d.servers if s.port != old]

        def writable() -> int | None:
            for port in others:  # the new owner takes it; others answer MOVED (an error)
                with redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5) as r:
                    with contextlib.suppress(redis.RedisError):
                        r.set(probe_key, 1)
                        return int(r.execute_command("WAIT", 1, 50))
            return None

    else:
        return None

    def probe() -> Window:
        start = time.monotonic()
        taken: float | None = None
        while time.monotonic() - start < 30:
            with contextlib.suppress(redis.RedisError, OSError):
                replicas = writable()
                if replicas is not None and taken is None:
                    taken = time.monotonic() - start
                if replicas:
                    return taken, time.monotonic() - start
            time.sleep(0.02)
        return taken, None

    return probe


def pause(server: Server, pause_s: float, master_port: Callable[[], int]) -> int:
    """SIGSTOP for ``pause_s``, then SIGCONT; returns the master port seen last meanwhile."""
    server.process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + pause_s
    promoted = server.port
    while time.monotonic() < deadline:
        time.sleep(0.1)
        with contextlib.suppress(Exception):
            promoted = master_port()
    server.process.send_signal(signal.SIGCONT)
    return promoted


def pause_sentinel_master(d: Deployment, instances: list[Instance], pause_s: float = 5.0) -> str:
    """The split brain of redis-measurements.md: the master stops (SIGSTOP: a long GC-like stall,
    a frozen VM) for longer than down-after plus the failover, then resumes still believing it
    is master, and keeps taking writes on the connections clients held to it until the
    sentinels turn it into a replica of the promoted one, which drops those writes."""
    assert isinstance(d, SentinelGroup)
    master = d.master()
    promoted = pause(master, pause_s, d.master_port)
    return (
        f"SIGSTOP of the Sentinel master 127.0.0.1:{master.port} for {pause_s:.0f} s (the sentinels "
        f"promoted :{promoted}), then SIGCONT: it resumes believing it is the master"
    )


def kill_cluster_master(
    d: Deployment, instances: list[Instance], queues: list[str], ns: str = "drill"
) -> str:
    assert isinstance(d, Cluster)
    with d.sync_client() as c:
        node = c.get_node_from_key(QueueKeys(ns, queues[0]).meta)
    server = d.server_on(node.port)
    server.kill(signal.SIGKILL)
    # As a process supervisor would: the node comes back 5 s later and rejoins as a replica of
    # the promoted one, so its shard can confirm durable writes again.
    threading.Timer(5.0, server.restart).start()
    return (
        f"SIGKILL of the Cluster master 127.0.0.1:{node.port} (holding queue {ns}/{queues[0]}); "
        "restarted 5 s later"
    )


def pause_cluster_master(
    d: Deployment, instances: list[Instance], queues: list[str], pause_s: float = 5.0
) -> str:
    """The Cluster's version of (a'): the master of the busy queue stops for longer than
    cluster-node-timeout (2 s) plus the failover, then resumes; gossip tells it that its replica
    took its slots over."""
    assert isinstance(d, Cluster)
    key = QueueKeys("drill", queues[0]).meta
    with d.sync_client() as c:
        port = c.get_node_from_key(key).port

    def owner() -> int:
        with redis.Redis(
            port=next(s.port for s in d.servers if s.port != port), socket_timeout=0.5
        ) as c:
            slot = c.cluster("keyslot", key)
            for lo, hi, master, *_ in c.cluster("slots"):
                if lo <= slot <= hi:
                    return int(master[1])
        return port

    promoted = pause(d.server_on(port), pause_s, owner)
    return (
        f"SIGSTOP of the Cluster master 127.0.0.1:{port} (holding queue {queues[0]}) for {pause_s:.0f} s "
        f"(its replica :{promoted} took the slots over), then SIGCONT"
    )


def reshard(d: Deployment, instances: list[Instance], queues: list[str]) -> str:
    assert isinstance(d, Cluster)
    from cluster_dq.localredis import migrate_slot

    key = QueueKeys("drill", queues[0]).meta  # busy, and holding the backlog
    with d.sync_client() as c:
        slot = c.keyslot(key)
        source = c.get_node_from_key(key)
        masters = [n for n in c.get_primaries() if n.port != source.port]
    target = masters[0]
    moved = migrate_slot(d, slot, source.port, target.port)
    return f"slot {slot} (queue drill/{queues[0]}: live traffic and the backlog, {moved} keys) moved from :{source.port} to :{target.port} under load"


def kill_leading_instance(d: Deployment, instances: list[Instance]) -> str:
    """Kills the instance whose worker leads the most pump shards."""
    victim = leading_instance(d, instances)
    victim.kill()
    return f"SIGKILL of service instance {victim.base} (supervisor and workers; it led pump shards)"


def leading_instance(d: Deployment, instances: list[Instance]) -> Instance:
    """The instance whose worker leads the most pump shards (the first one if none is found)."""
    (leader_pid, _), *_ = leaders_of(d).most_common(1)

    def parent(pid: str) -> int:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return -1
        return int(
            next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        )

    return next((i for i in instances if i.proc.pid == parent(leader_pid)), instances[0])


def leaders_of(d: Deployment, shards: int = 16) -> Counter[str]:
    """Pump shards led, by the leader's worker pid ("none": no leader)."""
    from cluster_dq.keys import ShardKeys

    out: Counter[str] = Counter()
    with d.sync_client() as c:
        for s in range(shards):
            raw = c.get(ShardKeys(s).lock)
            out[(raw or b"none").decode().split("-")[0]] += 1
    return out


# -- the drill ---------------------------------------------------------------------------------


def setup(scenario: str, min_replicas: int = 1, full_coverage: bool = True) -> Deployment:
    if scenario.startswith("standalone"):
        return start_server()
    if scenario.startswith("sentinel"):
        return start_sentinel(min_replicas=min_replicas)
    return start_cluster(node_timeout_ms=2000, full_coverage=full_coverage)


async def run_load(
    instances: list[Instance],
    token: str,
    queues: list[str],
    rate: float,
    seconds: float,
    event: Any,
    probe: Callable[[], Window] | None = None,
    ack_behind: int = 0,
) -> tuple[Ledger, float, str, Window]:
    ledger = Ledger()
    t0 = time.monotonic()
    until = t0 + seconds
    consumers = [
        asyncio.create_task(
            consumer(instances, token, queues, until + 15, ledger, t0, k, ack_behind)
        )
        for k in range(8)
    ]
    pub = asyncio.create_task(publisher(instances, token, queues, rate, until, ledger, t0))
    await asyncio.sleep(seconds / 3)
    event_at = time.monotonic() - t0
    probed = asyncio.create_task(asyncio.to_thread(probe)) if probe else None
    what = await asyncio.to_thread(event)
    await pub
    failover_s = await probed if probed else (None, None)
    # Drain: until every acknowledged job was delivered, or 15 s.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not set(ledger.acked_publish) <= set(ledger.delivered):
        await asyncio.sleep(0.2)
    for c in consumers:
        c.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    return ledger, event_at, what, failover_s


def preload(d: Deployment, ns: str, q: str, n: int) -> None:
    """``n`` jobs due in an hour in queue ``q`` (wheel buckets and all), so that the slot that
    moves, or the master that dies, holds a real backlog."""
    from cluster_dq.engine import commands as ops
    from cluster_dq.engine.sync import SyncEngine
    from cluster_dq.models import JobSpec

    with d.sync_client() as client:
        engine = SyncEngine(client)
        now = int(time.time() * 1000)
        for i in range(0, n, 64 * 32):
            batches = [
                (
                    ns,
                    q,
                    [
                        JobSpec(b"backlog", delay_ms=3_600_000 + (i + k) % 600_000, ttl_ms=0)
                        for k in range(j, min(j + 64, n - i))
                    ],
                )
                for j in range(0, min(64 * 32, n - i), 64)
            ]
            engine.run(ops.publish_many(engine.config, batches, now), idempotent=True)


def backlog_left(d: Deployment, ns: str, q: str) -> int:
    from cluster_dq.engine import commands as ops
    from cluster_dq.engine.sync import SyncEngine

    with d.sync_client() as client:
        return SyncEngine(client).run(ops.sizes(SyncEngine(client).config, ns, q)).delayed


def keep_logs(d: SentinelGroup | Cluster) -> str:
    """Copies every server's and sentinel's log out of the topology before it is removed."""
    import shutil as sh
    import tempfile as tf

    out = Path(tf.mkdtemp(prefix="cluster-dq-drill-logs-"))
    members = d.servers + (d.sentinels if isinstance(d, SentinelGroup) else [])
    for m in members:
        for log in m.workdir.glob("*.log"):
            sh.copy(log, out / f"{m.port}-{log.name}")
    return str(out)


def still_stored(d: Deployment, ids: list[str], queues: list[str]) -> int:
    """How many of ``ids`` (never delivered) are still in Redis: stuck, not lost."""
    from cluster_dq.engine import commands as ops
    from cluster_dq.engine.sync import SyncEngine

    if not ids:
        return 0
    with d.sync_client() as client:
        engine = SyncEngine(client)
        return sum(
            1
            for jid in ids
            if any(engine.run(ops.peek_job("drill", q, jid)) is not None for q in queues)
        )


def drill(
    scenario: str,
    rate: float = 800,
    seconds: float = 30,
    durable: bool = True,
    n_queues: int = 8,
    backlog: int = 50_000,
    min_replicas: int = 1,
    ack_behind: int = 0,
    full_coverage: bool = True,
) -> dict[str, Any]:
    d = setup(scenario, min_replicas, full_coverage)
    instances: list[Instance] = []
    try:
        instances = [start_instance(d, durable) for _ in range(2)]
        token = httpx.post(
            f"{instances[0].admin}/token/drill", params={"description": "drill"}
        ).json()["token"]
        queues = [f"q{i}" for i in range(n_queues)]
        if backlog:
            preload(d, "drill", queues[0], backlog)
        time.sleep(1.5)  # leases settle: both instances lead some shards
        leaders_before = leaders_of(d)
        events = {
            "sentinel-master": lambda: kill_sentinel_master(d, instances),
            "sentinel-pause": lambda: pause_sentinel_master(d, instances),
            "cluster-pause": lambda: pause_cluster_master(d, instances, queues),
            "cluster-master": lambda: kill_cluster_master(d, instances, queues),
            "reshard": lambda: reshard(d, instances, queues),
            "service-leader": lambda: kill_leading_instance(d, instances),
        }
        probe = (
            failover_probe(d, QueueKeys("drill", queues[0]))
            if scenario in ("sentinel-master", "sentinel-pause", "cluster-master", "cluster-pause")
            else None
        )
        ledger, event_at, what, failover_s = asyncio.run(
            run_load(instances, token, queues, rate, seconds, events[scenario], probe, ack_behind)
        )
        lost = sorted(set(ledger.acked_publish) - set(ledger.delivered))
        # Delivered again by a consume asked for after the ack had succeeded: beyond at-least-once.
        dup_after_ack = [
            j
            for j, ts in ledger.delivered.items()
            if j in ledger.ack_done and any(t > ledger.ack_done[j] for t in ts[1:])
        ]
        window, window_at = unavailability(ledger.outcomes)
        before = [ms for due, ms, _ in ledger.late_ms if due < event_at]
        in_event = [
            (ms, q)
            for due, ms, q in ledger.late_ms
            if event_at <= due < event_at + max(window, 1) + 5
        ]
        during = [ms for ms, _ in in_event]
        # the queues other than q0 (whose slot the Cluster drills fail): on the healthy masters
        elsewhere = [ms for ms, q in in_event if q != queues[0]]
        # How long after the failover window (until writes are confirmed) jobs due during the
        # event were delivered: the consumers' own delay once Redis is back.
        ready_again = event_at + (failover_s[1] or failover_s[0] or 0.0)
        excess = [
            due + ms / 1000 - max(due, ready_again)
            for due, ms, _ in ledger.late_ms
            if event_at <= due < event_at + max(window, 1) + 5
        ]
        report = {
            "scenario": scenario,
            "event": what,
            "durable": durable,
            "ack_behind": ack_behind,
            "full_coverage": full_coverage if isinstance(d, Cluster) else None,
            "rate": rate,
            "seconds": seconds,
            "min_replicas": min_replicas if isinstance(d, SentinelGroup) else None,
            "http_requests_per_s": round(ledger.requests / (seconds + 2), 0),
            "published_ok": len(ledger.acked_publish),
            "publish_errors": dict(ledger.publish_errors),
            "consume_errors": dict(ledger.consume_errors),
            "rerouted": ledger.rerouted,
            "error_examples": ledger.error_examples,
            "failover_s": [None if t is None else round(t, 3) for t in failover_s],
            "unavailable_s": round(window, 3),
            "unavailable_from_s": round(window_at - event_at, 3),
            "lost_acknowledged": len(lost),
            "lost_examples": lost[:5],
            "undelivered_but_stored": still_stored(d, lost[:200], queues),
            "redelivered": sum(1 for ts in ledger.delivered.values() if len(ts) > 1),
            "delivered_after_ack": len(dup_after_ack),
            "delivered_after_ack_examples": [
                (
                    j,
                    [round(t - event_at, 3) for t in ledger.delivered[j]],
                    round(ledger.ack_done[j] - event_at, 3),
                )
                for j in dup_after_ack[:3]
            ],
            "lateness_before_ms": (round(pct(before, 50), 1), round(pct(before, 99), 1)),
            "lateness_during_ms": (
                round(pct(during, 50), 1),
                round(pct(during, 99), 1),
                round(max(during, default=float("nan")), 1),
            ),
            "lateness_during_other_queues_ms": (
                round(pct(elsewhere, 50), 1),
                round(pct(elsewhere, 99), 1),
                round(max(elsewhere, default=float("nan")), 1),
            ),
            "after_window_ms": (
                round(pct(excess, 50) * 1000, 1),
                round(pct(excess, 99) * 1000, 1),
                round(max(excess, default=float("nan")) * 1000, 1),
            ),
        }
        if backlog:
            report["backlog"] = (backlog, backlog_left(d, "drill", queues[0]))
        if (lost or dup_after_ack) and isinstance(d, SentinelGroup | Cluster):
            report["logs_kept_in"] = keep_logs(d)  # evidence: which failovers happened when
        report["shard_leaders_before"] = dict(leaders_before)
        # Every shard must have a leader again within a few seconds (leases are 3 s).
        deadline = time.monotonic() + 10
        while "none" in (after := leaders_of(d)) and time.monotonic() < deadline:
            time.sleep(0.2)
        report["shard_leaders_after"] = dict(after)
        return report
    finally:
        for inst in instances:
            inst.kill()
        d.stop()


def print_report(r: dict[str, Any]) -> None:
    print(f"drill {r['scenario']}: {r['event']}")
    print(
        f"  load: {r['rate']:.0f} publishes/s for {r['seconds']:.0f} s over 2 instances (~"
        f"{r['http_requests_per_s']:,.0f} HTTP requests/s with consumes and acks), durable publish "
        f"{'on (WaitReplicas=1)' if r['durable'] else 'off'}"
        + (f", acks up to {r['ack_behind']} batches behind" if r.get("ack_behind") else "")
        + (", cluster-require-full-coverage no" if r.get("full_coverage") is False else "")
        + (
            f", Redis min-replicas-to-write {r['min_replicas']}"
            if r.get("min_replicas") is not None
            else ""
        )
    )
    print(f"  published (2xx): {r['published_ok']:,}   publish errors: {r['publish_errors'] or 0}")
    for kind, text in r["error_examples"].items():
        print(f"    e.g. {kind}: {text}")
    print(
        f"  consume/ack errors: {r['consume_errors'] or 0}   requests re-sent to the other instance "
        f"after a refused connection (as a load balancer does): {r['rerouted']}"
    )
    taken, confirmed = r.get("failover_s") or (None, None)
    if taken is not None:
        print(
            f"  failover window (from the event): the new master of q0's slot takes writes after "
            f"{taken:.2f} s; a replica confirms them (WAIT 1) after "
            + (f"{confirmed:.2f} s" if confirmed is not None else "more than 30 s")
        )
    if r["unavailable_s"]:
        print(
            f"  unavailability window: {r['unavailable_s']:.2f} s (starting {r['unavailable_from_s']:+.2f} s "
            "from the event)"
        )
    else:
        print("  unavailability window: none (no publish failed)")
    print(
        f"  acknowledged jobs never delivered: {r['lost_acknowledged']} {r['lost_examples'] or ''}"
        + (
            f" (of the first 200, {r['undelivered_but_stored']} are still in Redis: stuck, not lost)"
            if r["lost_acknowledged"]
            else ""
        )
    )
    print(
        f"  redelivered (at-least-once): {r['redelivered']}   delivered again after a successful ack: "
        f"{r['delivered_after_ack']}"
    )
    print(
        f"  lateness before the event p50/p99: {r['lateness_before_ms'][0]} / {r['lateness_before_ms'][1]} ms;"
        f" during: p50/p99/max {r['lateness_during_ms'][0]} / {r['lateness_during_ms'][1]} / "
        f"{r['lateness_during_ms'][2]} ms; during, queues other than q0: p50/p99/max "
        "{} / {} / {} ms".format(*r["lateness_during_other_queues_ms"])
    )
    if r.get("failover_s") and r["failover_s"][0] is not None:
        print(
            "  delivery of the jobs due during the event, after the failover window (or their due "
            "time if later) p50/p99/max: {} / {} / {} ms".format(*r["after_window_ms"])
        )
    if "backlog" in r:
        print(
            f"  backlog of q0 (jobs due in 1 h) after the event: {r['backlog'][1]:,} of {r['backlog'][0]:,}"
        )
    if "logs_kept_in" in r:
        print(f"  Redis and Sentinel logs kept in {r['logs_kept_in']}")
    print(
        f"  pump shards led, by worker pid: before {r['shard_leaders_before']}, after {r['shard_leaders_after']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    ap.add_argument("--rate", type=float, default=800)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--no-durable", action="store_true")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--backlog", type=int, default=50_000, help="jobs resting in drill/backlog")
    ap.add_argument(
        "--min-replicas",
        type=int,
        default=1,
        help="min-replicas-to-write of the Sentinel group's servers (0: Redis's default)",
    )
    ap.add_argument(
        "--ack-behind",
        type=int,
        default=0,
        metavar="N",
        help="consumers ask for the next batch while up to N batches' acks are under way",
    )
    ap.add_argument(
        "--partial-coverage",
        action="store_true",
        help="Cluster nodes with cluster-require-full-coverage no (the masters that are up go on"
        " serving while one is failed)",
    )
    a = ap.parse_args()
    scenarios = list(SCENARIOS) if a.scenario == "all" else [a.scenario]
    for s in scenarios:
        print_report(
            drill(
                s,
                a.rate,
                a.seconds,
                not a.no_durable,
                a.queues,
                a.backlog,
                a.min_replicas,
                a.ack_behind,
                not a.partial_coverage,
            )
        )


if __name__ == "__main__":
    main()
