"""The one retry policy for transient Redis errors, applied only to operations safe to repeat.

Publish is safe to repeat (job ids are fixed before the first attempt, so a repeat reports
"duplicate"); ack, peek, sizes and pump steps are idempotent. Consume is never repeated: a
lost reply leaves the jobs reserved until their ttr, after which they are delivered again.
Release (nack) is never repeated either: once the job is back, another consumer may hold it.
A step the server refused before running it (NOREPLICAS: ``StaleMaster``, READONLY, TRYAGAIN,
LOADING: ``aio.REFUSED``) is repeated always.
"""

from __future__ import annotations

from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    ReadOnlyError,
    TimeoutError,
    TryAgainError,
)
from redis.exceptions import (
    ClusterError as _ClusterError,
)
from tenacity import (
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

TRANSIENT = (
    ConnectionError,
    TimeoutError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    BusyLoadingError,
    _ClusterError,
)

# ~5 s of retrying covers a Sentinel failover (~2.3 s measured) and most of a Cluster one.
POLICY = dict(
    retry=retry_if_exception_type(TRANSIENT),
    wait=wait_exponential_jitter(multiplier=0.05, max=0.5),
    stop=stop_after_attempt(12) | stop_after_delay(5.0),
    reraise=True,
)
