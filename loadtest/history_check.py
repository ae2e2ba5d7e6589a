"""The checker of a recorded history (loadtest/history_events.py: what is recorded, and how
an outcome may be unknown). Pure: no I/O, no Redis.

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
- ``dedup_twice``: two jobs held one simple (or debounce) dedup key at once;
- ``while_paused``: a job delivered while its group was certainly paused;
- ``over_concurrency``: more of a group's jobs certainly held at once than its concurrency limit;
- ``over_rate``: two deliveries of a group closer together than its rate lets them.

The last five are the extensions' (loadtest/history_extensions.py and, for a group's settings,
loadtest/history_limits.py, where their derivations are).

A publish under a dedup key may make no job of its own (answered ``existing``: the key's holder),
and a debounce puts its body into the key's holder (answered ``replaced``, keeping that job's
id, its tries and delivery count started afresh): a job whose body changed (answered
``replaced``, or seen under two bodies) is checked once, by its id, at the end (``lost``: a job
that a 2xx publish made or replaced, never acked, gone at the end); its publishes are not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from loadtest.history_events import Delivery, History, Op, pair
from loadtest.history_extensions import dedup_twice, starved
from loadtest.history_limits import group_limits

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
    "while_paused",
    "over_concurrency",
    "over_rate",
)


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
    # A publish answered with a dedup key's job (existing) made none, and a job a debounce gave
    # another body (answered replaced, or seen under two bodies) is checked by id, below.
    bodies: dict[str, set[str]] = {}  # job id -> the bodies (keys) it was made or seen with
    for key, p in publishes.items():
        if p.type == "ok" and p.result.get("dedup", "new") == "new" and p.result.get("job_id"):
            bodies.setdefault(p.result["job_id"], set()).add(key)
        for d in deliveries.get(key, []):
            bodies.setdefault(d.job_id, set()).add(key)
    replaced = {j for j, keys in bodies.items() if len(keys) > 1} | {
        p.result["job_id"] for p in publishes.values() if p.result.get("dedup") == "replaced"
    }

    def job_of(key: str) -> str | None:
        ds = deliveries.get(key)
        return publishes[key].result.get("job_id") or (ds[0].job_id if ds else None)

    dead_ids: dict[str, set[str]] = {}  # dead jobs are counted once, by id
    for key, p in publishes.items():
        state = final.states.get(key)
        if state == "dead":
            dead_ids.setdefault(p.args["queue"], set()).add(job_of(key) or key)
        acts = by_key.get(key, [])
        if p.type == "fail" or any(a.f == "ack" and a.type == "info" for a in acts):
            continue  # maybe acked: gone or dead are both right
        if p.result.get("dedup") == "existing" or job_of(key) in replaced:
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
    acked_ids = {o.args.get("job_id") for o in ops if o.f == "ack" and o.type != "fail"}
    keys_of: dict[str | None, list[str]] = {}  # job id -> the publishes answered with it, or seen
    for key, p in publishes.items():
        if p.type != "fail":
            keys_of.setdefault(job_of(key), []).append(key)
    for jid in sorted(replaced - acked_ids):  # a 2xx made or replaced it: acked, dead or lost
        keys = keys_of.get(jid, [])
        made = any(
            publishes[k].type == "ok" and publishes[k].result.get("dedup") != "existing"
            for k in keys
        )
        if made and all(final.states.get(k) is None for k in keys):
            flag("lost", {"job_id": jid, "bodies": sorted(bodies.get(jid, ()))})
    dead_by_queue.update({q: len(ids) for q, ids in dead_ids.items()})
    for q, size in final.dead_sizes.items():
        if size != dead_by_queue[q]:
            flag(
                "dead_letter",
                {"queue": q, "deadletter_size": size, "dead_jobs_found": dead_by_queue[q]},
            )
    for name, what in final.leftovers.items():
        flag("left_behind", {name: what})

    turns = starved(ops, publishes, deliveries, flag)
    dedup_twice(ops, publishes, deliveries, flag)
    limits = group_limits(ops, publishes, deliveries, by_key, flag)

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
        **turns,
        **limits,
    }
    return Report(counts, examples, stats)
