"""How the client's shells put a request on the wire and what a failure there means.

A sender takes one request (method, path, query, headers, body, timeout) and answers a
``Reply``, or raises the error tree's ``TransportError``, whose ``sent`` says whether any of
the request may have left this process (the retry rule, ``_retry.py``, depends on it).

- ``AiohttpSender``: the asyncio client's own, on aiohttp: it costs a fifth of httpx's CPU per
  request, and less still with requests in flight (``loadtest/bench_client.py``).
- ``HttpxAsyncSender`` / ``HttpxSender``: httpx, for the blocking client, and for an asyncio
  client given an httpx ``transport=`` (an in-process ASGI app, a transport of one's own).

Both mean the same by a timeout of T seconds: T to get a connection (from the pool, or a new
one), T between two reads of the reply (a long poll's wait is added by the shell). Writes
differ: httpx bounds each write by T; aiohttp has no write timeout, so a request whose body is
over ``WRITE_BOUND`` must be sent and answered within T in all (a small body is written at
once, into the socket's buffer)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import aiohttp
import httpx
from yarl import URL

from cluster_dq.client._core import Reply
from cluster_dq.client.errors import TransportError

Params = Sequence[tuple[str, str]]
WRITE_BOUND = 64 * 1024  # bytes of body past which aiohttp's whole exchange is bounded


def same_loop(bound: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop:
    """The event loop an asyncio sender is bound to: the one it first ran in (its pooled
    connections belong to it). Used from another loop: a RuntimeError saying so, before
    anything is sent."""
    loop = asyncio.get_running_loop()
    if bound is not None and bound is not loop:
        raise RuntimeError(
            "this AsyncClient was first used in another event loop, whose connections it "
            "holds: make one AsyncClient per event loop (docs/client.md)"
        )
    return loop


def basic_auth(auth: tuple[str, str] | None) -> dict[str, str]:
    """The ``Authorization`` header of basic auth (UTF-8, as httpx encodes it), or none."""
    if auth is None:
        return {}
    return {"Authorization": aiohttp.BasicAuth(*auth, encoding="utf-8").encode()}


class AiohttpSender:
    """An aiohttp session, opened in the event loop of the first request and bound to it (its
    pooled connections belong to that loop)."""

    def __init__(
        self, url: str, headers: Mapping[str, str], max_connections: int, auth: Mapping[str, str]
    ) -> None:
        self._base = url.rstrip("/")
        self._headers = {**headers, **auth}
        self._max = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _open(self) -> aiohttp.ClientSession:
        self._loop = same_loop(self._loop)
        if self._session is None:
            if self._closed:
                raise RuntimeError("this client is closed")
            connector = aiohttp.TCPConnector(limit=self._max, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                middlewares=(_no_second_send,),
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # the data port sets none; keep none
                auto_decompress=True,
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        params: Params,
        headers: Mapping[str, str],
        content: bytes | None,
        timeout: float | None,
    ) -> Reply:
        session = self._open()
        target = self._base + path + ("?" + urlencode(params) if params else "")
        limits = aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout)
        # aiohttp has no write timeout: a big body to a peer that stops reading would wait
        # for ever, so a big one's whole exchange is bounded by the timeout instead
        big = timeout is not None and content is not None and len(content) > WRITE_BOUND
        try:
            async with (
                asyncio.timeout(timeout if big else None),
                session.request(
                    method,
                    URL(target, encoded=True),  # the path's segments are quoted already (_core)
                    headers=headers,
                    data=_payload(content),
                    timeout=limits,
                    allow_redirects=False,
                ) as r,
            ):
                body = await r.read()
                return Reply(r.status, r.headers, body)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise unsent_or_not(e) from e

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()


class ReplyLost(aiohttp.ClientConnectionError):
    """The connection failed after the request was written (or while it was): the request may
    have been applied."""


async def _no_second_send(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    """aiohttp sends a PUT or DELETE a second time, unasked, when a kept-alive connection
    fails under it (aio-libs/aiohttp#10790, no option to turn it off): here a publish is a PUT
    and a second one is a second job. The failure is raised as ``ReplyLost`` instead, which it
    does not repeat, and the client's retry rule decides."""
    try:
        return await handler(request)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        if isinstance(e, aiohttp.ClientConnectorError):
            raise
        raise ReplyLost(f"{type(e).__name__}: {e}") from e


def _payload(content: bytes | None) -> bytes | io.BytesIO | None:
    """A body over 1 MiB as a stream, written in chunks (aiohttp's advice: one write of it
    would hold the event loop)."""
    if content is None or len(content) <= aiohttp.payload.TOO_LARGE_BYTES_BODY:
        return content
    return io.BytesIO(content)


def unsent_or_not(exc: BaseException) -> TransportError:
    """An aiohttp failure: ``sent`` is False only when no connection was had (none could be
    made, or none came free from the pool in time)."""
    unsent = isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)
    return TransportError(f"{type(exc).__name__}: {exc}", sent=not unsent)


