"""``AsyncAdminClient``: the asyncio client of the admin port (tokens, rate limits, info, health,
metrics). ``url`` defaults to CLUSTER_DQ_ADMIN_URL, ``auth`` to CLUSTER_DQ_ADMIN_AUTH
("user:password"; none: no basic auth)."""

from __future__ import annotations

import os
from typing import Any

import httpx

from cluster_dq.client import _admin as a
from cluster_dq.client._async.client import _Shell
from cluster_dq.client._transport import async_sender
from cluster_dq.client._core import ADMIN_URL_ENV, admin_auth, setting, shell_options
from cluster_dq.client.models import TokenLimit


def _settings(url: str | None, auth: tuple[str, str] | None) -> tuple[str, Any]:
    return setting(url, os.environ, ADMIN_URL_ENV, "admin url"), admin_auth(auth, os.environ)


class AsyncAdminClient(_Shell):
    def __init__(
        self,
        url: str | None = None,
        auth: tuple[str, str] | None = None,
        *,
        timeout: float | None = 30.0,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        shell_options(timeout, 10, retries)
        self.url, basic = _settings(url, auth)
        sender = async_sender(self.url, {}, 10, transport, basic)
        super().__init__(sender, timeout, retries)

    async def info(self, pool: str | None = None) -> dict[str, list[str]]:
        return await self._send(a.info(pool))

    async def pools(self) -> list[str]:
        return await self._send(a.pools())

    async def limits(self) -> list[TokenLimit]:
        return await self._send(a.limits())

    async def set_limit(
        self, namespace: str, token: str, *, read: int, write: int, interval: int
    ) -> TokenLimit:
        call = a.set_limit(namespace, token, read=read, write=write, interval=interval)
        return await self._send(call)

    async def delete_limit(self, namespace: str, token: str) -> None:
        return await self._send(a.delete_limit(namespace, token))

    async def create_token(
        self, namespace: str, description: str, *, token: str | None = None, pool: str | None = None
    ) -> str:
        return await self._send(a.create_token(namespace, description, token=token, pool=pool))

    async def tokens(self, namespace: str, *, pool: str | None = None) -> dict[str, str]:
        return await self._send(a.tokens(namespace, pool=pool))

    async def delete_token(self, namespace: str, token: str) -> None:
        return await self._send(a.delete_token(namespace, token))

    async def metrics_text(self) -> str:
        return await self._send(a.metrics_text())

    async def healthz(self) -> bool:
        return await self._send(a.healthz())

    async def readyz(self) -> dict[str, Any]:
        return await self._send(a.readyz())

    async def version(self) -> str:
        return await self._send(a.version())
