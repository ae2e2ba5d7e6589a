"""Durable publish (WaitReplicas): a 2xx only once the replicas confirmed the job; otherwise a
503 that names the job ids, and publishing again with the same id is safe."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from cluster_dq.engine import commands as ops
from cluster_dq.clock import now_ms
from cluster_dq import waiters
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.errors import StaleMaster
from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import Cluster, SentinelGroup, migrate_slot
from cluster_dq.models import JobSpec
from cluster_dq.pools import check_redis, close_client, make_client
from cluster_dq.waiters import WaiterHub
from tests.support import ADMIN_AUTH, serve


def token(admin: str) -> str:
    r = httpx.post(f"{admin}/token/dur", params={"description": "durable"}, auth=ADMIN_AUTH)
    return str(r.json()["token"])


@pytest.fixture
def sentinel_service(redis_sentinel: SentinelGroup) -> Iterator[tuple[str, str, SentinelGroup]]:
    svc = serve(
        redis_sentinel.pool_settings(),
        CLUSTER_DQ_POOL__DEFAULT__WAITREPLICAS="2",
        CLUSTER_DQ_POOL__DEFAULT__WAITTIMEOUTMS="300",
    )
    base, admin = svc.base, svc.admin
    yield base, admin, redis_sentinel
    svc.stop(timeout=20)


def test_publish_waits_for_replicas_and_says_what_happened_when_they_lag(
    sentinel_service: tuple[str, str, SentinelGroup],
) -> None:
    base, admin, group = sentinel_service
    h = {"X-Token": token(admin)}
    r = httpx.put(f"{base}/api/dur/q", headers=h, content=b"safe")
    assert r.status_code == 201, r.text  # both replicas confirmed
    master = group.master()
    replica = next(s for s in group.servers if s is not master)
    os.kill(replica.process.pid, signal.SIGSTOP)  # one replica stops acknowledging
    try:
        jid = "order-42-reminder"
        # (each after the retry budget: an unconfirmed write is sent again until it ends)
        r = httpx.put(
            f"{base}/api/dur/q", headers=h, params={"job_id": jid}, content=b"at risk", timeout=30
        )
        assert r.status_code == 503
        msg = r.json()["error"]
        assert jid in msg and "1 of 2 replicas" in msg and "same job_id is idempotent" in msg
        r = httpx.put(f"{base}/api/dur/q/bulk", headers=h, content=b'["a","b"]', timeout=30)
        assert r.status_code == 503 and r.json()["error"].count(",") >= 1  # every id named
        for mode in ("simple", "debounce"):  # a publish under a dedup key, new or replacing
            params = {"dedup_key": "order-44", "dedup_mode": mode}
            r = httpx.put(
                f"{base}/api/dur/q", headers=h, params=params, content=mode.encode(), timeout=30
            )
            assert r.status_code == 503 and "replicas confirmed" in r.json()["error"], r.text
        r = httpx.delete(f"{base}/api/dur/q/job/{jid}", headers=h, timeout=30)  # acks too
        assert r.status_code == 503 and "the write was applied on the master" in r.json()["error"]
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    r = httpx.put(f"{base}/api/dur/q", headers=h, params={"job_id": jid}, content=b"at risk")
    # the unconfirmed ack above was applied: the id is remembered, so this is a duplicate
    assert r.status_code == 201 and r.json() == {
        "msg": "published",
        "job_id": jid,
        "duplicate": True,
    }
    r = httpx.put(f"{base}/api/dur/q", headers=h, params={"job_id": "order-43"}, content=b"ok")
    assert r.status_code == 201 and r.json() == {"msg": "published", "job_id": "order-43"}
    assert httpx.delete(f"{base}/api/dur/q/job/order-43", headers=h).status_code == 204


def test_durable_publish_on_a_cluster_waits_on_the_queues_own_master(
    redis_cluster: Cluster,
) -> None:
    svc = serve(redis_cluster.pool_settings(), CLUSTER_DQ_POOL__DEFAULT__WAITREPLICAS="1")
    base, admin = svc.base, svc.admin
    try:
        h = {"X-Token": token(admin)}
        for q in ("a", "b", "c", "d", "e", "f"):  # queues on different masters
            r = httpx.put(f"{base}/api/dur/{q}", headers=h, content=b"x")
            assert r.status_code == 201, r.text
            r = httpx.put(f"{base}/api/dur/{q}/bulk", headers=h, content=b'["a","b"]')
            assert r.status_code == 201, r.text
    finally:
        svc.stop(timeout=20)


def _failover_to(port: int, old: int) -> None:
    """CLUSTER FAILOVER on the replica at ``port``; returns once it is master and ``old``, now
    its replica, is in sync (so a WAIT 1 can be confirmed). Asked again every 6 s: masters
    refuse a second vote for the same slots within 2 x cluster-node-timeout (4 s), and a
    manual failover that gets no votes just expires."""
    deadline, asked = time.monotonic() + 40, 0.0
    while time.monotonic() < deadline:
        with redis.Redis(port=port) as new, redis.Redis(port=old) as was:
            if new.info("replication")["role"] == "master":
                if was.info("replication").get("master_link_status") == "up":
                    return
            elif time.monotonic() - asked > 6:
                new.execute_command("CLUSTER", "FAILOVER")
                asked = time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"failover to :{port} did not complete")


async def test_a_durable_write_rides_through_a_cluster_failover_its_client_has_not_seen(
    redis_cluster: Cluster,
) -> None:
    """Drill b' found it: after a failover the client's slot map still names the old master.
    The script follows the MOVED redirect to the new master, but the WAIT goes to the old one,
    now a replica ("WAIT cannot be used with replica instances"). That is a topology change
    like any other: the engine repeats the write (the id is fixed, so nothing is doubled)
    instead of failing it."""
    client = make_client(redis_cluster.pool_settings())
    await client.initialize()
    engine = AsyncEngine(client, wait_replicas=1, wait_timeout_ms=2_000)
    cfg = engine.config
    await engine.run(
        ops.publish(cfg, "fo", "q", [JobSpec(b"before")], now_ms()), idempotent=True, durable=True
    )
    old = client.get_node_from_key(QueueKeys("fo", "q").meta).port
    with redis.Redis(port=old) as r:
        replica = int(r.info("replication")["slave0"]["port"])
    with redis.Redis(port=replica) as r:  # as after any earlier NOSCRIPT recovery there; else
        for script in engine.scripts.values():  # that recovery re-sends the pipeline and hides it
            r.script_load(script.source)
    _failover_to(replica, old)  # the engine's client has not seen it: its slot map is stale
    try:
        assert client.get_node_from_key(QueueKeys("fo", "q").meta).port == old
        (p,) = await engine.run(
            ops.publish(cfg, "fo", "q", [JobSpec(b"after")], now_ms()),
            idempotent=True,
            durable=True,
        )
        assert await engine.run(ops.peek_job("fo", "q", p.job_id)) is not None
        assert client.get_node_from_key(QueueKeys("fo", "q").meta).port == replica  # caught up
        assert (await engine.run(ops.sizes(cfg, "fo", "q"))).ready == 2
    finally:
        _failover_to(old, replica)  # the session's cluster as it was
        await engine.run(ops.destroy(cfg, "fo", "q"), idempotent=True)
        await close_client(client)


@pytest.mark.parametrize("move", ["failover", "migration"])
async def test_long_polls_hear_their_queues_notices_after_its_slot_moves(
    redis_cluster: Cluster, monkeypatch: pytest.MonkeyPatch, move: str
) -> None:
    """Notices are sharded (SPUBLISH in the queue's slot, notices.py): a process listens on the
    node that holds the slot. After the slot fails over to its replica, or migrates to another
    master, the process's next command there (a watcher's safety poll) learns the new map and
    its subscription follows: a job published then by another process reaches the waiting
    long-poll by its notice, not by the watcher's safety poll."""
    client = make_client(redis_cluster.pool_settings())
    await client.initialize()
    engine = AsyncEngine(client)
    hub = WaiterHub(engine)
    qk = QueueKeys("fo", "n")
    slot = client.keyslot(qk.meta)
    old = client.get_node_from_key(qk.meta).port
    with redis.Redis(port=old) as r:
        replica = int(r.info("replication")["slave0"]["port"])
    master = next(
        p
        for p in (s.port for s in redis_cluster.servers)
        if p not in (old, replica) and redis.Redis(port=p).info("replication")["role"] == "master"
    )

    def there() -> None:
        if move == "failover":
            _failover_to(replica, old)
        else:
            migrate_slot(redis_cluster, slot, old, master)

    def back() -> None:  # the session's cluster as it was
        if move == "failover":
            _failover_to(old, replica)
        else:
            migrate_slot(redis_cluster, slot, master, old)

    other = SyncEngine(redis_cluster.sync_client())  # another instance's
    try:
        poll = asyncio.create_task(hub.consume("fo", ["n"], 30_000, 1, 60_000))
        for _ in range(500):
            if qk.notify.encode() in hub.notices.channels:
                break
            await asyncio.sleep(0.01)
        await asyncio.to_thread(there)
        await asyncio.sleep(2.5)  # safety polls meet the new slot map; the channel moves
        monkeypatch.setattr(waiters, "SAFETY_POLL_S", 30.0)
        await asyncio.sleep(1.5)  # the watcher's 1-s sleep under way ends; the next is 30 s
        assert not poll.done()
        published = time.monotonic()
        other.run(ops.publish(other.config, "fo", "n", [JobSpec(b"after")], now_ms()))
        (job,) = await asyncio.wait_for(poll, 10)
        assert job.body == b"after"
        assert time.monotonic() - published < 0.5  # its notice, heard where the slot is now
    finally:
        await hub.close()
        await asyncio.to_thread(back)
        other.run(ops.destroy(other.config, "fo", "n"), idempotent=True)
        await close_client(client)


