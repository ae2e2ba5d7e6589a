"""The reference model's records (tests/support/model_ref.py): a job as the model keeps it
(``MJob``), a group's settings (``GConf``), the names of the states, and what a mismatch
raises."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from cluster_dq.backoff import Backoff
from cluster_dq.models import id_due_ms, id_to_member, is_wheel_member

DELAYED, READY, RESERVED, DEAD = "delayed", "ready", "reserved", "dead"
PRIO_SHIFT = 2**42
OPEN_LEAD_MS = 5_000


# What the model saw happen to groups, over a run (the test prints it: how deep it went)
EVENTS: Counter[str] = Counter()


class Mismatch(AssertionError):
    """The engine did something the model does not allow."""


@dataclass
class MJob:
    queue: str
    job_id: str
    state: str
    due: int  # delayed: due ms; ready: the time in its score; reserved/dead: as before
    priority: int
    tries: int  # tries left
    deliveries: int
    expire_at: int  # 0: never
    wheel: int | None = None  # bucket start while it rests in the wheel
    deadline: int = 0  # reserved: ttr deadline
    died: int = 0  # dead: time of death
    holder: int | None = None  # reserved: the delivery (consume number) holding it
    client_id: bool = False
    lease: str | None = None  # reserved: the lease of the delivery holding it (None: unknown)
    reason: str = ""  # dead: why it died (ttr_expired, tries_exhausted, buried)
    error: str = ""  # the last error text it was given (a bury's, a release's); kept after
    backoff: Backoff | None = None  # its own retry backoff (else its queue's)
    group: str | None = None
    dedup_key: str | None = None  # the simple or debounce key its record carries
    held: bool = False  # ready, but held back by its group (HELD): no score
    loose: bool = False  # an unknown outcome: tag and holding as the engine has them
    published: int = 0  # the record's publish time (a grouped ready job's due time, for a
    # client id, whose id holds none)
    scheduled: int | None = None  # the due time its record carries (a debounce's job: its last
    # debounce's; a job a reschedule or a revival moved), which peek_job reports for it grouped

    def score(self) -> int | None:
        """What peek_job reports as the job's time in its state (a ready job: its score masked
        of the priority, which orders the ready set: ``order``; a grouped one's is its fair
        tag, and peek_job reports the due time its record carries instead, else the one in its
        id, or its publish time for a client's id; None while its group holds it back)."""
        if self.state == RESERVED:
            return self.deadline
        if self.state == DEAD:
            return self.died
        if self.held:
            return None
        if self.state == READY and self.group is not None:
            if self.scheduled is not None:
                return self.scheduled
            member = self.member()
            return id_due_ms(member) if is_wheel_member(member) else self.published
        return self.due

    def due_moved(self, due: int) -> None:
        """A reschedule or a revival (kick, respawn, redrive): the record carries its new due
        time, unless it has none and its id carries that one (lib/record.lua with_due)."""
        member = self.member()
        if self.scheduled is None and is_wheel_member(member) and id_due_ms(member) == due:
            return
        self.scheduled = due

    def rank(self) -> int:
        return (255 - self.priority) * PRIO_SHIFT + self.due

    def member(self) -> bytes:
        return id_to_member(self.job_id)

    def order(self) -> tuple[int, bytes]:
        """Its place in READY: the score, then the member's bytes (a ZSET's order for ties)."""
        return self.rank(), self.member()

    def expired(self, now: int) -> bool:
        return 0 < self.expire_at <= now

    def held_by(self, delivery: int | None, now: int) -> bool:
        return self.state == RESERVED and self.holder == delivery and self.deadline > now


Key = tuple[str, str]  # (queue, job id)
GKey = tuple[str, str]  # (queue, group)
# What the scripts keep beside the jobs: each group's last tag (GROUPS `t:<g>`), each rate's
# earliest next delivery (GCONF `a:<g>`), each group's rate wake-up (GWAKE)
Hidden = tuple[
    tuple[tuple[GKey, int], ...], tuple[tuple[GKey, float], ...], tuple[tuple[GKey, int], ...]
]


@dataclass
class GConf:
    """A group's settings (GCONF)."""

    paused: bool = False
    concurrency: int | None = None
    rate: tuple[int, int] | None = None  # (jobs, per ms)
