"""The model-based test's publishes (tests/engine/test_model.py): single and bulk, with client
ids, priorities, backoffs and groups, and under a dedup key; each checked against the model.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from cluster_dq.backoff import Backoff
from cluster_dq.errors import (
    BadRequest,
    QueueFull,
    WrongState,
)
from cluster_dq.models import Dedup, JobSpec, JobState
from tests.support.model_harness import (
    NS,
    QUEUES,
    STATS,
    TOLERATE,
    backoffs,
    delays,
    groups,
    ids,
    prios,
    ttls,
)
from tests.support.model_machine import ModelMachine
from tests.support.model_ref import (
    DELAYED,
    READY,
    RESERVED,
    Mismatch,
    Model,
)


class PublishRules(ModelMachine):
    @rule(
        q=st.sampled_from(QUEUES),
        job_id=ids,
        delay=delays,
        ttl=ttls,
        tries=st.integers(1, 3),
        prio=prios,
        backoff=backoffs,
        group=groups,
    )
    def publish(
        self,
        q: str,
        job_id: str | None,
        delay: int,
        ttl: int,
        tries: int,
        prio: int,
        backoff: Backoff | None,
        group: str | None,
    ) -> None:
        self.publish_bulk(q, [(job_id, delay, ttl, tries, prio, group)], backoff)

    @rule(
        q=st.sampled_from(QUEUES),
        specs=st.lists(
            st.tuples(ids, delays, ttls, st.integers(1, 3), prios, groups), min_size=2, max_size=5
        ),
    )
    def bulk(self, q: str, specs: list[tuple[str | None, int, int, int, int, str | None]]) -> None:
        self.publish_bulk(q, specs)

    def publish_bulk(
        self,
        q: str,
        raw: list[tuple[str | None, int, int, int, int, str | None]],
        backoff: Backoff | None = None,
    ) -> None:
        specs = [
            JobSpec(
                b"x",
                delay_ms=d,
                ttl_ms=(d + t if t else 0) if t != 30 else d,
                tries=n,
                priority=p,
                job_id=i,
                backoff=backoff,
                group=g,
            )
            for i, d, t, n, p, g in raw
        ]
        # ttl 30 stands for "ttl == delay" (issue 13 #2: refused with 400 once fixed)
        t0 = self.clock.now
        out, err = self.request("publish", self.svc.publish(self.route, NS, q, specs))
        if isinstance(err, BadRequest):
            if not any(s.ttl_ms and s.ttl_ms <= s.delay_ms for s in specs):
                raise Mismatch(f"publish refused: {err}")
            return  # refused whole: nothing changed (the next observation checks it)
        self.no_503_when_retried("publish", err)
        if isinstance(err, QueueFull):

            def refused(m: Model, now: int) -> None:
                new = sum(1 for s in specs if s.job_id is None or not m.duplicate(q, s.job_id, now))
                if not m.full(q, new):
                    raise Mismatch(f"publish of {new} new jobs refused as full: {err}")

            self.each(self.stamps(t0, ("publish",)), refused)
            STATS["429 publish"] += 1
            return  # refused whole: nothing written
        assert out is not None and len(out) == len(specs)
        if (
            any(s.ttl_ms and s.ttl_ms <= s.delay_ms for s in specs)
            and "ttl-eq-delay" not in TOLERATE
        ):
            raise Mismatch("ttl == delay accepted (issue 13 #2: must be 400)")
        lost = self.fired() is not None and self.fired().kind == "lost"

        def apply(m: Model, now: int) -> None:
            m.batch(True)  # (one publish.lua call: READY's head read once)
            try:
                placed(m, now)
            finally:
                m.batch(False)

        def placed(m: Model, now: int) -> None:
            new = sum(1 for s in specs if s.job_id is None or not m.duplicate(q, s.job_id, now))
            if m.full(q, new) and not lost:
                raise Mismatch(f"publish of {new} new jobs past max_size {m.max_size[q]} taken")
            for spec, p in zip(specs, out):
                if spec.job_id is not None and p.job_id != spec.job_id:
                    raise Mismatch(f"client id {spec.job_id} published as {p.job_id}")
                dup = m.duplicate(q, p.job_id, now)
                if dup and not p.duplicate:
                    raise Mismatch(f"{p.job_id} published anew, but it is a duplicate")
                if not dup and p.duplicate:
                    at = m.acked.get((q, p.job_id))
                    if lost and (q, p.job_id) not in m.acked:
                        pass  # the retry after a lost reply found it: the job is there all the same
                    elif at is not None and "acked-memory" in TOLERATE:
                        continue  # remembered past the memory (issue 13 #9)
                    else:
                        raise Mismatch(f"{p.job_id} called a duplicate, but it is new")
                if dup:
                    continue
                state = m.place(
                    q,
                    p.job_id,
                    spec.job_id is not None,
                    t0,
                    now,
                    spec.delay_ms,
                    spec.ttl_ms,
                    spec.tries,
                    spec.priority,
                    spec.backoff,
                    group=spec.group,
                )
                want = JobState.READY if state == READY else JobState.DELAYED
                if p.state is not None and p.state != want:
                    raise Mismatch(f"{p.job_id} published {p.state}, model says {want}")

        self.each(self.stamps(t0, ("publish",)), apply)

    @rule(
        q=st.sampled_from(QUEUES),
        key=st.sampled_from(["k1", "k2"]),
        mode=st.sampled_from(["simple", "debounce"]),
        delay=delays,
        ttl=ttls,
        tries=st.integers(1, 3),
        group=groups,
    )
    def publish_deduplicated(
        self, q: str, key: str, mode: str, delay: int, ttl: int, tries: int, group: str | None
    ) -> None:
        """A publish under a dedup key. ``simple``: while the key's job is delayed, ready or
        reserved, its id is the answer and nothing is written; else a new job holds the key.
        ``debounce``: a delayed or ready holder is replaced (the new body, tries, ttl and due
        time; never the wheel), a reserved one refused, nothing written."""
        spec = JobSpec(
            b"x", delay_ms=delay, ttl_ms=delay + ttl if ttl else 0, tries=tries, group=group
        )
        t0 = self.clock.now
        call = self.svc.publish_keyed(self.route, NS, q, [spec], Dedup(key, mode), None)
        out, err = self.request("publish deduplicated", call)
        self.no_503_when_retried("publish deduplicated", err)
        if isinstance(err, QueueFull):

            def refused(m: Model, now: int) -> None:
                _, alive, _ = m.dedup_holder(q, key)
                if alive or not m.full(q, 1):
                    raise Mismatch(f"publish under {key} refused as full: {err}")

            self.each(self.stamps(t0, ("publish_keyed",)), refused)
            return
        if isinstance(err, WrongState):

            def forbidden(m: Model, now: int) -> None:
                held, _, _ = m.dedup_holder(q, key)
                outcomes = [m.jobs.get((q, held or "")), *m.alts.get((q, held or ""), [])]
                if mode != "debounce" or not any(j and j.state == RESERVED for j in outcomes):
                    raise Mismatch(f"{key}: refused ({err}), the model's holder is {held}")

            self.each(self.stamps(t0, ("publish_keyed",)), forbidden)
            STATS["dedup refused"] += 1
            return
        if err is not None:
            raise err
        assert out is not None and len(out.published) == 1
        p = out.published[0]
        STATS[f"dedup {mode} {out.dedup}"] += 1

        def apply(m: Model, now: int) -> None:
            held, alive, free = m.dedup_holder(q, key)
            if out.dedup == "existing":
                if mode != "simple" or p.job_id != held or not alive:
                    raise Mismatch(f"{key}: answered {p.job_id}, model's holder {held} ({alive})")
                return
            if out.dedup == "replaced":
                outcomes = [m.jobs.get((q, p.job_id)), *m.alts.get((q, p.job_id), [])]
                waiting = [j for j in outcomes if j and j.state in (DELAYED, READY)]
                if mode != "debounce" or p.job_id != held or not waiting:
                    raise Mismatch(f"{key}: {p.job_id} replaced; model's holder {held}")
                error = waiting[0].error
                old = m.jobs.get((q, p.job_id))
                if old is not None:
                    m.gone(old)  # (its group counted out, then the new record's counted in)
                    if old.state == READY and not old.held:
                        m.let_one_go(q, old.group, now)  # (unready: it hands its turn on)
                m.place(
                    q,
                    p.job_id,
                    False,
                    t0,
                    now,
                    delay,
                    ttl and delay + ttl,
                    tries,
                    0,
                    None,
                    False,
                    group,
                )
                j = m.jobs[(q, p.job_id)]
                assert j is not None
                j.error = error  # (the job's notes stay: its last error with them)
                return
            if out.dedup != "new":
                raise Mismatch(f"{key}: a {mode} key answered {out.dedup}")
            if not free and p.job_id != held:
                raise Mismatch(f"{key}: a new job {p.job_id} while {held} holds the key")
            if p.job_id == held:  # (a retry after a lost reply found its own job)
                return
            if m.full(q, 1):
                raise Mismatch(f"publish under {key} past max_size {m.max_size[q]} taken")
            m.place(
                q,
                p.job_id,
                False,
                t0,
                now,
                delay,
                ttl and delay + ttl,
                tries,
                0,
                None,
                False,
                group,
            )
            m.dedup[(q, key)] = p.job_id

        self.each(self.stamps(t0, ("publish_keyed",)), apply)
