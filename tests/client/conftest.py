"""The client folder's standalone service: the shared one on the standalone Redis, for the tests of
the worker's own logic (they do not depend on the topology)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis

from cluster_dq.client import AsyncClient
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH
from tests.support.workers import NS


@pytest.fixture
def solo_service(solo_served: ServiceProcess) -> tuple[str, str]:
    """The shared service on the standalone Redis, for the tests of the worker's own logic
    (they do not depend on the topology)."""
    return solo_served.base, solo_served.admin


@pytest.fixture
def solo_dq(solo_service: tuple[str, str], standalone_redis: redis.Redis) -> tuple[str, str]:
    """(data URL, token) of ``solo_service``, over a flushed Redis."""
    base, admin = solo_service
    r = httpx.post(f"{admin}/token/{NS}", params={"description": "worker"}, auth=ADMIN_AUTH)
    return base, str(r.json()["token"])


@pytest.fixture
async def solo(solo_dq: tuple[str, str]) -> AsyncIterator[AsyncClient]:
    """A client of ``solo_service`` over a flushed Redis."""
    async with AsyncClient(solo_dq[0], solo_dq[1], NS, timeout=30) as c:
        yield c
