"""Pure engine operations for per-job control and the dead letter: bury, kick, reschedule one
job by id; list, redrive and purge dead jobs with a cursor. Steps and reply decoding only, no
I/O (the executors in aio.py / sync.py run them), as in the other operations (steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster_dq.engine import replies
from cluster_dq.engine.lookups import by_id
from cluster_dq.engine.steps import (
    Cmd,
    EngineConfig,
    Op,
    fixed_keys,
    lease_arg,
    lua,
    raise_conflicts,
    signal,
)
from cluster_dq.engine.replies import ReplyCode
from cluster_dq.errors import BadRequest, WrongState
from cluster_dq.keys import QueueKeys
from cluster_dq.models import (
    DEATH_CODES,
    UNKNOWN_REASON,
    DeadLetter,
    Job,
    Note,
    Record,
    id_to_member,
    id_to_text,
)

DEAD_EXAMINE = 1_000  # dead entries one redrive or purge call looks at, matching or not
MAX_DEAD_PAGE = 1_000  # dead jobs per listing page / per redrive or purge call
FOREVER_MS = 2**53  # "no upper bound" for a time of death

# A position in the dead letter: (time of death ms, member); the next page starts after it.
After = tuple[int, bytes]


def _moved_job(
    ns: str, q: str, job_id: str, reply: replies.JobMoveReply, operation: str, allowed: str
) -> Job | None:
    """The job a per-job script answered with; None when there is none. Raises ``WrongState``
    (state forbids), ``BadRequest`` (reschedule past the ttl) or ``Conflict`` (a lease)."""
    if reply.code is ReplyCode.NOT_FOUND:
        return None
    if reply.code is ReplyCode.FORBIDDEN:
        raise WrongState(job_id, reply.state and str(reply.state), operation, allowed)
    if reply.code is ReplyCode.TOO_LATE:
        raise BadRequest(
            f"the new due time of job {job_id} is at or past the end of its ttl; "
            "nothing was changed",
            "at",
        )
    raise_conflicts([job_id], [reply.code])
    return Job.from_record(
        ns, q, id_to_member(job_id), reply.record, reply.state, note=Note.unpack(reply.note)
    )


def bury(
    ns: str, q: str, job_id: str, text: str, now: int, lease: str | None = None
) -> Op[Job | None]:
    """RESERVED / READY / DELAYED -> DEAD (reason ``buried``, ``text`` kept as its last error).
    None: no such job. ``WrongState`` when it is dead already; with a ``lease`` that does not
    hold it, ``Conflict``. Nothing changed then."""
    qk = QueueKeys(ns, q)
    member, bname, keys = by_id(qk, id_to_member(job_id))
    call = lua(
        "bury",
        keys,
        stamped=True,
        now=now,
        member=member,
        bucket_name=bname,
        lease=lease_arg(lease),
        text=text.encode(),
    )
    reply = replies.decode_job_move((yield call))
    return _moved_job(ns, q, job_id, reply, "bury", "reserved, ready or delayed")


def kick(
    cfg: EngineConfig,
    ns: str,
    q: str,
    job_id: str,
    delay_ms: int,
    tries: int,
    ttl_ms: int,
    now: int,
) -> Op[Job | None]:
    """DEAD -> READY (or DELAYED for ``delay_ms``) with ``tries`` and a fresh ttl (0 = never).
    None: no such job; ``WrongState`` when it is not dead (nothing changed)."""
    qk = QueueKeys(ns, q)
    member, _, keys = by_id(qk, id_to_member(job_id))
    call = lua(
        "kick",
        keys,
        stamped=True,
        now=now,
        member=member,
        delay=delay_ms,
        tries=tries,
        ttl=ttl_ms,
        notify=qk.notify,
    )
    reply = replies.decode_job_move((yield call))
    job = _moved_job(ns, q, job_id, reply, "kick", "dead")
    if reply.lowered:
        yield signal(qk, cfg, _earliest(now, delay_ms, ttl_ms))
    return job


def reschedule_job(
    cfg: EngineConfig, ns: str, q: str, job_id: str, due_ms: int, now: int
) -> Op[Job | None]:
    """READY / DELAYED -> DELAYED until ``due_ms`` (READY when that is not after ``now``).
    None: no such job; ``WrongState`` when it is reserved or dead; ``BadRequest`` when the
    due time is at or past its ttl end. Nothing changed then."""
    qk = QueueKeys(ns, q)
    member, bname, keys = by_id(qk, id_to_member(job_id))
    call = lua(
        "reschedule_job",
        keys,
        stamped=True,
        now=now,
        member=member,
        bucket_name=bname,
        due=due_ms,
        notify=qk.notify,
    )
    reply = replies.decode_job_move((yield call))
    job = _moved_job(ns, q, job_id, reply, "reschedule", "ready or delayed")
    if reply.lowered:
        at = [t for t in (due_ms if due_ms > now else None, job and job.expire_at_ms) if t]
        yield signal(qk, cfg, min(at) if at else now)
    return job


def _earliest(now: int, delay_ms: int, ttl_ms: int) -> int:
    at = [now + t for t in (delay_ms, ttl_ms) if t > 0]
    return min(at) if at else now


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead jobs a redrive or purge acts on: a reason (None: any; ``unknown``: none
    recorded) and a time-of-death range, both ends included."""

    reason: str | None = None
    from_ms: int = 0
    to_ms: int = FOREVER_MS

    def reason_code(self) -> int:
        if self.reason is None:
            return -1
        if self.reason == UNKNOWN_REASON:
            return 0
        return DEATH_CODES[self.reason]


