"""The model-based test's deliveries and what settles them (tests/engine/test_model.py):
consume, ack (batch, leases), republish, touch, release and bury; each checked against the
model.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from cluster_dq.errors import (
    Conflict,
    NotFound,
    PoolUnavailable,
    QueueFull,
    WrongState,
)
from cluster_dq.models import JobSpec, JobState
from tests.support.model_harness import (
    NS,
    QUEUES,
    STATS,
    TOLERATE,
    Fault,
    delays,
    groups,
    ids,
    note,
    picks,
    prios,
    tick_at,
    ttls,
    ttrs,
)
from tests.support.model_machine import ModelMachine
from tests.support.model_ref import (
    DEAD,
    DELAYED,
    READY,
    RESERVED,
    Mismatch,
    Model,
)


class DeliveryRules(ModelMachine):
    @rule(
        queues=st.sampled_from([["a"], ["b"], ["a", "b"], ["b", "a"]]),
        ttr=ttrs,
        count=st.integers(1, 3),
    )
    def consume_again(self, queues: list[str], ttr: int, count: int) -> None:
        self.consume(queues, ttr, count)  # a second rule: consumers are the busiest clients

    @rule(
        queues=st.sampled_from([["a"], ["b"], ["a", "b"], ["b", "a"]]),
        ttr=ttrs,
        count=st.integers(1, 3),
    )
    def consume(self, queues: list[str], ttr: int, count: int) -> None:
        t0 = self.clock.now
        got, err = self.request("consume", self.svc.consume(self.route, NS, queues, ttr, count, 0))
        f = self.fired()
        if err is None and not got and f is not None and f.kind == "lost":
            # A consume whose reply was lost is answered "no job", not repeated: what it may
            # have reserved comes back after its ttr (engine/core.py, reserved_nothing).
            STATS["no job after a lost consume reply"] += 1
            for now in self.stamps(t0)[:1]:
                self.model.unknown_consume(queues, now, ttr)
            return
        if err is not None:
            assert isinstance(err, PoolUnavailable), err
            f = self.fired()
            if f is None:
                raise Mismatch(f"consume answered 503 without a fault: {err}")
            if f.kind in Fault.REFUSALS and f.step == "consume":
                raise Mismatch(
                    f"a consume refused before it ran ({f.kind}) must be repeated: {err}"
                )
            if f.step == "signal" and "signal-503" not in TOLERATE:
                raise Mismatch(
                    f"a failed shard signal after a consume answered 503 (issue 13 #5): {err}"
                )
            if f.kind == "lost" and "may" not in str(err) and "consume-503-text" not in TOLERATE:
                raise Mismatch(
                    f"a consume whose script ran and whose reply was lost answered a 503 that "
                    f"does not say the outcome is unknown (SPEC §2.7): {err}"
                )
            STATS["503 consume"] += 1
            for now in self.stamps(t0)[:1]:
                self.model.unknown_consume(queues, now, ttr)
            return
        self.deliveries += 1
        delivery = self.deliveries
        STATS["jobs delivered"] += len(got)
        STATS["jobs delivered, grouped"] += sum(1 for j in got if j.group is not None)
        note(f"consume #{delivery} -> {[(j.queue, j.job_id, j.lease) for j in got]}")
        for j in got:
            if j.lease is None or len(j.lease) != 16 or any(j.lease == x[2] for x in self.leases):
                raise Mismatch(
                    f"delivery of {j.job_id} carries lease {j.lease!r}: not a fresh 16-hex lease"
                )
            self.leases.append((j.queue, j.job_id, j.lease))

        def apply(m: Model, when: tuple[tuple[int, int, int], ...]) -> None:
            rest = list(got)
            for q, (now, first, then) in zip(queues, when):
                need = count - (len(got) - len(rest))
                if need <= 0:
                    break
                mine = [j for j in rest if j.queue == q]
                if q in m.paused:
                    STATS["consume of a paused queue"] += 1
                # attempt 0, then (fewer than needed and a bucket overdue) the pump's step and
                # attempt 1
                k = m.consume_script(q, now, ttr, mine, need, delivery)
                if k < need and m.stale(q, now):
                    tick_at(m, q, now, then, first)  # the buckets picked by the script's time
                    k += m.consume_script(q, then, ttr, mine[k:], need - k, delivery)
                if len(mine) > k:
                    raise Mismatch(f"consume delivered {len(mine)} of {q}, the model {k}")
                rest = [j for j in rest if j.queue != q]
            if rest:
                raise Mismatch(f"consume delivered jobs of queues not asked: {rest}")
            for j in got:
                mj = m.jobs[(j.queue, j.job_id)]
                assert mj is not None
                if (j.tries_left, j.deliveries) != (mj.tries, mj.deliveries):
                    raise Mismatch(
                        f"delivered {j.job_id} with remain_tries {j.tries_left}, deliveries "
                        f"{j.deliveries}; model {mj.tries}, {mj.deliveries}"
                    )

        # A step refused and repeated after the clock moved: it and every stamped step after it
        # run at the repeat's time. Which queues' scripts came after it (or were visited at
        # all: the first look skips a queue with nothing due at the consume's time) is not
        # known here: every queue's script ran at t0 or at the later time, and its pump step's
        # first scripts, and the scripts after its buckets opened, at the same or a later one.
        steps = ("consume", "open_buckets", "EXISTS", "promote_due", "signal")
        later = self.stamps(t0, steps)[0]
        choices = [(t0, t0, t0)]
        if later != t0:
            choices += [(later, later, later), (t0, later, later), (t0, t0, later)]
        self.each(list(itertools.product(choices, repeat=len(queues))), apply)

    def conflict(
        self, m: Model, q: str, job_id: str, lease: str | None, now: int, ack: bool = False
    ) -> str | None:
        """None when ``lease`` (if any) holds the job, else the state a Conflict names."""
        if lease is None:
            return None
        why = m.lease_check(q, job_id, lease, now)
        if why == "" or (ack and why == "gone"):
            return None  # (acking a job already gone is what its holder wanted)
        return why

    def expect_conflict(self, err: BaseException | None, wanted: list[tuple[str, str]]) -> None:
        if not wanted:
            if isinstance(err, Conflict):
                raise Mismatch(f"409 {err.conflicts}, but every lease holds its job")
            return
        if not isinstance(err, Conflict):
            raise Mismatch(f"lease conflicts {wanted} expected, engine answered {err!r}")
        got = sorted((i, s or "gone") for i, s in err.conflicts)
        if got != sorted(wanted):
            raise Mismatch(f"409 names {got}, model {sorted(wanted)}")
        STATS["409 checked"] += 1

    @rule(i=picks, leased=st.booleans())
    def ack(self, i: int, leased: bool) -> None:
        d = self.pick_lease(i) if leased else None
        if d is not None:
            self.ack_many(d[0], [d[1]], [d[2]])
        else:
            q, job_id = self.pick(i)
            self.ack_many(q, [job_id])

    @rule(
        q=st.sampled_from(QUEUES),
        picks_=st.lists(st.tuples(picks, st.booleans()), min_size=2, max_size=4),
    )
    def batch_ack(self, q: str, picks_: list[tuple[int, bool]]) -> None:
        chosen: dict[str, str | None] = {}
        for i, leased in picks_:
            d = self.pick_lease(i, q) if leased else None
            if d is not None:
                chosen.setdefault(d[1], d[2])
            else:
                chosen.setdefault(self.pick(i, q)[1], None)
        leases = list(chosen.values())
        self.ack_many(q, list(chosen), leases if any(leases) else None)

    def ack_many(self, q: str, ids_: list[str], leases: list[str | None] | None = None) -> None:
        t0 = self.clock.now
        states, err = self.request("ack", self.svc.ack(self.route, NS, q, ids_, leases))
        self.no_503_when_retried("ack", err)
        lost = self.fired() is not None and self.fired().kind == "lost"

        def apply(m: Model, now: int) -> None:
            wanted = [
                (i, c)
                for i, lease in zip(ids_, leases or [None] * len(ids_))
                if (c := self.conflict(m, q, i, lease, now, ack=True)) is not None
            ]
            self.expect_conflict(err, wanted)
            if wanted:
                return  # nothing of the batch acked
            for job_id, got in zip(ids_, states):
                was = m.remove(q, job_id, now)
                if (got.value if got else None) != was and not (lost and got is None):
                    raise Mismatch(f"ack {job_id}: engine says it was {got}, model {was}")

        self.each(self.stamps(t0, ("ack",)), apply)

    @rule(
        i=picks,
        job_id=ids,
        delay=delays,
        ttl=ttls,
        same=st.booleans(),
        leased=st.booleans(),
        prio=prios,
        group=groups,
    )
    def republish(
        self,
        i: int,
        job_id: str | None,
        delay: int,
        ttl: int,
        same: bool,
        leased: bool,
        prio: int,
        group: str | None,
    ) -> None:
        d = self.pick_lease(i) if leased else None
        q, old = d[:2] if d is not None else self.pick(i)
        lease = d[2] if d is not None else None
        if same and old != "nosuchjob" and not old.startswith("c"):
            same = False
        new_id = old if same else job_id
        if lease is not None and new_id is None:
            new_id = "c9"  # not repeated with a lease: an unknown outcome needs a known new id
        spec = JobSpec(
            b"y",
            delay_ms=delay,
            ttl_ms=delay + ttl if ttl else 0,
            job_id=new_id,
            priority=prio,
            group=group,
        )
        t0 = self.clock.now
        out, err = self.request(
            "republish", self.svc.republish(self.route, NS, q, old, spec, lease)
        )
        unknown = isinstance(err, PoolUnavailable)
        if lease is None and not isinstance(err, QueueFull):
            self.no_503_when_retried("republish", err)
        elif unknown:
            if self.fired() is None or "may" not in str(err):
                raise Mismatch(f"republish with a lease: 503 {err} (fault {self.fired()})")
            STATS["503 republish"] += 1
        lost = self.fired() is not None and self.fired().kind == "lost"

        def apply(m: Model, now: int) -> None:
            why = self.conflict(m, q, old, lease, now)
            if not unknown:
                self.expect_conflict(err, [(old, why)] if why else [])
            if why:
                return
            placed = new_id is None or m.jobs.get((q, new_id)) is None
            full = m.full(q, 1 if placed else 0, 1 if m.jobs.get((q, old)) else 0)
            if full != isinstance(err, QueueFull) and not unknown:
                raise Mismatch(
                    f"republish {old} -> {new_id}: engine {out or err}, model full={full}"
                )
            if full:
                STATS["429 republish"] += 1
                return  # nothing changed
            existed = m.remove(q, old, now) is not None
            if existed and new_id == old and "same-id" not in TOLERATE:
                m.acked.pop((q, old), None)  # replaced, not a duplicate of itself (issue 13 #1)
            new = out.job_id if out is not None else new_id
            dup = m.duplicate(q, new, now)
            if out is not None and dup != out.duplicate and not (lost and out.duplicate):
                raise Mismatch(f"republish as {out.job_id}: duplicate {out.duplicate}, model {dup}")
            if not dup:  # (after a lost reply the repeat finds the job the first attempt placed)
                m.place(
                    q, new, new_id is not None, t0, now, delay, spec.ttl_ms, 1, prio, group=group
                )

        self.each(self.stamps(t0, ("republish",)), apply, unknown)

    @rule(i=picks, ttr=ttrs, leased=st.booleans())
    def touch(self, i: int, ttr: int, leased: bool) -> None:
        d = self.pick_lease(i) if leased else None
        q, job_id = d[:2] if d is not None else self.pick(i)
        lease = d[2] if d is not None else None
        t0 = self.clock.now
        _, err = self.request("touch", self.svc.touch(self.route, NS, q, job_id, ttr, lease))
        self.no_503_when_retried("touch", err)

        def apply(m: Model, now: int) -> None:
            why = self.conflict(m, q, job_id, lease, now)
            self.expect_conflict(err, [(job_id, why)] if why else [])
            if why:
                return
            j = m.jobs.get((q, job_id))
            held = j is not None and j.state == RESERVED
            if held and j.deadline <= now and "touch-expired" not in TOLERATE:
                held = False  # its ttr ran out: not reserved any more (issue 13 #6)
            if held != (err is None):
                raise Mismatch(
                    f"touch {job_id}: engine {'ok' if err is None else err}, model reserved={held}"
                )
            if held:
                j.deadline = now + ttr

        self.each(self.stamps(t0, ("touch",)), apply)

    @rule(
        i=picks,
        delay=st.sampled_from([0, 0, 20, 6_000]),
        leased=st.booleans(),
        error=st.sampled_from(["", "", "boom", "bang"]),
    )
    def release(self, i: int, delay: int, leased: bool, error: str) -> None:
        d = self.pick_lease(i) if leased else None
        q, job_id = d[:2] if d is not None else self.pick(i)
        self.release_one(q, job_id, delay, d[2] if d is not None else None, error)

    def release_one(self, q: str, job_id: str, delay: int, lease: str | None, error: str) -> None:
        t0 = self.clock.now
        state, err = self.request(
            "release", self.svc.release(self.route, NS, q, job_id, delay, lease, error)
        )
        unknown = isinstance(err, PoolUnavailable)
        if unknown:
            if self.fired() is None:
                raise Mismatch(f"release answered 503 without a fault: {err}")
            if "may have been applied" not in str(err):
                raise Mismatch(f"a release 503 must say the outcome is unknown: {err}")
            STATS["503 release"] += 1

        def apply(m: Model, now: int) -> None:
            why = self.conflict(m, q, job_id, lease, now)
            if not unknown:
                self.expect_conflict(err, [(job_id, why)] if why else [])
            if why:
                return
            j = m.jobs.get((q, job_id))
            held = j is not None and j.state == RESERVED
            if held and j.deadline <= now and "touch-expired" not in TOLERATE:
                held = False
            if unknown:
                if not held:
                    return
            elif held != (err is None):
                raise Mismatch(
                    f"release {job_id}: engine {state if err is None else err}, model reserved={held}"
                )
            if not held:
                return
            assert j is not None
            j.holder, j.lease = None, None
            m.unreserve(j, now, but=j)  # its turn handed on first (release.lua)
            STATS[f"release of a held job, tries left {j.tries}, delay {delay}"] += 1
            wait = delay or m.retry_wait(j)  # until it would be ready again
            if j.expired(now):
                m.gone(j)
                want: Any = "expired"
            elif j.tries == 0:
                j.state, j.died, j.reason, want = DEAD, now, "tries_exhausted", JobState.DEAD
            elif j.expire_at and wait > 0 and now + wait >= j.expire_at:
                m.gone(j)  # its ttl ends before it would be ready again
                want = "expired"
            elif delay > 0:
                j.state, j.due, want = DELAYED, now + delay, JobState.DELAYED
            else:
                m.retry(j, now)  # its backoff, if any
                STATS[f"release to {j.state} (backoff {j.backoff or m.backoff.get(q)})"] += 1
                want = JobState.READY if j.state == READY else JobState.DELAYED
            j.error = error or j.error  # its last error ('' keeps the one it had)
            if not unknown and state != want:
                raise Mismatch(f"release {job_id} went to {state}, model {want}")

        self.each(self.stamps(t0, ("release",)), apply, unknown)

    @rule(i=picks, leased=st.booleans())
    def bury(self, i: int, leased: bool) -> None:
        d = self.pick_lease(i) if leased else None
        live = sorted(k for k, j in self.model.jobs.items() if j is not None and j.state != DEAD)
        lease: str | None = None
        if d is not None:
            q, job_id, lease = d
        elif live and i % 3:
            q, job_id = live[i % len(live)]  # mostly a job it can bury: dead letters want some
        else:
            q, job_id = self.pick(i)
        self.bury_one(q, job_id, lease)

    def bury_one(self, q: str, job_id: str, lease: str | None = None) -> None:
        t0 = self.clock.now
        job, err = self.request("bury", self.svc.bury(self.route, NS, q, job_id, "why", lease))
        unknown = isinstance(err, PoolUnavailable)
        if unknown and self.fired() is None:
            raise Mismatch(f"bury answered 503 without a fault: {err}")

        def apply(m: Model, now: int) -> None:
            why = self.conflict(m, q, job_id, lease, now)
            if not unknown:
                self.expect_conflict(err, [(job_id, why)] if why else [])
            if why:
                return
            j = m.jobs.get((q, job_id))
            if j is None or j.state == DEAD or j.expired(now):
                # past its ttl: found nowhere (the pump removes it), never made dead for good
                wanted = WrongState if j is not None and j.state == DEAD else NotFound
                if not unknown and not isinstance(err, wanted):
                    raise Mismatch(f"bury {job_id}: engine {job or err}, model {wanted.__name__}")
                return
            if not unknown and (err is not None or job is None or job.state is not JobState.DEAD):
                raise Mismatch(f"bury {job_id}: engine {job or err}, model {j.state} -> dead")
            was, held = j.state, j.held
            j.state, j.died, j.reason, j.holder, j.lease = DEAD, now, "buried", None, None
            j.error = "why"  # the bury's text
            j.wheel, j.held = None, False
            if was == READY and not held:
                m.let_one_go(q, j.group, now)  # (unready: it hands its turn on)
            elif was == RESERVED:
                m.unreserve(j, now)

        self.each(self.stamps(t0, ("bury",)), apply, unknown)
