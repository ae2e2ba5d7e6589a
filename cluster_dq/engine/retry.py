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

The budget is ``POLICY``'s ~5 s (a Sentinel failover measured ~2.4 s, a Cluster one up to
~4.5 s on a loaded host), or, for a request with a deadline of its own (a long-poll consume:
its timeout), that deadline (``until``): a consume rides over an outage shorter than its long
poll, and answers "no job" at its end if Redis is still unreachable.
"""

from __future__ import annotations

import time
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
POLICY: dict[str, Any] = dict(
    retry=retry_if_exception_type(Transient),
    wait=_WAIT,
    stop=stop_after_delay(5.0),
    reraise=True,
)
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
