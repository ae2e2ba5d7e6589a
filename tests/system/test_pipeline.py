"""The PySpark pipeline on local[2] against real Redis (standalone and Cluster): bulk
scheduling (validated, idempotent, cluster-aware), export while the queues work, lifecycle
analytics from a real service's event log, and the CLI."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.keys import QueueKeys, ShardKeys, shard_of
from cluster_dq.localredis import Cluster, Server
from cluster_dq.models import MAX_BODY, JobState
from cluster_dq.pipeline import spark_session
from cluster_dq.pipeline.analyze import analyze
from cluster_dq.pipeline.export import export
from cluster_dq.pipeline.schedule import JOBS_PER_CALL, schedule
from cluster_dq.pools import make_sync_client
from cluster_dq.routing import PoolRoute
from cluster_dq.settings import PoolSettings
from tests.support import flush
from cluster_dq.testing.invariants import check_queue
from tests.support import ADMIN_AUTH, serve

from tests.support import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # The driver JVM of a test run lives a minute: compiled by C1 alone, with the serial
    # collector, it starts and runs these small frames in ~20 % less time and far less CPU
    # (the JIT's C2 threads and parallel GC compete with the tests beside it). The CLI runs
    # below inherit it; the product's own sessions keep the JVM's defaults, made for long runs.
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS",
        "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell",
    )
    session = spark_session("cluster-dq-tests")
    session.sparkContext.setLogLevel("ERROR")
    # a test's frames hold at most a few thousand rows: a shuffle makes one partition per core
    # of local[2], not the CLI's 4 (each a task of its own; analyze's joins and aggregations
    # took 9 s warm with 4, 6 s with 1). No result depends on it; the frames that are
    # published are still split into 4 partitions, so 4 tasks publish at once (``frame``).
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture(params=["standalone", "cluster"])
def target(request: pytest.FixtureRequest) -> Iterator[Server | Cluster]:
    d: Server | Cluster = request.getfixturevalue(
        "redis_server" if request.param == "standalone" else "redis_cluster"
    )
    with d.sync_client() as c:
        flush(c)
    yield d


def rows(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        q = f"q{i % 3}"
        delay = [0, 60, 3600][i % 3]  # ready now, in a minute (delayed), in an hour (wheel)
        out.append(
            {
                "namespace": "bulk",
                "queue": q,
                "body": f"job-{i}",
                "delay_s": delay,
                "due_ms": None,
                "ttl_s": 0 if i % 7 == 0 else None,
                "tries": 1 + i % 3,
                "priority": None,
                "job_id": f"client-{i}" if i % 10 == 0 else None,
            }
        )
    bad = [
        {"namespace": "bulk", "queue": None, "body": "x"},  # no queue
        {"namespace": "bad ns!", "queue": "q", "body": "x"},  # bad name
        {"namespace": "bulk", "queue": "q0", "body": "x", "tries": 0},  # tries 0
        {"namespace": "bulk", "queue": "q0", "body": "x", "delay_s": 5, "due_ms": 1},  # both
        {
            "namespace": "bulk",
            "queue": "q0",
            "body": "x",
            "delay_s": 600,
            "ttl_s": 60,
        },  # ttl < delay
        {"namespace": "bulk", "queue": "q0", "body": "x", "job_id": "no spaces allowed"},
    ]
    full = {
        "namespace": None,
        "queue": None,
        "body": None,
        "delay_s": None,
        "due_ms": None,
        "ttl_s": None,
        "tries": None,
        "priority": None,
        "job_id": None,
    }
    return out + [{**full, **b} for b in bad]


def frame(spark: Any, data: list[dict[str, Any]]) -> Any:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("namespace", T.StringType()),
            T.StructField("queue", T.StringType()),
            T.StructField("body", T.StringType()),
            T.StructField("delay_s", T.LongType()),
            T.StructField("due_ms", T.LongType()),
            T.StructField("ttl_s", T.LongType()),
            T.StructField("tries", T.IntegerType()),
            T.StructField("priority", T.IntegerType()),
            T.StructField("job_id", T.StringType()),
        ]
    )
    return spark.createDataFrame(data, schema).repartition(4)


def sizes(d: Server | Cluster, q: str) -> ops.Sizes:
    client = make_sync_client(d.pool_settings())
    try:
        return SyncEngine(client).run(ops.sizes(SyncEngine(client).config, "bulk", q))
    finally:
        client.close()


def test_schedule_validates_publishes_and_reruns_idempotently(
    spark: Any, target: Server | Cluster, tmp_path: Path
) -> None:
    n = 3_000
    df = frame(spark, rows(n))
    ref = int(time.time() * 1000)
    rejects = str(tmp_path / "rejects")
    first = schedule(spark, df, target.pool_settings(), rejects_path=rejects, reference_ms=ref)
    assert (first.published, first.already_present, first.rejected) == (n, 0, 6)
    reasons = {r["reason"] for r in spark.read.parquet(rejects).collect()}
    assert any("tries" in r for r in reasons) and any("delay_s or due_ms" in r for r in reasons)
    assert any("ttl" in r for r in reasons) and any("job_id" in r for r in reasons)
    # Every job where it belongs: ready now, delayed a minute, resting in the wheel for an hour.
    assert sizes(target, "q0").ready == n // 3
    assert sizes(target, "q1").delayed == n // 3 and sizes(target, "q2").delayed == n // 3
    with target.sync_client() as c:
        wheel = c.zcard("dq:{bulk/q2}:wheel")
        assert wheel >= 1  # the hour-away jobs rest in compact buckets
        if isinstance(c, redis.Redis):
            for q in ("q0", "q1", "q2"):
                check_queue(c, "bulk", q)
    # A rerun (a retried Spark job) with the same reference time creates nothing new.
    again = schedule(spark, df, target.pool_settings(), reference_ms=ref)
    assert (again.published, again.already_present, again.rejected) == (0, n, 6)
    assert sizes(target, "q2").delayed == n // 3


def test_big_calls_fill_buckets_and_rerun_idempotently(
    spark: Any, target: Server | Cluster
) -> None:
    """A bulk schedule's calls (up to JOBS_PER_CALL jobs of one queue, over several lanes)
    with buckets that fill up (the rest of a full bucket waits in the delayed set): every job
    placed once, identical rows are one job, and a rerun (a retried task) finds every job
    present, wherever it went."""
    data = [
        {
            **rows(1)[0],
            **{"queue": "big", "body": f"big-{i % 1_990}", "job_id": None, "delay_s": None},
            **{"due_ms": 4_102_444_800_000, "ttl_s": 0},  # 2100: the same ids on every run
        }
        for i in range(2_000)
    ]  # the last 10 rows repeat the first 10
    df = frame(spark, data).coalesce(1)  # one task: calls of JOBS_PER_CALL jobs
    cfg = ops.EngineConfig(lane_capacity=64)  # 39 lanes of 64 at most: some fill up
    ref = int(time.time() * 1000)
    first = schedule(spark, df, target.pool_settings(), config=cfg, reference_ms=ref)
    assert 2_000 > JOBS_PER_CALL
    assert (first.published, first.already_present, first.rejected) == (1_990, 10, 0)
    assert sizes(target, "big").delayed == 1_990
    k = QueueKeys("bulk", "big")
    with target.sync_client() as c:
        assert 0 < c.zcard(k.delayed) < 1_990  # full buckets sent the rest to the delayed set
        if isinstance(c, redis.Redis):
            check_queue(c, "bulk", "big")
    again = schedule(spark, df, target.pool_settings(), config=cfg, reference_ms=ref)
    assert (again.published, again.already_present, again.rejected) == (0, 2_000, 0)
    assert sizes(target, "big").delayed == 1_990


def test_schedule_takes_only_the_columns_it_is_given_and_bodies_as_bytes(
    spark: Any, target: Server | Cluster
) -> None:
    """Rows read as Arrow batches: a missing column is absent for every row (the defaults
    apply), and a binary body arrives byte for byte, bytes that are not UTF-8 included."""
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("body", T.BinaryType()),
            T.StructField("queue", T.StringType()),
            T.StructField("namespace", T.StringType()),
        ]
    )
    bodies = [bytes([i % 256, 0xFF, 0x00]) + b"tail" * (i % 3) for i in range(300)]
    df = spark.createDataFrame([(b, "bin", "bulk") for b in bodies], schema).repartition(3)
    counts = schedule(spark, df, target.pool_settings())
    assert (counts.published, counts.already_present, counts.rejected) == (300, 0, 0)
    client = make_sync_client(target.pool_settings())
    try:
        engine = SyncEngine(client)
        got = engine.run(ops.consume(engine.config, "bulk", ["bin"], 30_000, 1_000, now_ms()))
    finally:
        client.close()
    assert sorted(j.body for j in got) == sorted(bodies)
    # the defaults of the absent columns: one try, due now, a day's ttl, priority 0
    assert {(j.tries_left, j.priority) for j in got} == {(0, 0)}
    assert all(0 < j.expire_at_ms - counts.reference_ms <= 86_400_000 for j in got)


def test_rows_the_schedule_cannot_take_are_counted_and_kept_as_rejects(
    spark: Any, redis_server: Server, tmp_path: Path
) -> None:
    """Rows are refused with a reason, never lost and never a failed job: a frame with none of
    the schedule's columns (names are case-sensitive), and infinite numbers."""
    with redis_server.sync_client() as c:
        flush(c)
    pool = redis_server.pool_settings()
    unknown = spark.createDataFrame(
        [("bulk", "q", f"b{i}") for i in range(7)], "Namespace string, Queue string, Body string"
    )
    rejects = str(tmp_path / "unknown")
    counts = schedule(spark, unknown, pool, rejects_path=rejects)
    assert (counts.published, counts.rejected) == (0, 7)
    assert {r["reason"] for r in spark.read.parquet(rejects).collect()} == {
        "namespace and queue are required strings"
    }

    infinite = spark.createDataFrame(
        [("bulk", "q", "x", float("inf")), ("bulk", "q", "y", 1.0)],
        "namespace string, queue string, body string, delay_s double",
    )
    counts = schedule(spark, infinite, pool)
    assert (counts.published, counts.rejected) == (1, 1)


