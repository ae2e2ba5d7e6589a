"""The client's one retry rule (docs/client.md, "Retries"): which failures of which calls are
repeated, and how long to wait before each repeat. Both shells build their tenacity loop here.

A failure is repeated when repeating it cannot do harm:

- nothing reached the server (the connection could not be made), or the service says the
  request was refused before it ran: any call;
- a rate limit (429 other than a full queue): nothing was done; wait ``Retry-After``;
- a write that lost to concurrent writers (409 ``Contended``): nothing was done;
- the reply was lost, or a 503 whose outcome is unknown: only an ``IDEMPOTENT`` call (reads,
  acks, touch, a publish with a fixed ``job_id``, consume: what a lost consume reserved comes
  back after its ttr). A ``ONCE`` call (a publish without ``job_id``, release, bury, kick…)
  surfaces the error: look before repeating it.

Never repeated: 4xx answers other than 429, and a full queue.
"""

from __future__ import annotations

from typing import Any

from tenacity import (
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from cluster_dq.client._core import Safety
from cluster_dq.client.errors import Contended, QueueFull, RateLimited, TransportError, Unavailable

FIRST_WAIT = 0.1  # seconds, doubled per attempt, with up to JITTER added at random
MAX_WAIT = 5.0
JITTER = 0.1
MAX_RETRY_AFTER = 60.0


def repeatable(safety: Safety, exc: BaseException) -> bool:
    """Whether a call of this ``safety`` that failed with ``exc`` may be sent again."""
    if isinstance(exc, QueueFull):
        return False
    if isinstance(exc, RateLimited | Contended):  # nothing was done
        return True
    if isinstance(exc, TransportError):
        return not exc.sent or safety is Safety.IDEMPOTENT
    if isinstance(exc, Unavailable):
        return not exc.maybe_applied or safety is Safety.IDEMPOTENT
    return False


_backoff = wait_exponential_jitter(multiplier=FIRST_WAIT, max=MAX_WAIT, jitter=JITTER)


def wait(state: RetryCallState) -> float:
    """``Retry-After`` when the server gave one, else exponential with jitter, capped."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, RateLimited) and exc.retry_after is not None:
        return min(max(exc.retry_after, 0.0), MAX_RETRY_AFTER)
    return float(_backoff(state))


def policy(safety: Safety, retries: int) -> dict[str, Any]:
    """tenacity keyword arguments for ``Retrying`` / ``AsyncRetrying``: ``retries`` repeats at
    most after the first attempt; the last failure is raised as it is."""
    return {
        "retry": retry_if_exception(lambda e: repeatable(safety, e)),
        "stop": stop_after_attempt(retries + 1),
        "wait": wait,
        "reraise": True,
    }
