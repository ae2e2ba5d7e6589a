"""The one retry policy for Redis failures, applied only to steps safe to repeat
(``core.plan`` decides which errors repeat which step).

Publish is safe to repeat (job ids are fixed before the first attempt, so a repeat reports
"duplicate"); ack, peek, sizes and pump steps are idempotent. Consume is never repeated once
it may have run: a lost reply leaves the jobs reserved until their ttr, after which they are
delivered again (a repeat would reserve more jobs than the consumer will ever get, each with
a try spent). Release (nack) is never repeated either: once the job is back, another consumer
may hold it. A step that did not run is repeated always, whatever it is: one the server
refused before running it (``Refused``: NOREPLICAS, READONLY, TRYAGAIN, LOADING) and one of
which nothing was sent (``Unsent``: connection refused, no master known yet, what a failover
looks like until the new master is known).

The budget is ``POLICY``'s ~5 s (``BUDGET_S``; a Sentinel failover measured ~2.4 s, a Cluster
one up to ~4.5 s on a loaded host; the setting ``RetryBudgetSecond`` changes it: ``within``), or, for a request with a deadline of its own (a long-poll
consume: its timeout), that deadline (``until``): a consume rides over an outage shorter than
its long poll, and answers at its end (a 503 saying nothing was reserved) if Redis is still
unreachable.

A request's budget is one, whatever the number of its steps (token, rate limits, queue
settings, the operation: before, each had ~5 s, and a request during an outage took 10-15 s):
the HTTP layer sets the request's deadline (``request_deadline``) and every step the engine
runs meanwhile repeats until that deadline at the latest (``bounded``). A task a request
starts for others (a long-poll watcher) runs ``detached`` from it.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

from tenacity import (
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from cluster_dq.errors import Transient

# 20, 40, 80, then every 100 ms (+ up to 20 ms of jitter): a request resumes within ~0.1 s
# of the new master taking writes. (tenacity's default jitter, up to 1 s, made every wait the
# 0.5-s maximum.) The budget is time, not attempts: ~5 s covers a Sentinel failover (~2.4 s
# measured) and most Cluster ones (~2.5-4.5 s).
_WAIT = wait_exponential_jitter(multiplier=0.02, max=0.1, jitter=0.02)
BUDGET_S = 5.0
POLICY: dict[str, Any] = dict(
    retry=retry_if_exception_type(Transient),
    wait=_WAIT,
    stop=stop_after_delay(BUDGET_S),
    reraise=True,
)


def within(budget_s: float) -> dict[str, Any]:
    """``POLICY`` with a budget of ``budget_s`` seconds (``RetryBudgetSecond``)."""
    return {**POLICY, "stop": stop_after_delay(budget_s)}


# A best-effort step (a shard signal) gets a short budget.
OPTIONAL_POLICY: dict[str, Any] = {**POLICY, "stop": stop_after_attempt(3)}


def until(deadline: float) -> dict[str, Any]:
    """``POLICY`` with the request's own deadline (``time.monotonic()`` seconds) as its budget:
    the waits are cut so that the last attempt is made at the deadline, and none after it."""

    def wait(state: RetryCallState) -> float:
        return max(0.0, min(_WAIT(state), deadline - time.monotonic()))

    def stop(state: RetryCallState) -> bool:
        return time.monotonic() >= deadline

    return {**POLICY, "wait": wait, "stop": stop}


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "cluster_dq_request_deadline", default=None
)


@contextlib.contextmanager
def request_deadline(deadline: float | None) -> Iterator[None]:
    """Within: the deadline (``time.monotonic()`` s) of every repeat of the engine's steps,
    replacing the one set before (a long poll sets its own, past the default budget)."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def bounded(deadline: float | None) -> float | None:
    """A step's deadline: its own (None: ``POLICY``'s budget), the request's at the latest."""
    outer = _DEADLINE.get()
    if outer is None:
        return deadline
    return outer if deadline is None else min(deadline, outer)


def detached() -> contextvars.Context:
    """The current context without a request's deadline: for a task that a request starts
    and that outlives it, serving others (a long-poll watcher, a give-back)."""
    ctx = contextvars.copy_context()
    ctx.run(_DEADLINE.set, None)
    return ctx
