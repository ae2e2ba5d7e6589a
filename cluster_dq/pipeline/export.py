"""Export of queue contents (ready, delayed, reserved, dead) to a DataFrame / Parquet while the
service keeps running: one Spark task per queue, each reading its queue page by page with
the engine's read-only ``dump_page`` / ``dump_wheel`` operations (no script, no lock)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.models import JobState
from cluster_dq.pipeline import Target, route_of
from cluster_dq.routing import PoolRoute
from cluster_dq.settings import PoolSettings

COLUMNS = (
    "namespace",
    "queue",
    "state",
    "job_id",
    "due_ms",
    "published_ms",
    "expire_at_ms",
    "tries_left",
    "deliveries",
    "priority",
    "body",
)


def route_rows(
    route: PoolRoute[PoolSettings],
    ns: str,
    q: str,
    states: Sequence[str],
    config: EngineConfig | None = None,
) -> Iterator[tuple[Any, ...]]:
    """The queue's jobs on every pool it may be on (a queue being drained is on two)."""
    for pool in route.place(ns, q).reads:
        yield from queue_rows(pool, ns, q, states, config)


def queue_rows(
    pool: PoolSettings, ns: str, q: str, states: Sequence[str], config: EngineConfig | None = None
) -> Iterator[tuple[Any, ...]]:
    from cluster_dq.engine.sync import SyncEngine
    from cluster_dq.pools import make_sync_client

    client = make_sync_client(pool)
    engine = SyncEngine(client, config)
    try:
        for name in states:
            state = JobState(name)
            jobs_pages = []
            if state is JobState.DELAYED:
                jobs_pages.append(engine.run(ops.dump_wheel(ns, q), idempotent=True))
            for held in (False, True) if state is JobState.READY else (False,):
                cursor = None
                while cursor != 0:
                    op = ops.dump_page(ns, q, state, cursor or 0, held=held)
                    cursor, jobs = engine.run(op, idempotent=True)
                    jobs_pages.append(jobs)
            for jobs in jobs_pages:
                for j in jobs:
                    yield (
                        ns,
                        q,
                        name,
                        j.job_id,
                        j.due_ms,
                        j.published_ms,
                        j.expire_at_ms or None,
                        j.tries_left,
                        j.deliveries,
                        j.priority,
                        bytearray(j.body),
                    )
    finally:
        client.close()


def export(
    spark: Any,
    target: Target,
    queues: Sequence[tuple[str, str]],
    states: Sequence[str] = ("ready", "delayed", "reserved", "dead"),
    path: str | None = None,
    config: EngineConfig | None = None,
) -> Any:
    """The jobs of ``queues`` ((namespace, queue) pairs) in ``states`` as a DataFrame; also
    written to ``path`` as Parquet when given."""
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("namespace", T.StringType(), False),
            T.StructField("queue", T.StringType(), False),
            T.StructField("state", T.StringType(), False),
            T.StructField("job_id", T.StringType(), False),
            T.StructField("due_ms", T.LongType()),
            T.StructField("published_ms", T.LongType()),
            T.StructField("expire_at_ms", T.LongType()),
            T.StructField("tries_left", T.IntegerType()),
            T.StructField("deliveries", T.IntegerType()),
            T.StructField("priority", T.IntegerType()),
            T.StructField("body", T.BinaryType()),
        ]
    )
    wanted = list(states)
    route = route_of(target)
    rdd = spark.sparkContext.parallelize(list(queues), max(1, len(queues))).flatMap(
        lambda nq: route_rows(route, nq[0], nq[1], wanted, config)
    )
    df = spark.createDataFrame(rdd, schema)
    if path is not None:
        df.write.mode("overwrite").parquet(path)
        df = spark.read.parquet(path)
    return df