def transport_error(exc: Exception) -> TransportError:
    """An httpx failure, the same way: nothing left this process only when the connection
    could not be made."""
    unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    return TransportError(f"{type(exc).__name__}: {exc}", sent=not unsent)


def _httpx_args(
    params: Params, headers: Mapping[str, str], content: bytes | None, timeout: float | None
) -> dict[str, Any]:
    return {"params": tuple(params), "headers": headers, "content": content, "timeout": timeout}


def _limits(max_connections: int) -> httpx.Limits:
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)


class HttpxAsyncSender:
    """An httpx ``AsyncClient``, bound to the event loop of its first request."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        max_connections: int,
        auth: Mapping[str, str],
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=url,
            headers={**headers, **auth},
            limits=_limits(max_connections),
            transport=transport,
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    async def request(
        self,
        method: str,
        path: str,
        params: Params,
        headers: Mapping[str, str],
        content: bytes | None,
        timeout: float | None,
    ) -> Reply:
        self._loop = same_loop(self._loop)
        try:
            r = await self._http.request(
                method, path, **_httpx_args(params, headers, content, timeout)
            )
        except httpx.TransportError as e:
            raise transport_error(e) from e
        return Reply(r.status_code, r.headers, r.content)

    async def aclose(self) -> None:
        await self._http.aclose()


class HttpxSender:
    """An httpx ``Client``: the blocking client's sender."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        max_connections: int,
        auth: Mapping[str, str],
        transport: httpx.BaseTransport | None,
    ) -> None:
        self._http = httpx.Client(
            base_url=url,
            headers={**headers, **auth},
            limits=_limits(max_connections),
            transport=transport,
        )

    def request(
        self,
        method: str,
        path: str,
        params: Params,
        headers: Mapping[str, str],
        content: bytes | None,
        timeout: float | None,
    ) -> Reply:
        try:
            r = self._http.request(method, path, **_httpx_args(params, headers, content, timeout))
        except httpx.TransportError as e:
            raise transport_error(e) from e
        return Reply(r.status_code, r.headers, r.content)

    def close(self) -> None:
        self._http.close()


AsyncSender = AiohttpSender | HttpxAsyncSender
Sender = HttpxSender


def async_sender(
    url: str,
    headers: Mapping[str, str],
    max_connections: int,
    transport: httpx.AsyncBaseTransport | None,
    auth: tuple[str, str] | None = None,
) -> AsyncSender:
    """aiohttp, unless an httpx transport is given."""
    if transport is None:
        return AiohttpSender(url, headers, max_connections, basic_auth(auth))
    return HttpxAsyncSender(url, headers, max_connections, basic_auth(auth), transport)


def sync_sender(
    url: str,
    headers: Mapping[str, str],
    max_connections: int,
    transport: httpx.BaseTransport | None,
    auth: tuple[str, str] | None = None,
) -> Sender:
    return HttpxSender(url, headers, max_connections, basic_auth(auth), transport)
