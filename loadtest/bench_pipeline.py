"""Pipeline benchmark: N jobs (default 10 M, 64-byte bodies, 16 queues, all due at the same
second tomorrow: "push 10 M notifications at 08:00") scheduled from Parquet by the Spark
pipeline on local[2], beside a single-process loader of the same rows (same validation, same
ids, same publish pipeline, one process, rows streamed from the same Parquet).

    python loadtest/bench_pipeline.py                       # 10 M jobs
    python loadtest/bench_pipeline.py --jobs 1000000 --single-jobs 1000000

Starts its own redis-server (Cluster with --cluster). Prints wall time, jobs/s and Redis
memory per job. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from cluster_dq.engine.commands import EngineConfig
from cluster_dq.localredis import start_cluster, start_server
from cluster_dq.pipeline import route_of, spark_session
from cluster_dq.pipeline.rows import check_row
from cluster_dq.pipeline.schedule import (
    lanes_for,
    publish_partition,
    schedule,
    window_of,
)


def make_parquet(spark: object, path: str, n: int, due_ms: int) -> None:
    from pyspark.sql import functions as F

    df = spark.range(n, numPartitions=8).select(  # type: ignore[attr-defined]
        F.lit("bench").alias("namespace"),
        F.concat(F.lit("q"), (F.col("id") % 16).cast("string")).alias("queue"),
        F.concat(F.lit("notification-"), F.lpad(F.col("id").cast("string"), 51, "0")).alias("body"),
        F.lit(due_ms).cast("long").alias("due_ms"),
        F.lit(2 * 86_400).cast("long").alias("ttl_s"),
        F.lit(3).alias("tries"),
    )
    df.write.mode("overwrite").parquet(path)


def redis_cpu(client: object) -> float:
    """Seconds of CPU the server (every node of a Cluster) has used."""
    info = client.info("cpu")  # type: ignore[attr-defined]
    nodes = info.values() if "used_cpu_user" not in info else [info]
    return sum(float(n["used_cpu_user"]) + float(n["used_cpu_sys"]) for n in nodes)


def spark_cpu() -> dict[str, float]:
    """Seconds of CPU of this machine's Spark processes: the JVM, and the Python workers."""
    out = {"jvm": 0.0, "python workers": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(stat[11]) + int(stat[12])) / tick
        if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd:
            out["python workers"] += seconds
        elif b"java" in cmd and b"spark" in cmd:
            out["jvm"] += seconds
    return out


def used_memory(client: object) -> int:
    info = client.info("memory")  # type: ignore[attr-defined]
    if isinstance(info, dict) and "used_memory" not in info:  # a Cluster: per node
        return sum(int(v["used_memory"]) for v in info.values())
    return int(info["used_memory"])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=10_000_000)
    ap.add_argument(
        "--single-jobs", type=int, help="rows for the single-process loader (default: all)"
    )
    ap.add_argument("--cluster", action="store_true", help="a 3+3 Cluster instead of one server")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cluster-dq-bench-pipeline-"))
    spark = spark_session("bench-pipeline")
    spark.sparkContext.setLogLevel("ERROR")
    deployment = start_cluster() if a.cluster else start_server()
    try:
        due = (int(time.time()) // 86_400 + 1) * 86_400_000 + 8 * 3_600_000  # 08:00 UTC tomorrow
        path = str(work / "jobs.parquet")
        t = time.monotonic()
        make_parquet(spark, path, a.jobs, due)
        print(f"{a.jobs:,} rows written to Parquet in {time.monotonic() - t:.1f} s", flush=True)
        pool = deployment.pool_settings()
        with deployment.sync_client() as c:
            base, redis0, spark0 = used_memory(c), redis_cpu(c), spark_cpu()
        counts = schedule(spark, path, pool, reference_ms=int(time.time() * 1000), progress=True)
        with deployment.sync_client() as c:
            jobs = max(counts.published, 1)
            per_job = (used_memory(c) - base) / jobs
            cpu = {"redis-server": redis_cpu(c) - redis0}
        cpu |= {k: v - spark0[k] for k, v in spark_cpu().items()}
        print(f"spark local[2]: {counts}", flush=True)
        print(
            f"  wall {counts.seconds:.1f} s, {counts.published / counts.seconds:,.0f} jobs/s, "
            f"Redis memory {per_job:.1f} B/job (target: 10 M in <= 120 s)",
            flush=True,
        )
        print(
            "  CPU per job: "
            + ", ".join(f"{k} {v / jobs * 1e6:.1f} us" for k, v in cpu.items())
            + f"; {sum(cpu.values()):.0f} core-seconds in all",
            flush=True,
        )
        with deployment.sync_client() as c:
            c.flushall() if not a.cluster else c.flushall(target_nodes="primaries")  # type: ignore[call-arg]
        n = a.single_jobs or a.jobs
        ref = int(time.time() * 1000)
        df = spark.read.parquet(path).limit(n)
        t = time.monotonic()
        rows = (check_row(r, ref) for r in df.toLocalIterator(prefetchPartitions=True))
        config = EngineConfig()  # the one schedule() uses above: the same lanes, ids, shards
        lanes = {
            ("bench", f"q{i}", window_of(due)): lanes_for(-(-n // 16), config.lane_capacity)
            for i in range(16)
        }
        ((new, present),) = publish_partition(
            route_of(pool), (r for r in rows if r[0]), lanes, config
        )
        took = time.monotonic() - t
        print(
            f"single process: {new + present:,} jobs in {took:.1f} s, {(new + present) / took:,.0f} jobs/s",
            flush=True,
        )
    finally:
        spark.stop()
        deployment.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
