"""The job data model: states, limits, job ids and the packed record stored in Redis. No I/O.

A job id is 16 bytes: ``due_ms`` (u48, big-endian) | ``lane`` (u16) | 8 random bytes. Its
text form is 26 Crockford base32 characters. Because the id carries its due time and lane,
the wheel bucket that holds a delayed job is derived from the id alone (O(1) lookup by id).
Client-chosen ids are any other name; they never live in the wheel (see lua/README.md).

The record (a hash value) is ``>I6 I6 H H B B`` = published_ms, expire_at_ms (0 = never),
tries_left, deliveries, priority, flags, followed by the job's retry backoff (``>B I I H``,
cluster_dq.backoff) when flags&2, then [u8 len + the job's group] when flags&4, then [u8 len
+ its simple or debounce dedup key] when flags&8, then [u16 attr_len + attrs JSON] when
flags&1, then its due ms (u48) when flags&16 (when its id does not say it: a debounce's job, a
job a reschedule or a revival moved), then the body. Lua reads and rewrites the fixed header
(and reads the backoff, the group and the key, and writes the due time: lib/record.lua
with_due; the dead-letter listing skips everything before the body).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from cluster_dq.backoff import SECTION as BACKOFF_SECTION
from cluster_dq.backoff import Backoff
from cluster_dq.errors import BadRequest, BodyTooLarge
from cluster_dq import names
from cluster_dq.keys import BUCKET_WIDTH_MS

# The names' rules live in names.py (the client shares them); given here as well.
from cluster_dq.names import CLIENT_ID_MAX_LEN as CLIENT_ID_MAX_LEN
from cluster_dq.names import MAX_ATTR_KEY as MAX_ATTR_KEY
from cluster_dq.names import MAX_ATTR_VALUE as MAX_ATTR_VALUE
from cluster_dq.names import MAX_ATTRIBUTES as MAX_ATTRIBUTES
from cluster_dq.names import MAX_NAME_LEN as MAX_NAME_LEN
from cluster_dq.names import NAME_RE as NAME_RE

MAX_TRIES = 65535
MAX_BODY = 1024 * 1024
MAX_BULK = 64
MAX_BATCH_CONSUME = 100
MAX_BATCH_ACK = 1000  # ids per batch ack: one script, bounded time
MAX_SECONDS = 2**32 - 1
MAX_PRIORITY = 255
# A job's progress, or its result on ack: one JSON value, at most this many bytes as stored
# (compact JSON, UTF-8). Small on purpose: it rides in Redis beside the job.
MAX_NOTE_BYTES = 4096

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_WHEEL_ID_RE = re.compile(r"\A[0-7][0-9A-HJKMNP-TV-Z]{25}\Z")
# A schedule's occurrence id (schedules.occurrence_id: ``s-<name>-<ms>``; an occurrence is never
# before now, so its ms has 13 digits until the year 2286, and 15 at the latest start_ms, 2^47):
# kept for the schedules, so that no publish can take an occurrence's place
OCCURRENCE_ID_RE = re.compile(r"\As-[-_A-Za-z0-9]+-[0-9]{13,15}\Z")

HEADER = struct.Struct(">6s6sHHBB")
HEADER_SIZE = HEADER.size  # 18
FLAG_ATTRS = 1
FLAG_BACKOFF = 2
FLAG_GROUP = 4
FLAG_DEDUP = 8
FLAG_DUE = 16


class JobState(StrEnum):
    """Where a job is. Each name matches the Redis structure that holds it (lua/README.md)."""

    DELAYED = "delayed"  # a wheel bucket, or the near-term ``delayed`` zset
    READY = "ready"
    RESERVED = "reserved"
    DEAD = "dead"


def _u48(value: int) -> bytes:
    return value.to_bytes(6, "big")


_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 characters
_PAIR_SHIFTS = tuple(range(120, -1, -10))  # 13 pairs = 130 bits, the top 2 always 0
_TO_BASE32_DIGITS = str.maketrans(_CROCKFORD, "0123456789abcdefghijklmnopqrstuv")


def encode_id(raw: bytes) -> str:
    """16 raw bytes -> 26-char Crockford base32 text (hot: once per job delivered)."""
    n = int.from_bytes(raw, "big")
    return "".join([_PAIRS[(n >> s) & 1023] for s in _PAIR_SHIFTS])


def decode_id(text: str) -> bytes | None:
    """26-char Crockford base32 -> 16 raw bytes, or None when ``text`` is not a wheel id.
    Crockford's digits are int()'s base-32 digits in another spelling."""
    if not _WHEEL_ID_RE.fullmatch(text):
        return None
    return int(text.translate(_TO_BASE32_DIGITS), 32).to_bytes(16, "big")


_last_id: list[int] = [-1, 0]  # (due_ms, lane) packed, and the random tail last used for it


def new_id(due_ms: int, lane: int) -> bytes:
    """A fresh id; within one (due ms, lane) ids increase, as monotonic ULIDs do, so jobs
    published in the same millisecond keep their order (ties sort by member)."""
    head = _u48(due_ms) + lane.to_bytes(2, "big")
    key = (due_ms << 16) | lane
    if _last_id[0] == key and _last_id[1] < 2**64 - 2**32:
        tail = _last_id[1] + 1
    else:
        tail = int.from_bytes(os.urandom(8), "big") >> 1
    _last_id[0], _last_id[1] = key, tail
    return head + tail.to_bytes(8, "big")


def id_due_ms(raw: bytes) -> int:
    return int.from_bytes(raw[:6], "big")


def id_due_ms_of_text(text: str) -> int | None:
    """The due time a server-made id carries (its top 48 bits), None for a client id."""
    if not _WHEEL_ID_RE.fullmatch(text):
        return None
    return int(text.translate(_TO_BASE32_DIGITS), 32) >> 80


def id_lane(raw: bytes) -> int:
    return int.from_bytes(raw[6:8], "big")


def is_client_id_valid(text: str) -> bool:
    """A client-chosen id: a name, at most 64 bytes, that cannot be mistaken for a wheel id."""
    return (
        0 < len(text) <= CLIENT_ID_MAX_LEN
        and NAME_RE.fullmatch(text) is not None
        and _WHEEL_ID_RE.fullmatch(text) is None
    )


def is_wheel_member(member: bytes) -> bool:
    """A server-made 16-byte id (its first byte, the top of a ms timestamp, is < 0x20 until
    the year 2527; a client id starts with a name character)."""
    return len(member) == 16 and member[0] < 0x20


# A wheel bucket's entry (lua/README.md "Wheel entries"; wheel_short makes a short value, the
# scripts write it and read it back in lua/lib/wheel.lua): short, a 10-byte field (the low 16
# bits of the job's due ms, then its id's last 8 bytes) and the record relative to its due time
# (`>I4 I4 H B`: ms from publish to due, ttl in ms from publish or 0, tries left, flags; then the
# rest of the record); or whole, its 16-byte id and its record. wheel_member and wheel_job read
# both.
WHEEL_SHORT_FIELD = 10
_WHEEL_SHORT_HEAD = struct.Struct(">IIHB")


def wheel_short_head(
    due: int, published: int, expire_at: int, tries: int, flags: int
) -> bytes | None:
    """The head of a short entry's value for a job due at ``due`` (it replaces the record's
    18-byte header), or None when the job does not fit the short form (a delay or ttl of 2^32
    ms or more)."""
    delay, ttl = due - published, expire_at - published if expire_at else 0
    if not 0 <= delay < 2**32 or (expire_at and not 0 < ttl < 2**32):
        return None
    return _WHEEL_SHORT_HEAD.pack(delay, ttl, tries, flags)


def wheel_short(member: bytes, due: int, record: bytes) -> bytes | None:
    """A job's short entry value (``record`` re-headed), or None when it must rest whole: its
    id is not due at ``due``, it has deliveries or a priority, or ``wheel_short_head`` says no."""
    pub, exp, tries, deliveries, prio, flags = HEADER.unpack_from(record)
    if deliveries or prio or id_due_ms(member) != due:
        return None
    head = wheel_short_head(
        due, int.from_bytes(pub, "big"), int.from_bytes(exp, "big"), tries, flags
    )
    return None if head is None else head + record[HEADER_SIZE:]


def wheel_member(bucket: str, field: bytes) -> bytes:
    """The id of the job whose entry in wheel bucket ``bucket`` (its name, ``<window>:<lane>``)
    has ``field``."""
    if len(field) != WHEEL_SHORT_FIELD:
        return field
    window, lane = bucket.split(":")
    start = int(window) * BUCKET_WIDTH_MS
    due = start + (int.from_bytes(field[:2], "big") - start) % 65536
    return _u48(due) + int(lane).to_bytes(2, "big") + field[2:]


def wheel_job(bucket: str, field: bytes, value: bytes) -> tuple[bytes, bytes]:
    """The job (id, record) an entry of wheel bucket ``bucket`` holds."""
    member = wheel_member(bucket, field)
    if member is field:
        return member, value
    delay, ttl, tries, flags = _WHEEL_SHORT_HEAD.unpack_from(value)
    pub = id_due_ms(member) - delay
    head = HEADER.pack(_u48(pub), _u48(pub + ttl if ttl else 0), tries, 0, 0, flags)
    return member, head + value[_WHEEL_SHORT_HEAD.size :]


def id_to_text(member: bytes) -> str:
    """A stored member (16 raw bytes, or a client id) -> the id a client sees."""
    if is_wheel_member(member):
        return encode_id(member)
    return member.decode()


def id_to_member(text: str) -> bytes:
    raw = decode_id(text)
    return raw if raw is not None else text.encode()


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a producer asks for; times in milliseconds."""

    body: bytes
    delay_ms: int = 0
    ttl_ms: int = 86_400_000  # 0 = never expires
    tries: int = 1
    priority: int = 0
    attributes: dict[str, str] | None = None
    job_id: str | None = None  # client-chosen id (idempotent publish)
    # Bulk scheduling (cluster_dq.pipeline): an absolute due time, with job_id a server-format
    # id made for it (its due ms and lane), so that a rerun places the very same job; and an
    # absolute end of life (0 = never), counted from the schedule's reference time, not from
    # when a partition happens to publish.
    due_ms: int | None = None
    expire_at_ms: int | None = None
    backoff: Backoff | None = None  # the job's own retry backoff (else its queue's, if any)
    group: str | None = None  # its group (names.NAME_RE): fair turns and limits per group
    # the simple or debounce dedup key it holds (set by the engine from the publish's Dedup)
    dedup_key: str | None = None
    # a debounce's job (set by the engine): its record carries its due time, which a later
    # debounce moves out while the job's id keeps the first
    debounced: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    published_ms: int
    expire_at_ms: int
    tries_left: int
    deliveries: int
    priority: int
    body: bytes
    attributes: dict[str, str] | None = None
    backoff: Backoff | None = None
    group: str | None = None
    dedup_key: str | None = None  # the simple or debounce dedup key it was published under
    # when it is due, when its id does not say it: a debounce's job (a later debounce moves it
    # out, while the job's id keeps the first), a job a reschedule or a revival moved (a
    # client's id says none)
    due_ms: int | None = None

    def pack(self) -> bytes:
        flags = 0
        extra = b""
        if self.backoff is not None:
            flags |= FLAG_BACKOFF
            extra = self.backoff.pack()
        if self.group:
            flags |= FLAG_GROUP
            name = self.group.encode()
            extra += len(name).to_bytes(1, "big") + name
        if self.dedup_key:
            flags |= FLAG_DEDUP
            key = self.dedup_key.encode()
            extra += len(key).to_bytes(1, "big") + key
        if self.attributes:
            flags |= FLAG_ATTRS
            blob = json.dumps(self.attributes, separators=(",", ":")).encode()
            extra += len(blob).to_bytes(2, "big") + blob
        if self.due_ms is not None:
            flags |= FLAG_DUE
            extra += _u48(self.due_ms)
        head = HEADER.pack(
            _u48(self.published_ms),
            _u48(self.expire_at_ms),
            self.tries_left,
            self.deliveries,
            self.priority,
            flags,
        )
        return head + extra + self.body

    @staticmethod
    def header(published: bytes, expire_at_ms: int, tries_left: int, priority: int) -> bytes:
        """``pack``'s header for a new job without attributes (bulk writers, who pass the
        6 bytes of the publish time once for a whole batch); the body follows it."""
        return HEADER.pack(published, _u48(expire_at_ms), tries_left, 0, priority, 0)

    @classmethod
    def unpack(cls, data: bytes) -> Record:
        pub, exp, tries, deliveries, prio, flags = HEADER.unpack_from(data)
        rest = data[HEADER_SIZE:]
        attrs, backoff, group, dedup_key, due = None, None, None, None, None
        if flags & FLAG_BACKOFF:
            backoff = Backoff.unpack_from(rest, 0)
            rest = rest[BACKOFF_SECTION.size :]
        if flags & FLAG_GROUP:
            group = rest[1 : 1 + rest[0]].decode()
            rest = rest[1 + rest[0] :]
        if flags & FLAG_DEDUP:
            dedup_key = rest[1 : 1 + rest[0]].decode()
            rest = rest[1 + rest[0] :]
        if flags & FLAG_ATTRS:
            n = int.from_bytes(rest[:2], "big")
            attrs = json.loads(rest[2 : 2 + n])
            rest = rest[2 + n :]
        if flags & FLAG_DUE:
            due = int.from_bytes(rest[:6], "big")
            rest = rest[6:]
        return cls(
            int.from_bytes(pub, "big"),
            int.from_bytes(exp, "big"),
            tries,
            deliveries,
            prio,
            bytes(rest),
            attrs,
            backoff,
            group,
            dedup_key,
            due,
        )


