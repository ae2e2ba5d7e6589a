"""The client's typed results: frozen dataclasses decoded from the service's JSON (times in
float seconds; ``*_at`` fields are epoch seconds)."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Job:
    """A job as consume, peek, get_job, bury, kick and reschedule answer it. ``ttl``: seconds
    left before it expires (0: never); ``lease``: this delivery's token (consume only);
    ``result``: a job acked with a result (``state == "acked"``, no body)."""

    namespace: str
    queue: str
    id: str
    body: bytes
    ttl: float
    elapsed_ms: int
    remain_tries: int
    # hash=False: a Job hashes (sets, dict keys) though these may hold dicts
    attributes: dict[str, str] | None = field(default=None, hash=False)
    state: str | None = None
    deliveries: int = 0
    lease: str | None = None
    progress: Any = field(default=None, hash=False)
    last_error: str | None = None
    next_attempt_at: float | None = None
    reason: str | None = None
    died_at: float | None = None
    result: Any = field(default=None, hash=False)
    dedup_key: str | None = None  # get_job: the dedup key it was published under
    group: str | None = None  # the group it was published in (None: none)

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return _json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Publication:
    """What a publish did (``publish_outcome``): ``dedup`` is None without a dedup key, else
    ``"new"``, ``"existing"`` (the key's job answered, nothing written) or ``"replaced"`` (the
    key's waiting job got this body and due time: debounce); ``duplicate``: the ``job_id``
    given exists already; ``replayed``: the first answer to this Idempotency-Key."""

    job_id: str
    dedup: str | None = None
    duplicate: bool = False
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Sizes:
    """Jobs of a queue per state, exact at the time of the look."""

    ready: int
    delayed: int
    reserved: int
    dead: int

    @property
    def total(self) -> int:
        return self.ready + self.delayed + self.reserved + self.dead


@dataclass(frozen=True, slots=True)
class DeadJob:
    """One entry of the dead-letter listing (no body)."""

    id: str
    reason: str
    died_at: float | None
    deliveries: int
    last_error: str | None
    size: int
    published_at: float | None
    attributes: dict[str, str] | None = field(default=None, hash=False)


@dataclass(frozen=True, slots=True)
class DeadPage:
    jobs: list[DeadJob]
    cursor: str | None
    more: bool


@dataclass(frozen=True, slots=True)
class Sweep:
    """One bounded step of a redrive or purge: call again with ``cursor`` while ``more``."""

    count: int
    more: bool
    cursor: str | None


@dataclass(frozen=True, slots=True)
class Backoff:
    """A retry backoff: ``kind`` is ``fixed`` or ``exponential`` (``none`` on a publish: no
    backoff, whatever the queue's); ``base`` and ``cap`` in seconds (cap 0: none)."""

    kind: str
    base: float = 0.0
    cap: float = 0.0
    jitter: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's own settings (None: not set, the service's default applies)."""

    namespace: str
    queue: str
    paused: bool
    ttr: float | None
    tries: int | None
    max_size: int | None
    backoff: Backoff | None


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue of the namespace listing. ``oldest_due_at``: the due time of the next ready
    job (epoch s), ``lateness``: how late it is (s); both None when nothing is ready."""

    name: str
    ready: int
    delayed: int
    reserved: int
    dead: int
    paused: bool
    oldest_due_at: float | None
    lateness: float | None


@dataclass(frozen=True, slots=True)
class QueuePage:
    queues: list[QueueInfo]
    cursor: str | None  # None: the last page


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group of a queue: ``size`` its jobs in every state, ``reserved`` those being worked
    on, ``held`` its ready jobs held back by its pause, concurrency limit or rate. ``concurrency``:
    at most this many reserved at once; ``rate``: at most ``<jobs>/<window>ms`` deliveries
    (``"100/1000ms"``); None: no limit."""

    namespace: str
    queue: str
    name: str
    size: int
    reserved: int
    held: int
    paused: bool
    concurrency: int | None
    rate: str | None


@dataclass(frozen=True, slots=True)
class GroupPage:
    """A page of the groups that hold jobs (a group with settings but no job is not listed)."""

    groups: list[GroupInfo]
    cursor: str | None  # None: the last page


@dataclass(frozen=True, slots=True)
class ScheduleJob:
    body: str = ""
    delay: float = 0.0
    ttl: float | None = None
    tries: int | None = None
    priority: int = 0
    group: str | None = None  # each occurrence's job's group


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring job: ``cron`` (with ``tz``) or ``every`` seconds from ``start_at``.
    ``next_at``: the next occurrence (epoch s; None while paused)."""

    namespace: str
    queue: str
    name: str
    cron: str | None
    tz: str | None
    every: float | None
    start_at: float | None
    catch_up: float
    paused: bool
    next_at: float | None
    fired: int
    missed: int
    job: ScheduleJob = field(default_factory=ScheduleJob)


@dataclass(frozen=True, slots=True)
class SchedulePage:
    schedules: list[Schedule]
    cursor: str | None  # None: the last page


@dataclass(frozen=True, slots=True)
class TokenLimit:
    """A token's rate limit: ``read`` / ``write`` requests per ``interval`` seconds."""

    namespace: str
    token: str
    read: int
    write: int
    interval: int


@dataclass(frozen=True, slots=True)
class HeldJob:
    """A job a worker holds, as its announcement lists it."""

    queue: str
    job_id: str
    started_at: float | None = None  # epoch seconds


@dataclass(frozen=True, slots=True)
class WorkerPage:
    """``workers()``: the workers by id; ``truncated``: the service answered at most 4 MiB of
    announcements, and more workers are announced than it listed."""

    workers: list[WorkerInfo]
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker as ``workers()`` lists it: who, where, what it consumes and holds; times in
    epoch seconds. A worker that stopped or died is not listed (its announcement ran out)."""

    worker_id: str
    last_seen: float
    expires_at: float
    host: str | None = None
    pid: int | None = None
    version: str | None = None
    started_at: float | None = None
    queues: tuple[str, ...] = ()
    concurrency: int | None = None
    in_flight: tuple[HeldJob, ...] = ()
