"""A loopback HTTP/1.1 proxy that injects ``LoseReplies``' faults on a real connection, for a
client with no transport of its own to fault (``AsyncClient`` on aiohttp): each request is
passed on to the service; the reply of those ``faults`` chooses is dropped after the service
answered it (the client's connection closed, as a reset would), or held ``stall`` seconds. It
listens on ``port`` (0: one the system picks).
It runs in the test's event loop, so it serves asyncio clients only."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from tests.support.clients import LoseReplies


class FaultProxy:
    def __init__(
        self, upstream: str, faults: LoseReplies, stall: float = 0.0, port: int = 0
    ) -> None:
        url = httpx.URL(upstream)
        self.host, self.port = url.host, url.port or 80
        self.faults, self.stall, self.listen = faults, stall, port
        self.server: asyncio.Server | None = None
        self.base = ""

    async def start(self) -> FaultProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.listen)
        port = self.server.sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head, body = await _message(reader, request=True)
                if not head:
                    return
                if up is None:
                    up = await asyncio.open_connection(self.host, self.port)
                method, target = head.split(b" ", 2)[:2]
                request = httpx.Request(method.decode(), f"http://dq{target.decode()}")
                lose = self.faults._drop(request)  # counts and records it, as the transport does
                up[1].write(head + body)
                await up[1].drain()
                rhead, rbody = await _message(up[0], request=False, method=method)
                if lose and self.stall:
                    await asyncio.sleep(self.stall)
                elif lose:
                    return  # the reply is lost: the connection closes unanswered
                writer.write(rhead + rbody)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            for w in (writer, up[1] if up else None):
                if w is not None:
                    w.close()


async def _message(
    reader: asyncio.StreamReader, *, request: bool, method: bytes = b""
) -> tuple[bytes, bytes]:
    """One HTTP/1.1 message's head and body, as read (b"" at the end of the stream)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return b"", b""
        raise
    fields = _fields(head)
    status = b"" if request else head.split(b" ", 2)[1]
    if not request and (method == b"HEAD" or status in (b"204", b"304")):
        return head, b""
    if fields.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            chunks.append(size_line + chunk)
            if size == 0:
                return head, b"".join(chunks)
    length = int(fields.get("content-length", "0"))
    return head, await reader.readexactly(length)


def _fields(head: bytes) -> dict[str, Any]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