# Why a job died: the reason codes of its NOTES field (lua/lib/notes.lua, DIED_*).
DEATH_REASONS: dict[int, str] = {1: "ttr_expired", 2: "tries_exhausted", 3: "buried"}
DEATH_CODES: dict[str, int] = {name: code for code, name in DEATH_REASONS.items()}
UNKNOWN_REASON = "unknown"  # a dead job with no recorded death (code 0)
MAX_NOTE_TEXT = 1024  # bytes (UTF-8) of a bury reason or a release's error text
_NOTE = struct.Struct(">B6s")


@dataclass(frozen=True, slots=True)
class Note:
    """What a job carries beside its record (its NOTES field): why and when it died (reason
    code 0 and ``died_ms`` 0 while alive) and the last error text it was given."""

    reason_code: int = 0
    died_ms: int = 0
    last_error: str | None = None

    @property
    def reason(self) -> str:
        return DEATH_REASONS.get(self.reason_code, UNKNOWN_REASON)

    @classmethod
    def unpack(cls, data: bytes | None) -> Note | None:
        if not data:
            return None
        code, died = _NOTE.unpack_from(data)
        text = data[_NOTE.size :].decode("utf-8", "replace")
        return cls(code, int.from_bytes(died, "big"), text or None)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead job as the dead-letter listing shows it (no body: its size)."""

    job_id: str
    reason: str
    died_ms: int
    deliveries: int
    last_error: str | None
    size: int
    published_ms: int
    attributes: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the engine returns it."""

    namespace: str
    queue: str
    job_id: str
    body: bytes
    published_ms: int
    expire_at_ms: int
    tries_left: int
    deliveries: int
    priority: int = 0
    attributes: dict[str, str] | None = None
    state: JobState | None = None
    due_ms: int | None = None
    lease: str | None = None  # the delivery's token (consume only): ack, touch, release may show it
    extra: dict[str, int] = field(default_factory=dict)
    progress: bytes | None = None  # the last progress a consumer recorded (JSON), peek only
    note: Note | None = None  # death and last error, where a lookup by id read them
    dedup_key: str | None = None  # the dedup key it was published under, lookup by id only
    group: str | None = None  # its group, if it was published with one
    record_due_ms: int | None = None  # the due time its record carries (Record.due_ms)

    @property
    def scheduled_ms(self) -> int | None:
        """When it is due (for its lateness): the due time its record carries (a debounce's
        job's last debounce, a reschedule's, a revival's), else its id's (its publish's);
        None for a client's id that was never moved."""
        if self.record_due_ms is not None:
            return self.record_due_ms
        return id_due_ms_of_text(self.job_id)

    @classmethod
    def from_record(
        cls,
        namespace: str,
        queue: str,
        member: bytes,
        data: bytes,
        state: JobState | None = None,
        due_ms: int | None = None,
        lease: str | None = None,
        progress: bytes | None = None,
        note: Note | None = None,
        keyed: bool = False,
    ) -> Job:
        """``keyed``: with the dedup key it was published under (a lookup by id)."""
        rec = Record.unpack(data)
        return cls(
            namespace,
            queue,
            id_to_text(member),
            rec.body,
            rec.published_ms,
            rec.expire_at_ms,
            rec.tries_left,
            rec.deliveries,
            rec.priority,
            rec.attributes,
            state,
            due_ms,
            lease,
            progress=progress,
            note=note,
            dedup_key=rec.dedup_key if keyed else None,
            group=rec.group,
            record_due_ms=rec.due_ms,
        )

    def ttl_ms(self, now_ms: int) -> int:
        """Remaining time to live; 0 means forever (lmstfy)."""
        if self.expire_at_ms == 0:
            return 0
        return max(self.expire_at_ms - now_ms, 0)


