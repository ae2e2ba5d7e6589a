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

import asyncio
import hashlib
import itertools
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from cluster_dq.engine.replies import ReplyCode
from cluster_dq.errors import BadRequest
from cluster_dq.models import Dedup, Idempotency, JobSpec, id_to_text
from cluster_dq.service import Service
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


def with_states(want: tuple[Any, ...], other: tuple[Any, ...]) -> tuple[Any, ...]:
    """``want`` with each job's state as ``other`` gives it (the same jobs' answer at another
    moment), or ``want`` itself when ``other`` answers other jobs or an error."""
    if len(want) != 3 or len(other) != 3 or [a[0] for a in want[0]] != [b[0] for b in other[0]]:
        return want
    return (tuple((*a[:2], b[2]) for a, b in zip(want[0], other[0])), *want[1:])


def keyed_jobs(specs: list[JobSpec], answered: list[str]) -> list[KeyedJob]:
    """A request's jobs as the model takes them (``answered``: the ids the engine gave)."""
    return [
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


def windows_of(
    t0: int, dedup: Dedup | None, idem: Idempotency | None
) -> tuple[tuple[str, str, int] | None, tuple[str, bytes, int] | None]:
    """The dedup key (key, mode, a throttle window's end) and the Idempotency-Key (key,
    fingerprint, the answer's end) of a request made at ``t0``, as the model takes them."""
    d = (dedup.key, dedup.mode, t0 + dedup.ttl_ms) if dedup is not None else None
    i = (idem.key, idem.fingerprint, t0 + IDEM_MS) if idem is not None else None
    return d, i


def asked_ids(args: Any) -> list[str]:
    """The job ids a publish_keyed call of one request asks for, read from its ARGV (now,
    notify, remember_acked, then the request's 7 values and its packed jobs: a 10-byte head
    whose last byte is the member's length, then the member)."""
    n = int(args[9])
    return [id_to_text(bytes(a[10 : 10 + a[9]])) for a in args[10 : 10 + n]]


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
        jobs = keyed_jobs(specs, [p.job_id for p in out.published] if out is not None else [])
        d, i = windows_of(t0, dedup, idem)
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

    def keyed_publish_held(
        self, name: str, q: str, request: Request, idem: Idempotency | None, moves: list[Any]
    ) -> None:
        """A keyed publish whose reply is lost, and the engine's repeat of it held while other
        clients make ``moves`` (each checked as the machine checks it; then an observation):
        its job taken, acked or buried, another publish under the key, time passing within the
        repeat's budget. The model runs the call when it ran, the moves, then the repeat, stamped
        afresh. The client gets the first attempt's answer when that attempt wrote (jobs made, a
        job replaced, an answer kept), each job's state as of either attempt; else the
        repeat's (the first wrote nothing: the request took effect when the repeat ran)."""
        specs, dedup = request
        t0 = self.clock.now
        f = Fault("lost", 0, 0)
        f.ran, f.hold = asyncio.Event(), asyncio.Event()
        self.net.armed = f
        self.net.start_request()
        STATS[f"op {name}"] += 1
        self.pending = True
        task = self.loop.create_task(self.svc.publish_keyed(self.route, NS, q, specs, dedup, idem))

        async def ran_or_done() -> None:
            ran = asyncio.ensure_future(f.ran.wait())  # type: ignore[union-attr]
            await asyncio.wait({task, ran}, return_when=asyncio.FIRST_COMPLETED)
            ran.cancel()

        self.run(ran_or_done())
        if not f.ran.is_set():
            raise Mismatch(f"{name}: its script never ran ({self.outcome(task)}, {f})")
        jobs = keyed_jobs(specs, asked_ids(f.args))
        d, i = windows_of(t0, dedup, idem)
        call = next(CALLS)
        self.held_open = True
        firsts: list[Reply] = []
        self.each(
            [t0], lambda m, now: firsts.append(m.publish_keyed(q, now, t0, jobs, d, i, call=call))
        )
        first = firsts[0]
        self.engine_agrees()
        # the moves through another instance of the service (this one's group commit of the
        # queue's keyed publishes waits for the call held, as it would for any call in flight)
        mine, self.svc = self.svc, Service(self.settings, {"default": self.pool})
        try:
            for move in moves:
                self.move_between(q, dedup, first, *move)
                self.engine_agrees()
        finally:
            self.svc = mine
        armed, self.net.armed = self.net.armed, None
        f.hold.set()
        try:
            out, err = self.outcome(task)  # the repeat, stamped afresh (engine/core.py restamp)
        finally:
            self.net.armed, self.held_open = armed, False
        self.no_503_when_retried(name, err)
        got = engine_told(out, err)
        client = any(s.job_id is not None for s in specs)
        wrote = first.status is ReplyCode.OK and not first.replayed
        wrote = wrote and (idem is not None or first.dedup is not ReplyCode.EXISTING)
        now = self.clock.now

        def repeat(m: Model, _: int) -> None:
            placed = first.status is ReplyCode.OK and not first.replayed and not first.dedup
            last = m.publish_keyed(q, now, t0, jobs, d, i, first.ids if placed else None, call)
            want = told(first if wrote and not client else last, jobs, dedup is not None)
            if got != want and got != with_states(want, told(last, jobs, dedup is not None)):
                raise Mismatch(
                    f"{name} on {q} ({dedup}, {idem and idem.key}), its reply lost and its "
                    f"repeat held while {[m[0] for m in moves]}: engine {got}, model {want} "
                    f"({first.how}; then {last.how})"
                )
            what = "+".join(m[0] for m in moves)
            STATS[f"keyed repeat after {what}: {first.how} -> {last.how}"] += 1

        self.each([now], repeat)

    def move_between(self, q: str, dedup: Dedup | None, first: Reply, what: str, arg: Any) -> None:
        """Another client's move while a keyed publish's repeat is held: ``take`` (a consume
        of the queue), ``ack``, ``bury`` or ``nack`` (a release, ``arg`` ms later) the job the
        first attempt named (else the key's),
        ``publish`` another job under the key (``arg``: its mode), ``advance`` the clock (``arg``
        ms)."""
        named = first.ids[0] if first.ids and first.ids[0] else None
        if named is None and dedup is not None:
            named = self.model.dedup.get((q, dedup.key))
        if what == "take":
            self.consume([q], 20_000, 3)
        elif what == "ack" and named is not None:
            self.ack_many(q, [named])
        elif what == "bury" and named is not None:
            self.bury_one(q, named)
        elif what == "nack" and named is not None:
            self.release_one(q, named, int(arg), None, "nacked")
        elif what == "publish" and dedup is not None:
            self.publish_deduplicated(q, dedup.key, arg, 900, 0, 0, 1, None, None)
        elif what == "advance":
            self.advance(int(arg))

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