@pytest.mark.long  # 2.1 GiB through Spark twice: ~20 s
def test_bodies_over_the_limit_are_refused_even_beyond_an_arrow_batchs_2_gib(
    spark: Any, redis_server: Server, tmp_path: Path
) -> None:
    """2,100 bodies of 1 MiB + 1 byte in one partition: more than the 2 GiB the JVM gives an
    Arrow column of a batch of Spark's default size. Each is refused; the job does not fail."""
    from pyspark.sql import functions as F

    with redis_server.sync_client() as c:
        flush(c)
    pool = redis_server.pool_settings()
    big = spark.range(0, 2_100, 1, 1).select(
        F.lit("bulk").alias("namespace"),
        F.lit("big").alias("queue"),
        F.expr(f"repeat('x', {MAX_BODY + 1})").alias("body"),
    )
    rejects = str(tmp_path / "big")
    counts = schedule(spark, big, pool, rejects_path=rejects)
    assert (counts.published, counts.rejected) == (0, 2_100)
    assert {r["reason"] for r in spark.read.parquet(rejects).collect()} == {"body too large"}


def test_export_reads_every_state_while_queues_work(
    spark: Any, target: Server | Cluster, tmp_path: Path
) -> None:
    n = 300
    schedule(spark, frame(spark, rows(n)[:n]), target.pool_settings())
    client = make_sync_client(target.pool_settings())
    engine = SyncEngine(client)
    reserved = engine.run(
        ops.consume(engine.config, "bulk", ["q0"], 60_000, 10, int(time.time() * 1000))
    )
    client.close()
    assert len(reserved) == 10
    out = str(tmp_path / "export")
    df = export(
        spark, target.pool_settings(), [("bulk", "q0"), ("bulk", "q1"), ("bulk", "q2")], path=out
    )
    counts = {
        (r["queue"], r["state"]): r["count"] for r in df.groupBy("queue", "state").count().collect()
    }
    assert counts == {
        ("q0", "ready"): n // 3 - 10,
        ("q0", "reserved"): 10,
        ("q1", "delayed"): n // 3,
        ("q2", "delayed"): n // 3,
    }
    row = df.filter("queue = 'q2'").first()
    assert row["due_ms"] > time.time() * 1000 + 3_000_000 and row["body"].decode().startswith(
        "job-"
    )
    assert {r["job_id"] for r in df.filter("state = 'reserved'").collect()} == {
        j.job_id for j in reserved
    }
    assert reserved[0].state is JobState.RESERVED


