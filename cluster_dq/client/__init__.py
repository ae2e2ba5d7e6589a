"""The Python client of cluster_dq: ``Client`` (blocking) and ``AsyncClient`` (asyncio) for
the data port, ``AdminClient`` / ``AsyncAdminClient`` for the admin port, over one pure core
(``_core``, ``_verbs``) and one retry rule (``_retry``). See docs/client.md."""

from cluster_dq.client.admin import AdminClient, AsyncAdminClient
from cluster_dq.client.aio import AsyncClient
from cluster_dq.client.errors import (
    BadRequest,
    Conflict,
    Contended,
    DQError,
    LeaseLost,
    NotFound,
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
    Job,
    QueueInfo,
    QueuePage,
    QueueSettings,
    Schedule,
    ScheduleJob,
    SchedulePage,
    Sizes,
    Sweep,
    TokenLimit,
)
from cluster_dq.client.sync import Client

__all__ = [
    "AdminClient",
    "AsyncAdminClient",
    "AsyncClient",
    "Backoff",
    "BadRequest",
    "Client",
    "Conflict",
    "Contended",
    "DQError",
    "DeadJob",
    "DeadPage",
    "Job",
    "LeaseLost",
    "NotFound",
    "QueueFull",
    "QueueInfo",
    "QueuePage",
    "QueueSettings",
    "RateLimited",
    "Schedule",
    "ScheduleJob",
    "SchedulePage",
    "Sizes",
    "Sweep",
    "TokenLimit",
    "TooLarge",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "WrongState",
]