async def test_a_master_without_its_replicas_refuses_writes_and_the_engine_asks_sentinel_again(
    redis_sentinel: SentinelGroup,
) -> None:
    """The guard against a master paused past a failover (drill sentinel-pause): the group's
    servers run with min-replicas-to-write 1, so a master that lost its replicas refuses every
    script (NOREPLICAS). The engine then changes nothing, drops its idle connections and says
    so; a refused consume is repeated (nothing ran), and goes through once writes are taken."""
    client = make_client(redis_sentinel.pool_settings())
    engine = AsyncEngine(
        client, clock=lambda: 2_000
    )  # the test's clock (a repeat is stamped with it)
    cfg = engine.config
    master = redis_sentinel.master().client()
    try:
        assert not [
            w for w in await check_redis("default", client) if "min-replicas" in w
        ]  # guarded
        (job,) = await engine.run(
            ops.publish(cfg, "stale", "q", [JobSpec(b"kept")], 1_000), idempotent=True
        )
        before = await engine.run(ops.sizes(cfg, "stale", "q"))
        master.config_set(
            "min-replicas-to-write", 3
        )  # 2 replicas: what a stale master sees (0 of 1)
        with pytest.raises(StaleMaster, match="nothing written"):
            await engine.run(ops.consume(cfg, "stale", ["q"], 30_000, 1, 2_000))
        idle = client.connection_pool._available_connections  # redis-py's pool, no public view
        assert idle and not any(c.is_connected for c in idle)  # the next one asks Sentinel again
        with pytest.raises(StaleMaster):
            await engine.run(
                ops.ack("stale", "q", [job.job_id]), idempotent=True
            )  # retried ~5 s, then told
        assert (
            await engine.run(ops.sizes(cfg, "stale", "q")) == before
        )  # reads still work; nothing changed

        async def writes_back_soon() -> None:
            await asyncio.sleep(0.5)
            master.config_set("min-replicas-to-write", 1)

        back = asyncio.create_task(writes_back_soon())
        got = await engine.run(ops.consume(cfg, "stale", ["q"], 30_000, 1, 2_000))
        await back
        assert [j.job_id for j in got] == [job.job_id]
        master.config_set("min-replicas-to-write", 0)
        assert any("min-replicas-to-write is 0" in w for w in await check_redis("default", client))
    finally:
        master.config_set("min-replicas-to-write", 1)
        master.close()
        await engine.run(ops.destroy(cfg, "stale", "q"), idempotent=True)
        await close_client(client)
