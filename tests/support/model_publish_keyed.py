"""The model-based test's keyed publishes (tests/engine/test_model.py): under a dedup key in
each mode (``simple``, ``throttle``, ``debounce``; a queue's modes share its keys) and with an
Idempotency-Key (a publish or a bulk, sent again as it was or as another request); each answer
checked against the model's run of lua/publish_keyed.lua (tests/support/model_keyed.py), and
what the call wrote by the observation after it (KEYED exactly).

Under the machine's faults: a refused call writes nothing and is repeated (at the later time,
if the refusal took some); a call whose reply was lost is repeated with the same ids, so the
model runs it twice and the client gets the first answer (docs/api.md), or, for a client's job
id, the answer any request with that id gets.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from cluster_dq.engine.replies import ReplyCode
from cluster_dq.errors import BadRequest
from cluster_dq.models import Dedup, Idempotency, JobSpec
from tests.support.model_harness import (
    IDEM_MS,
    NS,
    QUEUES,
    STATS,
    TOLERATE,
    Fault,
    dedup_keys,
    dedup_modes,
    delays,
    groups,
    idem_keys,
    keyed_ids,
    prios,
    ttls,
    windows,
)
from tests.support.model_keyed import KeyedJob, Reply, engine_told, told
from tests.support.model_machine import ModelMachine
from tests.support.model_ref import Mismatch, Model

CALLS = itertools.count()  # a number per keyed publish request: its runs share it
Request = tuple[list[JobSpec], Dedup | None]  # a keyed request: its jobs, its dedup key


def fingerprint(request: Request) -> bytes:
    """What names a request under its Idempotency-Key: its route (a one-job publish or a bulk),
    its query (each job's id, delay, ttl, tries, priority, group; the dedup key) and body."""
    specs, dedup = request
    route = "bulk" if len(specs) > 1 else "publish"
    shape = [(s.body, s.job_id, s.delay_ms, s.ttl_ms, s.tries, s.priority, s.group) for s in specs]
    return hashlib.blake2b(repr((route, shape, dedup)).encode(), digest_size=16).digest()


class KeyedPublishRules(ModelMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sent: dict[tuple[str, str], Request] = {}  # (queue, idempotency key) -> the last
        self.opened: dict[tuple[str, str], int] = {}  # (queue, KEYED field) -> its last end
        self.fresh = 0  # requests made: each new one has a body of its own

    @rule(
        q=st.sampled_from(QUEUES),
        key=dedup_keys,
        mode=dedup_modes,
        window=windows,
        delay=delays,
        ttl=ttls,
        tries=st.integers(1, 3),
        group=groups,
        job_id=keyed_ids,
    )
    def publish_deduplicated(
        self,
        q: str,
        key: str,
        mode: str,
        window: int,
        delay: int,
        ttl: int,
        tries: int,
        group: str | None,
        job_id: str | None,
    ) -> None:
        """A publish under a dedup key. ``simple``: while the key's job is delayed, ready or
        reserved, its id is the answer and nothing is written; else a new job holds the key.
        ``throttle``: for ``window`` ms after the publish that made a job under it, that job's
        id, whatever became of it. ``debounce``: a delayed or ready holder is replaced (the new
        body, tries, ttl and due time; never the wheel), a reserved or dead one refused,
        nothing written. A simple or debounce key's live job holds it before a throttle window."""
        spec = JobSpec(
            b"x",
            delay_ms=delay,
            ttl_ms=delay + ttl if ttl else 0,
            tries=tries,
            group=group,
            job_id=job_id,
        )
        dedup = Dedup(key, mode, window if mode == "throttle" else 0)
        self.keyed_publish("publish deduplicated", q, ([spec], dedup), None)

    @rule(
        q=st.sampled_from(QUEUES),
        ikey=idem_keys,
        again=st.sampled_from([True, True, False]),
        raw=st.lists(
            st.tuples(keyed_ids, delays, ttls, st.integers(1, 3), prios, groups),
            min_size=1,
            max_size=3,
        ),
        key=st.sampled_from([None, None, "k1", "k2"]),
        mode=dedup_modes,
        window=windows,
    )
    def publish_idempotent(
        self,
        q: str,
        ikey: str,
        again: bool,
        raw: list[tuple[str | None, int, int, int, int, str | None]],
        key: str | None,
        mode: str,
        window: int,
    ) -> None:
        """A publish (one job, maybe under a dedup key) or a bulk with an Idempotency-Key:
        ``again``, the queue's request whose answer the key keeps (or the last one) sent again as
        it was (within the key's window, the first answer, nothing written), else a request of
        its own (within the window, another request is refused: a mismatch)."""
        request = self.sent.get((q, ikey)) if again else None
        if request is None:
            self.fresh += 1
            specs = [
                JobSpec(
                    f"r{self.fresh}".encode(),
                    delay_ms=d,
                    ttl_ms=(d + t if t else 0) if t != 30 else d,  # (30: ttl == delay, a 400)
                    tries=n,
                    priority=p,
                    job_id=i,
                    group=g,
                )
                for i, d, t, n, p, g in raw
            ]
            dedup = None if key is None else Dedup(key, mode, window if mode == "throttle" else 0)
            request = (specs[:1], dedup) if dedup is not None else (specs, None)
        else:
            STATS["idem: a request sent again"] += 1
        fp = fingerprint(request)
        self.keyed_publish("publish idempotent", q, request, Idempotency(ikey, fp))
        kept = self.model.keyed.get((q, "i:" + ikey))
        if kept is None or kept.fingerprint == fp:  # (sent again: the one whose answer is kept)
            self.sent[(q, ikey)] = request

    def keyed_publish(self, name: str, q: str, request: Request, idem: Idempotency | None) -> None:
        specs, dedup = request
        t0 = self.clock.now
        ends = [
            self.opened.get((q, f"{kind}:{k.key}"))
            for kind, k in (("t", dedup), ("i", idem))
            if k is not None
        ]
        call = self.svc.publish_keyed(self.route, NS, q, specs, dedup, idem)
        out, err = self.request(name, call)
        if isinstance(err, BadRequest):
            if not any(s.ttl_ms and s.ttl_ms <= s.delay_ms for s in specs):
                raise Mismatch(f"{name} refused: {err}")
            STATS["keyed: refused (400: nothing written)"] += 1
            return  # refused whole: nothing changed (the next observation checks it)
        self.no_503_when_retried(name, err)
        f = self.fired()
        lost = f is not None and f.kind == "lost" and f.step == "publish_keyed"
        answered = [p.job_id for p in out.published] if out is not None else []
        jobs = [
            KeyedJob(
                s.job_id,
                answered[i] if i < len(answered) else None,
                s.delay_ms,
                s.ttl_ms,
                s.tries,
                s.priority,
                s.group,
            )
            for i, s in enumerate(specs)
        ]
        d = (dedup.key, dedup.mode, t0 + dedup.ttl_ms) if dedup is not None else None
        i = (idem.key, idem.fingerprint, t0 + IDEM_MS) if idem is not None else None
        client = any(s.job_id is not None for s in specs)
        got = engine_told(out, err)
        runs: list[tuple[Reply, Reply]] = []

        call = next(CALLS)

        def apply(m: Model, now: int) -> None:
            first = m.publish_keyed(q, now, t0, jobs, d, i, call=call)
            last = first
            if lost:  # the engine's repeat, with the same ids, at the same time
                placed = first.status is ReplyCode.OK and not first.replayed and not first.dedup
                own = first.ids if placed else None
                last = m.publish_keyed(q, now, t0, jobs, d, i, own, call)
            # the client's answer: the first (docs/api.md), but for a client's job id, which
            # names no one request: what any request with that id gets (the repeat's)
            want = told(last if client else first, jobs, dedup is not None)
            if want != got and not self.tolerated(want, got, first, lost and not client, i):
                raise Mismatch(
                    f"{name} on {q} ({dedup}, {idem and idem.key}, lost reply {lost}): engine "
                    f"{got}, model {want} ({first.how}{'; then ' + last.how if lost else ''})"
                )
            runs.append((first, last))

        stamps = self.stamps(t0, ("publish_keyed",))
        self.each(stamps, apply)
        now = stamps[0]
        ended = [e is not None and e <= now for e in ends]  # (a window or answer kept before)
        self.count(runs[0][0], runs[0][1], f, dedup, idem, lost, ended)
        for (q2, field), k in self.model.keyed.items():
            if q2 == q:
                self.opened[(q, field)] = k.until

    def tolerated(
        self, want: tuple[Any, ...], got: tuple[Any, ...], first: Reply, repeat: bool, idem: Any
    ) -> bool:
        """An open defect the model is told to tolerate (harness: TOLERATE)."""
        if (
            "idem-repeat-replayed" in TOLERATE
            and repeat
            and idem is not None
            and first.dedup in (ReplyCode.EXISTING, ReplyCode.REPLACED)
            and len(want) == 3
            and got == (want[0], want[1], True)
        ):
            STATS["tolerated idem-repeat-replayed"] += 1
            return True
        return False

    def count(
        self,
        first: Reply,
        last: Reply,
        fault: Fault | None,
        dedup: Dedup | None,
        idem: Idempotency | None,
        lost: bool,
        ended: list[bool],
    ) -> None:
        """The run's figures: which outcome each keyed publish reached (``ended``: the dedup
        key's throttle window, the Idempotency-Key's answer, had one, now ended)."""
        outcome = {
            ReplyCode.FULL: "refused: full",
            ReplyCode.FORBIDDEN: "refused: debounce of a job not waiting",
            ReplyCode.MISMATCH: "refused: another request under the key",
        }.get(first.status)
        if outcome is None:
            outcome = {ReplyCode.EXISTING: "existing", ReplyCode.REPLACED: "replaced"}.get(
                first.dedup or ReplyCode.OK, "new"
            )
            outcome = "replay" if first.replayed else outcome
        if idem is not None:
            kind = {"replay": "replay", "mismatch": "mismatch"}.get(first.how, "")
            if not kind:
                kind = "first answer" if first.status is ReplyCode.OK else "refused (nothing kept)"
                if ended[-1]:
                    kind = "window ended: " + kind
            STATS[f"idem: {kind}"] += 1
        if dedup is not None and first.how not in ("replay", "mismatch"):
            how = first.how
            if how.endswith("free") and dedup.mode == "throttle" and ended[0]:
                how += " (its throttle window ended)"
            STATS[f"dedup {how} -> {outcome}"] += 1
        if fault is not None and fault.step == "publish_keyed":
            what = {
                "lost": "reply lost: run twice",
                "before": "failed before sending: repeated",
                "stall": "stalled",
            }.get(fault.kind, "refused (nothing written): repeated")
            if lost and last.replayed and not first.replayed:
                outcome += " (the repeat found its answer)"
            STATS[f"keyed fault: {what} -> {outcome}"] += 1