def test_schedule_and_export_follow_a_ring(
    spark: Any, target: Server | Cluster, redis_server: Server
) -> None:
    """Scheduled through a ring (a standalone DB and the target), each queue's jobs land on the
    member the service would route it to, and export reads them back from there."""
    side = PoolSettings("side", Addr=f"127.0.0.1:{redis_server.port}", DB=5)
    redis.Redis(port=redis_server.port, db=5).flushdb()
    pools = {"side": side, "main": dataclasses.replace(target.pool_settings(), name="main")}
    route = PoolRoute("ring", pools, ["side", "main"])
    data = [
        {**rows(1)[0], "queue": f"r{i % 12}", "body": f"ring-{i}", "delay_s": 0, "job_id": None}
        for i in range(240)
    ]
    counts = schedule(spark, frame(spark, data), route)
    assert (counts.published, counts.rejected) == (240, 0)
    placed = {f"r{i}": route.place("bulk", f"r{i}").write.name for i in range(12)}
    assert set(placed.values()) == {"side", "main"}
    for q, name in placed.items():
        client = make_sync_client(pools[name])
        other = make_sync_client(pools["main" if name == "side" else "side"])
        try:
            assert (
                SyncEngine(client).run(ops.sizes(SyncEngine(client).config, "bulk", q)).ready == 20
            ), q
            assert (
                SyncEngine(other).run(ops.sizes(SyncEngine(other).config, "bulk", q)).ready == 0
            ), q
        finally:
            client.close()
            other.close()
    df = export(spark, route, [("bulk", q) for q in placed])
    assert df.count() == 240 and {
        r["queue"] for r in df.select("queue").distinct().collect()
    } == set(placed)


