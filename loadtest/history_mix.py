"""What a history run (loadtest/history.py) publishes beyond plain jobs, and the group settings
its operator changes: the choices, and their tally for the report. Pure: no I/O.

- **Groups**, in a queue of their own (``q1``: every job there has a group, the only kind of
  queue whose fair turns the checker can judge): a heavy group published in bursts (a
  backlog), light groups one job at a time, and a metered group whose settings an operator
  changes at run time (paused, resumed, a concurrency limit, a rate, each lifted again).
- **Dedup keys**, in the other queues: a small pool of keys per queue, each publish under one
  ``simple`` or ``debounce`` at random (so they meet: answered ``new``, ``existing`` or
  ``replaced``, or refused with a 409 when the key's job is reserved), and throttle windows
  (``dedup_ttl``) on keys of their own.

On a Cluster the master a history run kills is ``q0``'s, whose slot range also holds ``q1``: the
failover meets both dedup keys and groups.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from loadtest.history_events import History, pair

GROUPED = 1  # the index of the grouped queue in the run's queues
HEAVY, METERED = "heavy", "metered"
LIGHT = ("light-a", "light-b", "light-c")
BURST = 8  # the heavy group's publishes, sent at once
METERED_SHARE = 0.5  # of the grouped queue's other publishes: a backlog its limits meet
KEYED = 0.4  # the share of publishes to the other queues made under a dedup key
KEYS = ("k0", "k1", "k2")  # per queue, simple or debounce at random
WINDOWS = ("w0",)  # per queue, throttle
# The operator's changes to the metered group, at random, then UNLIMITED before the drain.
SETTINGS: tuple[dict[str, Any], ...] = (
    {"paused": True},
    {"paused": False},
    {"concurrency": 1},
    {"concurrency": 2},
    {"concurrency": None},
    {"rate": "5/1s"},
    {"rate": None},
)
UNLIMITED = {"paused": False, "concurrency": None, "rate": None}


def settings_round(rng: random.Random) -> list[dict[str, Any]]:
    """``SETTINGS``, each once, in a random order that begins with a pause, a limit or a rate
    (a short run judges at least one of them)."""
    order = rng.sample(SETTINGS, len(SETTINGS))
    first = next(i for i, s in enumerate(order) if any(v not in (None, False) for v in s.values()))
    return [order[first], *order[:first], *order[first + 1 :]]


def grouped_queue(queues: list[str]) -> str:
    return queues[GROUPED]


def heavy(queues: list[str]) -> tuple[str, dict[str, Any]]:
    """A heavy-group job: its queue and its publish's extra parameters."""
    return grouped_queue(queues), {"group": HEAVY}


def pick(rng: random.Random, queues: list[str]) -> tuple[str, dict[str, Any]]:
    """Any other publish: a queue at random; in the grouped queue the metered group
    (``METERED_SHARE``) or a light one, elsewhere a plain job or (``KEYED``) one under a dedup
    key."""
    q = rng.choice(queues)
    if q == grouped_queue(queues):
        return q, {"group": METERED if rng.random() < METERED_SHARE else rng.choice(LIGHT)}
    if rng.random() >= KEYED:
        return q, {}
    if rng.random() < 0.75:
        mode = rng.choice(("simple", "debounce"))
        return q, {"dedup_key": rng.choice(KEYS), "dedup_mode": mode}
    ttl = rng.randint(200, 1500)
    return q, {"dedup_key": rng.choice(WINDOWS), "dedup_mode": "throttle", "dedup_ttl": ttl}


def recorded(params: dict[str, Any]) -> dict[str, Any]:
    """The invoke's arguments for a publish's extra parameters (loadtest/history_extensions.py:
    ``group``, ``dedup``, ``dedup_mode``)."""
    names = {"group": "group", "dedup_key": "dedup", "dedup_mode": "dedup_mode"}
    out = {names[k]: v for k, v in params.items() if k in names}
    if "dedup_ttl" in params:
        out["dedup_ttl_ms"] = params["dedup_ttl"]
    return out


def tally(history: History) -> Counter[str]:
    """What the run did with groups and dedup keys, for the report: publishes per kind of group
    and dedup mode (answered 2xx), the dedup answers (and the 409s of debounces that found the
    key's job reserved), deliveries of grouped jobs, group changes answered 200."""
    out: Counter[str] = Counter()
    grouped: set[str] = set()
    for o in pair(history):
        if o.f == "publish" and o.args.get("group"):
            g = o.args["group"]
            out["grouped"] += 1
            out[g if g in (HEAVY, METERED) else "light"] += o.type == "ok"
            grouped.add(o.args["key"])
        elif o.f == "publish" and o.args.get("dedup"):
            out["keyed"] += 1
            out[o.args["dedup_mode"]] += o.type == "ok"
            if o.type == "ok":
                out[o.result.get("dedup", "new")] += 1
            elif o.result.get("status") == 409:
                out["refused"] += 1
        elif o.f == "consume" and o.type == "ok":
            out["grouped_deliveries"] += sum(j["key"] in grouped for j in o.result["jobs"])
        elif o.f == "configure_group" and o.type == "ok":
            out["group_changes"] += 1
    return out


def describe(t: Counter[str]) -> str:
    return (
        f"grouped publishes {t['grouped']} (2xx: heavy {t[HEAVY]}, light {t['light']}, "
        f"metered {t[METERED]}), their deliveries {t['grouped_deliveries']}, group changes "
        f"{t['group_changes']}; keyed publishes {t['keyed']} (2xx: simple {t['simple']}, "
        f"debounce {t['debounce']}, throttle {t['throttle']}; new {t['new']}, existing "
        f"{t['existing']}, replaced {t['replaced']}; debounce refused {t['refused']})"
    )
