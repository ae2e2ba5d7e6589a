"""The history checks of two extensions (loadtest/history_check.py runs them with the others):
fair turns between a queue's groups, and one job per dedup key. Pure.

Groups and dedup keys come from a publish's arguments: ``group``, ``priority`` (absent: 0),
``ttl_ms``, ``dedup`` (the key) and ``dedup_mode`` (absent: simple; a throttle key promises no
single job: not checked); its ``ok`` result has ``job_id`` and ``dedup`` (new, existing,
replaced). A ``configure_group`` operation (``queue``, ``group``) may have paused or limited
that group.

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
(G's deliveries whose consume was invoked before R and that may bring their job back: not one
on its last try, which its ttr or a release ends, nor one whose lease's ack succeeded while
no other ack of the job may have come first, since a lease acks a gone job too) + (the jobs
asked for by consumes of q whose reply was lost, before R) - (G's deliveries, J's aside, whose
reply came before J's publish invoke + d). Flagged: some H with more than ``W + 2`` such
deliveries by consumes whose reply came before ``end``: J waited behind more than one job of H
per round. The rule never passes that bound (V read from the head of a higher priority, above
J's whole line, would: flagged). A group's held-back jobs (a pause, a concurrency limit, a
rate) come back by design one tag apart just behind READY's head (docs/api.md, "Groups"), not
at fresh tags of their group's line, so they may pass J more often than that: a group a
``configure_group`` touched is judged neither as J's group (paused or at its limit, it waits by
design) nor as one passing J. Not checked either: a queue with ungrouped jobs (a due time can
put READY's head, and V, below the tags), and histories that kick or redrive dead jobs (a
revived job becomes ready without a delivery).

``dedup_twice``. A job is certainly alive from the completion of the first operation that showed
it (its publish answered with it, ``new``, ``existing`` or ``replaced``, or its delivery) until
the first instant it may have ended: the invoke of an ack of it, the consume invoke of a
delivery that used its last try (a release or its ttr may end it from then), the invoke + ttr
of any consume of its queue whose reply was lost (it may have used the last try unseen), or its
ttl's end. Flagged: for one key, an operation showing another job id invoked after the first
job was certainly alive and completed before it may have ended. Across a Redis failover this
is reported, not a verdict: a failover without durable writes loses jobs and frees their keys,
and even with them a job shown only by writes that are not durable (an ``existing`` answer
writes nothing, a consume is not a durable write) may be rolled back.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter

from loadtest.history_events import Delivery, Flag, Op, lost_consumes


def starved(
    ops: list[Op], publishes: dict[str, Op], deliveries: dict[str, list[Delivery]], flag: Flag
) -> dict[str, int]:
    """``starved`` (module docstring): per grouped job J, the deliveries of each other group
    of its queue that passed it, against the turns it may have had to wait. Returns how much
    was judged: the jobs, the most jobs of one group seen passing one of them, and the fewest
    turns any of them had to spare (bound - passes; below 0: flagged)."""
    judged, most, spare = 0, 0, math.inf
    done = [o for o in ops if o.type != "fail"]
    limited = {(o.args["queue"], o.args["group"]) for o in done if o.f == "configure_group"}
    lost = lost_consumes(ops)
    acks: dict[str, list[Op]] = {}  # by key: the acks that may have happened
    for o in (o for o in done if o.f == "ack"):
        acks.setdefault(o.args["key"], []).append(o)

    def brings_nothing_back(d: Delivery, p: Op) -> bool:
        """Whether delivery d certainly brought its job back to no readiness: it used the last
        try (its ttr or a release ends the job), or an ack with its lease succeeded while no
        other ack of the job may have come first (a lease acks a gone job too) nor its ttl."""
        if d.remain_tries == 0:
            return True
        if d.lease is None or p.args.get("ttl_ms"):
            return False
        mine = acks.get(d.key, [])
        return any(
            a.type == "ok"
            and a.args.get("lease") == d.lease
            and not any(b is not a and b.invoked < a.completed for b in mine)
            for a in mine
        )

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
            if not brings_nothing_back(d, p):
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
        end = min([math.inf, *(d.invoked for d in mine), *(a.invoked for a in acks.get(key, []))])
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
            if h != g and (q, h) not in limited and k.invoked > ready and prio:
                passed[h] += 1
        judged, most = judged + 1, max([most, *passed.values()])
        spare = min(spare, max(0, w) + 2 - max(passed.values(), default=0))
        over = [(h, n) for h, n in passed.items() if n > max(0, w) + 2]
        if over:
            waited = round(min([end, *(d.completed for d in mine)]) - ready, 3)
            what = {"key": key, "queue": q, "group": g, "passed_by": over[0][0]}
            flag(
                "starved",
                {**what, "deliveries": over[0][1], "bound": max(0, w) + 2, "waited_s": waited},
            )
    return {
        "turns_judged": judged,
        "turns_passed_most": most,
        "turns_spare_least": int(spare) if judged else 0,
    }


def dedup_twice(
    ops: list[Op], publishes: dict[str, Op], deliveries: dict[str, list[Delivery]], flag: Flag
) -> None:
    """``dedup_twice`` (module docstring): per simple or debounce dedup key, whether a second
    job was seen while the first was certainly alive."""
    lost = lost_consumes(ops)
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
