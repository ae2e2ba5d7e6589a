"""A recorded history of queue operations and its checker (pure: no I/O, no Redis).

The history is kept the way Jepsen keeps one: every operation is an ``invoke`` event when the
client sends it and one completion event when it learns the outcome:

- ``ok``: the operation happened (a 2xx);
- ``fail``: it certainly did not happen (a 4xx, or a connection that was never opened);
- ``info``: the outcome is unknown (a 503, a timeout, a connection lost mid-request).

Times are the *client's* monotonic clock. The checker never compares them with the server's
clock: an operation took effect somewhere between its invoke and its completion, and every
verdict is drawn only when it holds for every instant in those intervals, so neither clock skew
nor a slow reply can make a false alarm (it can only hide an anomaly).

Jobs are known by a ``key`` that is their body, unique per publish, so that a delivery can be
traced back to a publish whose reply was lost (its server-assigned id never reached us).

Anomalies (``check`` counts each, with examples):

- ``unexpected``: delivered, but never published, or its publish certainly failed;
- ``double_publish``: one publish delivered as two jobs (two job ids for one body): the service
  wrote it twice (the client never repeats a request that may have been sent);
- ``lost``: a publish that got a 2xx, never acked, and gone at the end (neither delivered
  and acked nor resting in the dead letter); ``never_delivered`` (reported) counts 2xx
  publishes never delivered at all;
- ``duplicated``: delivered by a consume sent after an ack of the job had succeeded;
- ``early``: the consume's reply arrived before (publish invoke + delay);
- ``early_release``: after a release with a delay that succeeded before the consume was sent,
  the reply arrived before (release invoke + delay) (apart from ``early`` because a release
  that is not replicated can be lost in a failover without durable writes: then the job's
  ttr runs out and it comes back "early" for a release that no longer happened);
- ``held_twice``: two deliveries of a job that cannot be ttr apart: the later one (known by its
  ``deliveries`` count) came back before (first consume invoke + first ttr), and no release or
  ack of the job was under way in between that could have ended the first hold (a touch under
  way may end it earlier: then its invoke + its ttr is the bound);
- ``over_tries``: a delivery counting more than ``tries``, or more deliveries seen than ``tries``;
- ``remain_tries``: a delivery whose ``remain_tries`` is not ``tries - deliveries``;
- ``dead_letter``: a job whose last delivery used its last try and was never acked is not in the
  dead letter at the end, a dead job that should not be, or a dead-letter size that disagrees;
- ``left_behind``: anything still stored after the drain (a job not dead, a size not 0, a key);
- ``stale_lease``: an ack/touch/release that succeeded with the lease of a delivery that no
  longer held the job when the request was sent: a later delivery's reply had come, or the
  hold's ttr (counted from the consume's reply, or a touch's) had run out (it must be a 409);
  except an ack when another ack of the job may have come first: a gone job is no conflict
  (lua/ack.lua: acking it is what the holder wanted, and a repeat after a lost reply succeeds);
- ``starved``: a grouped job waited behind more jobs of another group than its turns allow;
- ``dedup_twice``: two jobs held one simple (or debounce) dedup key at once.

Groups and dedup keys come from a publish's arguments: ``group``, ``priority`` (absent: 0),
``ttl_ms``, ``dedup`` (the key) and ``dedup_mode`` (absent: simple; a throttle key promises no
single job: not checked); its ``ok`` result has ``job_id`` and ``dedup`` (new, existing,
replaced). A ``configure_group`` operation (``queue``, ``group``) may have limited that group.

``starved``. Under the fair tag rule (lua/lib/groups.lua) a grouped job's READY score is
``tag = max(V, its group's last tag + 1)``, V the tag of READY's head; a group's tags are
distinct and, from where it last took V, one apart. In a queue whose jobs are all grouped, a
job enters READY at V or above and leaves it at its head, so V, at one priority, never goes
back while J waits. Take J of group G, queue q, published ``ok`` with delay d: ready by
``R = publish completion + d``, waiting until ``end``, the first instant it may have stopped:
the invoke of its first seen delivery's consume (of any consume whose reply was lost, when
that delivery is not its first), of an ack of it, or its ttl's end. A job of another group H
of q published (invoked) after R takes tags ``>= V_R``: each of its deliveries before J's has
a distinct tag in ``[V_R, tag_J]`` (a priority above J's is not counted), and ``tag_J - V_R <=
W + 1``, W being G's readinesses that came before J's and were not delivered by R (G's tags
from ``V_R`` to ``tag_J`` are one apart, one per readiness; a tag delivered by R is at most
``V_R``). From the history: W <= (G's publishes, J's aside, whose invoke + delay is before R) +
(G's deliveries whose consume was invoked before R: each may bring its job back) + (the jobs
asked for by consumes of q whose reply was lost, before R) - (G's deliveries, J's aside, whose
reply came before J's publish invoke + d). Flagged: some H with more than ``W + 2`` such
deliveries by consumes whose reply came before ``end``: J waited behind more than one job of H
per round. The rule never passes that bound; the engine does in two ways, each a starvation,
flagged as such: V read from the head of a higher priority (above J's whole line), and a job
H held back (a limit, a pause, a rate) brought back at READY's head with the head's tag,
not a fresh one (it ties with J and passes it by its older id, each time). Not checked: J of a
group a ``configure_group`` touched (paused, at its limit or rate, it waits by design), a
queue with ungrouped jobs (a due time can put READY's head, and V, below the tags), and
histories that kick or redrive dead jobs (a revived job becomes ready without a delivery).

``dedup_twice``. A job is certainly alive from the completion of the first operation that showed
it (its publish answered with it, ``new`` or ``existing``, or its delivery) until the first
instant it may have ended: the invoke of an ack of it, the consume invoke of a delivery that
used its last try (a release or its ttr may end it from then), the invoke + ttr of any consume
of its queue whose reply was lost (it may have used the last try unseen), or its ttl's end.
Flagged: for one key, an operation showing another job id invoked after the first job was
certainly alive and completed before it may have ended (a failover that loses a job without
durable writes frees its key: reported there, as ``lost`` is).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

KINDS = (
    "unexpected",
    "double_publish",
    "lost",
    "duplicated",
    "early",
    "early_release",
    "held_twice",
    "over_tries",
    "remain_tries",
    "dead_letter",
    "left_behind",
    "stale_lease",
    "starved",
    "dedup_twice",
)


@dataclass
class Event:
    op: int  # the operation's index: an invoke and its completion share it
    process: int  # the client (publisher or consumer) that ran it
    type: str  # invoke | ok | fail | info
    f: str  # publish | consume | ack | touch | release
    time: float  # client monotonic seconds
    value: dict[str, Any]


@dataclass
class History:
    events: list[Event] = field(default_factory=list)
    _next: int = 0

    def invoke(self, process: int, f: str, time: float, **value: Any) -> int:
        op = self._next
        self._next += 1
        self.events.append(Event(op, process, "invoke", f, time, value))
        return op

    def complete(self, op: int, type: str, time: float, **value: Any) -> None:
        assert type in ("ok", "fail", "info"), type
        inv = next(e for e in reversed(self.events) if e.op == op and e.type == "invoke")
        self.events.append(Event(op, inv.process, type, inv.f, time, value))

    def counts(self) -> Counter[str]:
        """Completed operations by ``f:type`` (the report's operations line)."""
        return Counter(f"{e.f}:{e.type}" for e in self.events if e.type != "invoke")


@dataclass
class Op:
    """An invoke paired with its completion (``type`` "info" when it never completed)."""

    f: str
    process: int
    invoked: float
    completed: float
    type: str
    args: dict[str, Any]
    result: dict[str, Any]


@dataclass
class Delivery:
    key: str
    job_id: str
    invoked: float  # the consume's invoke: the delivery happened after this
    completed: float  # and before this
    ttr_s: float
    remain_tries: int
    deliveries: int
    lease: str | None
    process: int


@dataclass
class Final:
    """What the driver saw at the end, after the drain: each job's state by key (``None``: gone;
    else "dead", "ready", ...), each queue's dead-letter size, and leftovers (name -> what)."""

    states: dict[str, str | None]
    dead_sizes: dict[str, int]
    leftovers: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    counts: Counter[str]
    examples: dict[str, list[Any]]
    stats: dict[str, int]

    def ok(self, kinds: tuple[str, ...] = KINDS) -> bool:
        return not any(self.counts[k] for k in kinds)


def pair(history: History) -> list[Op]:
    invokes: dict[int, Event] = {}
    done: dict[int, Event] = {}
    for e in history.events:
        (invokes if e.type == "invoke" else done)[e.op] = e
    out = []
    for op, inv in invokes.items():
        c = done.get(op)
        out.append(
            Op(
                inv.f,
                inv.process,
                inv.time,
                c.time if c else float("inf"),
                c.type if c else "info",
                inv.value,
                c.value if c else {},
            )
        )
    return out


def check(history: History, final: Final) -> Report:
    ops = pair(history)
    counts: Counter[str] = Counter({k: 0 for k in KINDS})
    examples: dict[str, list[Any]] = {k: [] for k in KINDS}

    def flag(kind: str, what: Any) -> None:
        counts[kind] += 1
        if len(examples[kind]) < 5:
            examples[kind].append(what)

    publishes: dict[str, Op] = {}
    deliveries: dict[str, list[Delivery]] = {}
    by_key: dict[str, list[Op]] = {}  # acks, touches, releases
    for o in ops:
        if o.f == "publish":
            publishes[o.args["key"]] = o
        elif o.f == "consume" and o.type == "ok":
            for j in o.result["jobs"]:
                deliveries.setdefault(j["key"], []).append(
                    Delivery(
                        j["key"],
                        j["job_id"],
                        o.invoked,
                        o.completed,
                        o.args["ttr_ms"] / 1000,
                        j["remain_tries"],
                        j["deliveries"],
                        j.get("lease"),
                        o.process,
                    )
                )
        elif o.f in ("ack", "touch", "release"):
            by_key.setdefault(o.args["key"], []).append(o)

    for key, ds in deliveries.items():
        ds.sort(key=lambda d: (d.deliveries, d.invoked))
        p = publishes.get(key)
        if p is None or p.type == "fail":
            flag(
                "unexpected", {"key": key, "job_id": ds[0].job_id, "publish": p.type if p else None}
            )
            continue
        if len({d.job_id for d in ds}) > 1:
            flag("double_publish", {"key": key, "job_ids": sorted({d.job_id for d in ds})})
        acts = by_key.get(key, [])
        acked_at = [a.completed for a in acts if a.f == "ack" and a.type == "ok"]
        releases = [a for a in acts if a.f == "release" and a.type != "fail"]
        ends = [a for a in acts if a.f in ("ack", "release") and a.type != "fail"]
        for d in ds:
            # duplicated: asked for after an ack had succeeded
            if any(t < d.invoked for t in acked_at):
                flag("duplicated", {"key": key, "job_id": d.job_id, "deliveries": d.deliveries})
            # early: the reply came before the earliest instant the job could be due
            bound = p.invoked + p.args["delay_ms"] / 1000
            if d.completed < bound:
                flag(
                    "early",
                    {
                        "key": key,
                        "job_id": d.job_id,
                        "deliveries": d.deliveries,
                        "early_by_s": round(bound - d.completed, 3),
                    },
                )
            for r in releases:
                if (
                    r.type == "ok"
                    and r.completed < d.invoked
                    and d.completed < r.invoked + r.args["delay_ms"] / 1000
                ):
                    flag(
                        "early_release",
                        {
                            "key": key,
                            "job_id": d.job_id,
                            "deliveries": d.deliveries,
                            "early_by_s": round(
                                r.invoked + r.args["delay_ms"] / 1000 - d.completed, 3
                            ),
                        },
                    )
                    break
            tries = p.args["tries"]
            if d.deliveries > tries:
                flag("over_tries", {"key": key, "deliveries": d.deliveries, "tries": tries})
            if d.remain_tries != tries - d.deliveries:
                flag(
                    "remain_tries",
                    {
                        "key": key,
                        "remain_tries": d.remain_tries,
                        "deliveries": d.deliveries,
                        "tries": tries,
                    },
                )
        for jid, seen in Counter(d.job_id for d in ds).items():
            if seen > p.args["tries"]:
                flag(
                    "over_tries",
                    {"key": key, "job_id": jid, "seen": seen, "tries": p.args["tries"]},
                )
        # held twice: two holds that cannot be a ttr apart, nothing having ended the first
        touches = [a for a in acts if a.f == "touch" and a.type != "fail"]

        def held_until(x: Delivery, y: Delivery) -> float:
            """The earliest instant x's hold can end before y: its ttr from the consume's invoke,
            or a touch's ttr from the touch's invoke (a touch may shorten a hold too)."""
            end = x.invoked + x.ttr_s
            for t in touches:
                if t.invoked < y.completed and t.completed > x.invoked:
                    end = min(end, t.invoked + t.args["ttr_ms"] / 1000)
            return end

        for i, a in enumerate(ds):
            for b in ds[i + 1 :]:
                if b.job_id != a.job_id:
                    continue  # a double publish: two jobs (counted above)
                if any(e.invoked < b.completed and e.completed > a.invoked for e in ends):
                    continue  # an ack or release under way between them may have ended a's hold
                if b.deliveries > a.deliveries:
                    twice = b.completed < held_until(a, b)
                else:  # same count (a lost write): order unknown, both orders must overlap
                    twice = b.completed < held_until(a, b) and a.completed < held_until(b, a)
                if twice:
                    flag(
                        "held_twice",
                        {
                            "key": key,
                            "job_id": a.job_id,
                            "deliveries": (a.deliveries, b.deliveries),
                            "gap_s": round(b.completed - a.invoked, 3),
                            "ttr_s": a.ttr_s,
                        },
                    )
        # stale lease: a request carrying a lease that no longer held the job, and succeeded
        for o in acts:
            lease = o.args.get("lease")
            held = [d for d in ds if d.lease == lease]
            if lease is None or o.type != "ok" or not held:
                continue
            if o.f == "ack" and any(
                a is not o and a.f == "ack" and a.type != "fail" and a.invoked < o.completed
                for a in acts
            ):
                continue  # the job may be gone already: acking a gone job is no conflict (ack.lua)
            if any(d.deliveries > held[0].deliveries and d.completed < o.invoked for d in ds):
                flag(
                    "stale_lease", {"key": key, "f": o.f, "lease": lease, "why": "a later delivery"}
                )
                continue
            # Its ttr ran out before the request was sent: the hold ended at the latest ttr after
            # the consume's reply, or after the reply of a touch with this lease.
            deadline = held[0].completed + held[0].ttr_s
            for t in acts:
                if (
                    t is not o
                    and t.f == "touch"
                    and t.args.get("lease") == lease
                    and t.type != "fail"
                ):
                    deadline = max(deadline, t.completed + t.args["ttr_ms"] / 1000)
            if o.invoked > deadline:
                flag(
                    "stale_lease",
                    {
                        "key": key,
                        "f": o.f,
                        "lease": lease,
                        "why": "ttr ran out",
                        "late_by_s": round(o.invoked - deadline, 3),
                    },
                )

    # lost, dead letters, leftovers: the end state against what the history promises
    dead_by_queue: Counter[str] = Counter()
    lost_consumes = [o for o in ops if o.f == "consume" and o.type == "info"]
    never_delivered = 0
    # a publish answered with a dedup key's job made none, and a debounce replaced a job's body:
    # their keys name another publish's job (dead jobs are counted once, by id)
    replaced = {
        p.result["job_id"] for p in publishes.values() if p.result.get("dedup") == "replaced"
    }
    dead_ids: dict[str, set[str]] = {}
    for key, p in publishes.items():
        state = final.states.get(key)
        if state == "dead":
            dead_ids.setdefault(p.args["queue"], set()).add(p.result.get("job_id") or key)
        acts = by_key.get(key, [])
        if p.type == "fail" or any(a.f == "ack" and a.type == "info" for a in acts):
            continue  # maybe acked: gone or dead are both right
        if p.result.get("dedup") == "existing" or p.result.get("job_id") in replaced:
            continue
        acked = any(a.f == "ack" and a.type == "ok" for a in acts)
        ds = deliveries.get(key, [])
        if p.type == "ok" and not ds:
            never_delivered += 1
        if p.type != "ok" and not ds:
            continue  # indeterminate or failed and never seen: whatever it left is checked below
        last = max(ds, key=lambda d: d.deliveries) if ds else None
        should_be_dead = not acked and last is not None and last.remain_tries == 0
        # A consume whose reply was lost may have taken the job once more, unseen, and used
        # its last try: then dead is right too.
        since = last.invoked if last else p.invoked
        maybe_taken = any(
            c.completed > since and p.args["queue"] in c.args["queues"] for c in lost_consumes
        )
        if p.type == "ok" and not acked and state is None:
            flag("lost", {"key": key, "job_id": p.result.get("job_id"), "delivered": len(ds)})
        elif should_be_dead and state != "dead":
            flag("dead_letter", {"key": key, "expected": "dead", "found": state})
        elif state == "dead" and not should_be_dead and not maybe_taken:
            flag(
                "dead_letter",
                {
                    "key": key,
                    "expected": "not dead",
                    "acked": acked,
                    "last_remain_tries": last.remain_tries if last else None,
                },
            )
        elif state not in (None, "dead"):
            flag("left_behind", {"key": key, "state": state})
    dead_by_queue.update({q: len(ids) for q, ids in dead_ids.items()})
    for q, size in final.dead_sizes.items():
        if size != dead_by_queue[q]:
            flag(
                "dead_letter",
                {"queue": q, "deadletter_size": size, "dead_jobs_found": dead_by_queue[q]},
            )
    for name, what in final.leftovers.items():
        flag("left_behind", {name: what})

    starved(ops, publishes, deliveries, flag)
    dedup_twice(ops, publishes, deliveries, flag)

    stats = {
        "publish_ok": sum(1 for p in publishes.values() if p.type == "ok"),
        "publish_indeterminate": sum(1 for p in publishes.values() if p.type == "info"),
        "publish_failed": sum(1 for p in publishes.values() if p.type == "fail"),
        "deliveries": sum(len(ds) for ds in deliveries.values()),
        "redelivered_jobs": sum(1 for ds in deliveries.values() if len(ds) > 1),
        "never_delivered": never_delivered,
        "dead_at_end": sum(dead_by_queue.values()),
        "lease_conflicts": sum(
            1 for o in ops if o.type == "fail" and o.result.get("status") == 409
        ),
        "operations": sum(1 for o in ops),
        "grouped_publishes": sum(1 for p in publishes.values() if p.args.get("group")),
        "dedup_publishes": sum(1 for p in publishes.values() if p.args.get("dedup")),
    }
    return Report(counts, examples, stats)


Flag = Callable[[str, Any], None]


def _lost_consumes(ops: list[Op]) -> dict[str, list[Op]]:
    """Consumes whose outcome is unknown, by queue asked, in invoke order."""
    out: dict[str, list[Op]] = {}
    for o in sorted(ops, key=lambda o: o.invoked):
        if o.f == "consume" and o.type == "info":
            for q in o.args["queues"]:
                out.setdefault(q, []).append(o)
    return out


def starved(
    ops: list[Op], publishes: dict[str, Op], deliveries: dict[str, list[Delivery]], flag: Flag
) -> None:
    """``starved`` (module docstring): per grouped job J, the deliveries of each other group
    of its queue that passed it, against the turns it may have had to wait."""
    done = [o for o in ops if o.type != "fail"]
    limited = {(o.args["queue"], o.args["group"]) for o in done if o.f == "configure_group"}
    lost = _lost_consumes(ops)
    acks: dict[str, list[float]] = {}
    for o in (o for o in done if o.f == "ack"):
        acks.setdefault(o.args["key"], []).append(o.invoked)

    def of(p: Op) -> tuple[str, str | None]:
        return p.args["queue"], p.args.get("group")

    def sec(p: Op, name: str) -> float:
        return float(p.args.get(name) or 0) / 1000

    # per (queue, group), sorted (bisect counts them): when each publish may have made its job
    # ready at the earliest, its deliveries' consume invokes and replies
    ready_from: dict[tuple[str, str | None], list[float]] = {}
    asked: dict[tuple[str, str | None], list[float]] = {}
    answered: dict[tuple[str, str | None], list[float]] = {}
    passing: dict[str, list[tuple[float, Op]]] = {}  # per queue: grouped deliveries, by reply
    for key, p in publishes.items():
        if p.type == "fail" or of(p)[1] is None:
            continue
        ready_from.setdefault(of(p), []).append(p.invoked + sec(p, "delay_ms"))
        for d in deliveries.get(key, []):
            asked.setdefault(of(p), []).append(d.invoked)
            answered.setdefault(of(p), []).append(d.completed)
            passing.setdefault(p.args["queue"], []).append((d.completed, p))
    for xs in (*ready_from.values(), *asked.values(), *answered.values(), *passing.values()):
        xs.sort(key=lambda x: x[0] if isinstance(x, tuple) else x)
    mixed = {p.args["queue"] for p in publishes.values() if p.type != "fail" and not of(p)[1]}
    for key, p in publishes.items():
        q, g = of(p)
        if g is None or p.type != "ok" or (q, g) in limited or q in mixed:
            continue
        due = p.invoked + sec(p, "delay_ms")  # J was not ready before this,
        ready = p.completed + sec(p, "delay_ms")  # and ready by this (R)
        mine = deliveries.get(key, [])
        end = min([math.inf, *(d.invoked for d in mine), *acks.get(key, [])])
        if all(d.deliveries != 1 for d in mine):  # taken unseen by a consume whose reply was lost
            end = min([end, *(c.invoked for c in lost.get(q, []) if c.completed > p.invoked)])
        if p.args.get("ttl_ms"):
            end = min(end, p.invoked + sec(p, "ttl_ms"))
        # W: G's readinesses before J's that were not delivered by R, at most
        w = bisect.bisect_left(ready_from[(q, g)], ready) - 1  # (J's own aside)
        w += bisect.bisect_left(asked.get((q, g), []), ready)
        w += sum(c.args.get("count", 1) for c in lost.get(q, []) if c.invoked < ready)
        w -= bisect.bisect_left(answered.get((q, g), []), due)
        w += sum(1 for d in mine if d.completed < due)
        passed: Counter[str] = Counter()
        for t, k in passing.get(q, []):
            if t >= end:
                break
            h = k.args.get("group")
            prio = int(k.args.get("priority") or 0) <= int(p.args.get("priority") or 0)
            if h != g and k.invoked > ready and prio:
                passed[h] += 1
        over = [(h, n) for h, n in passed.items() if n > max(0, w) + 2]
        if over:
            waited = round(min([end, *(d.completed for d in mine)]) - ready, 3)
            what = {"key": key, "queue": q, "group": g, "passed_by": over[0][0]}
            flag(
                "starved",
                {**what, "deliveries": over[0][1], "bound": max(0, w) + 2, "waited_s": waited},
            )


def dedup_twice(
    ops: list[Op], publishes: dict[str, Op], deliveries: dict[str, list[Delivery]], flag: Flag
) -> None:
    """``dedup_twice`` (module docstring): per simple or debounce dedup key, whether a second
    job was seen while the first was certainly alive."""
    lost = _lost_consumes(ops)
    # (queue, key) -> job id -> the intervals of the operations that showed it
    shown: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}
    ends: dict[str, list[float]] = {}  # job id -> instants from which it may have ended
    for key, p in publishes.items():
        dk = p.args.get("dedup")
        if not dk or p.args.get("dedup_mode", "simple") not in ("simple", "debounce"):
            continue
        ids = shown.setdefault((p.args["queue"], dk), {})
        if p.type == "ok" and p.result.get("job_id"):
            ids.setdefault(p.result["job_id"], []).append((p.invoked, p.completed))
            if p.args.get("ttl_ms") and p.result.get("dedup", "new") == "new":
                ends.setdefault(p.result["job_id"], []).append(p.invoked + p.args["ttl_ms"] / 1000)
        for d in deliveries.get(key, []):
            ids.setdefault(d.job_id, []).append((d.invoked, d.completed))
            if d.remain_tries == 0:  # its last try: a release or its ttr may end it from here
                ends.setdefault(d.job_id, []).append(d.invoked)
    for o in ops:
        if o.f == "ack" and o.type != "fail" and o.args.get("job_id"):
            ends.setdefault(o.args["job_id"], []).append(o.invoked)
    for (q, dk), ids in shown.items():
        twice = []
        for j1, seen in ids.items():
            start, born = min(x1 for _, x1 in seen), min(x0 for x0, _ in seen)
            # a consume whose reply was lost may have used its last try, unseen
            unseen = [
                c.invoked + c.args["ttr_ms"] / 1000 for c in lost.get(q, []) if c.completed > born
            ]
            end = min([math.inf, *ends.get(j1, []), *unseen])
            twice += [
                (j1, j2, x)
                for j2, other in ids.items()
                for x in other
                if j2 != j1 and x[0] >= start and x[1] < end
            ]
        if twice:
            j1, j2, x = twice[0]
            flag("dedup_twice", {"queue": q, "dedup": dk, "first": j1, "second": j2, "at": x})
