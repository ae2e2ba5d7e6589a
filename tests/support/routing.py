"""The routing suites' pools and service: standalone databases standing for other pools, a
service started with every pool of a routing test, and a token naming its pool."""

from __future__ import annotations

import httpx

from cluster_dq.localredis import Server
from cluster_dq.settings import PoolSettings
from cluster_dq.testing.service_process import ServiceProcess, pool_env
from tests.support import ADMIN_AUTH, serve


def standalone_db(server: Server, db: int, name: str) -> PoolSettings:
    return PoolSettings(name, Addr=f"127.0.0.1:{server.port}", DB=db)


def start(pools: dict[str, PoolSettings], **env: str) -> ServiceProcess:
    environ = {k: v for p in pools.values() for k, v in pool_env(p).items()}
    return serve(pools["default"], **environ, **env)


def token(admin: str, name: str) -> str:
    r = httpx.post(
        f"{admin}/token/ns",
        params={"description": "t", "token": f"{name}:{'t' * 24}"},
        auth=ADMIN_AUTH,
    )
    assert r.status_code in (201, 400), r.text  # 400: created by an earlier start
    return f"{name}:{'t' * 24}"
