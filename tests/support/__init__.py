"""What the test folders share: the repository's root, the topologies a test may be given, and
the one way a test starts the service (``serve``, with the suite's admin account). Fixtures
built on these are in ``tests/support/fixtures.py``; test modules never import one another."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import Cluster, SentinelGroup, Server
from cluster_dq.settings import PoolSettings
from cluster_dq.testing.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]  # the checkout: tests/support/ -> .
ADMIN_AUTH = ("admin", "s3cret")

Deployment = Server | Cluster | SentinelGroup


def flush(client: Any) -> None:
    """Empties every master of a topology (a Cluster's through each primary)."""
    if isinstance(client, redis.RedisCluster):
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        client.flushall()


def serve(pool: PoolSettings | str, stderr: Any = None, **env: str) -> ServiceProcess:
    """Starts `cluster-dq serve` on free ports (from a random place in the range, so that two
    suites running at once do not take the same ones) against ``pool`` (or a standalone
    address), with the suite's admin account; ``stderr``: where its log goes. The queues'
    history is off unless ``env`` turns it on (``CLUSTER_DQ_HISTORYFLUSHSECOND``): its flush
    once a minute would add keys and commands in the middle of the tests that compare Redis
    before and after a request (tests/dashboard/test_history.py runs it every second)."""
    suite = {
        "CLUSTER_DQ_ACCOUNTS__ADMIN": ADMIN_AUTH[1],
        "CLUSTER_DQ_TOKENCACHESECOND": "1",
        "CLUSTER_DQ_LOGLEVEL": "warning",
        "CLUSTER_DQ_HISTORYFLUSHSECOND": "0",
        # a suite's service sees thousands of queues in a run: past the cap a queue's counters
        # go to queue="_other", and stats shows no rates of its own (tests of the cap set it)
        "CLUSTER_DQ_METRICSMAXQUEUES": "1000000",
    }
    return ServiceProcess.start(pool, env={**suite, **env}, log=stderr, timeout=20)


def size(api: httpx.Client, q: str = "q") -> dict[str, int]:
    """A queue's sizes through the data port (the client holds a token of namespace ``ns``)."""
    r = api.get(f"/api/ns/{q}/size")
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


def listeners(client: redis.Redis, ns: str, q: str) -> int:
    """How many connections listen to a queue's notices (its long-polls' watchers)."""
    channel = QueueKeys(ns, q).notify
    return int(dict(client.pubsub_shardnumsub(channel))[channel.encode()])


@contextlib.contextmanager
def commands_run(client: redis.Redis) -> Iterator[collections.Counter[str]]:
    """Counts the commands a Redis server runs while the block runs (``MONITOR``), by name;
    a script call by the name of its script (``EVALSHA consume``). Counted once the block
    has ended."""
    from cluster_dq.engine.scripts import load_all

    names = {s.sha: name for name, s in load_all().items()}
    seen: collections.Counter[str] = collections.Counter()
    done = threading.Event()
    started = threading.Event()

    def watch() -> None:
        with client.monitor() as m:
            started.set()
            for c in m.listen():  # the pump's steps come every second: done is looked at
                if done.is_set():
                    return
                name, *args = c["command"].split()
                name = name.upper()
                if name in ("EVALSHA", "EVALSHA_RO") and args:
                    name = f"{name} {names.get(args[0], args[0])}"
                seen[name] += 1

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    started.wait(10)
    try:
        yield seen
    finally:
        done.set()
        client.ping()  # a command to wake the reader
        t.join(10)