def has_fixed_server_id(spec: JobSpec) -> bool:
    """A server-format job id that the caller built for ``spec.due_ms`` (bulk scheduling)."""
    raw = decode_id(spec.job_id) if spec.job_id is not None and spec.due_ms is not None else None
    return raw is not None and id_due_ms(raw) == spec.due_ms


def validate_spec(spec: JobSpec) -> None:
    """Refuses a bad job whole, naming the parameter (lmstfy's messages where it has one)."""
    if spec.delay_ms < 0 or spec.delay_ms > MAX_SECONDS * 1000:
        raise BadRequest("invalid delay", "delay")
    if spec.ttl_ms < 0 or spec.ttl_ms > MAX_SECONDS * 1000:
        raise BadRequest("invalid ttl", "ttl")
    if spec.ttl_ms and spec.ttl_ms <= spec.delay_ms:
        # equal would expire the job the moment it becomes due: it could never be delivered
        raise BadRequest("ttl must be longer than delay", "ttl")
    if spec.expire_at_ms and spec.due_ms is not None and spec.expire_at_ms <= spec.due_ms:
        raise BadRequest("ttl must end after the due time", "ttl")
    if spec.tries == 0:
        raise BadRequest("tries shouldn't be zero", "tries")
    if not 0 < spec.tries <= MAX_TRIES:
        raise BadRequest("invalid tries", "tries")
    if not 0 <= spec.priority <= MAX_PRIORITY:
        raise BadRequest("invalid priority", "priority")
    if len(spec.body) > MAX_BODY:
        raise BodyTooLarge("body too large", "body")
    if spec.group is not None and (why := names.group(spec.group)):
        raise BadRequest(why, "group")
    if spec.attributes:
        if len(spec.attributes) > MAX_ATTRIBUTES:
            raise BadRequest("too many attributes, cannot exceed 16", "attributes")
        for k, v in spec.attributes.items():
            if not k or len(k) > MAX_ATTR_KEY or len(v) > MAX_ATTR_VALUE:
                raise BadRequest("invalid attribute", "attributes")
    if spec.job_id is not None and not (
        is_client_id_valid(spec.job_id) or has_fixed_server_id(spec)
    ):
        raise BadRequest(
            "invalid job_id: 1-64 of [-_A-Za-z0-9], and not a 26-char server id", "job_id"
        )
    if spec.job_id is not None and OCCURRENCE_ID_RE.fullmatch(spec.job_id):
        raise BadRequest(
            "invalid job_id: s-<name>-<13 to 15 digits> is the id of a schedule's occurrence",
            "job_id",
        )


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job acked with a result, while the result is kept (``ResultSecond``)."""

    namespace: str
    queue: str
    job_id: str
    done_ms: int  # when it was acked
    result: bytes  # JSON


def check_names(ns: str, q: str | None = None) -> None:
    """A namespace (and queue) name as ``cluster_dq/names.py`` rules it, which the Python client
    applies before sending: ``BadRequest`` naming the parameter, before anything is written."""
    problem = names.namespace(ns)
    if problem:
        raise BadRequest(problem, "namespace")
    problem = names.queue(q) if q is not None else None
    if problem:
        raise BadRequest(problem, "queue")


@dataclass(frozen=True, slots=True)
class Dedup:
    """A publish's dedup key (one job; docs/api.md): ``simple`` while the job it made exists
    and is not dead, ``throttle`` for ``ttl_ms`` after it, ``debounce`` replacing that job
    while it waits."""

    key: str
    mode: str = "simple"  # names.DEDUP_MODES
    ttl_ms: int = 0  # throttle's window (required there, refused elsewhere)


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A request's Idempotency-Key and its fingerprint (16 bytes naming the request)."""

    key: str
    fingerprint: bytes


