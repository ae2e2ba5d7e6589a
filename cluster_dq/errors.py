"""One exception tree for the whole service. The domain errors say what went wrong; the one
HTTP status table (``http/errors.py``) maps each class to a status code.

    ClusterDQError
    ├── BadRequest            user input refused, names the parameter
    │   └── BodyTooLarge
    ├── NotFound              job, queue head, pool
    ├── Conflict              a lease that no longer holds its job (nothing changed)
    ├── WrongState            the job's state forbids the operation (nothing changed)
    ├── IdempotencyMismatch   an Idempotency-Key repeated with another request (nothing written)
    ├── Contended             others kept changing it meanwhile; nothing changed, try again
    ├── Unauthorized
    ├── Forbidden             refused whoever asks: a cross-site request, a read-only port
    │   └── WriteLimited      refused to any token with a write limit (a schedule)
    ├── RateLimited
    ├── QueueFull             a publish beyond the queue's max_size (nothing written)
    ├── PoolUnavailable       what a client is told when Redis failed (the service's advice)
    ├── ConfigError           bad settings at start-up (names the key)
    └── RedisFailure          a Redis step failed: redis-py's and the OS's errors, translated
        │                     once, by the engine (``engine/core.py``, ``translate``)
        ├── Transient         the connection or the topology failed: the step may have run
        │   ├── Refused       the server refused the step before running it: nothing ran
        │   │   ├── StaleMaster      NOREPLICAS: a master without its replicas
        │   │   └── Unsent           no connection could be made: nothing was sent
        │   └── MovedDuringWait      a durable write's WAIT met a replica (Cluster failover)
        ├── NotReplicated     a durable write that too few replicas confirmed in time
        └── ServerError       permanent: an error reply the engine has no meaning for
"""

from __future__ import annotations

from typing import Any


class ClusterDQError(Exception):
    pass


class BadRequest(ClusterDQError):
    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class BodyTooLarge(BadRequest):
    pass


class NotFound(ClusterDQError):
    pass


class Forbidden(ClusterDQError):
    """Refused whatever the credentials: a request a page on another site could have made,
    a change on a read-only admin port. Nothing changed."""


class Conflict(ClusterDQError):
    """A lease was given and the job is not held by that delivery any more: another delivery
    holds it, its ttr ran out, or it is in another state (``None``: gone). Nothing changed."""

    def __init__(self, conflicts: list[tuple[str, str | None]], leased: bool = True) -> None:
        self.conflicts = conflicts
        self.job_id, self.state = conflicts[0]
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        if not leased:  # no lease given: the job's state forbids what was asked
            why = {"ttr_expired": "its ttr ran out"}.get(self.state or "", self.state)
            super().__init__(f"job {self.job_id} is not reserved: {why}; nothing was changed")
            return
        why = {
            "reserved": "held by a later delivery",
            "ttr_expired": "this delivery's ttr ran out",
            None: "gone",
        }.get(self.state, self.state)
        super().__init__(f"lease does not hold job {self.job_id}: {why}{more}; nothing was changed")


class WrongState(ClusterDQError):
    """A per-job operation (bury, kick, reschedule) that the job's state forbids: e.g. a bury
    of a dead job, a kick of one that is not dead. ``state``: where the job is. Nothing
    changed."""

    def __init__(self, job_id: str, state: str | None, operation: str, allowed: str) -> None:
        self.job_id, self.state, self.operation = job_id, state, operation
        super().__init__(
            f"cannot {operation} job {job_id}: it is {state or 'in no state'}, "
            f"{operation} needs {allowed}; nothing was changed"
        )


