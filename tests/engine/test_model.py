"""A model-based test of the engine with injected faults (issue 13, SPEC §2.7).

A Hypothesis ``RuleBasedStateMachine`` drives the real service layer in-process
(``Service`` over a ``RedisPool`` on a real redis-server, no pump: pump steps are rules) and
compares every answer, size and job state with the reference model of tests/support/model_ref.py.
Time moves only when a rule says so (a fake clock). Faults are rules too: the next step of the
next request loses its reply after running, fails before sending, is refused (NOREPLICAS,
TRYAGAIN, READONLY, LOADING) or stalls; the model then checks what the retry policy promises.

Operations: publish, bulk, consume, ack (batch, leases), republish, touch, release (with an
error text), bury, kick, reschedule by id, peek, pump steps, destroy, respawn / delete of dead
letters, the dead-letter listing by cursor, filtered redrive and purge, pause / resume and
max_size, retry backoff without jitter (a job's own, a queue's) (issue 17), publishes under a
`simple` or `debounce` dedup key (one live job per key; a waiting holder replaced, a reserved
one refused), `wheel widen`; groups: every publish (single, bulk, dedup, republish) in a group
or none, a group's settings changed (pause / resume, a concurrency limit of 1, 2 or none, a
rate or none), with their fair tags, holding back and bringing back, rate turns and wake-ups
(tests/support/model_ref.py). Not modelled yet: backoff jitter, progress, results on ack, the
`throttle` dedup mode, the Idempotency-Key.

After every step: each job's state, tries, deliveries, ttl end, score (peek_job), group, whether
its group holds it back (HELD, and peek_job's missing score), death reason and last error are
one of the outcomes the model allows; every ready job's READY score (a grouped job's fair tag,
which peek_job does not give) is exact; the sizes, and every group's (describe_groups: size,
reserved, held, settings), are exact; the groups' last tags, rates and wake-ups are as the
model has them; and cluster_dq/testing/invariants.py::check_queue holds. At the end
everything is deleted and nothing but the expiring acked-ids memory may remain.

Two machines share the examples: ``EngineModel`` (four fifths) and ``GroupsModel``, the same
rules with the groups' weighted up (grouped jobs ready at once, consumes of several, acks,
group settings), so that groups hold jobs back and bring them back within 40 steps.

The default run: bounded, standalone, ~60 s; the long run: 5x the examples, standalone and
a Cluster. Longer still (e.g. 30 min, both topologies)::

    DQ_MODEL_EXAMPLES=3000 DQ_MODEL_STEPS=80 DQ_MODEL_TOPOLOGY=standalone \
        .venv/bin/python -m pytest tests/engine/test_model.py -x -q -s
    DQ_MODEL_EXAMPLES=1500 DQ_MODEL_STEPS=80 DQ_MODEL_TOPOLOGY=cluster \
        .venv/bin/python -m pytest tests/engine/test_model.py -x -q -s

A failure prints the shrunk sequence of rules (Hypothesis's reproduction) and the model's notes.
``DQ_MODEL_SHRINK=0`` skips shrinking (a deliberately broken script, to see the test fail,
is reported in seconds instead of minutes).
``DQ_MODEL_TOLERATE`` (comma-separated) lists known engine defects the model tolerates until
their fix lands (see TOLERATE below); by default those still open (OPEN_DEFECTS, each shown by
a test of its own at the end of this file); ``DQ_MODEL_TOLERATE=`` tolerates none.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from redis.exceptions import BusyLoadingError, ReadOnlyError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from cluster_dq.backoff import Backoff
from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import EngineConfig, Eval, Group, GroupChanges, Rate
from cluster_dq.engine import control
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.control import FOREVER_MS, DeadFilter, widen_wheel
from cluster_dq.errors import (
    BadRequest,
    Conflict,
    NotFound,
    PoolUnavailable,
    QueueFull,
    WrongState,
)
from cluster_dq.keys import QueueKeys
from cluster_dq.models import Dedup, JobSpec, JobState, id_to_member
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load
from tests.support import flush
from cluster_dq.testing.invariants import check_queue, queue_keys
from tests.support.model_ref import (
    EVENTS,
    PRIO_SHIFT,
    DEAD,
    DELAYED,
    READY,
    RESERVED,
    GConf,
    Key,
    Mismatch,
    MJob,
    Model,
)
from tests.support.run import TIER, examples

NS = "m"
QUEUES = ("a", "b")
EXAMPLES = int(os.environ.get("DQ_MODEL_EXAMPLES") or examples(150))  # at the tier's size
STEPS = int(os.environ.get("DQ_MODEL_STEPS", "40"))
# standalone in the default run; the long run adds a Cluster (DQ_MODEL_TOPOLOGY: one of them)
TOPOLOGIES = (
    [os.environ["DQ_MODEL_TOPOLOGY"]]
    if os.environ.get("DQ_MODEL_TOPOLOGY")
    else ["standalone", "cluster"]
    if TIER == "long"
    else ["standalone"]
)
SHRINK = os.environ.get("DQ_MODEL_SHRINK", "1") != "0"  # 0: report the first failure as found
# Engine defects the model can be told to tolerate (DQ_MODEL_TOLERATE=a,b). Each was found by
# this model (issue 13); all are fixed on main and none is tolerated by default:
#   touch-expired  touch/release of a reservation whose ttr passed (not yet moved) succeed (#6)
#   ttl-eq-delay   ttl == delay accepted (it should be 400) (#2)
#   acked-memory   an id acked longer ago than the memory is still a duplicate (#9)
#   same-id        republish with the same client id loses the job (#1)
#   signal-503     a failed shard signal after a consume that ran answers 503 (#5)
#   stale-stamp    a retried step keeps the first attempt's time (#4)
#   republish-tidy republish.lua never called tidy(): a republish that removed the queue's last
#                  job and placed nothing (a duplicate id) left the META hash behind
#   consume-503-text  a consume 503 whose outcome is unknown (the script may have run) does not
#                  say so (SPEC §2.7)
# Defects of groups that this model found, each fixed since, with its test below (the
# dead letter's listing of a grouped record, the same group change twice, V under a
# priority, a resume's backlog and a limited group passing a waiting job); none open.
# DQ_MODEL_TOLERATE= (empty) tolerates none.
OPEN_DEFECTS: tuple[str, ...] = ()
TOLERATE = set(filter(None, os.environ.get("DQ_MODEL_TOLERATE", ",".join(OPEN_DEFECTS)).split(",")))
REMEMBER_MS = 60_000

STATS: Counter[str] = Counter()


class FakeClock:
    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


class Fault:
    """A fault armed for step ``at`` of the next request."""

    REFUSALS = {
        "noreplicas": lambda: ResponseError("NOREPLICAS Not enough good replicas to write."),
        "tryagain": lambda: TryAgainError(
            "TRYAGAIN Multiple keys request during rehashing of slot"
        ),
        "readonly": lambda: ReadOnlyError("READONLY You can't write against a read only replica."),
        "loading": lambda: BusyLoadingError("LOADING Redis is loading the dataset in memory"),
    }
    KINDS = ("lost", "before", "stall", *REFUSALS)

    def __init__(self, kind: str, at: int, ms: int) -> None:
        self.kind, self.at, self.ms = kind, at, ms
        self.step: str = ""  # what it hit
        self.seen = False  # a request started while it was armed

    def __repr__(self) -> str:
        return f"Fault({self.kind}, step {self.at}, {self.ms} ms, hit {self.step or 'nothing'})"


def describe(step: Any) -> str:
    if isinstance(step, Eval):
        return step.script
    if isinstance(step, tuple):
        return "pipeline(" + ",".join(describe(s) for s in step) + ")"
    return str(step.args[0])


def tick_at(m: Model, q: str, picked: int, now: int, first: int | None = None) -> None:
    """The pump's step as ``ops.tick`` runs it (``Model.tick``): its first scripts at
    ``first`` (else ``now``), the wheel buckets picked by ``picked`` (its own time; an earlier
    one when a step of it was repeated later), the scripts after them at ``now``."""
    m.tick(q, picked, now, first)


class Transport:
    """Test-only: wraps ``AsyncEngine._step`` (one attempt of one step) to inject one fault."""

    def __init__(self, pool: RedisPool, clock: FakeClock) -> None:
        self.engine = pool.engine
        self.real = pool.engine._step
        self.clock = clock
        self.armed: Fault | None = None
        self.fired: Fault | None = None
        self.count = 0
        self.engine._step = self._step  # type: ignore[method-assign]

    def start_request(self) -> None:
        if self.armed is not None and self.armed.seen:
            STATS["fault armed, request too short"] += 1
            self.armed = None  # a fault is for the one request after it, hit or not
        if self.armed is not None:
            self.armed.seen = True
        self.count, self.fired = 0, None

    async def _step(self, step: Any) -> Any:
        n, self.count = self.count, self.count + 1
        f = self.armed
        if f is None or f.at != n:
            return await self.real(step)
        self.armed, self.fired, f.step = None, f, describe(step)
        STATS[f"fault {f.kind}"] += 1
        if f.kind == "lost":
            await self.real(step)
            raise RedisConnectionError("injected: reply lost after the step ran")
        if f.kind == "before":
            raise RedisConnectionError("injected: connection failed before sending")
        self.clock.now += f.ms  # a stall, or the time a refusal and its backoff take
        if f.kind == "stall":
            return await self.real(step)
        raise Fault.REFUSALS[
            f.kind
        ]()  # classified by the engine (_guarded) as Redis's reply would be


def patch_clock(clock: FakeClock, pool: RedisPool) -> list[tuple[Any, str, Any]]:
    """The fake clock everywhere below the service (pool.engine.clock once main has it)."""
    import cluster_dq.engine.delivery as delivery

    saved = []
    pool.engine.clock = clock
    for mod in (delivery,):  # (what reads the clock itself: ack's default ``now``)
        if hasattr(mod, "now_ms"):
            saved.append((mod, "now_ms", mod.now_ms))
            mod.now_ms = clock  # type: ignore[attr-defined]
    return saved


DEPLOYMENT: Any = None  # set by the test function (a conftest deployment)

delays = st.sampled_from([0, 0, 1, 40, 900, 3_000, 9_000, 16_000, 31_000])
ttls = st.sampled_from([0, 0, 1, 30, 700, 5_000, 60_000])
ttrs = st.sampled_from([1, 30, 500, 4_000, 20_000])
ids = st.one_of(st.none(), st.none(), st.sampled_from(["c1", "c2", "c3"]))
prios = st.sampled_from([0, 0, 0, 3, 255])
picks = st.integers(0, 1_000)
# retry backoffs without jitter (the wait is then exact); kind 0: none, not even the queue's
backoffs = st.sampled_from([None, None, None, Backoff(1, 700), Backoff(2, 300, 1_000), Backoff(0)])
GROUPS = ("g1", "g2", "g3")
groups = st.sampled_from([None, None, "g1", "g1", "g2", "g3"])  # (a third in no group)
grouped_jobs = st.lists(
    st.tuples(st.sampled_from(["g1", "g1", "g2", "g3"]), st.sampled_from([0, 0, 0, 40])),
    min_size=1,
    max_size=4,
)


class EngineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.sync = DEPLOYMENT.sync_client()
        flush(self.sync)
        ps = DEPLOYMENT.pool_settings()
        env = {"CLUSTER_DQ_POOL__DEFAULT__ADDR": ps.Addr}
        if ps.Cluster:
            env["CLUSTER_DQ_POOL__DEFAULT__CLUSTER"] = "true"
        self.settings = load(None, env)
        self.pool = RedisPool.create(
            self.settings.Pool["default"], EngineConfig(remember_acked_ms=REMEMBER_MS)
        )
        self.clock = FakeClock(1_800_000_000_000)
        self.saved = patch_clock(self.clock, self.pool)
        self.run(self.pool.start(run_pump=False))
        self.svc = Service(self.settings, {"default": self.pool})
        self.route = self.svc.route("default")
        self.net = Transport(self.pool, self.clock)
        self.model = Model(REMEMBER_MS)
        self.deliveries = 0
        self.leases: list[tuple[str, str, str]] = []  # every delivery: (queue, job id, lease)
        self.pending = False
        STATS["examples"] += 1
        if STATS["examples"] % 200 == 0:  # a long run shows its figures as it goes
            print(summary_line(), flush=True)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            if not self.pending:  # a failed step keeps its own error
                self.clean_up()
        finally:
            for mod, name, value in self.saved:
                setattr(mod, name, value)
            self.run(self.pool.close())
            self.loop.close()
            self.sync.close()

    def clean_up(self) -> None:
        """Nothing left behind: every job acked or the queue destroyed, then no key remains
        but the expiring memory of acked ids."""
        self.net.armed = None
        for (q, g), c in self.model.gconf.items():
            if c != GConf():  # (a destroy keeps GCONF)
                off = GroupChanges(paused=False, clear_concurrency=True, clear_rate=True)
                self.run(self.svc.configure_group(self.route, NS, q, g, off))
        for q in QUEUES:
            if q in self.model.paused or q in self.model.max_size or q in self.model.backoff:
                conf = ["paused", "max_size", "backoff", "backoff_ms", "backoff_cap_ms"]
                conf.append("backoff_jitter")  # (a destroy keeps CONF)
                self.run(self.svc.configure(self.route, NS, q, [(f, "") for f in conf]))
            keys = [k[1] for k in self.model.jobs if k[0] == q and self.model.jobs[k] is not None]
            if keys and q == "a":
                self.run(self.svc.ack(self.route, NS, q, keys))
            else:
                self.run(self.svc.destroy(self.route, NS, q))
            left = queue_keys(self.sync, NS, q)
            assert not left, f"queue {q} left keys behind: {left}"

    # -- requests, each checked against the model -------------------------------------------

    def request(self, name: str, coro: Any) -> tuple[Any, BaseException | None]:
        """Runs one service call; returns (answer, error) and counts it."""
        self.net.start_request()
        self.pending = True
        STATS[f"op {name}"] += 1
        try:
            return self.run(coro), None
        except (PoolUnavailable, NotFound, BadRequest, Conflict, WrongState, QueueFull) as e:
            return None, e

    def fired(self) -> Any:
        return self.net.fired

    def stamps(self, t0: int, main: tuple[str, ...] = ()) -> list[int]:
        """When the request's script ran, as its ARGV says: the request's start, or, when
        that step (or one before it, ``main`` naming them) was refused and repeated after the
        clock moved, the repeat's time (a repeated step is stamped afresh, and so is every
        stamped step of the operation after it)."""
        f = self.fired()
        if f is not None and f.kind in Fault.REFUSALS and f.ms and any(n in f.step for n in main):
            return [self.clock.now, t0] if "stale-stamp" in TOLERATE else [self.clock.now]
        return [t0]

    def no_503_when_retried(self, name: str, err: BaseException | None) -> None:
        if isinstance(err, PoolUnavailable):
            raise Mismatch(
                f"{name} is retried by the policy, yet one fault ({self.fired()}) answered 503: {err}"
            )

    def settle(self, worlds: list[Model], errors: list[BaseException]) -> None:
        """Keeps the outcomes that the engine's answer allows: the first as the model, the
        others as alternatives the next observation chooses among."""
        if not worlds:
            raise errors[0]
        first = worlds[0]
        for other in worlds[1:]:
            for key in set(first.jobs) | set(other.jobs):
                first.allow(key, other.jobs.get(key))
                for alt in other.alts.get(key, []):
                    first.allow(key, alt)
            for key, t in other.acked.items():
                first.acked.setdefault(key, t)
            first.hidden_alts += [other.hidden(), *other.hidden_alts]
            first.hidden_unknown = first.hidden_unknown or other.hidden_unknown
        self.model = first

    def each(self, candidates: list[Any], apply: Any, unknown: bool = False) -> None:
        """``apply`` to a copy of the model for each candidate (the times a step may have run
        at); ``unknown``: the outcome is unknown (a 503 that may have been applied), so the
        model before the step stays allowed too."""
        worlds, errors = [], []
        for c in candidates:
            m = self.model.copy()
            before = m.copy() if unknown else None
            try:
                apply(m, c)
            except Mismatch as e:
                errors.append(e)
                continue
            if before is not None:
                m.allow_world(before)
            worlds.append(m)
        self.settle(worlds, errors)

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

    def pick(self, i: int, q: str | None = None) -> Key:
        """A known job (reserved ones more often: where holders matter), or an unknown id."""
        keys = sorted(k for k in self.model.jobs if q is None or k[0] == q)
        held = [k for k in keys if (j := self.model.jobs[k]) is not None and j.state == RESERVED]
        if held and i % 3:
            return held[i % len(held)]
        keys.append((q or QUEUES[i % 2], "nosuchjob"))
        return keys[i % len(keys)]

    def pick_lease(self, i: int, q: str | None = None) -> tuple[str, str, str] | None:
        """A delivery's (queue, job, lease): mostly one that still holds its job, else a stale one."""
        log = [d for d in self.leases if q is None or d[0] == q]
        if not log:
            return None
        live = [d for d in log if (j := self.model.jobs.get(d[:2])) is not None and j.lease == d[2]]
        if live and i % 4:
            return live[i % len(live)]
        return log[i % len(log)]

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
        lease = d[2] if d is not None else None
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
            if j.expired(now):
                m.gone(j)
                want: Any = "expired"
            elif j.tries == 0:
                j.state, j.died, j.reason, want = DEAD, now, "tries_exhausted", JobState.DEAD
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

    @rule(ms=st.sampled_from([1, 29, 30, 31, 499, 1_000, 4_000, 6_000, 20_000, 61_000]))
    def advance(self, ms: int) -> None:
        self.clock.now += ms
        note(f"clock +{ms} -> {self.clock.now}")

    @rule(
        kind=st.sampled_from(Fault.KINDS),
        at=st.sampled_from([0, 0, 0, 1, 2]),
        ms=st.sampled_from([0, 0, 10, 600, 25_000]),
    )
    def fault(self, kind: str, at: int, ms: int) -> None:
        if self.net.armed is None:  # one armed at a time (see the note above dead_sweep)
            self.net.armed = Fault(kind, at, ms)

    # -- observation ----------------------------------------------------------------------------

    @invariant()
    def engine_agrees(self) -> None:
        if self.net.fired is not None:
            note(f"fired: {self.net.fired}")
        armed, self.net.armed = self.net.armed, None  # observations are not faulted
        try:
            self.observe()
        finally:
            self.net.armed = armed

    def observe(self) -> None:
        m = self.model
        seen = self.read_queues()
        keys = sorted(set(m.jobs) | set(m.alts))

        at_once = asyncio.Semaphore(32)  # well within the pool's connections

        async def peek(q: str, job_id: str) -> Any:
            async with at_once:
                try:
                    return await self.svc.peek_job(self.route, NS, q, job_id)
                except NotFound:
                    return None

        async def peek_all() -> list[Any]:  # at once: reads, and no fault is armed
            looks = [self.svc.sizes(self.route, NS, q) for q in QUEUES]
            looks += [
                self.pool.engine.run(ops.describe_groups(NS, q, GROUPS), idempotent=True)
                for q in QUEUES
            ]
            return await asyncio.gather(*looks, *(peek(q, job_id) for q, job_id in keys))

        found_all = self.run(peek_all())
        n = len(QUEUES)
        sizes, described = dict(zip(QUEUES, found_all[:n])), dict(zip(QUEUES, found_all[n : 2 * n]))
        for key, job in zip(keys, found_all[2 * n :], strict=True):
            q, job_id = key
            STATS["checks"] += 1
            records, leases, held_back, ready = seen[q][:4]
            options = [m.jobs.get(key)] + m.alts.get(key, [])
            member = id_to_member(job_id)
            held = member in held_back
            tag = ready.get(member)  # its READY score below the priority (a grouped job's tag)
            if job is not None and job.state is JobState.READY and held != (job.due_ms is None):
                raise Mismatch(f"{job_id}: held back {held}, yet peek_job's score is {job.due_ms}")
            holder = leases.get(member)
            found: MJob | None | str = next(
                (
                    o
                    for o in options
                    if matches(o, job, member not in records, held, tag)
                    and (o is None or o.lease is None or holder is None or o.lease == holder.hex())
                ),
                "none",
            )
            if isinstance(found, str):
                raise Mismatch(
                    f"job {q}/{job_id}: engine {summary(job, held, tag)}; model allows "
                    f"{[summary_m(o) for o in options]} (clock {self.clock.now})"
                )
            if found is None:
                m.jobs.pop(key, None)
            else:
                if found.state == RESERVED and found.lease is None and holder is not None:
                    found.lease = (
                        holder.hex()
                    )  # a reservation whose answer was lost: held by nobody
                if found.loose:  # an unknown outcome: its tag and holding as found
                    STATS["loose outcome read"] += 1
                    found.loose, found.held = False, held
                    if tag is not None:
                        found.due = tag
                    elif found.state == RESERVED and job.due_ms is not None:
                        found.deadline = job.due_ms
                m.jobs[key] = found
        m.alts.clear()
        self.check_hidden(seen)
        self.pending = False
        for q in QUEUES:
            s = sizes[q]
            mine = Counter(j.state for j in m.of(q))
            want = (mine[DELAYED], mine[READY], mine[RESERVED], mine[DEAD])
            if (s.delayed, s.ready, s.reserved, s.dead) != want:
                raise Mismatch(f"sizes of {q}: engine {s}, model {want}")
            try:
                shape = check_queue(self.sync, NS, q)
            except AssertionError as e:
                if "keeps its meta hash" not in str(e) or "republish-tidy" not in TOLERATE:
                    raise
                STATS["tolerated republish-tidy"] += 1
                self.sync.delete(QueueKeys(NS, q).meta)  # what tidy() would have done
                shape = check_queue(self.sync, NS, q)
            wheel = sum(1 for j in m.of(q, DELAYED) if j.wheel is not None)
            if (shape["wheel"], shape["delayed"]) != (wheel, mine[DELAYED] - wheel):
                raise Mismatch(f"{q}: engine wheel/near delayed {shape}, model wheel {wheel}")
            for j in m.of(q, RESERVED):
                if j.tries < 0:
                    raise Mismatch(f"{j.job_id}: tries exceeded")
            for g in described[q]:
                if view(g) != m.group_view(q, g.name):
                    raise Mismatch(
                        f"group {q}/{g.name}: engine {g}, model {m.group_view(q, g.name)}"
                    )
            STATS["checks"] += 4

    def read_queues(self) -> dict[str, tuple[Any, ...]]:
        """What the observation reads of each queue beside peek_job, in one round trip: records,
        leases, the members HELD holds back, READY's scores below the priority (grouped jobs'
        tags, which peek_job does not give), and what the scripts keep beside the jobs (GROUPS,
        GCONF, GWAKE)."""
        p = self.sync.pipeline(transaction=False)
        for q in QUEUES:
            qk = QueueKeys(NS, q)
            p.hgetall(qk.jobs)
            p.hgetall(qk.leases)
            p.zrange(qk.held, 0, -1)
            p.zrange(qk.ready, 0, -1, withscores=True)
            p.hgetall(qk.groups)
            p.hgetall(qk.group_conf)
            p.zrange(qk.group_wake, 0, -1, withscores=True)
        got = p.execute()
        out = {}
        for i, q in enumerate(QUEUES):
            records, leases, held, ready, groups_, gconf, wakes = got[7 * i : 7 * i + 7]
            held_ids = {h.split(b"\0", 1)[1] for h in held}
            tags = {m: int(sc) % PRIO_SHIFT for m, sc in ready}
            out[q] = (records, leases, held_ids, tags, groups_, gconf, wakes)
        return out

    def check_hidden(self, seen: dict[str, tuple[Any, ...]]) -> None:
        """Groups' settings exactly as the model has them; the groups' last tags, the rates'
        next allowed deliveries and their wake-ups as one of the outcomes it allows (taken from
        the engine when it cannot know them: after a consume whose reply was lost)."""
        m = self.model
        tags: dict[tuple[str, str], int] = {}
        tat: dict[tuple[str, str], float] = {}
        wake: dict[tuple[str, str], int] = {}
        conf: dict[tuple[str, str], GConf] = {}
        for q, (_, _, _, _, groups_, gconf, wakes) in seen.items():
            for f, x in groups_.items():
                kind, _, g = f.decode().partition(":")
                if kind == "t":
                    tags[(q, g)] = int(x)
            for f, x in gconf.items():
                kind, _, g = f.decode().partition(":")
                c = conf.setdefault((q, g), GConf())
                if kind == "a":
                    tat[(q, g)] = float(x)
                elif kind == "p":
                    c.paused = x == b"1"
                elif kind == "c":
                    c.concurrency = int(x)
                else:
                    jobs, per = x.split()
                    c.rate = (int(jobs), int(per))
            for g, at in wakes:
                wake[(q, g.decode())] = int(at)
        mine = {k: c for k, c in m.gconf.items() if c != GConf()}
        if {k: c for k, c in conf.items() if c != GConf()} != mine:
            raise Mismatch(f"group settings: engine {conf}, model {mine}")
        found = (
            tuple(sorted(tags.items())),
            tuple(sorted(tat.items())),
            tuple(sorted(wake.items())),
        )
        if m.hidden_unknown:
            STATS["hidden state read after an unknown outcome"] += 1
        elif found != m.hidden() and found not in m.hidden_alts:
            raise Mismatch(
                f"last tags, rate times, wake-ups: engine {found}, model {m.hidden()} "
                f"(or {m.hidden_alts})"
            )
        m.set_hidden(found)
        m.hidden_alts, m.hidden_unknown = [], False