def validate_keys(specs: Sequence[JobSpec], dedup: Dedup | None, idem: Idempotency | None) -> None:
    """Refuses a dedup key or an Idempotency-Key the service cannot take, naming it, and a
    keyed request without a job."""
    if not specs:
        raise BadRequest("no job to publish", "body")
    if dedup is not None:
        problem = names.dedup_key(dedup.key)
        if problem:
            raise BadRequest(problem, "dedup_key")
        if dedup.mode not in names.DEDUP_MODES:
            raise BadRequest("invalid dedup_mode: simple, throttle or debounce", "dedup_mode")
        if dedup.mode == "throttle":
            if not 0 < dedup.ttl_ms <= names.MAX_DEDUP_TTL_MS:
                raise BadRequest(
                    f"invalid dedup_ttl: throttle needs 1 to {names.MAX_DEDUP_TTL_MS} ms",
                    "dedup_ttl",
                )
        elif dedup.ttl_ms:
            raise BadRequest("dedup_ttl is for dedup_mode=throttle only", "dedup_ttl")
        if len(specs) != 1:
            raise BadRequest("dedup_key is for a one-job publish", "dedup_key")
    if idem is not None:
        problem = names.idempotency_key(idem.key)
        if problem:
            raise BadRequest(problem, "Idempotency-Key")
        if len(idem.fingerprint) != 16:
            raise BadRequest("invalid request fingerprint", "Idempotency-Key")
