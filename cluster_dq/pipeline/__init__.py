"""The data pipeline on PySpark (``pip install cluster_dq[spark]``): bulk scheduling, export
of queue contents, lifecycle analytics. Each reuses the engine's operations and Lua scripts;
Redis clients are created inside the Spark tasks.

    cluster-dq pipeline schedule jobs.parquet [--rejects rejects.parquet] [--at MS] [--pool NAME]
    cluster-dq pipeline export ns/q [ns/q ...] --out queues.parquet [--pool NAME]
    cluster-dq pipeline analyze EVENTS_DIR --out figures.parquet

``--pool`` is what a token names (a pool, a migrating pool or a ring): jobs are placed as the
service places them (``cluster_dq.routing``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from cluster_dq.routing import PoolRoute
from cluster_dq.settings import PoolSettings

Target = PoolSettings | PoolRoute[PoolSettings]


def route_of(target: Target) -> PoolRoute[PoolSettings]:
    """A route for a bare pool: every queue on it."""
    if isinstance(target, PoolRoute):
        return target
    return PoolRoute(target.name, {target.name: target}, [target.name])


def spark_session(app: str = "cluster-dq", master: str = "local[2]") -> Any:
    """A local SparkSession set up for this machine: workers run this interpreter, loopback
    only, no UI, few shuffle partitions."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # the CLI shows its own progress
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
