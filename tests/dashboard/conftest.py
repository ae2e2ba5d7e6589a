"""The dashboard folder's service (a ``cluster-dq serve`` per module on the test's topology),
the data API with a fresh token of ``NS``, and a browser-like client of ``/ui``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH
from tests.support.dashboard import NS


@pytest.fixture
def service(served: ServiceProcess) -> ServiceProcess:
    """The shared service (``served``) of the test's topology."""
    return served


@pytest.fixture
def api(service: ServiceProcess, sync_redis: redis.Redis) -> Iterator[httpx.Client]:
    """The data API with a fresh token of NS (Redis flushed before each test)."""
    token = httpx.post(
        f"{service.admin}/token/{NS}", params={"description": "test"}, auth=ADMIN_AUTH
    ).json()["token"]
    with httpx.Client(base_url=service.base, headers={"X-Token": token}, timeout=30) as client:
        yield client


@pytest.fixture
def ui(service: ServiceProcess, api: httpx.Client) -> Iterator[httpx.Client]:
    """A browser-like client of the dashboard: basic auth, cookies, redirects followed."""
    with httpx.Client(
        base_url=f"{service.admin}/ui", auth=ADMIN_AUTH, follow_redirects=True, timeout=30
    ) as client:
        assert client.get("/").status_code == 200  # the session's CSRF cookie
        yield client
