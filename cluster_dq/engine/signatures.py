"""The KEYS and ARGV of every Lua script, by name, as the script's header declares them.

Every operation builds the KEYS and ARGV of every script call through ``Signature.key_list`` and
``Signature.args`` (by name, so a value cannot slip into another's place), and
tests/engine/test_lua_contract.py checks this table against the headers in ``lua/``. A name ending
in ``...`` takes the rest (a sequence, spliced in); ``queue`` among the KEYS stands for the
queue's fixed keys (``QueueKeys.all_fixed``, in the order of ``lua/lib/keys.lua``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

QUEUE = "queue"  # the queue's fixed keys (KEYS[1..10])


class Signature:
    """One script's KEYS and ARGV names, and the builders that put named values in order."""

    __slots__ = ("script", "keys", "argv", "_keys", "_argv")

    def __init__(self, script: str, keys: Sequence[str], argv: Sequence[str]) -> None:
        self.script, self.keys, self.argv = script, tuple(keys), tuple(argv)
        self._keys = _Builder(script, "KEYS", self.keys, QUEUE)
        self._argv = _Builder(script, "ARGV", self.argv, "")

    def key_list(self, named: dict[str, Any]) -> list[str]:
        """KEYS in the declared order; ``queue`` and a variadic name take a sequence."""
        return self._keys(named)

    def args(self, named: dict[str, Any]) -> list[Any]:
        """ARGV in the declared order; a variadic name takes a sequence."""
        return self._argv(named)


class _Builder:
    """Names -> values in order, at C speed for the plain names (a hot path: every call)."""

    __slots__ = ("script", "what", "names", "get", "spliced")

    def __init__(self, script: str, what: str, names: tuple[str, ...], group: str) -> None:
        self.script, self.what, self.names = script, what, names
        bare = [n[:-3] if n.endswith("...") else n for n in names]
        self.spliced = tuple(i for i, n in enumerate(names) if n.endswith("...") or n == group)
        self.get = operator.itemgetter(*bare) if len(bare) > 1 else (lambda d: (d[bare[0]],))

    def __call__(self, named: dict[str, Any]) -> list[Any]:
        if len(named) != len(self.names):
            raise TypeError(f"{self.script}: {self.what} {self.names}, got {tuple(named)}")
        values = self.get(named)
        if not self.spliced:
            return list(values)
        out: list[Any] = []
        for i, v in enumerate(values):
            if i in self.spliced:
                out += v
            else:
                out.append(v)
        return out


_Q, _QB = (QUEUE,), (QUEUE, "buckets...")

SIGNATURES: dict[str, Signature] = {
    s.script: s
    for s in (
        Signature(
            "publish",
            _QB,
            (
                "now",
                "lane_capacity",
                "bucket_width",
                "notify",
                "open_lead",
                "remember_acked",
                "whole",
                "n",
                "jobs...",
            ),
        ),
        Signature(
            "publish_keyed",
            (QUEUE, "keyed", "keyed_due"),
            ("now", "notify", "remember_acked", "requests..."),
        ),
        Signature(
            "republish",
            _QB,
            (
                "now",
                "lane_capacity",
                "bucket_width",
                "notify",
                "old_member",
                "old_bucket_index",
                "old_bucket",
                "member",
                "due",
                "record",
                "bucket_index",
                "bucket",
                "wheel",
                "open_lead",
                "remember_acked",
                "lease",
            ),
        ),
        Signature(
            "consume",
            _Q,
            (
                "now",
                "ttr",
                "count",
                "limit",
                "notify",
                "open_lead",
                "lease_prefix",
                "seed",
                "report",
            ),
        ),
        Signature(
            "ack",
            _QB,
            ("now", "remember_acked", "check_only", "results", "keep_result", "n", "jobs..."),
        ),
        Signature("release", _Q, ("now", "delay", "notify", "mode", "seed", "error", "jobs...")),
        Signature("touch", _Q, ("now", "ttr", "member", "lease")),
        Signature("progress", (QUEUE, "bucket..."), ("now", "member", "lease", "progress")),
        Signature("open_buckets", _QB, ("now", "names...")),
        Signature("widen_wheel", _QB, ("names...",)),
        Signature("promote_due", _Q, ("now", "limit", "notify")),
        Signature("expire_reserved", _Q, ("now", "limit", "notify", "seed")),
        Signature("configure", _Q, ("notify", "fields...")),
        Signature(
            "group_configure", _Q, ("now", "group", "limit", "owed", "max_fields", "fields...")
        ),
        Signature("group_info", _Q, ("groups...",)),
        Signature("expire_ttl", _Q, ("now", "limit")),
        Signature("next_event", _Q, ("open_lead",)),
        Signature("sizes", _Q, ("open_lead",)),
        Signature("respawn", _Q, ("now", "limit", "ttl", "notify")),
        Signature("delete_dead", _Q, ("limit",)),
        Signature(
            "destroy",
            (QUEUE, "results", "results_due", "keyed", "keyed_due", "buckets..."),
            ("final", "names..."),
        ),
        Signature("peek", _Q, ("which",)),
        Signature("peek_job", (QUEUE, "bucket..."), ("member",)),
        Signature("bury", (QUEUE, "bucket..."), ("now", "member", "bucket_name", "lease", "text")),
        Signature(
            "kick", (QUEUE, "bucket..."), ("now", "member", "delay", "tries", "ttl", "notify")
        ),
        Signature(
            "reschedule_job",
            (QUEUE, "bucket..."),
            ("now", "member", "bucket_name", "due", "notify"),
        ),
        Signature("dead_page", _Q, ("after_score", "after_member", "limit")),
        Signature(
            "redrive_dead",
            _Q,
            (
                "now",
                "after_score",
                "after_member",
                "from",
                "to",
                "reason",
                "limit",
                "examine",
                "delay",
                "tries",
                "ttl",
                "notify",
            ),
        ),
        Signature(
            "purge_dead",
            _Q,
            ("after_score", "after_member", "from", "to", "reason", "limit", "examine"),
        ),
        Signature(
            "claim", ("schedule", "pending", "epoch"), ("now", "limit", "lease_end", "epoch")
        ),
        Signature(
            "reschedule",
            ("schedule", "pending", "epoch", "queues"),
            ("queue", "next", "epoch", "empty"),
        ),
        Signature("signal", ("schedule", "pending", "queues"), ("queue", "at")),
        Signature("listed", ("configured",), ("queue", "has")),
        Signature("leader", ("leader", "epoch"), ("token", "lease", "release")),
        Signature(
            "schedule_set",
            (QUEUE, "schedules"),
            ("name", "expected", "state", "definition", "limit"),
        ),
        Signature("schedule_unindex", ("timers",), ("member", "score")),
        Signature("rate_limit", ("counter",), ("limit", "window", "refund")),
    )
}