def test_analyze_turns_a_services_event_log_into_figures(
    spark: Any, redis_server: Server, tmp_path: Path
) -> None:
    events = tmp_path / "events"
    with redis_server.client() as c:
        c.flushall()
    svc = serve(f"127.0.0.1:{redis_server.port}", CLUSTER_DQ_LIFECYCLEDIR=str(events))
    base, admin = svc.base, svc.admin
    try:
        tok = httpx.post(
            f"{admin}/token/life", params={"description": "t"}, auth=ADMIN_AUTH
        ).json()["token"]
        # one client: a module-level httpx call builds a client (and its TLS context) each
        # time, ~80 ms a request here
        with httpx.Client(base_url=base, headers={"X-Token": tok}, timeout=30) as api:
            first_publish = time.monotonic()
            for i in range(20):
                api.put("/api/life/q", params={"tries": 1}, content=b"x%d" % i)
            for _ in range(15):
                jid = api.get("/api/life/q").json()["job_id"]
                assert api.delete(f"/api/life/q/job/{jid}").status_code == 204
            got = api.get("/api/life/q", params={"count": 5, "ttr": 1}).json()
            assert len(got) == 5  # never acked: ttr passes, no tries left -> dead letter
            # every job was due at its publish: none can have been later than this
            latest_ms = (time.monotonic() - first_publish) * 1000
            deadline = time.monotonic() + 15
            while api.get("/api/life/q/deadletter/size").json()["size"] < 5:
                assert time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        svc.stop(timeout=20)  # workers flush their event logs on the way out
    figures = analyze(spark, str(events), str(tmp_path / "figures")).collect()
    (row,) = figures
    assert (row["namespace"], row["queue"]) == ("life", "q")
    assert (row["published"], row["delivered_jobs"], row["acked"]) == (20, 20, 15)
    assert (row["ttr_expired"], row["dead_lettered"]) == (5, 5)
    assert row["dead_letter_rate"] == pytest.approx(0.25)
    assert 0 <= row["lateness_p50_ms"] <= row["lateness_max_ms"] <= latest_ms + 2  # ms rounding
    assert row["retry_rate"] == 0 and row["delivery_to_ack_p50_ms"] >= 0


