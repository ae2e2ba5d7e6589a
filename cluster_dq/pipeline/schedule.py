"""Bulk scheduling from Spark: validate every row, give each job a deterministic id, publish
partition by partition through the engine's own publish script.

Input columns (a DataFrame or a Parquet path): ``namespace``, ``queue``, ``body`` (binary or
string), and optionally ``delay_s`` (seconds after the reference time) or ``due_ms`` (absolute
epoch ms; one of the two, default due at the reference time), ``ttl_s`` (0 = forever; default
1 day), ``tries`` (default 1), ``priority`` (0-255), ``job_id`` (a client id).

Idempotent: a row's job id is its ``job_id``, or else is derived from the row (queue, due ms
and a hash of the body), with the lane chosen from the same hash over enough lanes for the
window's job count; so a retried Spark task, or a rerun with the same ``reference_ms``,
places the very same jobs and the engine reports them as already present. Two identical rows
(same queue, due and body) are one job. Only with the same version: how lanes are sized is part
of a derived id (lanes of 128 jobs since this version, of 409 before), so a window of more than
128 jobs without ``job_id`` gets other ids, and a rerun across an upgrade publishes them again.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import BulkJob, EngineConfig
from cluster_dq.keys import BUCKET_WIDTH_MS as WIDTH
from cluster_dq.models import MAX_BODY, JobSpec, encode_id, id_to_member
from cluster_dq.pipeline import Target, route_of
from cluster_dq.pipeline.rows import COLUMNS, Checked, check_batch, check_batches
from cluster_dq.routing import PoolRoute
from cluster_dq.settings import PoolSettings

FILL = 0.8  # never aim above 80 % of a bucket's capacity: hashing spreads rows unevenly
# Jobs a lane is aimed at. Each insert into a wheel bucket looks its id up in the bucket's
# listpack and grows it, so Redis pays per job with the bucket's size: 128-job lanes cost it
# ~9 us of CPU per bulk job against ~14 us at 409 (80 % of a 512-job bucket), at the same bytes
# per job (loadtest/bench_pipeline.py; docs/benchmarks.md). Smaller lanes save no more and add
# a key per 128 jobs.
LANE_FILL = 128
MAX_LANES = 65_535
# Jobs per publish script: the service's bulk limit is MAX_BULK (64), a bulk schedule's calls
# are bigger (~9 us of Redis per job: ~5 ms a call), so that a call's fixed work (the queue's
# keys, one lookup and WHEEL entry per bucket of up to 31 lanes) is shared by more jobs.
JOBS_PER_CALL = 512
PIPELINE_BATCHES = 8  # publish scripts per round trip (on a Cluster: split by node)
# Rows per Arrow batch: a column of bodies of up to MAX_BODY + 1 bytes (_column) stays within
# the 2 GiB the JVM allows a column of a batch, its buffer growing by doubling from the 512 MiB
# these take (Spark's default is 10,000 rows).
BATCH_ROWS = 512
BATCH_ROWS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
HELD_JOBS = 262_144  # jobs a task holds (~80 MB) to send them sorted by wheel bucket


@dataclass(frozen=True)
class ScheduleCounts:
    published: int
    already_present: int
    rejected: int
    reference_ms: int
    seconds: float

    def __str__(self) -> str:
        rate = (self.published + self.already_present) / self.seconds if self.seconds else 0
        return (
            f"published {self.published:,}, already present {self.already_present:,}, rejected "
            f"{self.rejected:,} in {self.seconds:.1f} s ({rate:,.0f} jobs/s); "
            f"reference time {self.reference_ms} (pass it again to rerun idempotently)"
        )


def window_of(due_ms: int) -> int:
    return due_ms - due_ms % WIDTH


def lanes_for(count: int, capacity: int) -> int:
    """Lanes for ``count`` wheel jobs of one queue's window, buckets holding ``capacity``."""
    return max(1, min(MAX_LANES, -(-count // min(LANE_FILL, int(capacity * FILL)))))


# (ns, q) -> blake2b of "ns/q\0", to copy; at most QUEUE_HASHES (0.5-0.7 kB each with its key)
_queue_hashes: dict[tuple[str, str], Any] = {}
QUEUE_HASHES = 10_000


def derived_member(ns: str, q: str, due_ms: int, body: bytes, lanes: int) -> bytes:
    """The 16 raw bytes (due ms | lane | 8 bytes of a hash) of the id the same row always gets:
    the hash is blake2b-64 of ``ns/q \0 due_ms \0 body``."""
    h = _queue_hashes.get((ns, q))
    if h is None:
        if len(_queue_hashes) >= QUEUE_HASHES:
            _queue_hashes.clear()
        h = _queue_hashes[ns, q] = blake2b(b"%s/%s\x00" % (ns.encode(), q.encode()), digest_size=8)
    h = h.copy()  # the queue's part hashed once: half the cost of hashing the whole row
    h.update(b"%d\x00%s" % (due_ms, body))
    tail = h.digest()
    return due_ms.to_bytes(6, "big") + (int.from_bytes(tail) % lanes).to_bytes(2) + tail


def derived_id(ns: str, q: str, due_ms: int, body: bytes, lanes: int) -> str:
    """A server-format id (due ms | lane | 8 bytes) that the same row always gets."""
    return encode_id(derived_member(ns, q, due_ms, body, lanes))


def spec_of(job: Checked, lanes: dict[tuple[str, str, int], int]) -> JobSpec:
    _, ns, q, body, due, expire_at, tries, priority, job_id, _ = job
    if job_id is None:
        job_id = derived_id(ns, q, due, body, lanes.get((ns, q, window_of(due)), 1))
    return JobSpec(body, 0, 0, tries, priority, None, job_id, due_ms=due, expire_at_ms=expire_at)


def bulk_job(job: Checked, lanes: dict[tuple[str, str, int], int]) -> BulkJob:
    """``spec_of`` as the engine's bulk publish takes it: the id as its stored member."""
    _, ns, q, body, due, expire_at, tries, priority, job_id, _ = job
    if job_id is None:
        member = derived_member(ns, q, due, body, lanes.get((ns, q, due - due % WIDTH), 1))
    else:
        member = id_to_member(job_id)  # a client id, or a server-format id made for its due
    return (member, due, expire_at, tries, priority, body)


# A queue's held jobs by wheel bucket: (10-s window, lane: bytes 6-7 of a server-format id)
Held = dict[tuple[int, bytes], list[BulkJob]]


def _hold(jobs: Held, job: BulkJob) -> None:
    key = (job[1] // WIDTH, job[0][6:8])
    try:
        jobs[key].append(job)
    except KeyError:
        jobs[key] = [job]


def publish_partition(
    route: PoolRoute[PoolSettings],
    rows: Iterable[Checked],
    lanes: dict[tuple[str, str, int], int],
    config: EngineConfig,
) -> Iterator[tuple[int, int]]:
    """Publishes one partition's valid rows, each on the pool its route places the queue on
    (a client per pool and partition, with the deployment's ``config``: the shard a queue is
    signalled on depends on it); yields (new, present). A sender thread does the round trips
    while this one reads and checks the next rows (the GIL is free while it waits on Redis);
    its failure fails the task."""
    from cluster_dq.engine.sync import SyncEngine
    from cluster_dq.pools import make_sync_client

    engines: dict[str, SyncEngine] = {}
    batches: dict[str, list[tuple[str, str, list[BulkJob]]]] = {}
    held: dict[tuple[str, str], tuple[str, Held]] = {}  # queue -> (pool, jobs)
    sends: queue.Queue[tuple[str, list[tuple[str, str, list[BulkJob]]]] | None]
    sends = queue.Queue(maxsize=2)
    failed: list[BaseException] = []
    new = present = 0

    def sender() -> None:
        nonlocal new, present
        try:
            while (item := sends.get()) is not None:
                pool, batch = item
                engine = engines[pool]
                now = int(time.time() * 1000)
                # durable: with the pool's WaitReplicas, a batch its replicas did not confirm
                # fails the task (NotReplicated), and Spark's rerun finds the confirmed jobs.
                dups = engine.run(
                    ops.publish_bulk(engine.config, batch, now), idempotent=True, durable=True
                )
                present += sum(dups)
                new += sum(len(jobs) for _, _, jobs in batch) - sum(dups)
        except BaseException as e:  # raised in the task's thread once it joins
            failed.append(e)
            while sends.get() is not None:  # never leave the reader blocked on a full queue
                pass

    def send(pool: str) -> None:
        if failed:
            raise failed[0]
        sends.put((pool, batches.pop(pool)))

    def send_held() -> None:
        # each queue's jobs by wheel bucket (window, lane): a call then touches a few buckets,
        # not one per job (a window of 10 M jobs has thousands of lanes)
        for (ns, q), (pool, by_bucket) in held.items():
            jobs = [job for key in sorted(by_bucket) for job in by_bucket[key]]
            for i in range(0, len(jobs), JOBS_PER_CALL):
                batches.setdefault(pool, []).append((ns, q, jobs[i : i + JOBS_PER_CALL]))
                if len(batches[pool]) >= PIPELINE_BATCHES:
                    send(pool)
        held.clear()

    thread = threading.Thread(target=sender, name="cluster-dq-schedule-sender", daemon=True)
    thread.start()
    try:
        count = 0
        for job in rows:
            key = (job[1], job[2])
            if key not in held:
                pool = route.place(*key).write
                if pool.name not in engines:
                    engines[pool.name] = SyncEngine(
                        make_sync_client(pool),
                        dataclasses.replace(config, lane_hints={}),
                        wait_replicas=pool.WaitReplicas,
                        wait_timeout_ms=pool.WaitTimeoutMs,
                    )
                held[key] = (pool.name, {})
            _hold(held[key][1], bulk_job(job, lanes))
            count += 1
            if count % HELD_JOBS == 0:
                send_held()
        send_held()
        for name in list(batches):
            send(name)
    finally:
        sends.put(None)
        thread.join()
        for engine in engines.values():
            engine.client.close()
    if failed:
        raise failed[0]
    yield new, present


def _checked_partition(
    route: PoolRoute[PoolSettings],
    rows: Iterable[Checked],
    lanes: dict[tuple[str, str, int], int],
    config: EngineConfig,
) -> Iterator[tuple[int, int, int]]:
    """Publishes one partition's checked rows; yields (new, present, rejected)."""
    rejected = 0

    def valid() -> Iterator[Checked]:
        nonlocal rejected
        for job in rows:
            if job[0]:
                yield job
            else:
                rejected += 1

    for new, present in publish_partition(route, valid(), lanes, config):
        yield new, present, rejected


def _column(df: Any, name: str) -> Any:
    """The input's column ``name`` as the schedule reads it (null when the input has none): a
    string or binary body as at most MAX_BODY + 1 bytes, refused all the same when longer, so
    that an Arrow batch of BATCH_ROWS rows stays within the 2 GiB the JVM gives a column."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if name not in df.columns:
        return F.lit(None).alias(name)
    if name == "body" and isinstance(df.schema[name].dataType, (T.StringType, T.BinaryType)):
        return F.substring(F.col(name).cast("binary"), 1, MAX_BODY + 1).alias(name)
    return F.col(name)


def window_counts(df: Any, reference_ms: int, open_lead_ms: int) -> dict[tuple[str, str, int], int]:
    """Rows without a ``job_id`` per (namespace, queue, 10-s window of the due time), for the
    windows that rest in the wheel: counted in the JVM, valid rows or not (a refused row only
    makes its window's lanes a little more), before any publish, so every task and every rerun
    derives the same lanes."""
    from pyspark.sql import functions as F

    col = {c: F.col(c) if c in df.columns else F.lit(None) for c in COLUMNS}
    # check_values' due time, in Spark's arithmetic (casts truncate as int() does)
    due = F.coalesce(
        col["due_ms"].cast("long"),
        F.lit(reference_ms) + (F.coalesce(col["delay_s"], F.lit(0)) * 1000).cast("long"),
    )
    return {
        (r[0], r[1], r[2]): r[3]
        for r in df.select(col["namespace"].alias("ns"), col["queue"].alias("q"), due.alias("due"))
        .where(col["job_id"].isNull() & (F.col("due") > reference_ms + open_lead_ms))
        .groupBy("ns", "q", (F.col("due") - F.col("due") % WIDTH).alias("window"))
        .count()
        .collect()
    }


def schedule(
    spark: Any,
    source: Any,
    target: Target,
    *,
    config: EngineConfig | None = None,
    rejects_path: str | None = None,
    reference_ms: int | None = None,
    progress: bool = False,
) -> ScheduleCounts:
    """Validates and publishes every row of ``source`` (a DataFrame or a Parquet path) to
    ``target``, a pool or a route (a ring spreads the queues over its pools). ``config``: the
    deployment's (``EngineConfig.from_settings``), as the service has it; the default suits
    only a deployment with the default settings."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    ref = reference_ms if reference_ms is not None else int(time.time() * 1000)
    df = spark.read.parquet(source) if isinstance(source, str) else source
    cfg = config or EngineConfig()
    capacity = cfg.lane_capacity
    # Lanes per (queue, 10-s window) from the window's job count: known before any publish,
    # so every task (and every rerun) derives the same ids.
    counts = window_counts(df, ref, cfg.open_lead_ms)
    lanes = {k: lanes_for(n, capacity) for k, n in counts.items()}
    lanes_bc = spark.sparkContext.broadcast(lanes)
    if progress:
        print(
            f"schedule: {sum(counts.values()):,} wheel jobs in {len(lanes):,} queue windows",
            flush=True,
        )
    route = route_of(target)
    # One pass over the rows, as Arrow batches of the columns there are (no Row per job, no
    # pickling in the JVM): each task checks and publishes its batches and yields its counts.
    names = [c for c in COLUMNS if c in df.columns] or ["namespace"]  # none: every row refused
    rows = df.select(*(_column(df, c) for c in names))

    def publish_batches(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        checked = check_batches(batches, ref)
        for n, p, r in _checked_partition(route, checked, lanes_bc.value, cfg):
            yield pa.RecordBatch.from_pydict({"new": [n], "present": [p], "rejected": [r]})

    batch_rows = spark.conf.get(BATCH_ROWS_CONF, None)
    spark.conf.set(BATCH_ROWS_CONF, str(BATCH_ROWS))
    try:
        sums = (
            rows.mapInArrow(publish_batches, "new long, present long, rejected long")
            .agg(*(F.coalesce(F.sum(c), F.lit(0)) for c in ("new", "present", "rejected")))
            .first()
        )
        new, present, rejected = (int(v) for v in sums)
        if rejects_path is not None and rejected:  # a second pass, only for the refused rows
            _write_rejects(rows, ref, rejects_path)
    finally:
        if batch_rows is None:
            spark.conf.unset(BATCH_ROWS_CONF)
        else:
            spark.conf.set(BATCH_ROWS_CONF, batch_rows)
    return ScheduleCounts(new, present, rejected, ref, time.monotonic() - started)


def _write_rejects(rows: Any, ref: int, path: str) -> None:
    """The refused rows of ``rows``, with their reasons, to Parquet."""

    def refused(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            bad = [c for c in check_batch(batch, ref) if not c[0]]
            yield pa.RecordBatch.from_pydict(
                {
                    k: [c[i] for c in bad]
                    for k, i in (("namespace", 1), ("queue", 2), ("reason", 9))
                },
                schema=pa.schema([(k, pa.string()) for k in ("namespace", "queue", "reason")]),
            )

    rows.mapInArrow(refused, "namespace string, queue string, reason string").write.mode(
        "overwrite"
    ).parquet(path)
