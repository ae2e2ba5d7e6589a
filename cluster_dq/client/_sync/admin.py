# Generated from cluster_dq/client/_async/admin.py by scripts/unasync.py:
# edit that file, then run the script.
"""``AdminClient``: the blocking client of the admin port (tokens, rate limits, info, health,
metrics). ``url`` defaults to CLUSTER_DQ_ADMIN_URL, ``auth`` to CLUSTER_DQ_ADMIN_AUTH
("user:password"; none: no basic auth)."""

from __future__ import annotations

import os
from typing import Any

import httpx

from cluster_dq.client import _admin as a
from cluster_dq.client._core import ADMIN_URL_ENV, admin_auth, setting, shell_options
from cluster_dq.client._sync.client import _Shell
from cluster_dq.client._transport import sync_sender
from cluster_dq.client.models import TokenLimit


def _settings(url: str | None, auth: tuple[str, str] | None) -> tuple[str, Any]:
    return setting(url, os.environ, ADMIN_URL_ENV, "admin url"), admin_auth(auth, os.environ)


class AdminClient(_Shell):
    def __init__(
        self,
        url: str | None = None,
        auth: tuple[str, str] | None = None,
        *,
        timeout: float | None = 30.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        shell_options(timeout, 10, retries)
        self.url, basic = _settings(url, auth)
        sender = sync_sender(self.url, {}, 10, transport, basic)
        super().__init__(sender, timeout, retries)

    def info(self, pool: str | None = None) -> dict[str, list[str]]:
        return self._send(a.info(pool))

    def pools(self) -> list[str]:
        return self._send(a.pools())

    def limits(self) -> list[TokenLimit]:
        return self._send(a.limits())

    def set_limit(
        self, namespace: str, token: str, *, read: int, write: int, interval: int
    ) -> TokenLimit:
        call = a.set_limit(namespace, token, read=read, write=write, interval=interval)
        return self._send(call)

    def delete_limit(self, namespace: str, token: str) -> None:
        return self._send(a.delete_limit(namespace, token))

    def create_token(
        self, namespace: str, description: str, *, token: str | None = None, pool: str | None = None
    ) -> str:
        return self._send(a.create_token(namespace, description, token=token, pool=pool))

    def tokens(self, namespace: str, *, pool: str | None = None) -> dict[str, str]:
        return self._send(a.tokens(namespace, pool=pool))

    def delete_token(self, namespace: str, token: str) -> None:
        return self._send(a.delete_token(namespace, token))

    def metrics_text(self) -> str:
        return self._send(a.metrics_text())

    def healthz(self) -> bool:
        return self._send(a.healthz())

    def readyz(self) -> dict[str, Any]:
        return self._send(a.readyz())

    def version(self) -> str:
        return self._send(a.version())
