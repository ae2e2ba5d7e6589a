"""One exception tree for the whole service; HTTP maps each class to one status code.

    ClusterDQError
    ├── BadRequest            user input refused (400), names the parameter
    │   └── BodyTooLarge      413
    ├── NotFound              404 (job, queue head, pool)
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


class Unauthorized(ClusterDQError):
    status = 401


class RateLimited(ClusterDQError):
    status = 429


class PoolUnavailable(ClusterDQError):
    """What a client is told (``str()``): the pool, that Redis is unavailable, and ``advice``
    (e.g. that a write may have been applied and whether repeating it is safe). ``detail``
    (the Redis error: addresses, exception text) is for the log only."""

    status = 503

    def __init__(self, pool: str, detail: str, advice: str = "") -> None:
        public = f"pool {pool!r} unavailable: redis unavailable (unreachable or failing over)"
        super().__init__(f"{public}; {advice}" if advice else public)
        self.pool, self.detail, self.advice = pool, detail, advice


class ConfigError(ClusterDQError):
    pass