def view(g: Group) -> tuple[Any, ...]:
    """A group as describe_groups answers it, as ``Model.group_view`` makes it."""
    rate = (g.rate.jobs, g.rate.per_ms) if g.rate else None
    return g.size, g.reserved, g.held, g.paused, g.concurrency, rate


class GroupsModel(EngineModel):
    """The same machine, its groups' rules weighted up (a share of the examples): grouped jobs
    ready at once in bulk, consumes of several jobs, acks and group settings twice as often,
    so that jobs are held back and brought back, wait for their rate's turns and go on them, in
    a history of 40 steps."""

    @initialize(
        conc=st.sampled_from([1, 1, 2]),
        rate=st.sampled_from([(2, 300), (1, 1_000), (3, 1_000), (5, 2)]),
    )
    def limits(self, conc: int, rate: tuple[int, int]) -> None:
        """Group g2 of queue a under a rate (5/2 ms: several turns a millisecond), beside g1
        (maybe limited: first_group_settings) and g3; g1 of queue b at a concurrency limit."""
        self.configure_group("a", "g2", None, None, rate)
        self.configure_group("b", "g1", None, conc, None)

    @rule(q=st.sampled_from(["a", "a", "b"]), raw=grouped_jobs)
    def publish_grouped(self, q: str, raw: list[tuple[str, int]]) -> None:
        """Grouped jobs, most of them ready at once: groups matter once their jobs are
        consumed (fair turns, holding back, rate turns), and most of the other publishes'
        jobs wait."""
        self.publish_bulk(q, [(None, d, 0, 2, 0, g) for g, d in raw])

    @rule(q=st.sampled_from(["a", "a", "b"]), raw=grouped_jobs)
    def publish_grouped_again(self, q: str, raw: list[tuple[str, int]]) -> None:
        self.publish_grouped(q, raw)

    @rule(queues=st.sampled_from([["a"], ["a"], ["a", "b"]]), ttr=ttrs, count=st.integers(2, 3))
    def consume_several(self, queues: list[str], ttr: int, count: int) -> None:
        self.consume(queues, ttr, count)

    @rule(q=st.sampled_from(["a", "a", "b"]), raw=grouped_jobs)
    def publish_grouped_3(self, q: str, raw: list[tuple[str, int]]) -> None:
        self.publish_grouped(q, raw)

    @rule(queues=st.sampled_from([["a"], ["a"], ["a", "b"]]), ttr=ttrs, count=st.integers(2, 3))
    def consume_several_2(self, queues: list[str], ttr: int, count: int) -> None:
        self.consume(queues, ttr, count)

    @rule(queues=st.sampled_from([["a"], ["b"], ["a", "b"]]), ttr=ttrs, count=st.integers(1, 3))
    def consume_3(self, queues: list[str], ttr: int, count: int) -> None:
        self.consume(queues, ttr, count)

    @rule(i=picks, leased=st.booleans())
    def ack_again(self, i: int, leased: bool) -> None:
        self.ack(i, leased)

    @rule(i=picks, leased=st.booleans())
    def ack_3(self, i: int, leased: bool) -> None:
        self.ack(i, leased)

    @rule(i=picks, delay=st.sampled_from([0, 0, 20]), leased=st.booleans())
    def release_again(self, i: int, delay: int, leased: bool) -> None:
        self.release(i, delay, leased, "")

    @rule(ms=st.sampled_from([150, 334, 500, 1_000]))
    def advance_a_turn(self, ms: int) -> None:
        self.advance(ms)  # (a rate's turns: 2/300 ms, 3/s, 1/s)

    @rule(
        q=st.sampled_from(["a", "b"]),
        group=st.sampled_from(["g1", "g1", "g2"]),
        paused=st.sampled_from([None, None, True, False, False]),
        conc=st.sampled_from([None, 1, 2, 2, 0]),
        rate=st.sampled_from([None, None, None, (2, 300), (3, 1_000), (5, 2), 0]),
    )
    def configure_group_again(
        self,
        q: str,
        group: str,
        paused: bool | None,
        conc: int | None,
        rate: tuple[int, int] | int | None,
    ) -> None:
        self.configure_group(q, group, paused, conc, rate)


