"""Publishing: one job, many, and a bulk schedule's jobs (publish.lua). Where each new job goes
(the ready set, the delayed set, or a wheel bucket, short or whole: lua/README.md) is decided
here, once per call, and the script only writes it. Steps only, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import struct

from cluster_dq.engine import replies
from cluster_dq.engine.replies import ReplyCode
from cluster_dq.engine.replies import Sizes as Sizes  # re-exported: the service and metrics use it
from cluster_dq.errors import QueueFull
from cluster_dq.keys import BUCKET_WIDTH_MS, QueueKeys, window_bucket_name, parse_qualified
from cluster_dq.models import (
    JobSpec,
    JobState,
    Record,
    has_fixed_server_id,
    id_due_ms,
    id_lane,
    id_to_member,
    id_to_text,
    wheel_short,
    wheel_short_head,
    is_wheel_member,
    new_id,
)

from cluster_dq.engine.steps import EngineConfig, Eval, FIRST_EXTRA_KEY, Op, fixed_keys, lua, signal

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, slots=True)
class Published:
    job_id: str
    duplicate: bool
    state: JobState | None
    full: bool = False  # refused: the queue holds its max_size jobs (nothing written)


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
class NewJobs:
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


def place_jobs(
    cfg: EngineConfig,
    qk: QueueKeys,
    specs: Sequence[JobSpec],
    now: int,
    first_key: int = FIRST_EXTRA_KEY,
    wheel_ok: bool = True,
) -> NewJobs:
    """``wheel_ok`` False: no job rests in a wheel bucket (publish_keyed's jobs)."""
    out = NewJobs()
    heads, buckets, shorts = _Headers(now), _Buckets(out.buckets, first_key), _Shorts(now)
    for spec in specs:
        due = spec.due_ms if spec.due_ms is not None else now + spec.delay_ms
        if spec.expire_at_ms is not None:
            expire_at = spec.expire_at_ms
        else:
            expire_at = now + spec.ttl_ms if spec.ttl_ms else 0
        if spec.attributes or spec.backoff is not None or spec.group or spec.dedup_key:
            record = Record(
                now,
                expire_at,
                spec.tries,
                0,
                spec.priority,
                spec.body,
                spec.attributes,
                spec.backoff,
                spec.group,
                spec.dedup_key,
                due if spec.debounced else None,
            ).pack()
        else:  # Record.pack's bytes, its header shared with the call's other such jobs
            record = heads[expire_at, spec.tries, spec.priority] + spec.body
        start = due - due % BUCKET_WIDTH_MS
        # A wheel bucket opens only as fast as consumers drain the ready set, and what is in it
        # is unknown until then: a job with a priority stays out, or it could wait behind a
        # backlog of lower-priority ready jobs although it is due.
        far = start > now + cfg.open_lead_ms and spec.priority == 0 and wheel_ok
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
            if spec.attributes or spec.backoff is not None or spec.group or spec.dedup_key:
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


def publish_call(
    cfg: EngineConfig, qk: QueueKeys, specs: Sequence[JobSpec], now: int, whole: bool = False
) -> tuple[Eval, NewJobs]:
    jobs = place_jobs(cfg, qk, specs, now)
    return publish_eval(cfg, qk, jobs, now, whole), jobs


def publish_eval(
    cfg: EngineConfig, qk: QueueKeys, jobs: NewJobs, now: int, whole: bool = False
) -> Eval:
    keys = {"queue": fixed_keys(qk), "buckets": [qk.bucket(b) for b in jobs.buckets]}
    return lua(
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
    cfg: EngineConfig, qk: QueueKeys, jobs: NewJobs, reply: replies.PublishReply
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


def signal_event(event: int | None, again_at: int | None) -> int | None:
    """When the shard must look at a queue a call reported lowered: the call's own first event,
    or, when the call may be a repeat (a job there already, a key's own job or kept answer),
    the queue's next event if earlier: the first attempt's signal may have been lost with its
    reply, and a retry's own event may be later (a client's retry is stamped afresh). A queue
    with no event is registered only (a ready job that never expires leaves no pump event nor
    META for the reconcile sweep to find it by)."""
    return min((t for t in (event, again_at) if t is not None), default=None)


def publish(
    cfg: EngineConfig, ns: str, q: str, specs: Sequence[JobSpec], now: int, whole: bool = False
) -> Op[list[Published]]:
    """Publishes ``specs`` on one queue. With the queue's max_size set, a job beyond it is
    refused (``Published.full``): job by job in order, or, ``whole``, all of them at once."""
    qk = QueueKeys(ns, q)
    call, jobs = publish_call(cfg, qk, specs, now, whole)
    reply = replies.decode_publish((yield call), len(jobs.members))
    if reply.lowered:
        yield signal(qk, cfg, signal_event(jobs.event, reply.again_at))
    return _published(cfg, qk, jobs, reply)


def _publish_pipelined(
    cfg: EngineConfig, placed: Sequence[tuple[QueueKeys, Eval, NewJobs]]
) -> Op[list[replies.PublishReply]]:
    """Publish calls in one pipeline, then the shard signals they call for in another."""
    raw = yield tuple(call for _, call, _ in placed)
    decoded = [replies.decode_publish(r, len(jobs.members)) for (_, _, jobs), r in zip(placed, raw)]
    signals = tuple(
        signal(qk, cfg, signal_event(jobs.event, reply.again_at))
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
        (qk, *publish_call(cfg, qk, specs, now))
        for qk, specs in ((QueueKeys(ns, q), specs) for ns, q, specs in batches)
    ]
    decoded = yield from _publish_pipelined(cfg, placed)
    return [_published(cfg, qk, jobs, reply) for (qk, _, jobs), reply in zip(placed, decoded)]


# A job of a bulk schedule, its id made by the writer: (member, due ms, expire at ms (0 =
# never), tries, priority, body). The member is 16 raw bytes of a server-format id (which
# carries the due time and lane, so a rerun finds it in its bucket), or a client id.
BulkJob = tuple[bytes, int, int, int, int, bytes]
_Bulk = tuple[int, str, int, bytes]  # a bulk job's bucket KEYS index and name, into, record head


def _place_bulk(cfg: EngineConfig, jobs: Sequence[BulkJob], now: int) -> NewJobs:
    """``place_jobs`` for ids made by the writer (a ``JobSpec`` with ``due_ms``,
    ``expire_at_ms`` and such a ``job_id``): the same arguments, without a text id per job. Jobs that share their id's first 8 bytes (due ms and lane), due
    time, ttl end, tries and priority share everything but their body: worked out once."""
    out = NewJobs()
    placed, lead = out.placed, cfg.open_lead_ms
    heads, shorts = _Headers(now), _Shorts(now)
    buckets = _Buckets(out.buckets, FIRST_EXTRA_KEY)
    events: list[int] = []

    def place(member: bytes, due: int, expire_at: int, tries: int, priority: int) -> _Bulk:
        start = due - due % BUCKET_WIDTH_MS
        if is_wheel_member(member):
            kidx, bname = buckets[due // BUCKET_WIDTH_MS, id_lane(member)]
            wheel = INTO if start > now + lead and priority == 0 else LOOK  # as in place_jobs
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
        placed.append((qk, publish_eval(cfg, qk, placement, now, whole=True), placement))
    decoded = yield from _publish_pipelined(cfg, placed)
    for (qk, _, _), reply in zip(placed, decoded):
        if ReplyCode.FULL in reply.codes:  # that batch wrote nothing; the others stand
            raise QueueFull(*parse_qualified(qk.qualified))
    return [sum(c is ReplyCode.DUPLICATE for c in reply.codes) for reply in decoded]
