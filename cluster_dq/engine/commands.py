"""Pure engine operations: key/argument builders and reply decoding, with no I/O.

Each operation is a generator that yields *steps* and receives their replies: an ``Eval`` (one
Lua script), a ``Cmd`` (one plain command) or a tuple of them (one pipeline, reply = list).
The async and sync executors (aio.py, sync.py) drive the same generators, which is how the
service, the Python client and the Spark pipeline share one engine.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

import os
import random
import struct

from cluster_dq.clock import now_ms
from cluster_dq.engine import replies
from cluster_dq.engine.replies import ReplyCode
from cluster_dq.engine.retry import BUDGET_S
from cluster_dq.engine.replies import Sizes as Sizes  # re-exported: the service and metrics use it
from cluster_dq.engine.signatures import SIGNATURES
from cluster_dq.errors import Conflict, QueueFull
from cluster_dq.keys import (
    BUCKET_WIDTH_MS,
    QueueKeys,
    ShardKeys,
    bucket_name,
    window_bucket_name,
    parse_qualified,
    shard_of,
)
from cluster_dq.queueconf import QueueSettings
from cluster_dq.models import (
    MAX_BULK,
    Job,
    JobResult,
    JobSpec,
    JobState,
    Note,
    Record,
    has_fixed_server_id,
    id_due_ms,
    id_lane,
    id_to_member,
    id_to_text,
    wheel_job,
    wheel_short,
    wheel_short_head,
    is_wheel_member,
    new_id,
)

if TYPE_CHECKING:
    from cluster_dq.settings import Settings

Arg = str | bytes | int


@dataclass(frozen=True, slots=True)
class Eval:
    script: str
    keys: Sequence[str]
    args: Sequence[Arg]
    # ARGV[1] is the caller's clock: a repeat of the step (the retry policy) is stamped afresh,
    # so that deadlines the script computes (a reservation's ttr) count from when it runs.
    stamped: bool = False
    # Best effort: the operation does not fail with this step (a shard signal, which the
    # reconcile sweep repairs when it is lost); the executor then sends back None.
    optional: bool = False

    def restamped(self, now: int) -> Eval:
        if not self.stamped:
            return self
        return Eval(self.script, self.keys, [now, *self.args[1:]], True, self.optional)


@dataclass(frozen=True, slots=True)
class Cmd:
    args: tuple[Arg, ...]


Call = Eval | Cmd
Step = Call | tuple[Call, ...]
T = TypeVar("T")
Op = Generator[Step, Any, T]


def _eval(
    script: str, keys: dict[str, Any], *, stamped: bool = False, optional: bool = False, **argv: Any
) -> Eval:
    """One script call, its KEYS and ARGV named as in the script's header (signatures.py)."""
    sig = SIGNATURES[script]
    return Eval(script, sig.key_list(keys), sig.args(argv), stamped, optional)


class MoveSink(Protocol):
    """Told of the jobs that scripts moved on their own (due time, ttr and ttl passing), so
    the metrics can count what no request asked for."""

    def moved(
        self, ns: str, q: str, promoted: int, retried: int, dead: int, expired: int
    ) -> None: ...


REMEMBER_ACKED_MS = 60_000
KEEP_RESULT_MS = 3_600_000  # ResultSecond's default
FIRST_EXTRA_KEY = len(QueueKeys("n", "q").all_fixed()) + 1  # KEYS index of a script's own keys


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Tunables of the storage layout and the pump (lua/README.md explains each). Frozen: one
    config per deployment, built from its settings by ``from_settings`` wherever jobs are
    written (service, pump, CLI, Spark), so every writer agrees on the shard of a queue."""

    lane_capacity: int = 512  # <= hash-max-listpack-entries (pools.check_redis; benchmarks.md)
    open_lead_ms: int = 5_000  # open a wheel bucket this long before it starts
    open_backlog: int = 20_000  # stop opening buckets while this many jobs wait in ready
    open_buckets_per_call: int = 4
    open_calls_per_tick: int = 8
    promote_limit: int = 1_000  # jobs moved per script call (keeps every script ~1 ms)
    shards: int = 16
    remember_acked_ms: int = (
        REMEMBER_ACKED_MS  # a publish of an id acked this recently is a duplicate
    )
    keep_result_ms: int = KEEP_RESULT_MS  # how long a job's result outlives its ack
    retry_budget_s: float = BUDGET_S  # how long a failed step safe to repeat is repeated
    moves: MoveSink | None = None  # where consume and tick report the jobs they moved
    lane_hints: dict[tuple[str, int], int] = field(default_factory=dict)
    # the jitter draw of retry backoffs, one per script call (tests fix it)
    draw: Callable[[], float] = field(default_factory=lambda: random.random)

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineConfig:
        """The deployment's settings that change where and how jobs are stored: a queue's shard
        (``Shards``), the memory of acked ids (``AckedIdMemorySecond``) and of results
        (``ResultSecond``), and how long a failed step is repeated (``RetryBudgetSecond``)."""
        return cls(
            shards=settings.Shards,
            remember_acked_ms=settings.AckedIdMemorySecond * 1000,
            keep_result_ms=settings.ResultSecond * 1000,
            retry_budget_s=settings.RetryBudgetSecond,
        )

    def hint(self, tag: str, start: int) -> int:
        return self.lane_hints.get((tag, start), 0)

    def learn(self, tag: str, start: int, lane: int, fill: int) -> None:
        if fill + MAX_BULK > self.lane_capacity and self.hint(tag, start) <= lane:
            if len(self.lane_hints) > 100_000:
                self.lane_hints.clear()
            self.lane_hints[(tag, start)] = lane + 1


@dataclass(frozen=True, slots=True)
class Published:
    job_id: str
    duplicate: bool
    state: JobState | None
    full: bool = False  # refused: the queue holds its max_size jobs (nothing written)


def _fixed(qk: QueueKeys) -> list[str]:
    return qk.all_fixed()


def _signal(qk: QueueKeys, cfg: EngineConfig, at_ms: int | None) -> Eval:
    """Tells the queue's shard that the pump must look at it by ``at_ms`` (and registers it).
    Sent only after a queue script reported that it lowered the queue's next event."""
    sk = ShardKeys(shard_of(qk.qualified, cfg.shards))
    keys = {"schedule": sk.schedule, "pending": sk.pending, "queues": sk.queues}
    return _eval(
        "signal", keys, optional=True, queue=qk.qualified, at=-1 if at_ms is None else at_ms
    )


def _bucket_of(member: bytes) -> str | None:
    if is_wheel_member(member):
        return bucket_name(id_due_ms(member), id_lane(member))
    return None


# What publish.lua does with a job's wheel bucket (its job argument's second field):
LOOK = 0  # only look there for a duplicate (a given server-format id whose bucket may be open)
INTO = 1  # place the job there unless its id is there already (HSETNX: a given id)
# place it there, its id made up by this very call: only an earlier attempt of the call can have
# written it, with the same record, so HSET (one look through the bucket instead of HSETNX's two)
INTO_NEW = 2
# a bit beside INTO / INTO_NEW: the job's value is its short wheel entry's
# (models.wheel_short), not its record (lua/README.md "Wheel entries")
SHORT = 4


