"""Delivery: consume (reserving jobs under a lease), ack, release, touch, progress and
republish; the scripts that move a job through its reservation. Steps only, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import os

from cluster_dq.clock import now_ms
from cluster_dq.engine import replies
from cluster_dq.engine.replies import ReplyCode
from cluster_dq.engine.replies import Sizes as Sizes  # re-exported: the service and metrics use it
from cluster_dq.errors import Conflict, QueueFull
from cluster_dq.keys import BUCKET_WIDTH_MS, QueueKeys
from cluster_dq.models import Job, JobSpec, JobState, id_to_member, id_to_text

from cluster_dq.engine.steps import (
    Arg,
    Call,
    Cmd,
    EngineConfig,
    FIRST_EXTRA_KEY,
    KEEP_RESULT_MS,
    Op,
    REMEMBER_ACKED_MS,
    fixed_keys,
    job_id_args,
    lease_arg,
    lua,
    raise_conflicts,
    signal,
)

from cluster_dq.engine.lookups import by_id
from cluster_dq.engine.publish import Published, place_jobs
from cluster_dq.engine.shard import tick

if TYPE_CHECKING:
    pass


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
            call = lua(
                "consume",
                {"queue": fixed_keys(qk)},
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
                yield signal(qk, cfg, reply.lowered)
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
            yield signal(qk, cfg, step.next_event_ms)
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
    extra, id_args = job_id_args(qk, ids, FIRST_EXTRA_KEY)
    jobs: list[Arg] = []
    for i in range(len(ids)):
        jobs += [
            *id_args[3 * i : 3 * i + 3],
            lease_arg(leases[i] if leases else None),
            (results[i] or b"") if results else b"",
        ]
    results_index = 0
    if results and any(results):
        results_index = FIRST_EXTRA_KEY + len(extra)
        extra = [*extra, qk.results, qk.results_due]
    call = lua(
        "ack",
        {"queue": fixed_keys(qk), "buckets": extra},
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
    raise_conflicts(ids, reply.codes)
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
    new = place_jobs(cfg, qk, [spec], now)
    old_keys, (old_member, old_kidx, old_bucket) = job_id_args(
        qk, [old_id], FIRST_EXTRA_KEY + len(new.buckets)
    )
    ((member, due, record, kidx, bucket, wheel),) = new.placed
    keys = {"queue": fixed_keys(qk), "buckets": [qk.bucket(b) for b in new.buckets] + old_keys}
    call = lua(
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
        lease=lease_arg(lease),
    )
    reply = replies.decode_republish((yield call))
    if reply.new is ReplyCode.FULL:
        raise QueueFull(ns, q)
    raise_conflicts([old_id], [reply.old])
    if reply.lowered:
        yield signal(qk, cfg, new.event)
    published = Published(
        id_to_text(new.members[0]),
        reply.new is ReplyCode.DUPLICATE and not new.made_up[0],
        replies.job_state(reply.new),
    )
    return replies.job_state(reply.old), published


def progress(ns: str, q: str, job_id: str, value: bytes, now: int, lease: str | None) -> Op[bool]:
    """Records ``value`` (JSON, checked by the caller) as the progress of a reserved job,
    replacing the last. With a ``lease``, only while that delivery holds the job; without
    one, while the job is in a running reservation. False: no such job (no lease given);
    ``Conflict`` naming where the job is when the lease (or, without one, the job's state)
    refuses it. Nothing changes unless it is recorded."""
    qk = QueueKeys(ns, q)
    member = id_to_member(job_id)
    call = lua(
        "progress",
        by_id(qk, member).keys,
        stamped=True,
        now=now,
        member=member,
        lease=lease_arg(lease),
        progress=value,
    )
    verdict = replies.decode_progress((yield call))
    conflicts = replies.conflicts([job_id], [verdict])
    if conflicts:
        raise Conflict(conflicts, leased=lease is not None)
    return verdict is ReplyCode.OK


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
        jobs += [id_to_member(job_id), lease_arg(leases[i] if leases else None)]
    call = lua(
        "release",
        {"queue": fixed_keys(qk)},
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
        yield signal(qk, cfg, reply.lowered)
    raise_conflicts(ids, reply.codes)
    return ["expired" if c is ReplyCode.EXPIRED else replies.job_state(c) for c in reply.codes]


def touch(
    cfg: EngineConfig, ns: str, q: str, job_id: str, ttr_ms: int, now: int, lease: str | None = None
) -> Op[bool]:
    """Moves a running reservation's deadline to ``now + ttr_ms``; False when the job is not
    reserved or its ttr already ran out. With a ``lease`` that does not hold it: ``Conflict``."""
    qk = QueueKeys(ns, q)
    call = lua(
        "touch",
        {"queue": fixed_keys(qk)},
        stamped=True,
        now=now,
        ttr=ttr_ms,
        member=id_to_member(job_id),
        lease=lease_arg(lease),
    )
    reply = replies.decode_touch((yield call))
    raise_conflicts([job_id], [reply.code])
    if reply.lowered:
        yield signal(qk, cfg, now + ttr_ms)
    return reply.code is ReplyCode.RESERVED
