"""The replies of the Lua scripts: their codes and one typed decoder per script.

``ReplyCode`` mirrors ``lua/lib/codes.lua`` (tests/engine/test_lua_contract.py checks that the two
agree): one meaning per code in every script. Every script's reply is decoded here and nowhere
else, into a frozen dataclass; the wire format stays flat arrays (cheap to build in Lua and
to decode here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from cluster_dq.errors import Fenced
from cluster_dq.models import JobState


class ReplyCode(IntEnum):
    # where a job is (or went)
    NOT_FOUND = 0  # no job in a state the script acts on; nothing done to it
    DELAYED = 1  # DELAYED, in the near-term zset
    READY = 2
    RESERVED = 3
    DEAD = 4
    WHEEL = 5  # DELAYED, resting in a wheel bucket (publish)
    # outcomes
    DUPLICATE = 6  # publish: the id is present, or was acked lately; nothing written
    EXPIRED = 7  # its ttl ended: removed (release)
    OK = 8  # the check passed (a lease holds its job; a shard step's epoch is current)
    FULL = 9  # publish: the queue holds its max_size jobs; nothing written
    EXISTING = 10  # publish_keyed: the dedup key's holder answered; nothing written
    REPLACED = 11  # publish_keyed: the dedup key's waiting holder replaced (debounce)
    # why a lease does not hold its job; nothing changed
    LEASE_DELAYED = -1
    LEASE_READY = -2
    LEASE_TAKEN = -3  # reserved by another (later) delivery
    LEASE_DEAD = -4
    LEASE_TTR_EXPIRED = -5  # still this delivery's, but its ttr ran out
    LEASE_GONE = -6  # acked, expired, destroyed
    # a shard step (claim, reschedule) carrying an older leadership epoch; nothing changed
    FENCED = -7
    # a per-job operation (bury, kick, reschedule) that the job's state forbids; nothing changed
    FORBIDDEN = -8
    # reschedule: the new due time is at or past the job's ttl end; nothing changed
    TOO_LATE = -9
    # publish_keyed: the Idempotency-Key came with another request; nothing written
    MISMATCH = -10


_CODES = {int(c): c for c in ReplyCode}  # a dict lookup: cheaper than ReplyCode(x)

# The job state a code names (DUPLICATE, NOT_FOUND and the verdicts name none).
JOB_STATES: dict[ReplyCode, JobState] = {
    ReplyCode.DELAYED: JobState.DELAYED,
    ReplyCode.WHEEL: JobState.DELAYED,
    ReplyCode.READY: JobState.READY,
    ReplyCode.RESERVED: JobState.RESERVED,
    ReplyCode.DEAD: JobState.DEAD,
}
# Why a lease does not hold its job, as errors.Conflict names it (None: gone).
LEASE_CONFLICTS: dict[ReplyCode, str | None] = {
    ReplyCode.LEASE_DELAYED: "delayed",
    ReplyCode.LEASE_READY: "ready",
    ReplyCode.LEASE_TAKEN: "reserved",
    ReplyCode.LEASE_DEAD: "dead",
    ReplyCode.LEASE_TTR_EXPIRED: "ttr_expired",
    ReplyCode.LEASE_GONE: None,
}


def code(raw: Any) -> ReplyCode:
    return _CODES[int(raw)]


def codes(raw: Sequence[Any]) -> tuple[ReplyCode, ...]:
    return tuple(_CODES[int(x)] for x in raw)


def job_state(c: ReplyCode) -> JobState | None:
    return JOB_STATES.get(c)


def conflicts(ids: Sequence[str], verdicts: Sequence[ReplyCode]) -> list[tuple[str, str | None]]:
    """The jobs whose lease does not hold them, and why (empty: every lease holds)."""
    return [(i, LEASE_CONFLICTS[c]) for i, c in zip(ids, verdicts) if c < 0]


# -- one reply type, and decoder, per script ------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishReply:
    codes: tuple[ReplyCode, ...]  # per job: DUPLICATE, WHEEL, DELAYED, READY
    fills: tuple[int, ...]  # per wheel bucket of the call: its jobs after the call
    lowered: bool  # the queue's next pump event moved earlier, or maybe a repeat: signal
    again_at: int | None  # maybe a repeat: signal by this time too (lowered_at)


def lowered_at(raw: Any) -> tuple[bool, int | None]:
    """A script's ``lowered``: 0 nothing to tell the shard; 1 signal at the call's own event; a
    time (ms), the call may be a repeat whose first signal was lost: signal by then too
    (lua/lib/jobs.lua again_at)."""
    v = int(raw)
    return v != 0, v if v > 1 else None


def decode_publish(reply: Sequence[Any], n: int) -> PublishReply:
    return PublishReply(
        codes(reply[:n]), tuple(int(f) for f in reply[n:-1]), *lowered_at(reply[-1])
    )


@dataclass(frozen=True, slots=True)
class RepublishReply:
    old: ReplyCode  # the old job's state, or a LEASE_* code (nothing changed then)
    new: ReplyCode  # as publish
    lowered: bool


def decode_republish(reply: Sequence[Any]) -> RepublishReply:
    old, new, lowered = reply
    return RepublishReply(_CODES[int(old)], _CODES[int(new)], int(lowered) == 1)


class Delivery(NamedTuple):
    """One reserved job (a named tuple: built per job on the consume path, at C speed)."""

    member: bytes
    record: bytes
    lease: bytes


@dataclass(frozen=True, slots=True)
class ConsumeReply:
    lowered: int  # the earliest event the call added, when it lowered META.next (ms), else 0
    stale: int  # the script's now when a wheel bucket should be open already (else 0)
    retried: int  # moved on the way: ttr passed -> READY
    dead: int  # ttr passed, no tries left -> DEAD
    expired: int  # ttl ended -> gone
    more: bool  # stopped at its bound of expired jobs
    # When fewer jobs than asked were reserved: the jobs left ready and the queue's next event
    # (None: none), as sizes.lua gives them; ``ready`` is -1 when the call got all it asked.
    ready: int
    next_event_ms: int | None
    deliveries: tuple[Delivery, ...]


CONSUME_HEAD = 8  # numbers before the (member, record, lease) triples


def decode_consume(reply: Sequence[Any]) -> ConsumeReply:
    triples = iter(reply[CONSUME_HEAD:])
    return ConsumeReply(
        int(reply[0]),
        int(reply[1]),
        int(reply[2]),
        int(reply[3]),
        int(reply[4]),
        int(reply[5]) == 1,
        int(reply[6]),
        None if int(reply[7]) < 0 else int(reply[7]),
        tuple(map(Delivery._make, zip(triples, triples, triples))),
    )


@dataclass(frozen=True, slots=True)
class AckReply:
    codes: tuple[ReplyCode, ...]  # per job: the state it was in; or OK / LEASE_* verdicts


def decode_ack(reply: Sequence[Any]) -> AckReply:
    return AckReply(codes(reply))


@dataclass(frozen=True, slots=True)
class ReleaseReply:
    codes: tuple[ReplyCode, ...]  # per job: NOT_FOUND, DELAYED, READY, DEAD, EXPIRED or LEASE_*
    lowered: int  # the earliest event the call added, when it lowered META.next (ms), else 0


def decode_release(reply: Sequence[Any]) -> ReleaseReply:
    return ReleaseReply(codes(reply[:-1]), int(reply[-1]))


@dataclass(frozen=True, slots=True)
class TouchReply:
    code: ReplyCode  # RESERVED (touched), NOT_FOUND or LEASE_*
    lowered: bool


def decode_touch(reply: Sequence[Any]) -> TouchReply:
    c, lowered = reply
    return TouchReply(_CODES[int(c)], int(lowered) == 1)


@dataclass(frozen=True, slots=True)
class Moved:
    """open_buckets, promote_due."""

    moved: int
    expired: int


def decode_moved(reply: Sequence[Any]) -> Moved:
    moved, expired = reply
    return Moved(int(moved), int(expired))


@dataclass(frozen=True, slots=True)
class ReservationsExpired:
    retried: int  # back to READY
    dead: int
    expired: int  # ttl ended: gone


def decode_expire_reserved(reply: Sequence[Any]) -> ReservationsExpired:
    retried, dead, expired = reply
    return ReservationsExpired(int(retried), int(dead), int(expired))


def decode_count(reply: Any) -> int:
    """expire_ttl, delete_dead, rate_limit (ms left in the window, 0: used up)."""
    return int(reply)


@dataclass(frozen=True, slots=True)
class RespawnReply:
    respawned: int
    lowered: bool


def decode_respawn(reply: Sequence[Any]) -> RespawnReply:
    n, lowered = reply
    return RespawnReply(int(n), int(lowered) == 1)


@dataclass(frozen=True, slots=True)
class DestroyReply:
    deleted: int
    gone: bool  # the queue is gone (the final step)


def decode_destroy(reply: Sequence[Any]) -> DestroyReply:
    n, gone = reply
    return DestroyReply(int(n), int(gone) == 1)


@dataclass(frozen=True, slots=True)
class PeekReply:
    member: bytes
    record: bytes | None
    score: float


def decode_peek(reply: Sequence[Any]) -> PeekReply | None:
    if not reply:
        return None
    return PeekReply(reply[0], reply[1], float(reply[2]))


@dataclass(frozen=True, slots=True)
class PeekJobReply:
    state: JobState
    record: bytes
    score: float
    note: bytes  # its NOTES field (b"": none)
    progress: bytes | None = None  # the job's NOTES field p:<id>


def decode_peek_job(reply: Sequence[Any]) -> PeekJobReply | None:
    if not reply:
        return None
    progress = reply[4] if len(reply) > 4 else None
    return PeekJobReply(
        JOB_STATES[_CODES[int(reply[0])]], reply[1], float(reply[2]), reply[3], progress
    )


def decode_progress(reply: Any) -> ReplyCode:
    """OK (recorded), NOT_FOUND, or a LEASE_* code saying where the job is."""
    return _CODES[int(reply)]


@dataclass(frozen=True, slots=True)
class Finished:
    """A job acked with a result, as RESULTS keeps it: ``done_ms`` (the ack), ``until_ms``
    (kept until), ``result`` (its JSON)."""

    done_ms: int
    until_ms: int
    result: bytes


def decode_result(raw: bytes | None) -> Finished | None:
    """A RESULTS value (>I6 I6 done ms, kept-until ms, then the result), or None."""
    if raw is None or len(raw) < 12:
        return None
    return Finished(int.from_bytes(raw[:6], "big"), int.from_bytes(raw[6:12], "big"), raw[12:])


@dataclass(frozen=True, slots=True)
class JobMoveReply:
    """bury, kick, reschedule_job: one job moved by id."""

    code: ReplyCode  # OK (moved), NOT_FOUND, FORBIDDEN, TOO_LATE or LEASE_*
    state: JobState | None  # where the job is afterwards (None: nowhere)
    record: bytes  # b"": none
    note: bytes  # its NOTES field (b"": none)
    lowered: bool


def decode_job_move(reply: Sequence[Any]) -> JobMoveReply:
    c, st, record, note, lowered = reply
    return JobMoveReply(
        _CODES[int(c)], JOB_STATES.get(_CODES[int(st)]), record, note, int(lowered) == 1
    )


class DeadEntry(NamedTuple):
    """One dead job as dead_page lists it."""

    member: bytes
    died_ms: int  # its score in DEAD
    head: bytes  # the record without its body
    size: int  # body bytes
    note: bytes


@dataclass(frozen=True, slots=True)
class DeadPageReply:
    more: bool
    entries: tuple[DeadEntry, ...]


def decode_dead_page(reply: Sequence[Any]) -> DeadPageReply:
    rest = reply[1:]
    entries = tuple(
        DeadEntry(rest[i], int(rest[i + 1]), rest[i + 2], int(rest[i + 3]), rest[i + 4])
        for i in range(0, len(rest), 5)
    )
    return DeadPageReply(int(reply[0]) == 1, entries)


@dataclass(frozen=True, slots=True)
class SweepReply:
    """redrive_dead, purge_dead."""

    count: int  # jobs moved / deleted
    more: bool  # call again from the cursor
    after: tuple[int, bytes] | None  # the last entry examined (the cursor), None: none
    lowered: bool


def decode_sweep(reply: Sequence[Any]) -> SweepReply:
    score = int(reply[2])
    after = None if score < 0 else (score, bytes(reply[3]))
    lowered = len(reply) > 4 and int(reply[4]) == 1
    return SweepReply(int(reply[0]), int(reply[1]) == 1, after, lowered)


@dataclass(frozen=True, slots=True)
class Sizes:
    """sizes, next_event."""

    delayed: int
    ready: int
    reserved: int
    dead: int
    next_event_ms: int | None


def decode_sizes(reply: Sequence[Any]) -> Sizes:
    nxt = int(reply[4])
    return Sizes(
        int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]), None if nxt < 0 else nxt
    )


def _unfenced(reply: Sequence[Any], epoch: int) -> None:
    if int(reply[0]) == ReplyCode.FENCED:
        raise Fenced(epoch)


def decode_claim(reply: Sequence[Any], epoch: int) -> list[str]:
    """The claimed queues (``ns/q``); ``Fenced`` when ``epoch`` is not the shard's."""
    _unfenced(reply, epoch)
    return [q.decode() for q in reply[1:]]