def matches(o: MJob | None, job: Any, in_wheel: bool, held: bool, tag: int | None) -> bool:
    """Whether the engine's job (peek_job's answer; ``held``: HELD holds it back; ``tag``: its
    READY score below the priority) is the model's outcome ``o``."""
    if o is None or job is None:
        return o is None and job is None
    same = (
        (o.wheel is not None) == in_wheel
        and o.state == job.state.value
        and o.tries == job.tries_left
        and o.deliveries == job.deliveries
        and o.expire_at == job.expire_at_ms
        and o.group == job.group
        and (o.state != DEAD or (job.note is not None and job.note.reason == o.reason))
        and o.error == ((job.note and job.note.last_error) or "")
    )
    if o.loose:  # (its tag and holding are read, not checked)
        return same
    mine = o.due if o.state == READY and not o.held else None
    return same and o.score() == job.due_ms and o.held == held and mine == tag


def summary(job: Any, held: bool = False, tag: int | None = None) -> str:
    if job is None:
        return "gone"
    return (
        f"{job.state.value} tries={job.tries_left} deliveries={job.deliveries} "
        f"expire={job.expire_at_ms} score={job.due_ms} reason={job.note and job.note.reason} "
        f"error={job.note and job.note.last_error} group={job.group}"
        f"{' held' if held else ''}{f' tag={tag}' if tag is not None else ''}"
    )


