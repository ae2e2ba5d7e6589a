"""Fixtures more than one test folder uses: a shared service per topology (running only
while the tests that use it run), a data-port client holding a fresh token of namespace
``ns`` (Redis flushed first), and an admin client. Registered for every test by
``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from cluster_dq.localredis import Server
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, Deployment, serve
from tests.support.clients import close, make, new_token


# -- the shared service: one per worker, running only while the tests that use it run --------

_running: dict[int, ServiceProcess] = {}  # the deployment's id -> its shared service
# The fixtures that hand it out, and the topology each is on (None: the test's); the run's
# order puts the tests that use it first in each file (``run.order_folders``).
SHARED: dict[str, str | None] = {"served": None, "solo_served": "standalone"}


def _shared(target: Deployment, start: Callable[[], ServiceProcess]) -> ServiceProcess:
    svc = _running.get(id(target))
    if svc is not None and svc.proc.poll() is None:
        return svc
    _stop_shared()
    _running[id(target)] = svc = start()
    return svc


def _stop_shared() -> None:
    while _running:
        _running.popitem()[1].stop(timeout=20)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that does not use the shared service has none running behind it: its pump and
    schedule firer would act on the Redis that the test drives with pumps, firers and clocks
    of its own (a schedule test at a test clock saw the service's firer fire the occurrences
    at today's time, and the service's pump took the shards from the test's). Stopped before
    any of the test's fixtures is set up (an autouse fixture came after the module's own:
    a module's service started while the shared one still pumped)."""
    if not SHARED.keys() & set(getattr(item, "fixturenames", ())):
        _stop_shared()


@pytest.fixture(scope="session", autouse=True)
def _shared_services_stopped() -> Iterator[None]:
    yield
    _stop_shared()


@pytest.fixture
def served(deployment: Deployment) -> ServiceProcess:
    """``cluster-dq serve`` with the suite's settings (an admin account, a 1 s token cache) on
    the test's topology, shared by the tests that use it one after the other (across modules);
    stopped as soon as a test that does not use it comes. Each test that uses it starts from a
    flushed Redis (``sync_redis``)."""
    return _shared(deployment, lambda: serve(deployment.pool_settings()))


@pytest.fixture
def solo_served(redis_server: Server) -> ServiceProcess:
    """The same on the standalone server (the same service as ``served`` there), for suites
    about the service itself or a client's own logic, which do not depend on the topology
    (``standalone_redis`` flushes it)."""
    return _shared(redis_server, lambda: serve(redis_server.pool_settings()))


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
