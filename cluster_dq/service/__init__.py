"""The use cases: the only thing the HTTP handlers and the dashboard call. One module per
concept over one small core (``core.py``: route -> pools -> engine, the fan-out over the pools
of a moving queue, and ``failures.py``: what a Redis failure means for a request, in one place).
``Service`` is all of them on one object, as redis-py's client is its command groups.
"""

from __future__ import annotations

from cluster_dq.lifecycle import LifecycleLog
from cluster_dq.metrics import Metrics
from cluster_dq.pools import RedisPool
from cluster_dq.service.control import JobControl
from cluster_dq.service.failures import nothing_written
from cluster_dq.service.groups import Groups
from cluster_dq.service.history import History
from cluster_dq.service.jobs import Jobs
from cluster_dq.service.operators import Operators
from cluster_dq.service.queues import Queues
from cluster_dq.service.schedules import Schedules
from cluster_dq.service.tokens import Tokens
from cluster_dq.service.workers import Workers
from cluster_dq.settings import Settings
from cluster_dq.waiters import Look

__all__ = ["Look", "Service", "nothing_written"]


class Service(Jobs, JobControl, Queues, Groups, Schedules, Tokens, Workers, History, Operators):
    """Every use case, over one ``ServiceCore`` (settings, pools, routes, metrics, the
    lifecycle log and the token store)."""

    def __init__(
        self,
        settings: Settings,
        pools: dict[str, RedisPool],
        events: LifecycleLog | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        # (the mixins that keep state of their own pass these on to ServiceCore)
        super().__init__(settings, pools, events, metrics)
