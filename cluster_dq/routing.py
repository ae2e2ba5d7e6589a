"""Routing: what the pool name in a token stands for, and on which pool each queue lives.

A token ``name:token`` names a *route*, which is one of

- a pool (``[Pool.<name>]``): every queue of the namespace on it;
- a pool with ``MigrateTo`` (lmstfy's migration mode): new jobs go to the target pool; reads
  (consume, peek, sizes, dead letters) drain the old pool first, then the target;
- a ring (``[Ring.<name>] Pools = [...]``): each queue ``ns/q`` lives on one member, chosen by
  consistent hashing (uhashring's ketama ring), so adding a member moves ~1/N of the queues.
  ``PreviousPools`` keeps the membership before the change: a queue that moved is written on
  its new member and drained from its old one until the operator drops ``PreviousPools``.

Ring members may themselves migrate. A placement depends only on the settings and the queue's
name, so every instance computes the same one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from uhashring import HashRing  # type: ignore[import-untyped]

from cluster_dq.settings import Settings

P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class Placement(Generic[P]):
    write: P  # where new jobs of the queue go
    reads: tuple[P, ...]  # where its jobs may be: pools being drained first, ``write`` last


class _Members:
    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.ring = HashRing(nodes=list(names)) if len(names) > 1 else None

    def of(self, key: str) -> str:
        return self.names[0] if self.ring is None else str(self.ring.get_node(key))

    def __reduce__(self) -> tuple[type[_Members], tuple[tuple[str, ...]]]:
        return _Members, (self.names,)  # the ring rebuilds itself (Spark ships routes to tasks)


class PoolRoute(Generic[P]):
    def __init__(
        self,
        name: str,
        pools: Mapping[str, P],
        members: Sequence[str],
        previous: Sequence[str] = (),
        moves: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self._pools = pools
        self._members = _Members(members)
        self._previous = _Members(previous) if previous else None
        self._moves = dict(moves or {})
        # Most routes are one pool that is not migrating: one placement for every queue.
        self._single = self._place("") if len(members) == 1 and not previous else None

    def place(self, ns: str, q: str) -> Placement[P]:
        return self._single or self._place(f"{ns}/{q}")

    def _place(self, key: str) -> Placement[P]:
        names: list[str] = []
        if self._previous is not None:
            names += self._expand(self._previous.of(key))
        member = self._members.of(key)
        names += self._expand(member)
        write = self._moves.get(member, member)
        reads = [n for n in dict.fromkeys(names) if n != write] + [write]
        return Placement(self._pools[write], tuple(self._pools[n] for n in reads))

    def _expand(self, name: str) -> list[str]:
        return [name, self._moves[name]] if name in self._moves else [name]

    def groups(self, ns: str, queues: Sequence[str]) -> list[tuple[P, list[str]]]:
        """The queues of one consume, grouped by the pool to read them from: pools being
        drained first, and within a pool the caller's order (its priority)."""
        by_pool: dict[int, tuple[P, list[str]]] = {}
        drained: list[int] = []
        for q in queues:
            reads = self.place(ns, q).reads
            for i, pool in enumerate(reads):
                entry = by_pool.setdefault(id(pool), (pool, []))
                entry[1].append(q)
                if i < len(reads) - 1:
                    drained.append(id(pool))
        first = dict.fromkeys(drained)
        order = [k for k in by_pool if k in first] + [k for k in by_pool if k not in first]
        return [by_pool[k] for k in order]

    def pools(self) -> list[P]:
        """Every pool the route may read from."""
        names = list(self._members.names) + list(self._previous.names if self._previous else ())
        names += [self._moves[n] for n in names if n in self._moves]
        return [self._pools[n] for n in dict.fromkeys(names)]


def build_routes(settings: Settings, pools: Mapping[str, P]) -> dict[str, PoolRoute[P]]:
    """Every name a token may carry: each pool, and each ring."""
    moves = {name: p.MigrateTo for name, p in settings.Pool.items() if p.MigrateTo}
    routes = {name: PoolRoute(name, pools, [name], moves=moves) for name in settings.Pool}
    for name, ring in settings.Ring.items():
        routes[name] = PoolRoute(name, pools, ring.Pools, ring.PreviousPools, moves)
    return routes