@dataclass(slots=True)
class _Placement:
    """New jobs ready for publish.lua / republish.lua: their members, per-job arguments, the
    wheel buckets they use (name -> KEYS index) and the earliest pump event among them."""

    members: list[bytes] = field(default_factory=list)
    # The ids this call made up. Such an id can only exist already if an earlier attempt of
    # this very call wrote it (its reply lost, the call repeated): not a duplicate then.
    made_up: list[bool] = field(default_factory=list)
    # per job: (member, due ms, record, bucket KEYS index (0 = none), bucket name, LOOK / INTO /
    # INTO_NEW)
    placed: list[tuple[bytes, int, bytes, int, str, int]] = field(default_factory=list)
    buckets: dict[str, int] = field(default_factory=dict)
    event: int | None = None


class _Headers(dict[tuple[int, int, int], bytes]):
    """A call's record headers (``Record.header``) by (ttl end, tries, priority), made once
    each: the jobs of a bulk mostly share one."""

    def __init__(self, now: int) -> None:
        self.published = now.to_bytes(6, "big")

    def __missing__(self, key: tuple[int, int, int]) -> bytes:
        head = self[key] = Record.header(self.published, *key)
        return head


class _Shorts(dict[tuple[int, int, int], bytes | None]):
    """A call's short wheel value heads (``models.wheel_short_head``) by (due ms, ttl end,
    tries), made once each: the jobs of a bulk mostly share one."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __missing__(self, key: tuple[int, int, int]) -> bytes | None:
        due, expire_at, tries = key
        head = self[key] = wheel_short_head(due, self.now, expire_at, tries, 0)
        return head


class _Buckets(dict[tuple[int, int], tuple[int, str]]):
    """A call's wheel buckets by (10-s window, lane) -> (KEYS index, name), numbered from
    ``first_key`` in the order met; ``names`` (the placement's) gets each name -> index."""

    def __init__(self, names: dict[str, int], first_key: int) -> None:
        self.names, self.first_key = names, first_key

    def __missing__(self, key: tuple[int, int]) -> tuple[int, str]:
        name = window_bucket_name(*key)
        kidx = self.names.setdefault(name, self.first_key + len(self.names))
        self[key] = kidx, name
        return kidx, name


def _place_jobs(
    cfg: EngineConfig,
    qk: QueueKeys,
    specs: Sequence[JobSpec],
    now: int,
    first_key: int = FIRST_EXTRA_KEY,
) -> _Placement:
    out = _Placement()
    heads, buckets, shorts = _Headers(now), _Buckets(out.buckets, first_key), _Shorts(now)
    for spec in specs:
        due = spec.due_ms if spec.due_ms is not None else now + spec.delay_ms
        if spec.expire_at_ms is not None:
            expire_at = spec.expire_at_ms
        else:
            expire_at = now + spec.ttl_ms if spec.ttl_ms else 0
        if spec.attributes or spec.backoff is not None:
            record = Record(
                now,
                expire_at,
                spec.tries,
                0,
                spec.priority,
                spec.body,
                spec.attributes,
                spec.backoff,
            ).pack()
        else:  # Record.pack's bytes, its header shared with the call's other such jobs
            record = heads[expire_at, spec.tries, spec.priority] + spec.body
        start = due - due % BUCKET_WIDTH_MS
        # A wheel bucket opens only as fast as consumers drain the ready set, and what is in it
        # is unknown until then: a job with a priority stays out, or it could wait behind a
        # backlog of lower-priority ready jobs although it is due.
        far = start > now + cfg.open_lead_ms and spec.priority == 0
        kidx, bname, wheel = 0, "", LOOK
        if has_fixed_server_id(spec):  # bulk scheduling: due and lane are in the id
            member = id_to_member(spec.job_id)  # type: ignore[arg-type]
            # A rerun looks for it in its bucket even when that may be open already: the pump
            # opens buckets late while consumers lag.
            kidx, bname = buckets[due // BUCKET_WIDTH_MS, id_lane(member)]
            wheel = INTO if far else LOOK
        elif spec.job_id is not None:
            member = spec.job_id.encode()
        elif spec.delay_ms > 0 and far:
            lane = cfg.hint(qk.tag, start)
            member = new_id(due, lane)
            kidx, bname = buckets[due // BUCKET_WIDTH_MS, lane]
            wheel = INTO_NEW
        else:
            member = new_id(due, 0)
        # the pump's first work for this job: open its bucket, promote it, or expire it
        at = start - cfg.open_lead_ms if wheel else due if due > now else expire_at or None
        if wheel:  # into its bucket: as a short entry when it fits one
            if spec.attributes or spec.backoff is not None:
                short = wheel_short(member, due, record)
            else:
                head = shorts[due, expire_at, spec.tries]
                short = None if head is None else head + spec.body
            if short is not None:
                record, wheel = short, wheel | SHORT
        if at is not None and (out.event is None or at < out.event):
            out.event = at
        out.members.append(member)
        out.made_up.append(spec.job_id is None)
        out.placed.append((member, due, record, kidx, bname, wheel))
    return out


_JOB_HEAD = struct.Struct(">HBHIB")  # publish.lua's job argument, before its member and record


def packed_job(member: bytes, due: int, record: bytes, kidx: int, into: int) -> bytes:
    """One job of a publish call as the script takes it, in one argument (lua/publish.lua):
    bucket KEYS index (u16), what to do with the bucket (u8: LOOK, INTO, INTO_NEW, the
    latter two with SHORT when ``record`` is the job's short wheel value), due ms
    (u48), member length (u8), the member, with SHORT its short field, the record. One
    argument instead of six: redis-py packs and Redis parses one."""
    head = _JOB_HEAD.pack(kidx, into, due >> 32, due & 0xFFFFFFFF, len(member))
    if into & SHORT:  # and its short field, cut from the member here rather than in Lua
        return b"".join((head, member, member[4:6], member[8:], record))
    return head + member + record


def _learn_lanes(
    cfg: EngineConfig, qk: QueueKeys, buckets: Sequence[str], fills: Sequence[Any]
) -> None:
    for name, fill in zip(buckets, fills):
        secs, lane = name.split(":")
        cfg.learn(qk.tag, int(secs) * BUCKET_WIDTH_MS, int(lane), int(fill))


def _publish_call(
    cfg: EngineConfig, qk: QueueKeys, specs: Sequence[JobSpec], now: int, whole: bool = False
) -> tuple[Eval, _Placement]:
    jobs = _place_jobs(cfg, qk, specs, now)
    return _publish_eval(cfg, qk, jobs, now, whole), jobs


def _publish_eval(
    cfg: EngineConfig, qk: QueueKeys, jobs: _Placement, now: int, whole: bool = False
) -> Eval:
    keys = {"queue": _fixed(qk), "buckets": [qk.bucket(b) for b in jobs.buckets]}
    return _eval(
        "publish",
        keys,
        stamped=True,
        now=now,
        lane_capacity=cfg.lane_capacity,
        bucket_width=BUCKET_WIDTH_MS,
        notify=qk.notify,
        open_lead=cfg.open_lead_ms,
        remember_acked=cfg.remember_acked_ms,
        whole="1" if whole else "0",
        n=len(jobs.members),
        jobs=[packed_job(m, d, r, k, w) for m, d, r, k, _, w in jobs.placed],
    )


def _published(
    cfg: EngineConfig, qk: QueueKeys, jobs: _Placement, reply: replies.PublishReply
) -> list[Published]:
    _learn_lanes(cfg, qk, list(jobs.buckets), reply.fills)
    return [
        Published(
            id_to_text(m),
            c is ReplyCode.DUPLICATE and not made_up,
            replies.job_state(c),
            c is ReplyCode.FULL,
        )
        for m, c, made_up in zip(jobs.members, reply.codes, jobs.made_up)
    ]


def publish(
    cfg: EngineConfig, ns: str, q: str, specs: Sequence[JobSpec], now: int, whole: bool = False
) -> Op[list[Published]]:
    """Publishes ``specs`` on one queue. With the queue's max_size set, a job beyond it is
    refused (``Published.full``): job by job in order, or, ``whole``, all of them at once."""
    qk = QueueKeys(ns, q)
    call, jobs = _publish_call(cfg, qk, specs, now, whole)
    reply = replies.decode_publish((yield call), len(jobs.members))
    if reply.lowered:
        yield _signal(qk, cfg, jobs.event)
    return _published(cfg, qk, jobs, reply)


def _publish_pipelined(
    cfg: EngineConfig, placed: Sequence[tuple[QueueKeys, Eval, _Placement]]
) -> Op[list[replies.PublishReply]]:
    """Publish calls in one pipeline, then the shard signals they call for in another."""
    raw = yield tuple(call for _, call, _ in placed)
    decoded = [replies.decode_publish(r, len(jobs.members)) for (_, _, jobs), r in zip(placed, raw)]
    signals = tuple(
        _signal(qk, cfg, jobs.event)
        for (qk, _, jobs), reply in zip(placed, decoded)
        if reply.lowered
    )
    if signals:
        yield signals
    return decoded


def publish_many(
    cfg: EngineConfig, batches: Sequence[tuple[str, str, Sequence[JobSpec]]], now: int
) -> Op[list[list[Published]]]:
    """Many publish batches (each one queue, <= 64 jobs) in one pipeline, then the shard
    signals they call for in another: bulk loaders. On a Cluster the pipeline is split by
    node, each node's share sent at once."""
    placed = [
        (qk, *_publish_call(cfg, qk, specs, now))
        for qk, specs in ((QueueKeys(ns, q), specs) for ns, q, specs in batches)
    ]
    decoded = yield from _publish_pipelined(cfg, placed)
    return [_published(cfg, qk, jobs, reply) for (qk, _, jobs), reply in zip(placed, decoded)]


# A job of a bulk schedule, its id made by the writer: (member, due ms, expire at ms (0 =
# never), tries, priority, body). The member is 16 raw bytes of a server-format id (which
# carries the due time and lane, so a rerun finds it in its bucket), or a client id.
BulkJob = tuple[bytes, int, int, int, int, bytes]
_Bulk = tuple[int, str, int, bytes]  # a bulk job's bucket KEYS index and name, into, record head


def _place_bulk(cfg: EngineConfig, jobs: Sequence[BulkJob], now: int) -> _Placement:
    """``_place_jobs`` for ids made by the writer (a ``JobSpec`` with ``due_ms``,
    ``expire_at_ms`` and such a ``job_id``): the same arguments, without a text id per job. Jobs that share their id's first 8 bytes (due ms and lane), due
    time, ttl end, tries and priority share everything but their body: worked out once."""
    out = _Placement()
    placed, lead = out.placed, cfg.open_lead_ms
    heads, shorts = _Headers(now), _Shorts(now)
    buckets = _Buckets(out.buckets, FIRST_EXTRA_KEY)
    events: list[int] = []

    def place(member: bytes, due: int, expire_at: int, tries: int, priority: int) -> _Bulk:
        start = due - due % BUCKET_WIDTH_MS
        if is_wheel_member(member):
            kidx, bname = buckets[due // BUCKET_WIDTH_MS, id_lane(member)]
            wheel = INTO if start > now + lead and priority == 0 else LOOK  # as in _place_jobs
            if wheel and id_due_ms(member) == due:  # as a short entry when it fits one
                head = shorts[due, expire_at, tries]
                if head is not None:
                    events.append(start - lead)
                    return kidx, bname, INTO | SHORT, head
        else:
            bname, kidx, wheel = "", 0, LOOK
        at = start - lead if wheel else due if due > now else expire_at or None
        if at is not None:
            events.append(at)
        return kidx, bname, wheel, heads[expire_at, tries, priority]

    shared: dict[tuple[bytes, int, int, int, int], _Bulk] = {}
    for member, due, expire_at, tries, priority, body in jobs:
        key = (member[:8], due, expire_at, tries, priority)
        got = shared.get(key)
        if got is None:
            got = shared[key] = place(member, due, expire_at, tries, priority)
        kidx, bname, wheel, head = got
        placed.append((member, due, head + body, kidx, bname, wheel))
    out.members = [j[0] for j in jobs]
    out.made_up = [False] * len(jobs)
    out.event = min(events, default=None)
    return out


def publish_bulk(
    cfg: EngineConfig,
    batches: Sequence[tuple[str, str, Sequence[BulkJob]]],
    now: int,
) -> Op[list[int]]:
    """``publish_many`` for a bulk schedule (ids made by the writer, each batch one queue; up
    to 512 jobs keep a call near 5 ms): the same scripts and signals; returns how many jobs
    of each batch were present already (the rest are new). A batch that would take its queue
    beyond its max_size writes nothing and raises ``QueueFull`` (the others are written: a
    rerun is idempotent)."""
    placed = []
    for ns, q, jobs in batches:
        qk = QueueKeys(ns, q)
        placement = _place_bulk(cfg, jobs, now)
        placed.append((qk, _publish_eval(cfg, qk, placement, now, whole=True), placement))
    decoded = yield from _publish_pipelined(cfg, placed)
    for (qk, _, _), reply in zip(placed, decoded):
        if ReplyCode.FULL in reply.codes:  # that batch wrote nothing; the others stand
            raise QueueFull(*parse_qualified(qk.qualified))
    return [sum(c is ReplyCode.DUPLICATE for c in reply.codes) for reply in decoded]


def _reserved(ns: str, q: str, deliveries: Sequence[replies.Delivery], now: int) -> list[Job]:
    """consume.lua's deliveries -> reserved jobs carrying their lease."""
    jobs = []
    for d in deliveries:
        job = Job.from_record(ns, q, d.member, d.record, JobState.RESERVED, lease=d.lease.hex())
        job.extra["reserved_ms"] = now
        jobs.append(job)
    return jobs


MAX_CONSUME = 65_535  # jobs one consume may reserve: a lease numbers its jobs in 2 bytes
CONSUME_CALLS_PER_QUEUE = (
    8  # bounded calls past expired jobs before the consume gives up on a queue
)


def consume(
    cfg: EngineConfig,
    ns: str,
    queues: Sequence[str],
    ttr_ms: int,
    count: int,
    now: int,
    seen: Callable[[str, int, int | None], None] | None = None,
) -> Op[list[Job]]:
    """Reserves up to ``count`` jobs, trying ``queues`` in priority order. Each job carries
    the lease of its delivery (``Job.lease``). ``seen(queue, ready, next_event_ms)`` is told
    what the call saw of each queue that did not give it every job it asked for (ready 0 and
    the queue's META.next, no later than its next event, for a queue it did not visit): a
    long-poll about to wait needs no sizes.lua of its own."""
    if not 1 <= count <= MAX_CONSUME:
        raise ValueError(f"count must be 1..{MAX_CONSUME}, got {count}")
    out: list[Job] = []
    visit = list(queues)
    if len(visit) > 1:
        # One round trip says which queues have anything to hand out now; only those are
        # visited, still in priority order. Walking every queue in turn cost a round trip
        # each, so the last queue's jobs always waited for all the queues before it.
        probe: list[Call] = []
        for q in visit:
            qk = QueueKeys(ns, q)
            probe += [Cmd(("EXISTS", qk.ready)), Cmd(("HGET", qk.meta, "next"))]
        found = yield tuple(probe)
        passed = visit
        visit = [q for i, q in enumerate(visit) if _has_work(found[2 * i], found[2 * i + 1], now)]
        if seen is not None:
            for i, q in enumerate(passed):
                if q not in visit:
                    seen(q, 0, None if found[2 * i + 1] is None else int(found[2 * i + 1]))
    for q in visit:
        qk = QueueKeys(ns, q)
        opened = False
        report: tuple[int, int | None] | None = None  # what the queue's latest call saw
        for _ in range(CONSUME_CALLS_PER_QUEUE):
            call = _eval(
                "consume",
                {"queue": _fixed(qk)},
                stamped=True,
                now=now,
                ttr=ttr_ms,
                count=count - len(out),
                limit=cfg.promote_limit,
                notify=qk.notify,
                open_lead=cfg.open_lead_ms,
                lease_prefix=os.urandom(6),
                seed=repr(cfg.draw()),
                report="1" if seen is not None else "",
            )
            reply = replies.decode_consume((yield call))
            if reply.lowered:  # these reservations' end, or a retry backoff's: the earliest
                yield _signal(qk, cfg, reply.lowered)
            if cfg.moves and (reply.retried or reply.dead or reply.expired):
                cfg.moves.moved(ns, q, 0, reply.retried, reply.dead, reply.expired)
            out += _reserved(ns, q, reply.deliveries, now)
            # (a call after the pump's step here may take all it asks: then the report of the
            # call before it, which saw the step's bucket still closed, is no longer true)
            report = (reply.ready, reply.next_event_ms) if reply.ready >= 0 else None
            if len(out) >= count:
                break
            if reply.more:  # stopped at its bound of expired jobs: go on past them
                continue
            if not reply.stale or opened:
                break
            # The pump is behind on this queue (failover, takeover, a lost signal): do its
            # step here, as of when the script saw it (later than ``now`` if the step was
            # repeated), tell the shard what comes next, and look again.
            step = yield from tick(cfg, ns, q, max(now, reply.stale))
            report = None  # made before the step: only a call after it may say what is left
            yield _signal(qk, cfg, step.next_event_ms)
            opened = True
        if seen is not None and report is not None:
            seen(q, *report)
        if len(out) >= count:
            break
    return out


def _has_work(ready: Any, next_event: Any, now: int) -> bool:
    """Whether a consume at ``now`` may find something in a queue: jobs ready, or an event
    due by META.next (a job to promote, a reservation run out, a wheel bucket to open). META.next
    is never later than the queue's next event (every script that adds an event lowers it), so
    a queue with work is never passed over; at worst one whose event is gone is visited."""
    return int(ready) > 0 or (next_event is not None and int(next_event) <= now)


def _id_args(qk: QueueKeys, ids: Sequence[str], first_key: int) -> tuple[list[str], list[Arg]]:
    buckets: dict[str, int] = {}
    args: list[Arg] = []
    for text in ids:
        member = id_to_member(text)
        bname = _bucket_of(member)
        kidx = buckets.setdefault(bname, first_key + len(buckets)) if bname else 0
        args += [member, kidx, bname or ""]
    return [qk.bucket(b) for b in buckets], args


def _lease_arg(lease: str | None) -> bytes:
    """A lease as the scripts compare it ('' = none). Not hex, or the wrong length: it cannot
    hold any job, which the script reports as a conflict."""
    if lease is None:
        return b""
    try:
        return bytes.fromhex(lease) if len(lease) == 16 else b"\xff"
    except ValueError:
        return b"\xff"


def _raise_conflicts(ids: Sequence[str], verdicts: Sequence[ReplyCode]) -> None:
    conflicts = replies.conflicts(ids, verdicts)
    if conflicts:
        raise Conflict(conflicts)


def ack(
    ns: str,
    q: str,
    ids: Sequence[str],
    now: int | None = None,
    remember_ms: int = REMEMBER_ACKED_MS,
    leases: Sequence[str | None] | None = None,
    check_only: bool = False,
    results: Sequence[bytes | None] | None = None,
    keep_result_ms: int = KEEP_RESULT_MS,
) -> Op[list[JobState | None]]:
    """Acks / deletes jobs in any state; returns the state each was in (None: not found).
    The acked ids are remembered for ``remember_ms``: publishing one again meanwhile is a
    duplicate (a publish retried after its reply was lost cannot bring the job back). With
    ``leases`` (aligned with ``ids``, None for none): if a lease does not hold its job,
    nothing is acked and ``Conflict`` names each such job. ``check_only``: the leases are
    checked, nothing is acked. ``results`` (aligned with ``ids``, JSON or None): what each
    job found gives as its result, kept ``keep_result_ms`` after the ack (``lookup_job``);
    without any, the call carries no results keys."""
    qk = QueueKeys(ns, q)
    extra, id_args = _id_args(qk, ids, FIRST_EXTRA_KEY)
    jobs: list[Arg] = []
    for i in range(len(ids)):
        jobs += [
            *id_args[3 * i : 3 * i + 3],
            _lease_arg(leases[i] if leases else None),
            (results[i] or b"") if results else b"",
        ]
    results_index = 0
    if results and any(results):
        results_index = FIRST_EXTRA_KEY + len(extra)
        extra = [*extra, qk.results, qk.results_due]
    call = _eval(
        "ack",
        {"queue": _fixed(qk), "buckets": extra},
        stamped=True,
        now=now_ms() if now is None else now,
        remember_acked=remember_ms,
        check_only="1" if check_only else "0",
        results=results_index,
        keep_result=keep_result_ms,
        n=len(ids),
        jobs=jobs,
    )
    reply = replies.decode_ack((yield call))
    _raise_conflicts(ids, reply.codes)
    return [None if check_only else replies.job_state(c) for c in reply.codes]


def known_ids(ns: str, q: str, ids: Sequence[str], now: int, remember_ms: int) -> Op[list[bool]]:
    """Whether each client id names a job of the queue, or one acked within the remembered
    window: what publish.lua calls a duplicate. A migrating route asks the pools it drains
    before it publishes on the new one, so idempotency spans the move."""
    qk = QueueKeys(ns, q)
    members = [id_to_member(i) for i in ids]
    replies = yield (
        *(Cmd(("HEXISTS", qk.jobs, m)) for m in members),
        Cmd(("ZMSCORE", qk.acked, *members)),
    )
    return [
        bool(int(found)) or (acked is not None and float(acked) > now - remember_ms)
        for found, acked in zip(replies[:-1], replies[-1])
    ]


def republish(
    cfg: EngineConfig,
    ns: str,
    q: str,
    old_id: str,
    spec: JobSpec,
    now: int,
    lease: str | None = None,
) -> Op[tuple[JobState | None, Published]]:
    """Acks ``old_id`` and publishes ``spec`` atomically; with a ``lease``, only while that
    delivery holds the old job (else ``Conflict``, nothing changed)."""
    qk = QueueKeys(ns, q)
    new = _place_jobs(cfg, qk, [spec], now)
    old_keys, (old_member, old_kidx, old_bucket) = _id_args(
        qk, [old_id], FIRST_EXTRA_KEY + len(new.buckets)
    )
    ((member, due, record, kidx, bucket, wheel),) = new.placed
    keys = {"queue": _fixed(qk), "buckets": [qk.bucket(b) for b in new.buckets] + old_keys}
    call = _eval(
        "republish",
        keys,
        stamped=True,
        now=now,
        lane_capacity=cfg.lane_capacity,
        bucket_width=BUCKET_WIDTH_MS,
        notify=qk.notify,
        old_member=old_member,
        old_bucket_index=old_kidx,
        old_bucket=old_bucket,
        member=member,
        due=due,
        record=record,
        bucket_index=kidx,
        bucket=bucket,
        wheel=wheel,
        open_lead=cfg.open_lead_ms,
        remember_acked=cfg.remember_acked_ms,
        lease=_lease_arg(lease),
    )
    reply = replies.decode_republish((yield call))
    if reply.new is ReplyCode.FULL:
        raise QueueFull(ns, q)
    _raise_conflicts([old_id], [reply.old])
    if reply.lowered:
        yield _signal(qk, cfg, new.event)
    published = Published(
        id_to_text(new.members[0]),
        reply.new is ReplyCode.DUPLICATE and not new.made_up[0],
        replies.job_state(reply.new),
    )
    return replies.job_state(reply.old), published


class ById(NamedTuple):
    """What a script acting on one job by id is given: the job's member, the name of the wheel
    bucket its id names ('' for a client id) and the keys (the queue's, then that bucket)."""

    member: bytes
    bucket_name: str
    keys: dict[str, Any]


def by_id(qk: QueueKeys, member: bytes) -> ById:
    bname = _bucket_of(member)
    return ById(
        member, bname or "", {"queue": _fixed(qk), "bucket": [qk.bucket(bname)] if bname else []}
    )


def _peek_job_call(qk: QueueKeys, member: bytes) -> Eval:
    return _eval("peek_job", by_id(qk, member).keys, member=member)


READY_SCORE_MASK = 2**42 - 1  # a ready score is (255 - priority) * 2^42 + due ms


def _peeked(ns: str, q: str, member: bytes, raw: Any) -> Job | None:
    reply = replies.decode_peek_job(raw)
    if reply is None:
        return None
    when = int(reply.score)
    if reply.state is JobState.READY:  # the ready rank: priority above the due ms
        when &= READY_SCORE_MASK
    return Job.from_record(
        ns,
        q,
        member,
        reply.record,
        reply.state,
        when,
        progress=reply.progress,
        note=Note.unpack(reply.note),
    )


def peek_job(ns: str, q: str, job_id: str) -> Op[Job | None]:
    """One job by id in any state (with its progress, if it has one)."""
    qk = QueueKeys(ns, q)
    member = id_to_member(job_id)
    return _peeked(ns, q, member, (yield _peek_job_call(qk, member)))


def lookup_job(ns: str, q: str, job_id: str, now: int) -> Op[Job | JobResult | None]:
    """``peek_job``, and for a job that is gone, its result while it is kept (acked with one
    less than its keep time before ``now``): one round trip."""
    qk = QueueKeys(ns, q)
    member = id_to_member(job_id)
    raw, kept = yield (_peek_job_call(qk, member), Cmd(("HGET", qk.results, member)))
    job = _peeked(ns, q, member, raw)
    if job is not None:
        return job
    done = replies.decode_result(kept)
    if done is None or done.until_ms <= now:
        return None  # never had one, or kept no longer (trimmed later, by an ack or PEXPIRE)
    return JobResult(ns, q, job_id, done.done_ms, done.result)


def progress(ns: str, q: str, job_id: str, value: bytes, now: int, lease: str | None) -> Op[bool]:
    """Records ``value`` (JSON, checked by the caller) as the progress of a reserved job,
    replacing the last. With a ``lease``, only while that delivery holds the job; without
    one, while the job is in a running reservation. False: no such job (no lease given);
    ``Conflict`` naming where the job is when the lease (or, without one, the job's state)
    refuses it. Nothing changes unless it is recorded."""
    qk = QueueKeys(ns, q)
    member = id_to_member(job_id)
    call = _eval(
        "progress",
        by_id(qk, member).keys,
        stamped=True,
        now=now,
        member=member,
        lease=_lease_arg(lease),
        progress=value,
    )
    verdict = replies.decode_progress((yield call))
    conflicts = replies.conflicts([job_id], [verdict])
    if conflicts:
        raise Conflict(conflicts, leased=lease is not None)
    return verdict is ReplyCode.OK


def peek(cfg: EngineConfig, ns: str, q: str, which: str, now: int) -> Op[Job | None]:
    """Head of the ready queue (after promoting what is due) or of the dead letter."""
    qk = QueueKeys(ns, q)
    keys = {"queue": _fixed(qk)}
    look = _eval("peek", keys, which=which)
    if which == "ready":
        promote = _eval("promote_due", keys, now=now, limit=cfg.promote_limit, notify=qk.notify)
        reply = replies.decode_peek((yield (promote, look))[-1])
    else:
        reply = replies.decode_peek((yield look))
    if reply is None or reply.record is None:
        return None
    state = JobState.READY if which == "ready" else JobState.DEAD
    return Job.from_record(ns, q, reply.member, reply.record, state)


def dump_page(
    ns: str, q: str, state: JobState, cursor: int, count: int = 500
) -> Op[tuple[int, list[Job]]]:
    """One page of a queue's ready, delayed (precise zset), reserved or dead jobs, read with
    ZSCAN + HMGET while the queue keeps working (a job moving meanwhile may be seen twice or
    not at all). ``Job.due_ms``: due time (ready, delayed), ttr deadline (reserved), death
    time (dead). Returns the next cursor (0: done) and the jobs."""
    qk = QueueKeys(ns, q)
    key = {
        JobState.READY: qk.ready,
        JobState.DELAYED: qk.delayed,
        JobState.RESERVED: qk.reserved,
        JobState.DEAD: qk.dead,
    }[state]
    nxt, flat = yield Cmd(("ZSCAN", key, cursor, "COUNT", count))
    # redis-py parses ZSCAN into (member, score) pairs; a raw reply is flat
    pairs = (
        list(flat)
        if flat and isinstance(flat[0], (tuple, list))
        else list(zip(flat[0::2], flat[1::2]))
    )
    members, scores = [m for m, _ in pairs], [int(float(sc)) for _, sc in pairs]
    records = (yield Cmd(("HMGET", qk.jobs, *members))) if members else []
    jobs = []
    for m, score, rec in zip(members, scores, records):
        if rec is not None:
            when = score & READY_SCORE_MASK if state is JobState.READY else score
            jobs.append(Job.from_record(ns, q, m, rec, state, when))
    return int(nxt), jobs


def dump_wheel(ns: str, q: str, buckets_per_call: int = 16) -> Op[list[Job]]:
    """Every job resting in the queue's wheel buckets (state delayed, due from the id)."""
    qk = QueueKeys(ns, q)
    names = [n.decode() for n in (yield Cmd(("ZRANGE", qk.wheel, 0, -1)))]
    out: list[Job] = []
    for i in range(0, len(names), buckets_per_call):
        chunk = names[i : i + buckets_per_call]
        replies = yield tuple(Cmd(("HGETALL", qk.bucket(b))) for b in chunk)
        for name, flat in zip(chunk, replies):
            for m, rec in _bucket_jobs(name, flat):
                out.append(Job.from_record(ns, q, m, rec, JobState.DELAYED, id_due_ms(m)))
    return out


def heads(ns: str, q: str, state: JobState, limit: int) -> Op[list[Job]]:
    """The first ``limit`` jobs of a queue's ready set (in delivery order) or of its delayed
    jobs (by due time: the near-term zset and the earliest wheel buckets), read-only: a look
    for the dashboard, not a step of any transition."""
    qk = QueueKeys(ns, q)
    if state is JobState.READY:
        pairs = _pairs((yield Cmd(("ZRANGE", qk.ready, 0, limit - 1, "WITHSCORES"))))
        members = [m for m, _ in pairs]
        records = (yield Cmd(("HMGET", qk.jobs, *members))) if members else []
        return [
            Job.from_record(ns, q, m, rec, state, int(float(sc)) & READY_SCORE_MASK)
            for (m, sc), rec in zip(pairs, records)
            if rec is not None
        ]
    near, wheel = yield (
        Cmd(("ZRANGE", qk.delayed, 0, limit - 1, "WITHSCORES")),
        Cmd(("ZRANGE", qk.wheel, 0, limit - 1, "WITHSCORES")),
    )
    near_pairs = _pairs(near)
    members = [m for m, _ in near_pairs]
    records = (yield Cmd(("HMGET", qk.jobs, *members))) if members else []
    out = [
        Job.from_record(ns, q, m, rec, state, int(float(sc)))
        for (m, sc), rec in zip(near_pairs, records)
        if rec is not None
    ]
    # Buckets in due order (lanes of one span share a score), read a span at a time until
    # ``limit`` jobs came from them: each holds at least one, so ``limit`` buckets suffice.
    spans: dict[float, list[str]] = {}
    for b, sc in _pairs(wheel):
        spans.setdefault(sc, []).append(_text(b))
    found = 0
    for names in spans.values():
        for name, flat in zip(names, (yield tuple(Cmd(("HGETALL", qk.bucket(b))) for b in names))):
            items = _bucket_jobs(name, flat)
            out += [Job.from_record(ns, q, m, rec, state, id_due_ms(m)) for m, rec in items]
            found += len(items)
        if found >= limit:
            break
    out.sort(key=lambda j: j.due_ms or 0)
    return out[:limit]


def _bucket_jobs(name: str, reply: Any) -> list[tuple[bytes, bytes]]:
    """A wheel bucket's HGETALL (a dict as redis-py parses it; RESP is flat) as its jobs' (id,
    record)."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[0::2], reply[1::2])
    return [wheel_job(name, field, value) for field, value in pairs]


def _pairs(reply: Any) -> list[tuple[bytes, float]]:
    """A ZRANGE WITHSCORES reply as (member, score) pairs (redis-py parses it; RESP is flat)."""
    if reply and isinstance(reply[0], (tuple, list)):
        return [(m, float(sc)) for m, sc in reply]
    return [(m, float(sc)) for m, sc in zip(reply[0::2], reply[1::2])]


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def sizes(cfg: EngineConfig, ns: str, q: str) -> Op[Sizes]:
    qk = QueueKeys(ns, q)
    return replies.decode_sizes(
        (yield _eval("sizes", {"queue": _fixed(qk)}, open_lead=cfg.open_lead_ms))
    )


def tick(cfg: EngineConfig, ns: str, q: str, now: int) -> Op[Sizes]:
    """One pump step for a queue: open wheel buckets that start soon (unless consumers lag
    behind), promote due jobs, expire reservations and ttls. Returns sizes and next event.

    The look for buckets to open goes in the same round trip as the promote and expiry
    scripts: most steps find none (a job due within the open lead never enters the wheel),
    and then the step is that one round trip. When buckets open, the scripts run once more
    after them, for the jobs the buckets brought."""
    qk = QueueKeys(ns, q)
    fixed = _fixed(qk)
    horizon = now + cfg.open_lead_ms
    probe = (
        Cmd(("ZCARD", qk.ready)),
        Cmd(("ZCOUNT", qk.delayed, "-inf", horizon + BUCKET_WIDTH_MS)),
        Cmd(
            ("ZRANGE", qk.wheel, "-inf", horizon, "BYSCORE", "LIMIT", 0, cfg.open_buckets_per_call)
        ),
    )
    queue = {"queue": fixed}
    steps = (
        _eval(
            "promote_due", queue, stamped=True, now=now, limit=cfg.promote_limit, notify=qk.notify
        ),
        _eval(
            "expire_reserved",
            queue,
            stamped=True,
            now=now,
            limit=cfg.promote_limit,
            notify=qk.notify,
            seed=repr(cfg.draw()),
        ),
        _eval("expire_ttl", queue, stamped=True, now=now, limit=cfg.promote_limit),
        _eval("next_event", queue, open_lead=cfg.open_lead_ms),
    )
    first = yield (*probe, *steps)
    (ready, near, names), replies_ = first[:3], [first[3:]]
    held_back = opened = False
    for _ in range(cfg.open_calls_per_tick):
        if not names:
            break
        if int(ready) + int(near) >= cfg.open_backlog:
            held_back = True
            break
        bnames = [n.decode() for n in names]
        keys = {"queue": fixed, "buckets": [qk.bucket(b) for b in bnames]}
        yield _eval("open_buckets", keys, stamped=True, now=now, names=bnames)
        opened = True
        ready, near, names = yield probe
    if opened:
        replies_.append((yield steps))
    moved = retried = dead = expired_ = 0
    for reply in replies_:
        promoted = replies.decode_moved(reply[0])
        expired = replies.decode_expire_reserved(reply[1])
        moved += promoted.moved
        retried += expired.retried
        dead += expired.dead
        expired_ += promoted.expired + expired.expired + replies.decode_count(reply[2])
    if cfg.moves:
        cfg.moves.moved(ns, q, moved, retried, dead, expired_)
    result = replies.decode_sizes(replies_[-1][-1])
    if held_back and result.next_event_ms is not None:
        # Consumers lag: look again soon instead of spinning on an overdue bucket.
        result = Sizes(
            result.delayed,
            result.ready,
            result.reserved,
            result.dead,
            max(result.next_event_ms, now + 50),
        )
    return result


def destroy(cfg: EngineConfig, ns: str, q: str) -> Op[int]:
    """Deletes a queue in every state, in bounded steps. Returns the number of jobs deleted."""
    qk = QueueKeys(ns, q)
    deleted = 0
    while True:
        names = yield Cmd(("ZRANGE", qk.wheel, 0, 63))
        bnames = [n.decode() for n in names]
        final = "1" if len(bnames) < 64 else "0"
        keys = {
            "queue": _fixed(qk),
            "results": qk.results,
            "results_due": qk.results_due,
            "buckets": [qk.bucket(b) for b in bnames],
        }
        reply = replies.decode_destroy((yield _eval("destroy", keys, final=final, names=bnames)))
        deleted += reply.deleted
        if reply.gone:
            break
    sk = ShardKeys(shard_of(qk.qualified, cfg.shards))
    yield (
        Cmd(("SREM", sk.queues, qk.qualified)),
        Cmd(("ZREM", sk.schedule, qk.qualified)),
        Cmd(("HDEL", sk.pending, qk.qualified)),
    )
    return deleted


def respawn(cfg: EngineConfig, ns: str, q: str, limit: int, ttl_ms: int, now: int) -> Op[int]:
    qk = QueueKeys(ns, q)
    done = 0
    while done < limit:
        step = min(limit - done, 500)
        call = _eval(
            "respawn",
            {"queue": _fixed(qk)},
            stamped=True,
            now=now,
            limit=step,
            ttl=ttl_ms,
            notify=qk.notify,
        )
        reply = replies.decode_respawn((yield call))
        n = reply.respawned
        if reply.lowered:
            yield _signal(qk, cfg, now + ttl_ms if ttl_ms else None)
        done += n
        if n < step:
            break
    return done


def delete_dead(ns: str, q: str, limit: int) -> Op[int]:
    qk = QueueKeys(ns, q)
    done = 0
    while done < limit:
        step = min(limit - done, 500)
        n = replies.decode_count((yield _eval("delete_dead", {"queue": _fixed(qk)}, limit=step)))
        done += n
        if n < step:
            break
    return done


def claim(shard: int, now: int, limit: int, lease_ms: int, epoch: int) -> Op[list[str]]:
    """Claims the shard's due queues (re-checked at ``now + lease_ms`` should the pump die).
    Raises ``Fenced`` when ``epoch`` is not the shard's current leadership."""
    sk = ShardKeys(shard)
    keys = {"schedule": sk.schedule, "pending": sk.pending, "epoch": sk.epoch}
    call = _eval("claim", keys, now=now, limit=limit, lease_end=now + lease_ms, epoch=epoch)
    return replies.decode_claim((yield call), epoch)


def reschedule(
    shard: int, qualified: str, next_ms: int | None, epoch: int, empty: bool = False
) -> Op[int | None]:
    """After a pump step: the next wake-up, folding in signals received since the claim. A
    queue the step found ``empty`` (no job in any state) leaves the shard's registry, unless a
    signal came meanwhile. Raises ``Fenced`` when ``epoch`` is not the shard's current leadership."""
    sk = ShardKeys(shard)
    keys = {"schedule": sk.schedule, "pending": sk.pending, "epoch": sk.epoch, "queues": sk.queues}
    call = _eval(
        "reschedule",
        keys,
        queue=qualified,
        next=-1 if next_ms is None else next_ms,
        epoch=epoch,
        empty="1" if empty else "0",
    )
    return replies.decode_reschedule((yield call), epoch)


def next_schedule(shard: int) -> Op[int | None]:
    sk = ShardKeys(shard)
    head = yield Cmd(("ZRANGE", sk.schedule, 0, 0, "WITHSCORES"))
    return int(head[0][1]) if head else None


# A queue scheduled this much after its own next event is late beyond a pump step in
# progress (a claim pushes the queue one lease, 3 s, ahead while the pump works on it).
RECONCILE_GRACE_MS = 5_000


def reconcile(cfg: EngineConfig, queues: Sequence[QueueKeys], now: int) -> Op[list[str]]:
    """The repair of a lost shard signal (a publisher killed between its queue's script and
    the signal): of ``queues``, those with a next event (META.next) that their shard's schedule
    lacks, or holds much later, are signalled now. Returns their ``ns/q``. Read-only for the
    others; a signal is idempotent (ZADD LT), so a race with a publisher or the pump at worst
    costs the pump one extra step."""
    nexts = yield tuple(Cmd(("HGET", qk.meta, "next")) for qk in queues)
    have = [(qk, int(n)) for qk, n in zip(queues, nexts, strict=True) if n is not None]
    if not have:
        return []
    scores = yield tuple(
        Cmd(("ZSCORE", ShardKeys(shard_of(qk.qualified, cfg.shards)).schedule, qk.qualified))
        for qk, _ in have
    )
    lost = [
        (qk, n)
        for (qk, n), s in zip(have, scores, strict=True)
        if s is None or float(s) > max(n, now) + RECONCILE_GRACE_MS
    ]
    if lost:
        yield tuple(_signal(qk, cfg, n) for qk, n in lost)
    return [qk.qualified for qk, _ in lost]


def queues_of_shard(shard: int) -> Op[list[str]]:
    members = yield Cmd(("SMEMBERS", ShardKeys(shard).queues))
    return sorted(m.decode() for m in members)


def sizes_of(cfg: EngineConfig, qualified: Sequence[str], chunk: int = 100) -> Op[dict[str, Sizes]]:
    """Sizes of many queues (``ns/q`` names), in pipelines of ``chunk`` read-only scripts."""
    out: dict[str, Sizes] = {}
    for i in range(0, len(qualified), chunk):
        names = qualified[i : i + chunk]
        got = yield tuple(
            _eval(
                "sizes",
                {"queue": _fixed(QueueKeys(*parse_qualified(n)))},
                open_lead=cfg.open_lead_ms,
            )
            for n in names
        )
        out.update((n, replies.decode_sizes(r)) for n, r in zip(names, got, strict=True))
    return out


def release(
    cfg: EngineConfig,
    ns: str,
    q: str,
    ids: Sequence[str],
    delay_ms: int,
    now: int,
    nack: bool = False,
    leases: Sequence[str | None] | None = None,
    error: str = "",
) -> Op[list[JobState | str | None]]:
    """Gives reserved jobs back, now or after ``delay_ms``. By default (a consumer gone before
    it got them) the try is restored; ``nack`` (a consumer's release) counts the delivery as a
    ttr expiry would: no tries left -> DEAD. The state each job went to; ``"expired"`` when
    its ttl had ended (removed), None when it was not reserved (or its ttr had run out). With
    ``leases``: a job whose lease does not hold it is left alone, and ``Conflict`` names it.
    ``error``: a text kept as each released job's last error (its NOTES field)."""
    qk = QueueKeys(ns, q)
    jobs: list[Arg] = []
    for i, job_id in enumerate(ids):
        jobs += [id_to_member(job_id), _lease_arg(leases[i] if leases else None)]
    call = _eval(
        "release",
        {"queue": _fixed(qk)},
        stamped=True,
        now=now,
        delay=delay_ms,
        notify=qk.notify,
        mode=int(nack),
        seed=repr(cfg.draw()),
        error=error.encode(),
        jobs=jobs,
    )
    reply = replies.decode_release((yield call))
    if reply.lowered:  # the delay's end, or a retry backoff's: the earliest
        yield _signal(qk, cfg, reply.lowered)
    _raise_conflicts(ids, reply.codes)
    return ["expired" if c is ReplyCode.EXPIRED else replies.job_state(c) for c in reply.codes]


def touch(
    cfg: EngineConfig, ns: str, q: str, job_id: str, ttr_ms: int, now: int, lease: str | None = None
) -> Op[bool]:
    """Moves a running reservation's deadline to ``now + ttr_ms``; False when the job is not
    reserved or its ttr already ran out. With a ``lease`` that does not hold it: ``Conflict``."""
    qk = QueueKeys(ns, q)
    call = _eval(
        "touch",
        {"queue": _fixed(qk)},
        stamped=True,
        now=now,
        ttr=ttr_ms,
        member=id_to_member(job_id),
        lease=_lease_arg(lease),
    )
    reply = replies.decode_touch((yield call))
    _raise_conflicts([job_id], [reply.code])
    if reply.lowered:
        yield _signal(qk, cfg, now + ttr_ms)
    return reply.code is ReplyCode.RESERVED


def lead(shard: int, token: str, lease_ms: int, give_up: bool = False) -> Op[int]:
    """Acquires or renews the shard's leadership: its fencing epoch (> 0); when another holds
    it, minus the ms that lease has left; 0 when given up."""
    sk = ShardKeys(shard)
    call = _eval(
        "leader",
        {"leader": sk.lock, "epoch": sk.epoch},
        token=token,
        lease=lease_ms,
        release="1" if give_up else "0",
    )
    return replies.decode_leader((yield call))


def rate_limit(key: str, per_window: int, window_ms: int, refund: bool = False) -> Op[int]:
    """Takes (or gives back) one unit of a fixed-window limit: the ms left in the window
    when taken, 0 when it is used up (a refund: 1)."""
    call = _eval(
        "rate_limit",
        {"counter": key},
        limit=per_window,
        window=window_ms,
        refund="1" if refund else "0",
    )
    return replies.decode_count((yield call))


def queue_settings(ns: str, q: str) -> Op[QueueSettings]:
    """The queue's own settings (its CONF hash)."""
    return QueueSettings.from_hash((yield Cmd(("HGETALL", QueueKeys(ns, q).conf))))


def queue_known(ns: str, q: str) -> Op[bool]:
    """Whether the queue exists here: a job in any state (JOBS, or META counting wheel jobs),
    settings of its own (CONF) or a schedule. A name nothing was written to is unknown."""
    qk = QueueKeys(ns, q)
    return bool((yield Cmd(("EXISTS", qk.jobs, qk.meta, qk.conf, qk.schedules))))


def configure(ns: str, q: str, changes: Sequence[tuple[str, str]]) -> Op[QueueSettings]:
    """Changes the queue's own settings (``queueconf.parse_changes``: field, value; '' removes
    it) atomically; resuming a queue wakes its long-polls. Returns the settings after it."""
    qk = QueueKeys(ns, q)
    fields = [x for pair in changes for x in pair]
    raw = yield _eval("configure", {"queue": _fixed(qk)}, notify=qk.notify, fields=fields)
    return QueueSettings.from_hash(dict(zip(raw[0::2], raw[1::2])))


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One queue as the namespace listing shows it."""

    name: str
    sizes: Sizes
    paused: bool
    oldest_due_ms: int | None  # the due time of the job at the head of READY


def queues_of_namespace(shards: int, ns: str) -> Op[list[str]]:
    """The names of the namespace's queues in the shard registries (every shard in one
    pipeline), sorted."""
    got = yield tuple(Cmd(("SMEMBERS", ShardKeys(s).queues)) for s in range(shards))
    prefix = ns + "/"
    return sorted(
        {m.decode()[len(prefix) :] for ms in got for m in ms if m.decode().startswith(prefix)}
    )


def overview(cfg: EngineConfig, ns: str, queues: Sequence[str]) -> Op[list[QueueOverview]]:
    """Sizes, paused flag and READY's head of each queue: one pipeline of read-only steps."""
    steps: list[Call] = []
    for q in queues:
        qk = QueueKeys(ns, q)
        steps += [
            _eval("sizes", {"queue": _fixed(qk)}, open_lead=cfg.open_lead_ms),
            Cmd(("HGET", qk.conf, "paused")),
            Cmd(("ZRANGE", qk.ready, 0, 0, "WITHSCORES")),
        ]
    got = (yield tuple(steps)) if steps else []
    out = []
    for i, q in enumerate(queues):
        sizes_, paused, head = got[3 * i : 3 * i + 3]
        score = (head[0][1] if isinstance(head[0], (tuple, list)) else head[1]) if head else None
        oldest = int(float(score)) & READY_SCORE_MASK if score is not None else None
        out.append(QueueOverview(q, replies.decode_sizes(sizes_), paused in (b"1", "1"), oldest))
    return out
