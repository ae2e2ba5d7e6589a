"""The Python client of cluster_dq: ``Client`` (blocking) and ``AsyncClient`` (asyncio) for
the data port, ``AdminClient`` / ``AsyncAdminClient`` for the admin port. The asyncio ones are
written in ``_async``; the blocking ones in ``_sync`` are generated from them
(``scripts/unasync.py``). All four run over one pure core (``_core``, ``_verbs``) and one retry
rule (``_retry``). See docs/client.md; the ``Worker`` (with ``Retry``, ``Snooze``, ``Bury``):
docs/worker.md."""

from typing import TYPE_CHECKING, Any

from cluster_dq.client._async.admin import AsyncAdminClient
from cluster_dq.client._async.client import AsyncClient
from cluster_dq.client._sync.admin import AdminClient
from cluster_dq.client._sync.client import Client
from cluster_dq.client.errors import (
    BadRequest,
    InvalidName,
    Conflict,
    Contended,
    DQError,
    LeaseLost,
    NotFound,
    IdempotencyMismatch,
    QueueFull,
    RateLimited,
    TooLarge,
    TransportError,
    Unauthorized,
    Unavailable,
    WrongState,
)
from cluster_dq.client.models import (
    Backoff,
    DeadJob,
    DeadPage,
    GroupInfo,
    GroupPage,
    Job,
    QueueInfo,
    QueuePage,
    QueueSettings,
    Schedule,
    ScheduleJob,
    SchedulePage,
    Publication,
    Sizes,
    Sweep,
    TokenLimit,
    HeldJob,
    WorkerInfo,
    WorkerPage,
)
from cluster_dq.client.outcomes import Bury, Retry, Snooze, TimeLimitExceeded

if TYPE_CHECKING:
    from cluster_dq.client.worker import Worker


def __getattr__(name: str) -> Any:
    # Worker is imported on first use: `python -m cluster_dq.client.worker` must find its
    # module not yet imported (runpy warns otherwise)
    if name == "Worker":
        from cluster_dq.client.worker import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AdminClient",
    "AsyncAdminClient",
    "AsyncClient",
    "Backoff",
    "BadRequest",
    "InvalidName",
    "Bury",
    "Client",
    "Conflict",
    "Contended",
    "DQError",
    "DeadJob",
    "DeadPage",
    "GroupInfo",
    "GroupPage",
    "Job",
    "LeaseLost",
    "NotFound",
    "IdempotencyMismatch",
    "QueueFull",
    "QueueInfo",
    "QueuePage",
    "QueueSettings",
    "RateLimited",
    "Retry",
    "Schedule",
    "ScheduleJob",
    "SchedulePage",
    "Publication",
    "Sizes",
    "Snooze",
    "TimeLimitExceeded",
    "Sweep",
    "TokenLimit",
    "HeldJob",
    "WorkerInfo",
    "WorkerPage",
    "TooLarge",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Worker",
    "WrongState",
]
