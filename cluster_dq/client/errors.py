"""The client's exception tree: every answer the service refuses with, and every failure to
reach it, as one class (decoded from the response by ``_core.error_from``).

    DQError                 .status, .message, .body
    ├── BadRequest          400: a bad parameter, name, id or body; nothing was written
    │   └── InvalidName     a name the service refuses, refused before sending (a ValueError too)
    ├── Unauthorized        401: no token, or not one of this namespace
    ├── NotFound            404: no such pool, job, schedule or route
    ├── Conflict            409: .state, where the job is (None: gone or not said)
    │   ├── LeaseLost       the lease no longer holds the job; nothing changed
    │   ├── WrongState      the job's state forbids the operation; nothing changed
    │   └── Contended       others kept changing it meanwhile (a schedule); nothing changed
    ├── TooLarge            413: a body, result or progress over its limit
    ├── IdempotencyMismatch 422: an Idempotency-Key repeated with another request; nothing written
    ├── RateLimited         429: .retry_after (seconds, or None); nothing was done
    ├── QueueFull           429: the queue holds its max_size; nothing was published
    ├── Unavailable         503 (or 502/504): .safe_to_repeat, .maybe_applied
    └── TransportError      no answer: .sent, whether the request may have reached the server
"""

from __future__ import annotations

from typing import Any


class DQError(Exception):
    """An error answer of the service (``status``, its ``message`` and JSON ``body``), or a
    failure to get one (``TransportError``, status 0)."""

    def __init__(self, message: str, status: int = 0, body: Any = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status, self.message, self.body = status, message, body


class BadRequest(DQError):
    pass


class InvalidName(BadRequest, ValueError):
    """A namespace, queue, job id, schedule name or token the service would refuse
    (``cluster_dq/names.py``), refused before anything is sent: the service's 400, and a
    ``ValueError`` as every argument the client checks itself."""


class Unauthorized(DQError):
    pass


class NotFound(DQError):
    pass


class Conflict(DQError):
    """The operation conflicts with where the job is: ``state`` says where (``None``: the job
    is gone, or the answer did not say). Nothing was changed."""

    def __init__(
        self, message: str, status: int = 409, body: Any = None, state: str | None = None
    ) -> None:
        super().__init__(message, status, body)
        self.state = state


class LeaseLost(Conflict):
    """The lease given no longer holds the job (a later delivery holds it, its ttr ran out, or
    the job moved on); without a lease, a progress of a job not in a running reservation."""


class WrongState(Conflict):
    """A per-job operation (bury, kick, reschedule) that the job's state forbids."""


class Contended(Conflict):
    """A write that kept losing to concurrent changes of the same thing (a schedule changed by
    other requests and firers meanwhile): nothing changed, and repeating it is safe."""


class TooLarge(DQError):
    pass


class RateLimited(DQError):
    """A rate limit (the token's, or too many long-polls waiting): nothing was done.
    ``retry_after``: the server's ``Retry-After`` in seconds, when it gave one."""

    def __init__(
        self, message: str, status: int = 429, body: Any = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status, body)
        self.retry_after = retry_after


class IdempotencyMismatch(DQError):
    """An ``idempotency_key`` sent with another request (body or arguments) than the first one
    under it, within its window: nothing was written; the first answer stands."""


class QueueFull(DQError):
    """The queue holds its ``max_size``: nothing of the request was published. Not retried:
    only consumers make room."""


class Unavailable(DQError):
    """Redis was unavailable after the service's own retries. ``safe_to_repeat``: the service
    says repeating the request is safe; ``maybe_applied``: False only when it says the request
    was refused before it ran (nothing was written)."""

    def __init__(
        self,
        message: str,
        status: int = 503,
        body: Any = None,
        *,
        safe_to_repeat: bool = False,
        maybe_applied: bool = True,
    ) -> None:
        super().__init__(message, status, body)
        self.safe_to_repeat, self.maybe_applied = safe_to_repeat, maybe_applied


class TransportError(DQError):
    """No answer: the connection failed or timed out. ``sent``: False when nothing of the
    request was sent (the connection could not be made), so it cannot have been applied."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent
