"""Fixtures more than one test folder uses: a service per module and topology, a
data-port client holding a fresh token of namespace ``ns`` (Redis flushed first), and an admin
client. Registered for every test by ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis

from cluster_dq.localredis import Server
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, Deployment, serve
from tests.support.clients import close, make, new_token


@pytest.fixture(scope="module")
def served(deployment: Deployment) -> Iterator[ServiceProcess]:
    """One ``cluster-dq serve`` per module and topology, with the suite's settings (an admin
    account, a 1 s token cache), for every fixture of the module that needs no settings of its
    own. Each test that uses it starts from a flushed Redis (``sync_redis``).

    Not one per session: a service outliving its module keeps its pump and schedule firer
    running on the Redis that later modules drive with clocks of their own (a schedule test at
    a fixed 2026 instant saw the service fire its occurrences at today's time)."""
    svc = serve(deployment.pool_settings())
    yield svc
    svc.stop(timeout=20)


@pytest.fixture(scope="module")
def solo_served(redis_server: Server) -> Iterator[ServiceProcess]:
    """The same on the standalone server, for suites about the service itself or a client's
    own logic, which do not depend on the topology (``standalone_redis`` flushes it)."""
    svc = serve(redis_server.pool_settings())
    yield svc
    svc.stop(timeout=20)


@pytest.fixture
def service(served: ServiceProcess) -> tuple[str, str]:
    """(data URL, admin URL) of the shared service."""
    return served.base, served.admin


@pytest.fixture
def api(service: tuple[str, str], sync_redis: redis.Redis) -> Iterator[httpx.Client]:
    base, admin = service
    token = httpx.post(f"{admin}/token/ns", params={"description": "test"}, auth=ADMIN_AUTH).json()[
        "token"
    ]
    with httpx.Client(base_url=base, headers={"X-Token": token}, timeout=30) as client:
        yield client


@pytest.fixture
def admin(service: tuple[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service[1], auth=ADMIN_AUTH, timeout=10) as client:
        yield client


@pytest.fixture
def token(served: ServiceProcess, sync_redis: redis.Redis) -> str:
    return new_token(served)  # after sync_redis flushed the deployment


@pytest.fixture(params=["sync", "async"])
async def dq(
    request: pytest.FixtureRequest, served: ServiceProcess, token: str
) -> AsyncIterator[Any]:
    c = make(request.param, served.base, token)
    yield c
    await close(c)
