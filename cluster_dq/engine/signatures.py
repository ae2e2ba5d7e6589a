"""The KEYS and ARGV of every Lua script, by name, as the script's header declares them.

commands.py builds the arguments of every script call through ``Signature.args`` (by name,
so an argument cannot slip into another's place), and tests/test_lua_contract.py checks this
table against the headers in ``lua/``. A name ending in ``...`` takes the rest (a sequence,
spliced in); ``queue`` among the KEYS stands for the queue's fixed keys
(``QueueKeys.all_fixed``, in the order of ``lua/lib/queue.lua``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

QUEUE = "queue"  # the queue's fixed keys (KEYS[1..10])


@dataclass(frozen=True, slots=True)
class Signature:
    script: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]

    def key_list(self, named: dict[str, Any]) -> list[str]:
        """KEYS in the declared order; ``queue`` and a variadic name take a sequence."""
        return _ordered(self.script, "KEYS", self.keys, named, QUEUE)

    def args(self, named: dict[str, Any]) -> list[Any]:
        """ARGV in the declared order; a variadic name takes a sequence."""
        return _ordered(self.script, "ARGV", self.argv, named, "")


def _ordered(script: str, what: str, names: tuple[str, ...], named: dict[str, Any], group: str) -> list[Any]:
    if len(named) != len(names):
        raise TypeError(f"{script}: {what} {names}, got {tuple(named)}")
    out: list[Any] = []
    for name in names:
        if name[-1] == ".":
            out += named[name[:-3]]
        elif name == group:
            out += named[name]
        else:
            out.append(named[name])
    return out


def _sig(script: str, keys: Sequence[str], argv: Sequence[str]) -> Signature:
    return Signature(script, tuple(keys), tuple(argv))


_Q, _QB = (QUEUE,), (QUEUE, "buckets...")

SIGNATURES: dict[str, Signature] = {s.script: s for s in (
    _sig("publish", _QB, ("now", "lane_capacity", "bucket_width", "notify", "open_lead", "remember_acked",
                          "n", "jobs...")),
    _sig("republish", _QB, ("now", "lane_capacity", "bucket_width", "notify", "old_member",
                            "old_bucket_index", "old_bucket", "member", "due", "record", "bucket_index",
                            "bucket", "wheel", "open_lead", "remember_acked", "lease")),
    _sig("consume", _Q, ("now", "ttr", "count", "limit", "notify", "open_lead", "lease_prefix")),
    _sig("ack", _QB, ("now", "remember_acked", "check_only", "n", "jobs...")),
    _sig("release", _Q, ("now", "delay", "notify", "mode", "jobs...")),
    _sig("touch", _Q, ("now", "ttr", "member", "lease")),
    _sig("open_buckets", _QB, ("now", "names...")),
    _sig("promote_due", _Q, ("now", "limit", "notify")),
    _sig("expire_reserved", _Q, ("now", "limit", "notify")),
    _sig("expire_ttl", _Q, ("now", "limit")),
    _sig("next_event", _Q, ("open_lead",)),
    _sig("sizes", _Q, ("open_lead",)),
    _sig("respawn", _Q, ("now", "limit", "ttl", "notify")),
    _sig("delete_dead", _Q, ("limit",)),
    _sig("destroy", _QB, ("final", "names...")),
    _sig("peek", _Q, ("which",)),
    _sig("peek_job", (QUEUE, "bucket..."), ("member",)),
    _sig("claim", ("schedule", "pending", "epoch"), ("now", "limit", "lease_end", "epoch")),
    _sig("reschedule", ("schedule", "pending", "epoch", "queues"), ("queue", "next", "epoch", "empty")),
    _sig("signal", ("schedule", "pending", "queues"), ("queue", "at")),
    _sig("leader", ("leader", "epoch"), ("token", "lease", "release")),
    _sig("rate_limit", ("counter",), ("limit", "window", "refund")),
)}  # fmt: skip