def summary_m(o: MJob | None) -> str:
    if o is None:
        return "gone"
    return (
        f"{o.state} tries={o.tries} deliveries={o.deliveries} expire={o.expire_at} score={o.score()}"
        f" reason={o.reason or None} error={o.error or None} group={o.group}"
        f"{' wheel' if o.wheel is not None else ''}{' held' if o.held else ''}"
        f"{f' tag={o.due}' if o.state == READY and not o.held else ''}"
        f"{' loose' if o.loose else ''}"
    )


@pytest.fixture(params=TOPOLOGIES)
def deployment_for_model(request: pytest.FixtureRequest) -> Iterator[Any]:
    name = {"standalone": "redis_server", "cluster": "redis_cluster"}[request.param]
    yield request.getfixturevalue(name)
    print(f"\nmodel summary ({request.param}): {summary_line()}")


def summary_line() -> str:
    steps = sum(v for k, v in STATS.items() if k.startswith("op "))
    faults = sum(v for k, v in STATS.items() if k.startswith("fault ") and "armed" not in k)
    return (
        f"examples {STATS['examples']}, requests {steps}, faults injected "
        f"{faults}, checks {STATS['checks']}; "
        + ", ".join(f"{k}: {v}" for k, v in sorted((STATS + EVENTS).items()))
    )


