"""Lifecycle analytics: the events the service recorded (``LifecycleDir``, JSON lines) turned
into per-queue figures: publish -> due, lateness (first delivery - due), delivery -> ack, and
retry and dead-letter rates. Written to Parquet and returned as a DataFrame."""

from __future__ import annotations

from typing import Any

FIGURES = (
    "namespace",
    "queue",
    "published",
    "delivered_jobs",
    "acked",
    "publish_to_due_p50_s",
    "publish_to_due_p99_s",
    "lateness_p50_ms",
    "lateness_p99_ms",
    "lateness_max_ms",
    "delivery_to_ack_p50_ms",
    "delivery_to_ack_p99_ms",
    "retry_rate",
    "ttr_expired",
    "dead_lettered",
    "dead_letter_rate",
    "respawned",
)


def analyze(spark: Any, events_path: str, out_path: str | None = None) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("ev", T.StringType()),
            T.StructField("ns", T.StringType()),
            T.StructField("q", T.StringType()),
            T.StructField("t", T.LongType()),
            T.StructField("id", T.StringType()),
            T.StructField("due", T.LongType()),
            T.StructField("n", T.LongType()),
        ]
    )
    ev = spark.read.schema(schema).json(events_path)
    key = ["ns", "q"]
    pct = F.percentile_approx

    pub = ev.filter(F.col("ev") == "published")
    published = pub.groupBy(key).agg(
        F.count("*").alias("published"),
        pct((F.col("due") - F.col("t")) / 1000.0, 0.5).alias("publish_to_due_p50_s"),
        pct((F.col("due") - F.col("t")) / 1000.0, 0.99).alias("publish_to_due_p99_s"),
    )
    dlv = ev.filter(F.col("ev") == "delivered")
    first = dlv.filter(F.col("n") == 1).withColumn(
        "late", F.greatest(F.col("t") - F.col("due"), F.lit(0))
    )
    delivered = first.groupBy(key).agg(
        F.count("*").alias("delivered_jobs"),
        pct("late", 0.5).alias("lateness_p50_ms"),
        pct("late", 0.99).alias("lateness_p99_ms"),
        F.max("late").alias("lateness_max_ms"),
    )
    retries = dlv.groupBy(key).agg(
        (F.sum(F.when(F.col("n") > 1, 1).otherwise(0)) / F.count("*")).alias("retry_rate")
    )
    last = dlv.groupBy(key + ["id"]).agg(F.max("t").alias("last_delivery"))
    acks = ev.filter(F.col("ev") == "acked").groupBy(key + ["id"]).agg(F.min("t").alias("acked_at"))
    to_ack = (
        acks.join(last, key + ["id"])
        .withColumn("d", F.col("acked_at") - F.col("last_delivery"))
        .groupBy(key)
        .agg(
            F.count("*").alias("acked"),
            pct("d", 0.5).alias("delivery_to_ack_p50_ms"),
            pct("d", 0.99).alias("delivery_to_ack_p99_ms"),
        )
    )
    counted = (
        ev.filter(F.col("ev").isin("ttr_expired", "dead_lettered", "respawned"))
        .groupBy(key)
        .pivot("ev", ["ttr_expired", "dead_lettered", "respawned"])
        .agg(F.sum("n"))
    )
    out = (
        published.join(delivered, key, "full")
        .join(retries, key, "full")
        .join(to_ack, key, "full")
        .join(counted, key, "full")
        .fillna(
            0, ["published", "delivered_jobs", "acked", "ttr_expired", "dead_lettered", "respawned"]
        )
        .withColumn(
            "dead_letter_rate",
            F.when(F.col("published") > 0, F.col("dead_lettered") / F.col("published")).otherwise(
                F.lit(None)
            ),
        )
        .withColumnRenamed("ns", "namespace")
        .withColumnRenamed("q", "queue")
        .select(*FIGURES)
        .orderBy("namespace", "queue")
    )
    if out_path is not None:
        out.write.mode("overwrite").parquet(out_path)
        out = spark.read.parquet(out_path).orderBy("namespace", "queue")
    return out
