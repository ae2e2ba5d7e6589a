"""A small in-memory reference model of one namespace's queues (SPEC §1-§2), for tests/engine/test_model.py.

Each job is a record: state, due (for ready: the time that orders it after priority), wheel
bucket start (delayed jobs still resting in the time wheel), ttr deadline, tries left,
deliveries, ttl end, the delivery that holds it. The model mirrors *when* the engine moves jobs
(lazily: a consume or a pump step at time ``now`` promotes, expires and opens what is due by
then), so that every physical state, size and count can be compared exactly.

Where the engine has a free choice (jobs with equal score, an unknown outcome behind a 503),
the model keeps alternatives per job (``Model.alts``) and the next observation (peek_job of
every job, after every step) picks the one that happened.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from cluster_dq.backoff import Backoff
from cluster_dq.keys import BUCKET_WIDTH_MS

DELAYED, READY, RESERVED, DEAD = "delayed", "ready", "reserved", "dead"
PRIO_SHIFT = 2**42
OPEN_LEAD_MS = 5_000


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

    def score(self) -> int:
        """What peek_job reports as the job's time in its state (a ready job: its due time,
        its score masked of the priority, which orders the ready set: ``rank``)."""
        if self.state == RESERVED:
            return self.deadline
        if self.state == DEAD:
            return self.died
        return self.due

    def rank(self) -> int:
        return (255 - self.priority) * PRIO_SHIFT + self.due

    def expired(self, now: int) -> bool:
        return 0 < self.expire_at <= now

    def held_by(self, delivery: int | None, now: int) -> bool:
        return self.state == RESERVED and self.holder == delivery and self.deadline > now


Key = tuple[str, str]  # (queue, job id)


@dataclass
class Model:
    remember_acked_ms: int
    jobs: dict[Key, MJob | None] = field(default_factory=dict)  # None: gone, not yet observed
    alts: dict[Key, list[MJob | None]] = field(default_factory=dict)  # other allowed outcomes
    acked: dict[Key, int] = field(default_factory=dict)  # client ids acked -> when
    paused: set[str] = field(default_factory=set)  # queues whose CONF says paused
    max_size: dict[str, int] = field(default_factory=dict)  # CONF max_size per queue
    backoff: dict[str, Backoff] = field(default_factory=dict)  # CONF backoff per queue
    dedup: dict[tuple[str, str], str] = field(default_factory=dict)  # (queue, key) -> job id

    def dedup_holder(self, q: str, key: str) -> tuple[str | None, bool, bool]:
        """A simple dedup key's job, and whether it may hold the key (alive: delayed, ready
        or reserved) and whether it may not (gone or dead), over the outcomes still allowed."""
        held = self.dedup.get((q, key))
        if held is None:
            return None, False, True
        outcomes = [self.jobs.get((q, held)), *self.alts.get((q, held), [])]
        alive = [j is not None and j.state != DEAD for j in outcomes]
        return held, any(alive), not all(alive)

    def copy(self) -> Model:
        return copy.deepcopy(self)

    def of(self, q: str, state: str | None = None) -> list[MJob]:
        return [
            j
            for j in self.jobs.values()
            if j is not None and j.queue == q and (state is None or j.state == state)
        ]

    def allow(self, key: Key, alt: MJob | None) -> None:
        """Another outcome for ``key`` that the next observation may find."""
        self.alts.setdefault(key, []).append(copy.deepcopy(alt))

    def gone(self, j: MJob) -> None:
        self.jobs[(j.queue, j.job_id)] = None

    # -- what the scripts do on the way (mirrors the libs of lua/lib) -----------------------------

    def retry(self, j: MJob, now: int) -> None:
        """lib/retry.lua retry: a failed attempt with tries left waits out its backoff (its
        own, else its queue's; jitter 0 here) in DELAYED, or is READY at once."""
        b = j.backoff or self.backoff.get(j.queue)
        wait = b.wait_ms(j.deliveries, 0.0) if b else 0
        j.state, j.due = (DELAYED, now + wait) if wait > 0 else (READY, now)

    def expire_reservations(self, q: str, now: int) -> None:
        for j in self.of(q, RESERVED):
            if j.deadline <= now:
                j.holder, j.lease = None, None
                if j.expired(now):
                    self.gone(j)
                elif j.tries > 0:
                    self.retry(j, now)
                else:
                    j.state, j.died, j.reason = DEAD, now, "ttr_expired"

    def promote(self, q: str, now: int) -> None:
        for j in self.of(q, DELAYED):
            if j.wheel is None and j.due <= now:
                if j.expired(now):
                    self.gone(j)
                else:
                    j.state = READY

    def open_buckets(self, q: str, now: int) -> None:
        for j in self.of(q, DELAYED):
            if j.wheel is not None and j.wheel <= now + OPEN_LEAD_MS:
                if j.expired(now):
                    self.gone(j)
                else:
                    j.wheel = None

    def expire_ttl(self, q: str, now: int) -> None:
        for j in self.of(q):
            if j.state != DEAD and j.wheel is None and j.expired(now):
                self.gone(j)

    def stale(self, q: str, now: int) -> bool:
        """A wheel bucket that should already be open (consume then does the pump's step)."""
        starts = [j.wheel for j in self.of(q, DELAYED) if j.wheel is not None]
        return bool(starts) and min(starts) - OPEN_LEAD_MS <= now

    def tick(self, q: str, now: int) -> None:
        self.open_buckets(q, now)
        self.promote(q, now)
        self.expire_reservations(q, now)
        self.expire_ttl(q, now)

    # -- requests ---------------------------------------------------------------------------

    def duplicate(self, q: str, job_id: str, now: int) -> bool:
        if self.jobs.get((q, job_id)) is not None:
            return True
        at = self.acked.get((q, job_id))
        return at is not None and now - at < self.remember_acked_ms

    def full(self, q: str, new: int, leaving: int = 0) -> bool:
        """publish.lua / republish.lua: ``new`` jobs would take ``q`` past its max_size (every
        state counts, wheel included; ``leaving``: jobs the same call removes). A call that
        adds nothing (duplicates only) is never refused, even by a queue over a lowered cap."""
        cap = self.max_size.get(q)
        return cap is not None and new > 0 and len(self.of(q)) - leaving + new > cap

    def place(
        self,
        q: str,
        job_id: str,
        client: bool,
        base: int,
        now: int,
        delay: int,
        ttl: int,
        tries: int,
        priority: int,
        backoff: Backoff | None = None,
        wheel: bool = True,
    ) -> str:
        """A new job (the caller checked it is not a duplicate); its published state. ``base``:
        the request's time (due and ttl count from it); ``now``: when the script ran (a
        retried step is stamped afresh); ``wheel``: whether it may rest in the wheel (a job
        published under a dedup key never does)."""
        due = base + delay
        start = due - due % BUCKET_WIDTH_MS
        j = MJob(
            q,
            job_id,
            READY if due <= now else DELAYED,
            due,
            priority,
            tries,
            0,
            base + ttl if ttl else 0,
            client_id=client,
            backoff=backoff,
        )
        # only priority-0 jobs rest in the wheel (a priority job must not wait behind a backlog)
        if (
            wheel
            and j.state == DELAYED
            and not client
            and priority == 0
            and start > base + OPEN_LEAD_MS
        ):
            j.wheel = start
        self.jobs[(q, job_id)] = j
        self.alts.pop((q, job_id), None)
        return j.state

    def remove(self, q: str, job_id: str, now: int) -> str | None:
        """Ack / delete in any state; the state it was in."""
        j = self.jobs.get((q, job_id))
        if j is None:
            return None
        self.gone(j)
        self.acked[(q, job_id)] = now
        return j.state

    def lease_check(self, q: str, job_id: str, lease: str, now: int) -> str | None:
        """Why ``lease`` does not hold the job ('' when it does): lua lease_check's names."""
        j = self.jobs.get((q, job_id))
        if j is None:
            return "gone"
        if j.state == RESERVED:
            if j.lease != lease:
                return "reserved"
            return "ttr_expired" if j.deadline <= now else ""
        return j.state

    def reschedule(self, q: str, job_id: str, due: int, now: int) -> str:
        """reschedule_job.lua: '' when done, else why not (gone, forbidden, too_late)."""
        j = self.jobs.get((q, job_id))
        if j is None:
            return "gone"
        if j.state not in (READY, DELAYED):
            return "forbidden"
        if j.expire_at and max(due, now) >= j.expire_at:
            return "too_late"
        j.wheel = None  # out of its wheel bucket, into the delayed zset (or ready)
        j.state, j.due = (DELAYED if due > now else READY), due
        return ""

    def reserve(
        self, j: MJob, now: int, ttr: int, delivery: int | None, lease: str | None = None
    ) -> None:
        j.state, j.deadline, j.holder, j.lease = RESERVED, now + ttr, delivery, lease
        j.tries -= 1
        j.deliveries += 1

    def consume_script(
        self, q: str, now: int, ttr: int, got: list[Any], need: int, delivery: int | None
    ) -> None:
        """consume.lua on ``q``: checks the engine's choice ``got`` (in its order) and applies it."""
        self.expire_reservations(q, now)
        self.promote(q, now)
        if q in self.paused:
            need = 0  # a paused queue hands out nothing (its jobs still move on in time)
        ready = self.of(q, READY)
        live = [j for j in ready if not j.expired(now)]
        by_key = {(j.queue, j.job_id): j for j in ready}
        chosen: list[MJob] = []
        for g in got:
            m = by_key.get((g.queue, g.job_id))
            if m is None or m.expired(now):
                raise Mismatch(
                    f"consume delivered {g.job_id} of {q}, not a live ready job (model: "
                    f"{self.jobs.get((g.queue, g.job_id))})"
                )
            chosen.append(m)
        if len(chosen) > need:
            raise Mismatch(f"consume delivered {len(chosen)} jobs of {q}, asked for {need}")
        if len({id(c) for c in chosen}) != len(chosen):
            raise Mismatch("consume delivered a job twice in one answer")
        ranks = [c.rank() for c in chosen]
        if ranks != sorted(ranks):
            raise Mismatch(f"consume of {q} out of priority/due order: {ranks}")
        rest = [j for j in live if all(j is not c for c in chosen)]
        if len(chosen) < need:
            if rest:
                raise Mismatch(
                    f"consume of {q} left live ready jobs behind: {[j.job_id for j in rest]}"
                )
            for j in ready:
                if j.expired(now):
                    self.gone(j)
        elif chosen:
            top = ranks[-1]
            if any(j.rank() < top for j in rest):
                raise Mismatch(
                    f"consume of {q} skipped a better job: {[j.job_id for j in rest if j.rank() < top]}"
                )
            for j in ready:
                if j.expired(now):
                    if j.rank() == top:
                        self.allow((j.queue, j.job_id), j)  # a tie: popped (gone) or not
                        self.gone(j)
                    elif j.rank() < top:
                        self.gone(j)
        for c, g in zip(chosen, got):
            self.reserve(c, now, ttr, delivery, g.lease)

    def unknown_consume(self, queues: list[str], now: int, ttr: int) -> None:
        """A consume whose answer was lost: any job of these queues may have been reserved
        (held by nobody), or not; the pre-steps may have happened, or not."""
        for q in queues:
            before = {(j.queue, j.job_id): copy.deepcopy(j) for j in self.of(q)}
            self.tick(q, now)
            for key, old in before.items():
                after = self.jobs.get(key)
                self.allow(key, old)
                if (
                    after is not None
                    and after.state == READY
                    and not after.expired(now)
                    and q not in self.paused
                ):
                    taken = copy.deepcopy(after)
                    self.reserve(taken, now, ttr, None)
                    self.allow(key, taken)
                if after is not None:
                    self.allow(key, after)
                    self.jobs[key] = old
                else:
                    self.allow(key, None)
                    self.jobs[key] = old
