"""The one retry policy for Redis failures, applied only to steps safe to repeat
(``core.plan`` decides which errors repeat which step).

Publish is safe to repeat (job ids are fixed before the first attempt, so a repeat reports
"duplicate"); ack, peek, sizes and pump steps are idempotent. Consume is never repeated: a
lost reply leaves the jobs reserved until their ttr, after which they are delivered again.
Release (nack) is never repeated either: once the job is back, another consumer may hold it.
A step the server refused before running it (``Refused``: NOREPLICAS, READONLY, TRYAGAIN,
LOADING) is repeated always.
"""

from __future__ import annotations

from typing import Any

from tenacity import (
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from cluster_dq.errors import Transient

# ~5 s of retrying covers a Sentinel failover (~2.3 s measured) and most of a Cluster one.
POLICY: dict[str, Any] = dict(
    retry=retry_if_exception_type(Transient),
    wait=wait_exponential_jitter(multiplier=0.05, max=0.5),
    stop=stop_after_attempt(12) | stop_after_delay(5.0),
    reraise=True,
)
# A best-effort step (a shard signal) gets a short budget.
OPTIONAL_POLICY: dict[str, Any] = {**POLICY, "stop": stop_after_attempt(3)}