def _after_args(after: After | None) -> dict[str, Any]:
    return {
        "after_score": -1 if after is None else after[0],
        "after_member": b"" if after is None else after[1],
    }


def _range_args(filt: DeadFilter) -> dict[str, Any]:
    return {"from": filt.from_ms, "to": filt.to_ms, "reason": filt.reason_code()}


def dead_page(
    ns: str, q: str, after: After | None, limit: int
) -> Op[tuple[list[DeadLetter], After | None]]:
    """Up to ``limit`` dead jobs, oldest death first, from just after ``after``; and where the
    next page starts (None: this was the last)."""
    qk = QueueKeys(ns, q)
    call = lua("dead_page", {"queue": fixed_keys(qk)}, **_after_args(after), limit=limit)
    reply = replies.decode_dead_page((yield call))
    out = []
    for e in reply.entries:
        note = Note.unpack(e.note) or Note()
        if e.head:
            rec = Record.unpack(e.head)
            deliveries, published, attrs = rec.deliveries, rec.published_ms, rec.attributes
        else:  # cannot happen while the invariants hold
            deliveries, published, attrs = 0, 0, None
        out.append(
            DeadLetter(
                id_to_text(e.member),
                note.reason,
                e.died_ms,
                deliveries,
                note.last_error,
                e.size,
                published,
                attrs,
            )
        )
    last = reply.entries[-1] if reply.entries else None
    nxt = (last.died_ms, bytes(last.member)) if reply.more and last else None
    return out, nxt


def redrive_dead(
    cfg: EngineConfig,
    ns: str,
    q: str,
    filt: DeadFilter,
    after: After | None,
    limit: int,
    delay_ms: int,
    tries: int,
    ttl_ms: int,
    now: int,
) -> Op[replies.SweepReply]:
    """One bounded step of a filtered redrive (as ``kick`` on each matching dead job)."""
    qk = QueueKeys(ns, q)
    call = lua(
        "redrive_dead",
        {"queue": fixed_keys(qk)},
        stamped=True,
        now=now,
        **_after_args(after),
        **_range_args(filt),
        limit=limit,
        examine=DEAD_EXAMINE,
        delay=delay_ms,
        tries=tries,
        ttl=ttl_ms,
        notify=qk.notify,
    )
    reply = replies.decode_sweep((yield call))
    if reply.lowered:
        yield signal(qk, cfg, _earliest(now, delay_ms, ttl_ms))
    return reply


def purge_dead(
    ns: str, q: str, filt: DeadFilter, after: After | None, limit: int
) -> Op[replies.SweepReply]:
    """One bounded step of a filtered delete of dead jobs."""
    qk = QueueKeys(ns, q)
    call = lua(
        "purge_dead",
        {"queue": fixed_keys(qk)},
        **_after_args(after),
        **_range_args(filt),
        limit=limit,
        examine=DEAD_EXAMINE,
    )
    return replies.decode_sweep((yield call))


def widen_wheel(cfg: EngineConfig, ns: str, q: str) -> Op[int]:
    """Rewrites the queue's short wheel entries as whole ones and clears its short-only mark
    (``META.s``), a few buckets per call: what a downgrade to a version without short entries
    needs first, with no instance of this version running (lua/README.md "Wheel entries").
    Returns the entries widened."""
    qk = QueueKeys(ns, q)
    names = [n.decode() for n in (yield Cmd(("ZRANGE", qk.wheel, 0, -1)))]
    widened, per = 0, cfg.open_buckets_per_call
    for i in range(0, max(len(names), 1), per):  # one call at least: META.s goes either way
        chunk = names[i : i + per]
        keys = {"queue": fixed_keys(qk), "buckets": [qk.bucket(b) for b in chunk]}
        widened += int((yield lua("widen_wheel", keys, names=chunk)))
    return widened
