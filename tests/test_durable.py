"""Durable publish (WaitReplicas): a 2xx only once the replicas confirmed the job; otherwise a
503 that names the job ids, and publishing again with the same id is safe."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import httpx
import pytest

from cluster_dq.localredis import Cluster, SentinelGroup
from tests.test_http import ADMIN_AUTH, serve


def token(admin: str) -> str:
    r = httpx.post(f"{admin}/token/dur", params={"description": "durable"}, auth=ADMIN_AUTH)
    return str(r.json()["token"])


@pytest.fixture
def sentinel_service(redis_sentinel: SentinelGroup) -> Iterator[tuple[str, str, SentinelGroup]]:
    proc, base, admin = serve(redis_sentinel.pool_settings(), CLUSTER_DQ_POOL__DEFAULT__WAITREPLICAS="2",
                              CLUSTER_DQ_POOL__DEFAULT__WAITTIMEOUTMS="300")  # fmt: skip
    yield base, admin, redis_sentinel
    proc.terminate()
    proc.wait(timeout=20)


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
        r = httpx.put(f"{base}/api/dur/q", headers=h, params={"job_id": jid}, content=b"at risk")
        assert r.status_code == 503
        msg = r.json()["error"]
        assert jid in msg and "1 of 2 replicas" in msg and "same job_id is idempotent" in msg
        r = httpx.put(f"{base}/api/dur/q/bulk", headers=h, content=b'["a","b"]')
        assert r.status_code == 503 and r.json()["error"].count(",") >= 1  # every id named
        r = httpx.delete(f"{base}/api/dur/q/job/{jid}", headers=h)  # an ack is confirmed too
        assert r.status_code == 503 and "the write was applied on the master" in r.json()["error"]
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    r = httpx.put(f"{base}/api/dur/q", headers=h, params={"job_id": jid}, content=b"at risk")
    # the unconfirmed ack above was applied: the id is remembered, so this is a duplicate
    assert r.status_code == 201 and r.json() == {"msg": "published", "job_id": jid, "duplicate": True}
    r = httpx.put(f"{base}/api/dur/q", headers=h, params={"job_id": "order-43"}, content=b"ok")
    assert r.status_code == 201 and r.json() == {"msg": "published", "job_id": "order-43"}
    assert httpx.delete(f"{base}/api/dur/q/job/order-43", headers=h).status_code == 204


def test_durable_publish_on_a_cluster_waits_on_the_queues_own_master(redis_cluster: Cluster) -> None:
    proc, base, admin = serve(redis_cluster.pool_settings(), CLUSTER_DQ_POOL__DEFAULT__WAITREPLICAS="1")
    try:
        h = {"X-Token": token(admin)}
        for q in ("a", "b", "c", "d", "e", "f"):  # queues on different masters
            r = httpx.put(f"{base}/api/dur/{q}", headers=h, content=b"x")
            assert r.status_code == 201, r.text
            r = httpx.put(f"{base}/api/dur/{q}/bulk", headers=h, content=b'["a","b"]')
            assert r.status_code == 201, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=20)