def test_engine_matches_the_model(deployment_for_model: Any) -> None:
    global DEPLOYMENT
    DEPLOYMENT = deployment_for_model
    STATS.clear()
    EVENTS.clear()
    # the examples shared: every rule in all of them, the groups' weighted up in a fifth
    share = {EngineModel: EXAMPLES - EXAMPLES // 5, GroupsModel: max(2, EXAMPLES // 5)}
    for machine, n in share.items():
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=n,
                stateful_step_count=STEPS,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                derandomize=False,
                # no explain phase: tracing every line of the engine while re-running the shrunk
                # case takes minutes here; the shrunk rule sequence is the reproduction
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
                + ([Phase.shrink] if SHRINK else []),
            ),
        )


_ = (redis, DEAD)


def test_the_model_agrees_when_a_group_changes_reply_is_lost(
    deployment_for_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A history written out (random ones seldom lose this reply while a group holds jobs back
    with room to run them): group g1 of queue a at its limit of 1, two of its jobs held back;
    the reply of a change to a limit of 2 lost, then of a change of its rate, then of a
    resume; the model checks each step as the machine does (a repeat of a change after a lost
    reply finds the same settings: it brings nothing more back)."""
    global DEPLOYMENT
    DEPLOYMENT = deployment_for_model
    monkeypatch.setattr(sys.modules[__name__], "note", lambda _: None)  # (outside a given)
    m = GroupsModel()
    try:
        m.configure_group("a", "g1", None, 1, None)
        m.engine_agrees()
        m.publish_grouped("a", [("g1", 0)] * 3)
        m.engine_agrees()
        m.consume(["a"], 20_000, 3)  # one reserved, two held back
        m.engine_agrees()
        assert m.model.group_view("a", "g1")[1:3] == (1, 2)
        for change in [(None, 2, None), (True, None, (2, 300)), (False, None, None)]:
            m.fault("lost", 0, 0)
            m.configure_group("a", "g1", *change)
            assert m.fired() is not None and m.fired().step == "group_configure"
            m.engine_agrees()
    finally:
        m.teardown()


# -- groups, each rule shown alone -------------------------------------------------------------
# What the model checks in passing, on small cases that fail plainly: each test below failed on
# an earlier version of groups (fixed in 7793940 and after).

GQ = "gd"  # the queue of these tests
T0 = 1_800_000_000_000


async def _publish(
    engine: AsyncEngine, now: int, group: str | None, n: int = 1, **kw: Any
) -> list[str]:
    specs = [JobSpec(b"x", group=group, **kw) for _ in range(n)]
    return [p.job_id for p in await engine.run(ops.publish(engine.config, NS, GQ, specs, now))]


async def _take(engine: AsyncEngine, now: int, count: int = 1) -> list[Any]:
    return await engine.run(ops.consume(engine.config, NS, (GQ,), 60_000, count, now))


async def _configure(engine: AsyncEngine, now: int, group: str, **kw: Any) -> Group:
    changes = GroupChanges(**kw)
    return await engine.run(ops.configure_group(engine.config, NS, GQ, group, changes, now))


async def test_a_group_entering_before_any_delivery_waits_one_round(engine: AsyncEngine) -> None:
    await _publish(engine, T0, "heavy", 30)
    (light,) = await _publish(engine, T0 + 20, "light")  # 20 ms later, before any consume
    order = [j.job_id for j in await _take(engine, T0 + 30, count=30)]
    assert order.index(light) <= 1, f"the light group's job came {order.index(light) + 1}th"


async def test_a_held_job_comes_back_within_a_round(engine: AsyncEngine) -> None:
    """A job held back comes back just behind READY's head (one round at most), not behind
    its group's backlog. (Its group's younger jobs at the head may go before it: the order
    within a limited group is not kept, so that a job waiting at the head is not passed.)"""
    await _configure(engine, T0, "one", concurrency=1)
    mine = await _publish(engine, T0, "one", 10)
    await _publish(engine, T0, "many", 10)
    first = await _take(engine, T0 + 1, count=2)  # one of each
    assert sorted(j.group for j in first) == ["many", "one"]
    await _take(engine, T0 + 1, count=2)  # one's 2nd, 3rd held back, many's 2nd, 3rd reserved
    done = next(j for j in first if j.group == "one")
    await engine.run(ops.ack(NS, GQ, [done.job_id], T0 + 2))  # its slot freed: the 2nd is back
    order = [j.job_id for j in await _take(engine, T0 + 3, count=4)]
    assert mine[1] in order[:3] or mine[3] in order[:2], order  # within a round"


async def test_an_ungrouped_job_is_not_passed_by_later_grouped_jobs(engine: AsyncEngine) -> None:
    await _publish(engine, T0, "g1")
    await _take(engine, T0)
    (plain,) = await _publish(engine, T0 + 1_000, None)
    await _publish(engine, T0 + 2_000, "g2", 20)  # a second later
    order = [j.job_id for j in await _take(engine, T0 + 2_001, count=21)]
    assert order.index(plain) <= 1, f"the ungrouped job came {order.index(plain) + 1}th"


async def test_a_rescheduled_job_does_not_pass_its_groups_rate(engine: AsyncEngine) -> None:
    await _configure(engine, T0, "r", rate=Rate(1, 10_000))
    a, b = await _publish(engine, T0, "r", 2)
    assert [j.job_id for j in await _take(engine, T0, count=2)] == [a]  # b's turn: T0 + 10 s
    await engine.run(control.reschedule_job(engine.config, NS, GQ, b, T0 + 1, T0 + 1))
    assert await _take(engine, T0 + 1, count=2) == [], "a second job within the rate's 10 s"


async def test_the_dead_letter_lists_a_dead_grouped_job(engine: AsyncEngine) -> None:
    (plain,) = await _publish(engine, T0, "g1")
    (rich,) = await _publish(engine, T0, "g1", attributes={"a": "b"})
    for job_id in (plain, rich):
        await engine.run(control.bury(NS, GQ, job_id, "why", T0 + 1))
    page, _ = await engine.run(control.dead_page(NS, GQ, None, 10))
    assert sorted(d.job_id for d in page) == sorted([plain, rich])


async def test_the_same_group_change_twice_brings_back_no_more(engine: AsyncEngine) -> None:
    await _configure(engine, T0, "g1", concurrency=1)
    await _publish(engine, T0, "g1", 4)
    assert len(await _take(engine, T0, count=10)) == 1  # 1 reserved, 3 held back
    g = await _configure(engine, T0 + 1, "g1", concurrency=2)
    assert (g.reserved, g.held) == (1, 2)  # room for one more: one back
    g = await _configure(engine, T0 + 2, "g1", concurrency=2)  # (a repeat after a lost reply)
    assert (g.reserved, g.held) == (1, 2), "the same change again brought back another job"


async def test_a_group_entering_under_a_priority_job_waits_one_round(engine: AsyncEngine) -> None:
    await _publish(engine, T0, "heavy", 10)
    await _publish(engine, T0 + 1_000, None, priority=9)  # READY's head while it waits
    (light,) = await _publish(engine, T0 + 1_001, "light")
    order = [j.job_id for j in await _take(engine, T0 + 1_002, count=12)]
    assert order.index(light) <= 2, f"the light group's job came {order.index(light) + 1}th"


async def test_a_resumed_group_takes_turns_with_the_others(engine: AsyncEngine) -> None:
    await _configure(engine, T0, "p", paused=True)
    await _publish(engine, T0, "p", 10)
    assert await _take(engine, T0 + 1) == []  # all ten held back
    await _publish(engine, T0 + 2, "b", 10)
    await _configure(engine, T0 + 3, "p", paused=False)  # all ten back at READY's head
    order = [j.group for j in await _take(engine, T0 + 4, count=20)]
    assert "b" in order[:3], order


async def test_a_group_at_its_limit_does_not_pass_a_waiting_job_again_and_again(
    engine: AsyncEngine,
) -> None:
    await _configure(engine, T0, "heavy", concurrency=1)
    await _publish(engine, T0, "heavy", 10)
    (running,) = await _take(engine, T0 + 1, count=10)  # one reserved, nine held back
    (light,) = await _publish(engine, T0 + 2, "light")  # waits in READY
    order = []
    for i in range(4):  # one consumer, one job at a time: its job done, it asks for the next
        await engine.run(ops.ack(NS, GQ, [running.job_id], T0 + 3 + i))
        (running,) = await _take(engine, T0 + 3 + i)
        order.append(running.group)
        if running.job_id == light:
            break
    assert "light" in order[:2], order
