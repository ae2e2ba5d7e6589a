"""The model-based test's control of jobs and queues (tests/engine/test_model.py): kick,
reschedule, peek, pump steps, wheel widen, destroy, the dead letter (respawn, delete, listing,
filtered redrive and purge), a queue's settings and a group's; each checked against the model.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from cluster_dq.backoff import Backoff
from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import GroupChanges, Rate
from cluster_dq.engine.control import FOREVER_MS, DeadFilter, widen_wheel
from cluster_dq.errors import (
    BadRequest,
    NotFound,
    PoolUnavailable,
    WrongState,
)
from cluster_dq.models import id_to_member
from tests.support.model_harness import (
    GROUPS,
    NS,
    QUEUES,
    STATS,
    TOLERATE,
    picks,
    tick_at,
    view,
)
from tests.support.model_machine import ModelMachine
from tests.support.model_ref import (
    DEAD,
    DELAYED,
    READY,
    Mismatch,
    MJob,
    Model,
)


class ControlRules(ModelMachine):
    @rule(i=picks, delay=st.sampled_from([0, 20, 6_000]), tries=st.integers(1, 2))
    def kick(self, i: int, delay: int, tries: int) -> None:
        dead = sorted(k for k, j in self.model.jobs.items() if j is not None and j.state == DEAD)
        q, job_id = dead[i % len(dead)] if dead and i % 4 else self.pick(i)
        t0 = self.clock.now
        job, err = self.request("kick", self.svc.kick(self.route, NS, q, job_id, delay, tries, 0))
        unknown = isinstance(err, PoolUnavailable)
        if unknown and self.fired() is None:
            raise Mismatch(f"kick answered 503 without a fault: {err}")

        def apply(m: Model, now: int) -> None:
            j = m.jobs.get((q, job_id))
            if j is None or j.state != DEAD:
                wanted = NotFound if j is None else WrongState
                if not unknown and not isinstance(err, wanted):
                    raise Mismatch(f"kick {job_id}: engine {job or err}, model {wanted.__name__}")
                return
            if not unknown and (err is not None or job is None):
                raise Mismatch(f"kick {job_id}: engine {err}, model dead -> back")
            j.tries, j.expire_at, j.reason = tries, 0, ""
            j.due_moved(now + delay)
            if delay:
                j.state, j.due = DELAYED, now + delay
            else:
                m.make_ready(j, now)

        self.each(self.stamps(t0, ("kick",)), apply, unknown)

    @rule(i=picks, d=st.sampled_from([-500, 0, 40, 3_000, 9_000, 31_000, 70_000]))
    def reschedule(self, i: int, d: int) -> None:
        """A new due time by id, ``d`` from now (negative: a time already past)."""
        live = sorted(
            k for k, j in self.model.jobs.items() if j is not None and j.state in (READY, DELAYED)
        )
        q, job_id = live[i % len(live)] if live and i % 3 else self.pick(i)
        t0 = self.clock.now
        job, err = self.request(
            "reschedule", self.svc.reschedule(self.route, NS, q, job_id, lambda n: n + d)
        )
        unknown = isinstance(err, PoolUnavailable)
        if unknown and self.fired() is None:
            raise Mismatch(f"reschedule answered 503 without a fault: {err}")

        def apply(m: Model, now: int) -> None:
            due = t0 + d  # from the request's time, as a publish's delay (a repeat keeps it)
            why = m.reschedule(q, job_id, due, now)
            if unknown:
                return
            wanted = {"gone": NotFound, "forbidden": WrongState, "too_late": BadRequest}.get(why)
            if wanted is not None:
                if not isinstance(err, wanted):
                    raise Mismatch(
                        f"reschedule {job_id} to {due}: engine {job or err}, model {why}"
                    )
                return
            j = m.jobs[(q, job_id)]
            assert j is not None
            if err is not None or job is None or job.state.value != j.state:
                raise Mismatch(
                    f"reschedule {job_id} to {due}: engine {job or err}, model {j.state}"
                )

        self.each(self.stamps(t0, ("reschedule_job",)), apply, unknown)

    @rule(q=st.sampled_from(QUEUES))
    def peek(self, q: str) -> None:
        t0 = self.clock.now
        job, err = self.request("peek", self.svc.peek(self.route, NS, q))
        self.no_503_when_retried("peek", err)

        def apply(m: Model, now: int) -> None:
            m.promote(q, now)
            ready = sorted((j for j in m.of(q, READY) if not j.held), key=MJob.order)
            if job is None:
                if ready:
                    raise Mismatch(f"peek of {q}: empty, model has {[j.job_id for j in ready]}")
                return
            if not ready or job.job_id != ready[0].job_id:
                raise Mismatch(f"peek of {q} gave {job.job_id}, model {ready[:1]}")

        self.each([t0], apply)  # peek's promote is not restamped when repeated: no deadline in it

    @rule(q=st.sampled_from(QUEUES))
    def tick(self, q: str) -> None:
        """One pump step for the queue, as pump.py runs it."""
        t0 = self.clock.now
        self.net.start_request()
        self.pending = True
        STATS["op tick"] += 1
        cfg = self.pool.engine.config
        self.run(self.pool.engine.run(ops.tick(cfg, NS, q, t0), idempotent=True))
        # A refused step repeated later: it and the steps after it run at the repeat's time;
        # the buckets opened are still those picked by t0 (the ZRANGE is the op's, unstamped).
        later = self.stamps(t0, ("ZCARD", "open_buckets", "promote_due"))[0]
        f = self.fired()
        first = later if f is not None and f.at == 0 else t0  # (its first step, or one after it)
        self.each([later], lambda m, now: tick_at(m, q, t0, now, first))

    @rule(q=st.sampled_from(QUEUES))
    def widen(self, q: str) -> None:
        """``cluster-dq wheel widen``: the queue's short wheel entries rewritten whole, as a
        version without short entries wrote them. Nothing a client sees may change, and the
        publishes after it write short entries beside whole ones: the observations check."""
        self.net.start_request()
        self.pending = True
        STATS["op widen"] += 1
        cfg = self.pool.engine.config
        STATS["widened"] += self.run(self.pool.engine.run(widen_wheel(cfg, NS, q), idempotent=True))

    @rule(q=st.sampled_from(QUEUES))
    def destroy(self, q: str) -> None:
        n, err = self.request("destroy", self.svc.destroy(self.route, NS, q))
        self.no_503_when_retried("destroy", err)
        lost = self.fired() is not None and self.fired().kind == "lost"

        def apply(m: Model, _: int) -> None:
            jobs = m.of(q)
            if n != len(jobs) and not lost:
                raise Mismatch(f"destroy of {q} deleted {n}, model {len(jobs)}")
            for j in jobs:
                m.gone(j)
            for key in [k for k in m.acked if k[0] == q]:
                del m.acked[key]
            m.forget_keyed(q)  # (its throttle windows and Idempotency-Keys' answers)

        self.each([0], apply)

    @rule(
        q=st.sampled_from(QUEUES),
        limit=st.integers(1, 3),
        ttl=st.sampled_from([0, 60_000]),
        delete=st.booleans(),
    )
    def dead_letters(self, q: str, limit: int, ttl: int, delete: bool) -> None:
        t0 = self.clock.now
        name = "delete_dead" if delete else "respawn"
        call = (
            self.svc.delete_dead(self.route, NS, q, limit)
            if delete
            else self.svc.respawn(self.route, NS, q, limit, ttl)
        )
        n, err = self.request(name, call)
        unknown = isinstance(err, PoolUnavailable)
        if unknown and self.fired() is None:
            raise Mismatch(f"{name} answered 503 without a fault: {err}")

        def apply(m: Model, now: int) -> None:
            dead = self.dead_order(m, q)  # (ZRANGE / ZPOPMIN of DEAD: death time, then member)
            k = min(limit, len(dead))
            if not unknown and n != k:
                raise Mismatch(f"{name} of {q}: {n}, model {k}")
            for j in dead[:k]:
                if delete:
                    m.gone(j)
                else:
                    j.tries, j.reason = 1, ""
                    j.expire_at = now + ttl if ttl else 0
                    j.due_moved(now)
                    m.make_ready(j, now)

        self.each(self.stamps(t0, ("respawn",)), apply, unknown)

    def deadest(self, q: str) -> str:
        """``q``, or the other queue when only that one has dead jobs (sweeps want some)."""
        if self.model.of(q, DEAD):
            return q
        return next((o for o in QUEUES if self.model.of(o, DEAD)), q)

    def dead_order(self, m: Model, q: str, filt: DeadFilter | None = None) -> list[MJob]:
        """The dead letter of ``q`` as the scripts walk it (time of death, then member bytes),
        keeping those ``filt`` matches."""
        dead = sorted(m.of(q, DEAD), key=lambda j: (j.died, id_to_member(j.job_id)))
        if filt is None:
            return dead
        return [
            j
            for j in dead
            if filt.from_ms <= j.died <= filt.to_ms and filt.reason in (None, j.reason)
        ]

    @rule(q=st.sampled_from(QUEUES), limit=st.integers(1, 3))
    def dead_listing(self, q: str, limit: int) -> None:
        """Walks the whole dead-letter listing with its cursor: every dead job once, in order,
        with its reason, time of death, deliveries and last error."""
        q = self.deadest(q)
        listed: list[Any] = []
        cursor: str | None = None
        for _ in range(30):
            try:
                out, err = self.request(
                    "dead_page", self.svc.dead_jobs(self.route, NS, q, cursor, limit)
                )
            except IndexError:
                grouped = any(j.group for j in self.model.of(q, DEAD))
                if not grouped or "dead-page-group" not in TOLERATE:
                    raise
                STATS["tolerated dead-page-group"] += 1
                self.pending = False
                return
            self.no_503_when_retried("dead_page", err)
            page, cursor = out
            if len(page) > limit:
                raise Mismatch(f"a dead page of {len(page)} jobs, limit {limit}")
            listed += page
            if cursor is None:
                break
        got = [(d.job_id, d.reason, d.died_ms, d.deliveries, d.last_error or "") for d in listed]

        def apply(m: Model, _: int) -> None:
            want = [
                (j.job_id, j.reason, j.died, j.deliveries, j.error) for j in self.dead_order(m, q)
            ]
            if got != want:
                raise Mismatch(f"dead letter of {q}: engine lists {got}, model {want}")

        self.each([0], apply)

    # No preconditions in this machine: which rules may run must not depend on what a step's
    # outcome made of the model, since a faulted step's outcome can depend on real time (its
    # retry budget) and Hypothesis replays the same choices expecting the same rules (a run on
    # a loaded machine failed with FlakyStrategyDefinition). A rule that has nothing to do
    # does nothing, or checks that nothing happens.
    @rule(
        q=st.sampled_from(QUEUES),
        limit=st.integers(1, 3),
        reason=st.sampled_from([None, "ttr_expired", "tries_exhausted", "buried"]),
        since=st.sampled_from([None, 5_000]),
        until=st.sampled_from([None, 1_000]),
        delete=st.booleans(),
        delay=st.sampled_from([0, 6_000]),
        tries=st.integers(1, 2),
        ttl=st.sampled_from([0, 60_000]),
    )
    def dead_sweep(
        self,
        q: str,
        limit: int,
        reason: str | None,
        since: int | None,
        until: int | None,
        delete: bool,
        delay: int,
        tries: int,
        ttl: int,
    ) -> None:
        """One bounded call of a filtered redrive or purge, from the start of the dead letter."""
        q = self.deadest(q)
        t0 = self.clock.now
        filt = DeadFilter(
            reason,
            0 if since is None else t0 - since,
            FOREVER_MS if until is None else t0 - until,
        )
        name = "purge_dead" if delete else "redrive_dead"
        call = (
            self.svc.purge(self.route, NS, q, filt, None, limit)
            if delete
            else self.svc.redrive(self.route, NS, q, filt, None, limit, delay, tries, ttl)
        )
        out, err = self.request(name, call)
        unknown = isinstance(err, PoolUnavailable)
        if delete:
            self.no_503_when_retried(name, err)
        elif unknown and self.fired() is None:
            raise Mismatch(f"{name} answered 503 without a fault: {err}")
        # purge is repeated after a lost reply: the repeat takes the next ones that match
        lost = delete and self.fired() is not None and self.fired().kind == "lost"

        def apply(m: Model, now: int) -> None:
            match = self.dead_order(m, q, filt)
            k = min(limit, len(match))
            STATS[f"{name}: {'some' if k else 'none'} of {len(m.of(q, DEAD))} dead matched"] += 1
            if not (unknown or lost) and (out is None or out[0] != k):
                raise Mismatch(f"{name} of {q} ({filt}): {out and out[0]}, model {k}")
            for idx, j in enumerate(match[: 2 * limit if lost else k]):
                key = (j.queue, j.job_id)
                if idx >= k:
                    m.allow(key, j)
                if delete:
                    m.gone(j)
                else:
                    j.tries, j.reason = tries, ""
                    j.expire_at = now + ttl if ttl else 0
                    j.due_moved(now + delay)
                    if delay:
                        j.state, j.due = DELAYED, now + delay
                    else:
                        m.make_ready(j, now)

        self.each(self.stamps(t0, (name,)), apply, unknown or lost)

    @rule(
        q=st.sampled_from(QUEUES),
        setting=st.sampled_from(
            [("paused", "1"), ("paused", ""), ("paused", ""), ("max_size", "4")]
            + [("max_size", "8"), ("max_size", ""), ("backoff", "1"), ("backoff", "2")]
            + [("backoff", ""), ("backoff", "")]
        ),
    )
    def configure(self, q: str, setting: tuple[str, str]) -> None:
        """Pause / resume a queue (``paused`` '1' / ''), set / remove its max_size, or its
        retry backoff (fixed 500 ms, exponential from 100 ms up to 800 ms; no jitter)."""
        field, value = setting  # (mostly resumed and unlimited: deliveries matter more)
        changes = [(field, value)]
        if field == "backoff":
            b = None if not value else Backoff(1, 500) if value == "1" else Backoff(2, 100, 800)
            kind = "" if b is None else "fixed" if b.kind == 1 else "exponential"
            changes = [
                ("backoff", kind),
                ("backoff_ms", str(b.base_ms) if b else ""),
                ("backoff_cap_ms", str(b.cap_ms) if b else ""),
                ("backoff_jitter", "0" if b else ""),
            ]
        got, err = self.request("configure", self.svc.configure(self.route, NS, q, changes))
        self.no_503_when_retried("configure", err)
        assert got is not None
        m = self.model
        if field == "paused":
            (m.paused.add if value else m.paused.discard)(q)
        elif field == "backoff":
            if b:
                m.backoff[q] = b
            else:
                m.backoff.pop(q, None)
        elif value:
            m.max_size[q] = int(value)
        else:
            m.max_size.pop(q, None)
        if (
            got.paused != (q in m.paused)
            or got.max_size != m.max_size.get(q)
            or got.backoff != m.backoff.get(q)
        ):
            raise Mismatch(f"settings of {q}: engine {got}, model {m.paused} {m.max_size}")

    @initialize(
        paused=st.sampled_from([None, None, None, True]),
        conc=st.sampled_from([None, 1, 1, 2]),
        rate=st.sampled_from([None, None, (1, 1_000), (2, 300), (3, 1_000)]),
    )
    def first_group_settings(self, paused: bool | None, conc: int | None, rate: Any) -> None:
        """Most histories begin with group g1 of queue a limited (the rule changes settings
        later, but in a history of 40 steps rarely before that group's jobs are consumed)."""
        self.configure_group("a", "g1", paused, conc, rate)

    @rule(
        q=st.sampled_from(QUEUES),
        group=st.sampled_from(GROUPS),
        paused=st.sampled_from([None, None, True, False, False]),
        conc=st.sampled_from([None, None, 1, 2, 0]),  # 0: the limit removed
        rate=st.sampled_from([None, None, (1, 1_000), (2, 300), (3, 1_000), 0]),  # 0: removed
    )
    def configure_group(
        self,
        q: str,
        group: str,
        paused: bool | None,
        conc: int | None,
        rate: tuple[int, int] | int | None,
    ) -> None:
        """A group's settings changed (the service's configure_group: ops.configure_group on
        the queue's pool): paused or resumed, a concurrency limit of 1, 2 or none, a rate of
        1/s, 2/300 ms, 3/s (a turn every 333.3 ms: the rate's times are not whole ms) or none.
        What the group held back and may now go comes back to READY, with fresh tags. The same
        change again changes nothing more, but for a rate, which starts afresh."""
        changes = GroupChanges(
            paused=paused,
            concurrency=conc or None,
            clear_concurrency=conc == 0,
            rate=Rate(*rate) if isinstance(rate, tuple) else None,
            clear_rate=rate == 0,
        )
        t0 = self.clock.now
        call = self.svc.configure_group(self.route, NS, q, group, changes)
        got, err = self.request("configure group", call)
        self.no_503_when_retried("configure group", err)
        assert got is not None
        repeated = self.fired() is not None and self.fired().kind == "lost"

        new_rate = rate if isinstance(rate, tuple) else None if rate == 0 else ...

        def apply(m: Model, now: int) -> None:
            back = m.group_configure(q, group, paused, conc, new_rate, now)
            STATS[f"configure group: {back} brought back"] += 1
            if repeated and "configure-repeat" in TOLERATE:
                # the repeat after the lost reply brings back as many again (TOLERATE)
                STATS["tolerated configure-repeat"] += 1
                m.group_configure(q, group, paused, conc, new_rate, now)
            want = m.group_view(q, group)
            if view(got) != want:
                raise Mismatch(f"configure_group {q}/{group}: engine {got}, model {want}")

        self.each(self.stamps(t0, ("group_configure",)), apply)
