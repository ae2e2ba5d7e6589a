"""A recorded history of queue operations: its events, and the operations and deliveries the
checkers (loadtest/history_check.py, loadtest/history_extensions.py) read from it. Pure.

The history is kept the way Jepsen keeps one: every operation is an ``invoke`` event when the
client sends it and one completion event when it learns the outcome:

- ``ok``: the operation happened (a 2xx);
- ``fail``: it certainly did not happen (a 4xx, or a connection that was never opened);
- ``info``: the outcome is unknown (a 503, a timeout, a connection lost mid-request). The
  service may still be running it when the client gives up, so it may take effect however
  late: the checkers take its completion as never (``Op.completed`` is infinite).

Times are the *client's* monotonic clock. The checker never compares them with the server's
clock: an operation took effect somewhere between its invoke and its completion, and every
verdict is drawn only when it holds for every instant in those intervals, so neither clock skew
nor a slow reply can make a false alarm (it can only hide an anomaly).

Jobs are known by a ``key`` that is their body, unique per publish, so that a delivery can be
traced back to a publish whose reply was lost (its server-assigned id never reached us).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Event:
    op: int  # the operation's index: an invoke and its completion share it
    process: int  # the client (publisher, consumer, operator) that ran it
    type: str  # invoke | ok | fail | info
    f: str  # publish | consume | ack | touch | release | configure_group
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
    """An invoke paired with its completion (``type`` "info" when it never completed, or its
    outcome is unknown: ``completed`` is then infinite, as it may take effect however late)."""

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


# A checker's way to report an anomaly: its kind and an example.
Flag = Callable[[str, Any], None]


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
                c.time if c and c.type != "info" else float("inf"),
                c.type if c else "info",
                inv.value,
                c.value if c else {},
            )
        )
    return out


def lost_consumes(ops: list[Op]) -> dict[str, list[Op]]:
    """Consumes whose outcome is unknown, by queue asked, in invoke order."""
    out: dict[str, list[Op]] = {}
    for o in sorted(ops, key=lambda o: o.invoked):
        if o.f == "consume" and o.type == "info":
            for q in o.args["queues"]:
                out.setdefault(q, []).append(o)
    return out
