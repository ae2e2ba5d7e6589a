"""The history checks of a group's settings (loadtest/history_check.py runs them with the
others): no delivery while its group is paused, never more of its jobs reserved than its
concurrency limit, never two deliveries closer than its rate lets them. Pure.

A ``configure_group`` operation (``queue``, ``group``, ``settings``: the fields it sets,
``paused``, ``concurrency`` and ``rate``, ``None`` lifting a limit) that succeeded took effect
somewhere between its invoke and its completion. One whose outcome is unknown (``info``) may
take effect at any time after its invoke, however late (the service may still be running it
when the client gives up). A setting is *certainly in force* from the completion of the 2xx
that set it, or, when later, of an earlier 2xx change of that field that could have set
something looser (a pause lifted, a higher limit; for a rate, any change: a changed rate
starts afresh), until the invoke of the next change of the field that was not certainly
refused (a ``fail`` changed nothing), unless that change is at least as strict (a pause again,
a lower limit: the window goes on, judged by the first setting's value). After a looser
change of unknown outcome, no window of that field is certain any more.
A rate's window ends at any change of it: a changed rate starts afresh.

A consume ran its script somewhere between its invoke and its completion. Only consumes run
wholly inside such a window are judged, so that neither clock nor a slow reply can make a
false alarm:

- ``while_paused``: a delivery of the group's job by a consume inside a pause.
- ``over_concurrency``: more deliveries than the limit *certainly* holding the group's jobs at
  one instant, each by a consume invoked inside the window. A delivery certainly holds its job
  from its reply until the first instant its hold may have ended: the invoke of an ack or a
  release of the job that was not refused, its consume's invoke + ttr, a touch's invoke + its
  ttr (a touch sets the hold's end anew, sooner too), the job's next delivery, or its ttl's
  end. The last of them to be reserved found
  the others reserved already, so the limit was passed then. Jobs that consumes reserved
  unseen (a lost reply) only make the group hold more back: they are not counted.
- ``over_rate``: two deliveries whose consumes ran inside one window of ``jobs/per``, which
  cannot have been ``per / jobs`` ms apart (less 2 ms: a script's clock is whole ms).

Across a Redis failover these are reported, not verdicts: a consume, and the group's settings
and turns it reads, are not durable writes, and a failover may roll them back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cluster_dq.engine.groups import Rate
from loadtest.history_events import Delivery, Flag, Op

SLACK_S = 0.002  # a rate's turns are counted in whole ms of the service's clock


@dataclass(frozen=True)
class Window:
    start: float  # the setting certainly in force from here (client clock, s)
    end: float  # until here
    value: Any  # True (paused), a limit (int) or a Rate


def _strict(field: str, value: Any) -> float:
    """How strict a value of ``field`` is, higher being stricter (inf: nothing passes)."""
    if value is None or value is False:
        return -math.inf
    if field == "paused":
        return math.inf
    if field == "concurrency":
        return -float(value)
    rate = Rate.parse(value)
    return rate.per_ms / rate.jobs


def windows(changes: list[Op], field: str) -> list[Window]:
    """The windows (module docstring) in which ``field`` was certainly set, from one group's
    ``configure_group`` operations in invoke order."""
    touching = [o for o in changes if field in o.args.get("settings", {}) and o.type != "fail"]
    out: list[Window] = []
    for i, o in enumerate(touching):
        value = o.args["settings"][field]
        if o.type != "ok" or value is None or value is False:
            continue
        if out and out[-1].end > o.invoked:
            continue  # as strict as a setting still in force, or stricter: judged by that one
        strict = _strict(field, value)
        start = max(
            [o.completed]
            + [
                a.completed  # (infinite for an info: it may land however late)
                for a in touching[:i]
                if field == "rate" or _strict(field, a.args["settings"][field]) < strict
            ]
        )
        end = math.inf
        for b in touching[i + 1 :]:
            if field == "rate" or _strict(field, b.args["settings"][field]) < strict:
                end = b.invoked
                break
        if start < end:
            out.append(Window(start, end, Rate.parse(value) if field == "rate" else value))
    return out


def held_until(d: Delivery, p: Op, acts: list[Op], mine: list[Delivery]) -> float:
    """The first instant delivery ``d`` of publish ``p`` may have stopped holding its job
    (module docstring); ``acts``: the job's acks, touches (``ttr_ms``) and releases, ``mine``:
    its deliveries."""
    ends = [d.invoked + d.ttr_s]
    ends += [
        a.invoked if a.f != "touch" else a.invoked + a.args["ttr_ms"] / 1000
        for a in acts
        if a.type != "fail" and a.completed > d.invoked
    ]
    ends += [e.invoked for e in mine if e.invoked > d.invoked]
    if p.args.get("ttl_ms"):
        ends.append(p.invoked + p.args["ttl_ms"] / 1000)
    return min(ends)


def group_limits(
    ops: list[Op],
    publishes: dict[str, Op],
    deliveries: dict[str, list[Delivery]],
    acts: dict[str, list[Op]],
    flag: Flag,
) -> dict[str, int]:
    """``while_paused``, ``over_concurrency`` and ``over_rate`` (module docstring). Returns how
    much was judged: the windows of each setting, and the deliveries inside them."""
    changes: dict[tuple[str, str], list[Op]] = {}
    for o in sorted(ops, key=lambda o: o.invoked):
        if o.f == "configure_group":
            changes.setdefault((o.args["queue"], o.args["group"]), []).append(o)
    stats = {
        "pause_windows": 0,
        "limit_windows": 0,
        "rate_windows": 0,
        "limited_deliveries": 0,  # inside a window of a limit or a rate
        "pause_consumes": 0,  # consumes of the group's queue run wholly inside a pause
        "limit_spare_least": -1,  # the limit less the most held at once (-1: nothing judged)
        "rate_closest_pct": -1,  # the closest two deliveries may have been, in % of the rate's
    }
    for (q, g), mine_changes in changes.items():
        ds = [
            (d, publishes[key])
            for key, xs in deliveries.items()
            if key in publishes
            and publishes[key].args.get("queue") == q
            and publishes[key].args.get("group") == g
            for d in xs
        ]
        ds.sort(key=lambda x: x[0].invoked)

        def inside(w: Window) -> list[tuple[Delivery, Op]]:
            return [(d, p) for d, p in ds if d.invoked >= w.start and d.completed <= w.end]

        for w in windows(mine_changes, "paused"):
            stats["pause_windows"] += 1
            stats["pause_consumes"] += sum(
                1
                for o in ops
                if o.f == "consume"
                and o.type == "ok"
                and q in o.args["queues"]
                and w.start <= o.invoked
                and o.completed <= w.end
            )
            for d, _ in inside(w):
                flag("while_paused", {"queue": q, "group": g, "key": d.key, "at": d.invoked})
        for w in windows(mine_changes, "concurrency"):
            stats["limit_windows"] += 1
            _concurrency(q, g, w, ds, deliveries, acts, flag, stats)
        for w in windows(mine_changes, "rate"):
            stats["rate_windows"] += 1
            _rate(q, g, w, inside(w), flag, stats)
    return stats


def _concurrency(
    q: str,
    g: str,
    w: Window,
    ds: list[tuple[Delivery, Op]],
    deliveries: dict[str, list[Delivery]],
    acts: dict[str, list[Op]],
    flag: Flag,
    stats: dict[str, int],
) -> None:
    moments: list[tuple[float, int, str]] = []  # (time, +1 from the reply / -1 at its end, key)
    for d, p in ds:
        if d.invoked < w.start or d.completed >= w.end:
            continue
        stats["limited_deliveries"] += 1
        end = held_until(d, p, acts.get(d.key, []), deliveries[d.key])
        if end > d.completed:
            moments += [(d.completed, 1, d.key), (end, -1, d.key)]
    held: list[str] = []
    for t, step, key in sorted(moments, key=lambda m: (m[0], m[1])):  # ends first
        if step < 0:
            held.remove(key)
            continue
        held.append(key)
        spare, least = w.value - len(held), stats["limit_spare_least"]
        stats["limit_spare_least"] = max(0, spare) if least < 0 else min(least, max(0, spare))
        if len(held) > w.value:
            flag(
                "over_concurrency",
                {"queue": q, "group": g, "limit": w.value, "held": sorted(held), "at": t},
            )


def _rate(
    q: str,
    g: str,
    w: Window,
    ds: list[tuple[Delivery, Op]],
    flag: Flag,
    stats: dict[str, int],
) -> None:
    turn = w.value.per_ms / w.value.jobs / 1000
    gap = turn - SLACK_S
    stats["limited_deliveries"] += len(ds)
    for i, (d1, _) in enumerate(ds):
        for d2, _ in ds[i + 1 :]:
            if d2.invoked - d1.completed >= turn:
                break  # (in invoke order: the later ones are further still)
            apart = max(d2.completed - d1.invoked, d1.completed - d2.invoked)
            pct, closest = int(100 * apart / turn), stats["rate_closest_pct"]
            stats["rate_closest_pct"] = pct if closest < 0 else min(closest, pct)
            if apart < gap:
                flag(
                    "over_rate",
                    {
                        "queue": q,
                        "group": g,
                        "rate": w.value.text(),
                        "keys": [d1.key, d2.key],
                        "apart_s_at_most": round(d2.completed - d1.invoked, 4),
                    },
                )
