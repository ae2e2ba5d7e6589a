"""One exception tree for the whole service; HTTP maps each class to one status code.

    ClusterDQError
    ├── BadRequest            user input refused (400), names the parameter
    │   └── BodyTooLarge      413
    ├── NotFound              404 (job, queue head, pool)
    ├── Conflict              409: a lease that no longer holds its job (nothing changed)
    ├── Unauthorized          401
    ├── RateLimited           429
    ├── PoolUnavailable       Redis unreachable or failing over after retries (503)
    └── ConfigError           bad settings at start-up (names the key)
"""

from __future__ import annotations


class ClusterDQError(Exception):
    status = 500


class BadRequest(ClusterDQError):
    status = 400

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class BodyTooLarge(BadRequest):
    status = 413


class NotFound(ClusterDQError):
    status = 404


class Conflict(ClusterDQError):
    """A lease was given and the job is not held by that delivery any more: another delivery
    holds it, its ttr ran out, or it is in another state (``None``: gone). Nothing changed."""

    status = 409

    def __init__(self, conflicts: list[tuple[str, str | None]]) -> None:
        self.conflicts = conflicts
        self.job_id, self.state = conflicts[0]
        why = {"reserved": "held by a later delivery", "ttr_expired": "this delivery's ttr ran out",
               None: "gone"}.get(self.state, self.state)  # fmt: skip
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        super().__init__(f"lease does not hold job {self.job_id}: {why}{more}; nothing was changed")


class Unauthorized(ClusterDQError):
    status = 401


class RateLimited(ClusterDQError):
    status = 429


class PoolUnavailable(ClusterDQError):
    status = 503

    def __init__(self, pool: str, detail: str) -> None:
        super().__init__(f"pool {pool!r} unavailable: {detail}")
        self.pool, self.detail = pool, detail


class ConfigError(ClusterDQError):
    pass
