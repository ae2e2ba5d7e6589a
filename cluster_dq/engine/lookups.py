"""Lookups: a job by id, the heads of a state, pages of a queue's jobs, its sizes. They read,
and never move a job. Steps only, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple


from cluster_dq.engine import replies
from cluster_dq.engine.replies import Sizes as Sizes  # re-exported: the service and metrics use it
from cluster_dq.keys import QueueKeys
from cluster_dq.models import (
    FLAG_DUE,
    FLAG_GROUP,
    HEADER_SIZE,
    Job,
    JobResult,
    JobState,
    Note,
    Record,
    id_due_ms,
    id_to_member,
    is_wheel_member,
    wheel_job,
)

from cluster_dq.engine.steps import Cmd, EngineConfig, Eval, Op, bucket_of, fixed_keys, lua

if TYPE_CHECKING:
    pass


class ById(NamedTuple):
    """What a script acting on one job by id is given: the job's member, the name of the wheel
    bucket its id names ('' for a client id) and the keys (the queue's, then that bucket)."""

    member: bytes
    bucket_name: str
    keys: dict[str, Any]


def by_id(qk: QueueKeys, member: bytes) -> ById:
    bname = bucket_of(member)
    return ById(
        member,
        bname or "",
        {"queue": fixed_keys(qk), "bucket": [qk.bucket(bname)] if bname else []},
    )


def _peek_job_call(qk: QueueKeys, member: bytes) -> Eval:
    return lua("peek_job", by_id(qk, member).keys, member=member)


READY_SCORE_MASK = 2**42 - 1  # a ready score is (255 - priority) * 2^42 + due ms


def ready_due(member: bytes, record: bytes, score: float) -> int:
    """A ready job's due time from its READY score: the score's due ms, but for a grouped job,
    whose score holds its group's fair tag instead: the due time its record carries (a
    debounce's job, a moved one), else in its id, or, for a client's id (which holds none),
    its publish time."""
    flags = record[HEADER_SIZE - 1]
    if not flags & FLAG_GROUP:
        return int(float(score)) & READY_SCORE_MASK
    if flags & FLAG_DUE or not is_wheel_member(member):
        rec = Record.unpack(record)
        return rec.due_ms if rec.due_ms is not None else rec.published_ms
    return id_due_ms(member)  # a server-made id


def _peeked(ns: str, q: str, member: bytes, raw: Any) -> Job | None:
    reply = replies.decode_peek_job(raw)
    if reply is None:
        return None
    when: int | None = int(reply.score)
    if reply.state is JobState.READY:  # -1: held back by its group
        when = None if when is None or when < 0 else ready_due(member, reply.record, when)
    return Job.from_record(
        ns,
        q,
        member,
        reply.record,
        reply.state,
        when,
        progress=reply.progress,
        note=Note.unpack(reply.note),
        keyed=True,
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


def peek(cfg: EngineConfig, ns: str, q: str, which: str, now: int) -> Op[Job | None]:
    """Head of the ready queue (after promoting what is due) or of the dead letter."""
    qk = QueueKeys(ns, q)
    keys = {"queue": fixed_keys(qk)}
    look = lua("peek", keys, which=which)
    if which == "ready":
        promote = lua("promote_due", keys, now=now, limit=cfg.promote_limit, notify=qk.notify)
        reply = replies.decode_peek((yield (promote, look))[-1])
    else:
        reply = replies.decode_peek((yield look))
    if reply is None or reply.record is None:
        return None
    state = JobState.READY if which == "ready" else JobState.DEAD
    return Job.from_record(ns, q, reply.member, reply.record, state)


def dump_page(
    ns: str, q: str, state: JobState, cursor: int, count: int = 500, held: bool = False
) -> Op[tuple[int, list[Job]]]:
    """One page of a queue's ready, delayed (precise zset), reserved or dead jobs, read with
    ZSCAN + HMGET while the queue keeps working (a job moving meanwhile may be seen twice or
    not at all). ``Job.due_ms``: due time (ready, delayed), ttr deadline (reserved), death
    time (dead). Returns the next cursor (0: done) and the jobs. ``held``: the ready jobs that
    their groups hold back instead (HELD; ``due_ms`` None)."""
    qk = QueueKeys(ns, q)
    key = {
        JobState.READY: qk.ready,
        JobState.DELAYED: qk.delayed,
        JobState.RESERVED: qk.reserved,
        JobState.DEAD: qk.dead,
    }[state]
    if held:
        key = qk.held
    nxt, flat = yield Cmd(("ZSCAN", key, cursor, "COUNT", count))
    # redis-py parses ZSCAN into (member, score) pairs; a raw reply is flat
    pairs = (
        list(flat)
        if flat and isinstance(flat[0], (tuple, list))
        else list(zip(flat[0::2], flat[1::2]))
    )
    members, scores = [m for m, _ in pairs], [int(float(sc)) for _, sc in pairs]
    if held:  # `<group>\0<id>`
        members, scores = [m.split(b"\0", 1)[1] for m in members], [-1] * len(members)
    records = (yield Cmd(("HMGET", qk.jobs, *members))) if members else []
    jobs = []
    for m, score, rec in zip(members, scores, records):
        if rec is not None:
            when: int | None = score
            if held:
                when = None
            elif state is JobState.READY:
                when = ready_due(m, rec, score)
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
    """The first ``limit`` jobs of a queue's ready set (in delivery order), of its delayed
    jobs (by due time: the near-term zset and the earliest wheel buckets) or of its reserved
    ones (by ttr deadline, their ``due_ms``, with their leases), read-only: a look for the
    dashboard, not a step of any transition."""
    qk = QueueKeys(ns, q)
    if state is JobState.RESERVED:  # soonest ttr deadline first, each with its lease
        pairs = _pairs((yield Cmd(("ZRANGE", qk.reserved, 0, limit - 1, "WITHSCORES"))))
        members = [m for m, _ in pairs]
        if not members:
            return []
        records, leases = yield (
            Cmd(("HMGET", qk.jobs, *members)),
            Cmd(("HMGET", qk.leases, *members)),
        )
        return [
            Job.from_record(ns, q, m, rec, state, int(sc), lease=lease.hex() if lease else None)
            for (m, sc), rec, lease in zip(pairs, records, leases)
            if rec is not None
        ]
    if state is JobState.READY:
        pairs = _pairs((yield Cmd(("ZRANGE", qk.ready, 0, limit - 1, "WITHSCORES"))))
        members = [m for m, _ in pairs]
        records = (yield Cmd(("HMGET", qk.jobs, *members))) if members else []
        return [
            Job.from_record(ns, q, m, rec, state, ready_due(m, rec, sc))
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
        (yield lua("sizes", {"queue": fixed_keys(qk)}, open_lead=cfg.open_lead_ms))
    )