class IdempotencyMismatch(ClusterDQError):
    """An Idempotency-Key repeated with another request (its query or body differ) within its
    window: refused (HTTP 422), nothing written; the first request's answer stands."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"Idempotency-Key {key!r} was used with another request (its query or body differ); "
            "nothing was written"
        )


class Contended(ClusterDQError):
    """A compare-and-set that lost to concurrent writers every time it tried (a schedule
    changed by other requests and firers meanwhile). Nothing changed; repeating is safe."""


class Unauthorized(ClusterDQError):
    pass


class RateLimited(ClusterDQError):
    pass


class WriteLimited(Forbidden):
    """What a token with a write limit may not do at all (start a schedule, whose firings
    would publish past the limit): refused, nothing changed."""


class QueueFull(ClusterDQError):
    """A publish that would take the queue beyond its ``max_size`` (jobs in all states):
    refused, nothing of the request written."""

    def __init__(self, ns: str, q: str, max_size: int | None = None) -> None:
        limit = f" ({max_size} jobs)" if max_size is not None else ""
        super().__init__(
            f"queue {ns}/{q} is full: the request would take it past its max_size{limit}; "
            "nothing was published"
        )


class PoolUnavailable(ClusterDQError):
    """What a client is told (``str()``): the pool, that Redis is unavailable, and ``advice``
    (e.g. that a write may have been applied and whether repeating it is safe). ``detail``
    (the Redis error: addresses, exception text) is for the log only."""

    def __init__(self, pool: str, detail: str, advice: str = "") -> None:
        public = f"pool {pool!r} unavailable: redis unavailable (unreachable or failing over)"
        super().__init__(f"{public}; {advice}" if advice else public)
        self.pool, self.detail, self.advice = pool, detail, advice


class ConfigError(ClusterDQError):
    pass


# -- Redis failures (raised by the engine's executors) ----------------------------------------


class RedisFailure(ClusterDQError):
    """A step sent to Redis failed. The text names the Redis error (for logs, never a client).
    ``nothing_written``: set by the engine when its operation failed: True when no step of it
    that may write can have reached Redis (every attempt of such a step was refused before it
    ran, or never sent; reads write nothing), so repeating the request is safe whatever it
    is; None when no engine said (then only a ``Refused`` error says nothing ran)."""

    nothing_written: bool | None = None


class Transient(RedisFailure):
    """The connection or the topology failed (reset, timeout, failover, slot moving): the step
    may have run. The retry policy repeats it where repeating is safe."""


class Refused(Transient):
    """The server refused the step before running it (NOREPLICAS, READONLY, TRYAGAIN,
    LOADING): nothing ran, so the step is repeated even when it is not safe to repeat."""


class StaleMaster(Refused):
    """A write refused with NOREPLICAS: the server has fewer good replicas than its
    ``min-replicas-to-write``. The case that matters is a master paused past a failover (a
    stall, a frozen VM) that comes back still believing it is the master: until the sentinels
    demote it (~10 s measured) it would take writes on the connections clients kept to it,
    and lose them all when it becomes a replica; reservations made there would deliver jobs
    already acked on the new master. Nothing was written. The engine drops its idle
    connections, so the next one asks Sentinel for the master again."""


class Unsent(Refused):
    """No connection to the server could be made (refused, timed out connecting, no master
    known to the sentinels yet, no Cluster node reachable): nothing of the step was sent, so
    nothing ran, and it is repeated like a refused step. What a failover looks like to a new
    connection until the new master is known (the executor knows a step was sent when the
    connection's transport says so: ``engine/core.py``, ``Attempt``)."""


class MovedDuringWait(Transient):
    """A durable write's ``WAIT`` reached a node that is a replica now: the queue's slot
    moved (a Cluster failover) between the client's slot map and the write. The script itself
    followed the MOVED redirect and may have run on the new master, unconfirmed. Transient, so
    the retry policy repeats the write (a repeat of the same job ids reports them as present)
    once the client's slot map has caught up."""


class NotReplicated(RedisFailure):
    """A durable write reached the master but fewer replicas than required confirmed it in
    time. ``result`` is what the operation returned (e.g. the job ids): the write may still
    be lost if the master fails now."""

    def __init__(self, acked: int, wanted: int, timeout_ms: int, result: Any) -> None:
        super().__init__(f"{acked} of {wanted} replicas confirmed the write within {timeout_ms} ms")
        self.acked, self.wanted, self.timeout_ms, self.result = acked, wanted, timeout_ms, result

    def of(self, result: Any) -> NotReplicated:
        """The same failure, about part of the result (one request's share of a batch)."""
        return NotReplicated(self.acked, self.wanted, self.timeout_ms, result)


class ServerError(RedisFailure):
    """An error reply the engine has no meaning for (OOM at maxmemory, BUSY, a script's own
    error such as FENCED): permanent, never repeated. ``reply`` is the server's text."""

    def __init__(self, message: str, reply: str) -> None:
        super().__init__(message)
        self.reply = reply


class Fenced(ServerError):
    """A pump step (claim, reschedule) carried an older leadership epoch than the shard's:
    another instance leads the shard now. Nothing was changed."""

    def __init__(self, epoch: int) -> None:
        text = f"FENCED stale pump leader epoch {epoch}"
        super().__init__(text, text)
        self.epoch = epoch
