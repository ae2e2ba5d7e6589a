"""A small in-memory reference model of one namespace's queues (SPEC §1-§2), for tests/engine/test_model.py.

Each job is a record: state, due (for ready: the time that orders it after priority), wheel
bucket start (delayed jobs still resting in the time wheel), ttr deadline, tries left,
deliveries, ttl end, the delivery that holds it. The model mirrors *when* the engine moves jobs
(lazily: a consume or a pump step at time ``now`` promotes, expires and opens what is due by
then), so that every physical state, size and count can be compared exactly.

Groups are modelled as the scripts act on them (tests/support/model_groups.py, a mixin of
``Model``): fair tags, holding back and bringing back, rate turns and wake-ups, every move in
the scripts' order. What the scripts keep beside the jobs (each group's last tag, each rate's
next allowed delivery, each wake-up) is ``Model.hidden``; the observation compares it with
Redis after every step, and every ready grouped job's tag with its READY score. The records
(``MJob``, ``GConf``) are in tests/support/model_job.py.

Where the engine's outcome is unknown (a 503, a lost reply), the model keeps alternatives per
job (``Model.alts``, and ``Model.hidden_alts`` for what is kept beside the jobs) and the next
observation (peek_job of every job, after every step) picks the one that happened. An outcome
whose tags cannot be known (a consume whose reply was lost: which jobs it took or held) is
``loose``: the observation takes its tag and holding from the engine.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from cluster_dq.backoff import Backoff
from cluster_dq.keys import BUCKET_WIDTH_MS
from tests.support.model_groups import GroupRules
from tests.support.model_job import (
    DEAD,
    DELAYED,
    EVENTS,
    OPEN_LEAD_MS,
    PRIO_SHIFT,
    READY,
    RESERVED,
    GConf,
    GKey,
    Hidden,
    Key,
    Mismatch,
    MJob,
)
from tests.support.model_keyed import Kept, KeyedRules

__all__ = [  # (the records are re-exported: the test imports the model from here)
    "DEAD",
    "DELAYED",
    "EVENTS",
    "OPEN_LEAD_MS",
    "PRIO_SHIFT",
    "READY",
    "RESERVED",
    "GConf",
    "GKey",
    "Hidden",
    "Key",
    "Mismatch",
    "MJob",
    "Model",
]


@dataclass
class Model(GroupRules, KeyedRules):
    remember_acked_ms: int
    jobs: dict[Key, MJob | None] = field(default_factory=dict)  # None: gone, not yet observed
    alts: dict[Key, list[MJob | None]] = field(default_factory=dict)  # other allowed outcomes
    acked: dict[Key, int] = field(default_factory=dict)  # client ids acked -> when
    paused: set[str] = field(default_factory=set)  # queues whose CONF says paused
    max_size: dict[str, int] = field(default_factory=dict)  # CONF max_size per queue
    backoff: dict[str, Backoff] = field(default_factory=dict)  # CONF backoff per queue
    # a simple or debounce key's job (queue, key) -> job id (NOTES `k:<key>`); it holds the key
    # while it exists, carries that key and is not dead (tests/support/model_keyed.py)
    dedup: dict[tuple[str, str], str] = field(default_factory=dict)
    # KEYED: throttle windows (`t:<key>`) and Idempotency-Keys' answers (`i:<key>`) per queue
    keyed: dict[tuple[str, str], Kept] = field(default_factory=dict)
    gconf: dict[GKey, GConf] = field(default_factory=dict)  # kept by a destroy, as CONF
    # a group's last tag and its busy period, while it has jobs; group "": the queue's period
    tags: dict[GKey, Any] = field(default_factory=dict)
    tat: dict[GKey, float] = field(default_factory=dict)  # a rate's earliest next delivery
    wake: dict[GKey, int] = field(default_factory=dict)  # a rate's wake-up (its next turn)
    hidden_alts: list[Hidden] = field(default_factory=list)  # other allowed `hidden()`
    hidden_unknown: bool = False  # the next observation takes `hidden()` from the engine
    # publish.lua reads READY's head of each priority once per call (the first time that
    # priority has a job): ``batched`` while the model places a publish's jobs, ``head`` what
    # it read, by priority
    batched: bool = False
    head: dict[int, int] = field(default_factory=dict)

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
        """The job leaves (and with its group's last job, the group's last tag and wake-up)."""
        self.jobs[(j.queue, j.job_id)] = None
        if j.group is not None and not any(o.group == j.group for o in self.of(j.queue)):
            self.tags.pop((j.queue, j.group), None)
            self.wake.pop((j.queue, j.group), None)
            if not any(o.group is not None for o in self.of(j.queue)):
                self.tags.pop((j.queue, ""), None)  # the busy period, with the last group

    def hidden(self) -> Hidden:
        return (
            tuple(sorted(self.tags.items())),
            tuple(sorted(self.tat.items())),
            tuple(sorted(self.wake.items())),
        )

    def set_hidden(self, h: Hidden) -> None:
        self.tags, self.tat, self.wake = dict(h[0]), dict(h[1]), dict(h[2])

    def allow_world(self, before: Model) -> None:
        """Every job as ``before`` had it, and what it kept beside them, allowed too (an
        outcome the engine's answer leaves unknown)."""
        for key in set(self.jobs) | set(before.jobs):
            self.allow(key, before.jobs.get(key))
        self.hidden_alts.append(before.hidden())

    # -- what the scripts do on the way (mirrors the libs of lua/lib) -----------------------------

    def retry_wait(self, j: MJob) -> int:
        """lib/retry.lua retry_wait: its own backoff, else its queue's (jitter 0 here)."""
        b = j.backoff or self.backoff.get(j.queue)
        return b.wait_ms(j.deliveries, 0.0) if b else 0

    def retry(self, j: MJob, now: int) -> None:
        """lib/retry.lua retry: a failed attempt with tries left waits out its backoff (its
        own, else its queue's; jitter 0 here) in DELAYED, or is READY at once; gone when its
        ttl ends before the backoff does."""
        wait = self.retry_wait(j)
        if wait > 0 and j.expire_at and now + wait >= j.expire_at:
            self.gone(j)
        elif wait > 0:
            j.state, j.due = DELAYED, now + wait
        else:
            self.make_ready(j, now)

    def expire_reservations(self, q: str, now: int) -> None:
        due = [j for j in self.of(q, RESERVED) if j.deadline <= now]
        for j in sorted(due, key=lambda j: (j.deadline, j.member())):
            j.holder, j.lease = None, None
            if j.expired(now):
                self.gone(j)
            elif j.tries > 0:
                self.retry(j, now)
            else:
                j.state, j.died, j.reason = DEAD, now, "ttr_expired"
            self.unreserve(j, now)

    def promote(self, q: str, now: int) -> None:
        """lib/promote.lua: the groups' wake-ups due, then DELAYED's jobs due."""
        self.wake_groups(q, now)
        due = [j for j in self.of(q, DELAYED) if j.wheel is None and j.due <= now]
        for j in sorted(due, key=lambda j: (j.due, j.member())):
            if j.expired(now):
                self.gone(j)
            else:
                self.make_ready(j, j.due)

    def open_buckets(self, q: str, now: int) -> None:
        for j in self.of(q, DELAYED):
            if j.wheel is not None and j.wheel <= now + OPEN_LEAD_MS:
                if j.expired(now):
                    self.gone(j)
                else:
                    j.wheel = None

    def forget(self, j: MJob, t: int) -> str:
        """lib/jobs.lua forget: the job dropped, then its turn handed on when it was in READY
        (not held back) or RESERVED. Returns the state it was in."""
        was = j.state
        self.gone(j)
        if was == READY and not j.held:
            self.let_one_go(j.queue, j.group, t)
        elif was == RESERVED:
            self.unreserve(j, t)
        return was

    def expire_ttl(self, q: str, now: int) -> None:
        due = [j for j in self.of(q) if j.state != DEAD and j.wheel is None and j.expired(now)]
        for j in sorted(due, key=lambda j: (j.expire_at, j.member())):
            if self.jobs.get((q, j.job_id)) is j:
                self.forget(j, now)

    def stale(self, q: str, now: int) -> bool:
        """A wheel bucket that should already be open (consume then does the pump's step)."""
        starts = [j.wheel for j in self.of(q, DELAYED) if j.wheel is not None]
        return bool(starts) and min(starts) - OPEN_LEAD_MS <= now

    def tick(self, q: str, picked: int, now: int, first: int | None = None) -> None:
        """The pump's step as ``ops.tick`` runs it: promote, expire reservations and ttls (at
        ``first``, else ``now``); then, when a wheel bucket is to open by ``picked`` (its own
        time; an earlier one when a step of it was repeated later), open it and run them again
        (at ``now``). A job whose ttl ended meanwhile is dropped by the next ``expire_ttl``."""
        at = now if first is None else first
        self.promote(q, at)
        self.expire_reservations(q, at)
        self.expire_ttl(q, at)
        if any(j.wheel is not None and j.wheel <= picked + OPEN_LEAD_MS for j in self.of(q)):
            self.open_buckets(q, picked)
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
        group: str | None = None,
        dedup_key: str | None = None,
        debounced: bool = False,
    ) -> str:
        """A new job (the caller checked it is not a duplicate); its published state. ``base``:
        the request's time (due and ttl count from it); ``now``: when the script ran (a
        retried step is stamped afresh); ``wheel``: whether it may rest in the wheel (a job
        published under a dedup key never does); ``dedup_key``: the simple or debounce key its
        record carries; ``debounced``: a debounce's job, whose record carries its due time. A grouped job made ready takes its fair tag from its due time
        (publish.lua: make_ready at due)."""
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
            group=group,
            dedup_key=dedup_key,
            published=base,
            scheduled=due if debounced else None,
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
        if j.state == READY:
            j.state = "new"  # (in no set while its place is found)
            self.make_ready(j, due)
        return j.state

    def remove(self, q: str, job_id: str, now: int) -> str | None:
        """Ack / delete in any state; the state it was in."""
        j = self.jobs.get((q, job_id))
        if j is None:
            return None
        self.acked[(q, job_id)] = now
        return self.forget(j, now)

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
        was, held = j.state, j.held
        j.wheel, j.held, j.state = None, False, "moving"  # out of its wheel bucket, or HELD
        j.due_moved(max(due, now))
        if was == READY and not held:
            self.let_one_go(q, j.group, now)  # (unready: it hands its turn on)
        if due > now:
            j.state, j.due = DELAYED, due
        else:
            self.make_ready(j, now)
        return ""

    def reserve(
        self, j: MJob, now: int, ttr: int, delivery: int | None, lease: str | None = None
    ) -> None:
        j.state, j.deadline, j.holder, j.lease = RESERVED, now + ttr, delivery, lease
        j.tries -= 1
        j.deliveries += 1
        j.held = False

    def consume_script(
        self, q: str, now: int, ttr: int, got: list[Any], need: int, delivery: int | None
    ) -> int:
        """consume.lua on ``q``: what it delivers, checked against the engine's choice ``got``
        (in its order; the jobs of a later call may follow) and applied. Returns how many
        of ``got`` this call delivered. READY is popped in batches (as many as are still
        wanted, in score then member order); of a batch, an expired job is dropped (its turn
        handed on), a grouped job held back (its group paused, at its concurrency limit, or
        its rate's turn not come: its wake-up then registered), the rest reserved."""
        self.expire_reservations(q, now)
        self.promote(q, now)
        if q in self.paused:
            need = 0  # a paused queue hands out nothing (its jobs still move on in time)
        order: list[Any] = []  # (for a mismatch's message)
        taken: list[MJob] = []
        while len(taken) < need:
            ready = sorted((j for j in self.of(q, READY) if not j.held), key=MJob.order)
            batch = ready[: need - len(taken)]
            if not batch:
                break
            order += [(j.job_id, j.group, j.rank()) for j in batch]
            for j in batch:
                j.state = "popped"  # (ZPOPMIN: out of READY, the batch at once)
            for j in batch:
                g = j.group
                if j.expired(now):
                    self.gone(j)
                    self.let_one_go(q, g, now)
                    continue
                if g is not None:
                    room, turn = self.room(q, g), 0
                    if room > 0 and self.conf(q, g).rate is not None:
                        turn = self.rate_turn(q, g, now)
                    if turn > 0 or room <= 0:
                        EVENTS[f"group: job held back ({'rate' if turn else 'limit'})"] += 1
                        self.hold(j, turn)
                        continue
                lease = got[len(taken)].lease if len(taken) < len(got) else None
                self.reserve(j, now, ttr, delivery, lease)
                taken.append(j)
        want = [j.job_id for j in taken]
        if [x.job_id for x in got[: len(taken)]] != want:
            raise Mismatch(
                f"consume of {q} at {now} delivered {[x.job_id for x in got]}, the model "
                f"{want} (popped in order: {order})"
            )
        return len(taken)

    def unknown_consume(self, queues: list[str], now: int, ttr: int) -> None:
        """A consume whose answer was lost: any job of these queues may have been reserved
        (held by nobody), held back by its group, or not; the pre-steps may have happened, or
        not. Which tags the jobs took is unknown (``loose``), and so is what the scripts keep
        beside them."""
        for q in queues:
            before = {(j.queue, j.job_id): copy.deepcopy(j) for j in self.of(q)}
            self.tick(q, now, now)
            for key, old in before.items():
                after = self.jobs.get(key)
                self.allow(key, old)
                if after is None:
                    self.allow(key, None)
                    self.jobs[key] = old
                    continue
                if after.state == READY and not after.expired(now) and q not in self.paused:
                    taken = copy.deepcopy(after)
                    self.reserve(taken, now, ttr, None)
                    self.allow(key, taken)
                    if after.group is not None:
                        held = copy.deepcopy(after)
                        held.loose, held.held = True, True
                        self.allow(key, held)
                after = copy.deepcopy(after)
                after.loose = after.group is not None and after.state == READY
                self.allow(key, after)
                self.jobs[key] = old
        self.hidden_unknown = True
