"""How many long-polls a worker lets wait at once (``MaxWaiters``, ``MaxWaitersPerNamespace``):
the HTTP layer's bound on what waiting consumers hold, checked before a long-poll waits."""

from __future__ import annotations


class Admission:
    """How many long-polls a worker lets wait at once: ``total`` in all (``MaxWaiters``), and at
    most ``per_namespace`` of them (``MaxWaitersPerNamespace``) for any one namespace, so a
    tenant that fills its share is refused (429) while the others still get in. Counts only:
    no I/O, nothing kept for a namespace with none waiting."""

    def __init__(self, total: int, per_namespace: int) -> None:
        self.total, self.per_namespace = total, min(per_namespace, total)
        self.waiting = 0
        self.by_namespace: dict[str, int] = {}

    def refusal(self, ns: str) -> str | None:
        """Why a new long-poll of ``ns`` may not wait now (None: it may)."""
        if self.waiting >= self.total:
            return "too many consumers waiting; retry later"
        if self.by_namespace.get(ns, 0) >= self.per_namespace:
            return f"too many consumers of namespace {ns} waiting; retry later"
        return None

    def enter(self, ns: str) -> None:
        self.waiting += 1
        self.by_namespace[ns] = self.by_namespace.get(ns, 0) + 1

    def leave(self, ns: str) -> None:
        self.waiting -= 1
        left = self.by_namespace[ns] - 1
        if left:
            self.by_namespace[ns] = left
        else:
            del self.by_namespace[ns]