def test_cli_schedule_and_export_print_counts(
    spark: Any, redis_server: Server, tmp_path: Path
) -> None:
    with redis_server.client() as c:
        c.flushall()
    path = str(tmp_path / "jobs.parquet")
    frame(spark, rows(30)).write.parquet(path)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{redis_server.port}",
        "CLUSTER_DQ_LOGLEVEL": "error",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster_dq.cli",
            "pipeline",
            "schedule",
            path,
            "--at",
            "1700000000000",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "published 30, already present 0, rejected 6" in out.stdout, out.stdout
    # stderr is no terminal here: progress comes as plain lines, the last one complete
    done = re.findall(r"^schedule: (\d+)/(\d+) tasks$", out.stderr, re.M)
    assert done and done[-1][0] == done[-1][1] != "0", out.stderr[-2000:]
    out = subprocess.run(
        [sys.executable, "-m", "cluster_dq.cli", "pipeline", "export", "bulk/q0", "bulk/q1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-2:] == [
        "export: bulk/q0 ready: 10",
        "export: bulk/q1 ready: 10",
    ]
    assert re.search(r"^export: (\d+)/\1 tasks$", out.stderr, re.M), out.stderr[-2000:]
    assert "[Stage " not in out.stderr  # Spark's own console bar is off: ours says it


def test_cli_schedule_signals_the_shard_of_the_configured_shard_count(
    spark: Any, redis_server: Server, tmp_path: Path
) -> None:
    """A deployment with ``Shards = 3``: the jobs Spark schedules are signalled on the shard
    the service's pump (which has the same settings file) looks at, not on the shard of the
    default 16, where no pump of that deployment ever would."""
    with redis_server.client() as c:
        c.flushall()
    path = str(tmp_path / "jobs.parquet")
    frame(spark, rows(30)).write.parquet(path)
    config = tmp_path / "dq.toml"
    config.write_text(
        f'Shards = 3\nLogLevel = "error"\n[Pool.default]\nAddr = "127.0.0.1:{redis_server.port}"\n'
    )
    queues = [f"bulk/q{i}" for i in range(3)]
    assert any(shard_of(qn, 3) != shard_of(qn, 16) for qn in queues)  # else the test proves nothing
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "cluster_dq.cli", "-c", str(config), "pipeline", "schedule", path],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "published 30, already present 0, rejected 6" in out.stdout, out.stdout
    with redis_server.client() as c:
        for qn in queues:
            assert c.sismember(ShardKeys(shard_of(qn, 3)).queues, qn), qn
            assert c.zscore(ShardKeys(shard_of(qn, 3)).schedule, qn) is not None, qn
        assert not [
            k for k in c.keys("dq:{shard-*}:*") if int(k.split(b"-")[1].split(b"}")[0]) >= 3
        ]
