"""The client suites' pieces: a token of ``NS``, the blocking client wrapped so that one async test body drives both clients (``dq``, once per kind), and a
transport that loses chosen replies after the server answered them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from cluster_dq.client import AsyncClient, Client
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH

NS = "cns"


def new_token(svc: ServiceProcess) -> str:
    r = httpx.post(f"{svc.admin}/token/{NS}", params={"description": "t"}, auth=ADMIN_AUTH)
    return str(r.json()["token"])


class Sync:
    """The blocking client behind the async test bodies: the same calls, awaited."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return call


def make(kind: str, url: str, token: str, **kw: Any) -> Any:
    if kind == "sync":
        return Sync(Client(url, token, NS, **kw))
    return AsyncClient(url, token, NS, **kw)


async def close(c: Any) -> None:
    if isinstance(c, Sync):
        c.client.close()
    else:
        await c.aclose()
        proxy = getattr(c, "fault_proxy", None)
        if proxy is not None:
            await proxy.close()


class LoseReplies(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """The real transport, except that the reply of the first ``lose`` requests that match
    ``which`` is dropped after the server answered it (``before_send``: the connection fails
    before anything is sent instead). ``seen``: every request that reached the transport."""

    def __init__(
        self, which: Callable[[httpx.Request], bool], lose: int = 1, before_send: bool = False
    ) -> None:
        self.which, self.lose, self.before_send = which, lose, before_send
        self.seen: list[httpx.Request] = []
        self.sync, self.aio = httpx.HTTPTransport(), httpx.AsyncHTTPTransport()

    def _drop(self, request: httpx.Request) -> bool:
        self.seen.append(request)
        if self.lose and self.which(request):
            self.lose -= 1
            return True
        return False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        drop = self._drop(request)
        if drop and self.before_send:
            raise httpx.ConnectError("connection refused", request=request)
        response = self.sync.handle_request(request)
        response.read()
        if drop:
            response.close()
            raise httpx.ReadError("connection reset: reply lost", request=request)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        drop = self._drop(request)
        if drop and self.before_send:
            raise httpx.ConnectError("connection refused", request=request)
        response = await self.aio.handle_async_request(request)
        await response.aread()
        if drop:
            await response.aclose()
            raise httpx.ReadError("connection reset: reply lost", request=request)
        return response

    def close(self) -> None:
        self.sync.close()

    async def aclose(self) -> None:
        await self.aio.aclose()


# The kinds of client the fault tests run: both on httpx with ``LoseReplies`` as their
# transport, and the asyncio client on its own aiohttp through ``FaultProxy``.
FAULTY_KINDS = ["sync", "async", "aiohttp"]


async def faulty(kind: str, svc: ServiceProcess, token: str, faults: LoseReplies, **kw: Any) -> Any:
    if kind != "aiohttp":
        return make(kind, svc.base, token, transport=faults, **kw)
    from tests.support.faultproxy import FaultProxy

    proxy = await FaultProxy(svc.base, faults).start()
    client = AsyncClient(proxy.base, token, NS, **kw)
    client.fault_proxy = proxy  # type: ignore[attr-defined]  # closed with it (close)
    return client
