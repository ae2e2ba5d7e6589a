"""The harness of the model-based test (tests/engine/test_model.py): its size and
topologies, the fake clock, the faults and the transport that injects them, the strategies the
rules draw from, and how an engine's job or group is compared with the model's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from redis.exceptions import BusyLoadingError, ReadOnlyError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from cluster_dq.backoff import Backoff
from cluster_dq.engine.commands import Eval, Group
from cluster_dq.pools import RedisPool
from tests.support.model_ref import (
    DEAD,
    EVENTS,
    READY,
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
# Defects of groups that this model found, each fixed since, with its test in
# tests/engine/test_model_groups.py (the dead letter's listing of a grouped record, the same
# group change twice, V under a priority, a resume's backlog and a limited group passing a
# waiting job). Of the keyed publishes, fixed since, each with its test in
# tests/engine/test_model_keyed.py:
#   idem-repeat-replayed  the service's own repeat of a publish with an Idempotency-Key, after
#                  a lost reply, whose first answer was a dedup key's holder (existing,
#                  replaced), was told as a replay (docs/api.md: "tells it as the first")
# Open defects (none now) are tolerated by default, each shown by a test of its own;
# DQ_MODEL_TOLERATE= (empty) tolerates none.
OPEN_DEFECTS: tuple[str, ...] = ()
TOLERATE = set(filter(None, os.environ.get("DQ_MODEL_TOLERATE", ",".join(OPEN_DEFECTS)).split(",")))
REMEMBER_MS = 60_000
IDEM_MS = 20_000  # how long an Idempotency-Key's answer is kept (IdempotencyKeySecond: 24 h)
# The fake clock's start: ahead of the real one, since Redis expires KEYED at the scripts'
# times (PEXPIREAT now + window) by its own clock: a fake time behind it would drop windows
# and answers at once. (1.8e12 is January 2027; later, a month ahead of the real time.)
START_MS = max(1_800_000_000_000, int(time.time() * 1000) + 30 * 86_400_000)

STATS: Counter[str] = Counter()


def note(text: str) -> None:
    """Hypothesis's ``note`` inside a run of the machine; nothing outside one (a history written
    out by hand, as test_model_groups.py's)."""
    if currently_in_test_context():
        hypothesis.note(text)


def machine_settings(n: int) -> settings:
    """How a machine is run: ``n`` examples of ``STEPS`` steps each, no deadline, no database."""
    return settings(
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
    )


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
        self.args: Any = ()  # the arguments of the step it hit (a script's ARGV)
        self.seen = False  # a request started while it was armed
        # a lost reply only: ``ran`` set once the step ran, the connection error (and the
        # engine's repeat) then held until ``hold`` is set: other clients' moves in between
        self.ran: asyncio.Event | None = None
        self.hold: asyncio.Event | None = None

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
        # a fault hit a step whose loss may leave a shard signal unsent (anything but a publish
        # script, which the engine repeats): the queues' registration is not checked after it
        self.unsignalled = False
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
        if f.step not in ("publish", "publish_keyed"):
            self.unsignalled = True
        f.args = getattr(step, "args", ())
        STATS[f"fault {f.kind}"] += 1
        if f.kind == "lost":
            await self.real(step)
            if f.ran is not None and f.hold is not None:
                f.ran.set()
                await f.hold.wait()
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
# keyed publishes: dedup keys (a queue's modes share them), throttle windows (ms), client ids
# now and then, Idempotency-Keys (a queue's own: the same key on the other queue is another)
dedup_keys = st.sampled_from(["k1", "k1", "k2"])
dedup_modes = st.sampled_from(["simple", "throttle", "throttle", "debounce"])
windows = st.sampled_from([1, 40, 900, 5_000, 5_000, 30_000])
keyed_ids = st.sampled_from([None, None, None, None, "c1", "c2"])
idem_keys = st.sampled_from(["i1", "i1", "i2"])
grouped_jobs = st.lists(
    st.tuples(st.sampled_from(["g1", "g1", "g2", "g3"]), st.sampled_from([0, 0, 0, 40])),
    min_size=1,
    max_size=4,
)


def view(g: Group) -> tuple[Any, ...]:
    """A group as describe_groups answers it, as ``Model.group_view`` makes it."""
    rate = (g.rate.jobs, g.rate.per_ms) if g.rate else None
    return g.size, g.reserved, g.held, g.paused, g.concurrency, rate


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


def summary_line() -> str:
    steps = sum(v for k, v in STATS.items() if k.startswith("op "))
    faults = sum(v for k, v in STATS.items() if k.startswith("fault ") and "armed" not in k)
    return (
        f"examples {STATS['examples']}, requests {steps}, faults injected "
        f"{faults}, checks {STATS['checks']}; "
        + ", ".join(f"{k}: {v}" for k, v in sorted((STATS + EVENTS).items()))
    )
