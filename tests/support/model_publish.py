"""The model-based test's publishes (tests/engine/test_model.py): single and bulk, with client
ids, priorities, backoffs and groups; each checked against the model. (Under a dedup key or an
Idempotency-Key: tests/support/model_publish_keyed.py.)
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from cluster_dq.backoff import Backoff
from cluster_dq.errors import (
    BadRequest,
    QueueFull,
)
from cluster_dq.models import JobSpec, JobState
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
    READY,
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