def decode_reschedule(reply: Sequence[Any], epoch: int) -> int | None:
    """The wake-up set (ms), None when none; ``Fenced`` when ``epoch`` is not the shard's."""
    _unfenced(reply, epoch)
    nxt = int(reply[1])
    return None if nxt < 0 else nxt


def decode_leader(reply: Any) -> int:
    """The leadership's epoch (> 0); not held: minus the ms another's lease has left, or 0
    when given up."""
    return int(reply)


def decode_flag(reply: Any) -> bool:
    """signal."""
    return int(reply) == 1


@dataclass(frozen=True, slots=True)
class KeyedReply:
    """publish_keyed's reply (lua/publish_keyed.lua)."""

    status: ReplyCode  # OK, FULL, FORBIDDEN (debounce: the holder's state in ``dedup``), MISMATCH
    replayed: bool  # the Idempotency-Key's answer, kept from its first call
    same_ids: bool  # (replayed) that first call asked for the same job ids as this one
    dedup: ReplyCode | None  # None (no key, or a new job holds it), EXISTING, REPLACED
    lowered: bool
    again_at: int | None  # as PublishReply's
    codes: tuple[ReplyCode, ...]  # per job: as publish's; the holder's state when EXISTING
    members: tuple[bytes, ...]  # per job; the holder's when EXISTING or REPLACED


def decode_keyed(reply: Sequence[Any]) -> KeyedReply:
    status, replayed, dedup = (int(x) for x in reply[:3])
    lowered = reply[3]
    rest = reply[4:]
    n = len(rest) // 2
    return KeyedReply(
        _CODES[status],
        replayed != 0,
        replayed == 2,
        _CODES[dedup] if dedup else None,
        *lowered_at(lowered),
        codes(rest[:n]),
        tuple(bytes(m) for m in rest[n:]),
    )
