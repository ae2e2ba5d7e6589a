"""The HTTP/1.1 protocol the workers serve with: uvicorn's httptools protocol with a bound on
the request line and on the headers. httptools has none, so a 40 MB query string was
buffered whole (and parsed) before any handler, or the token check, could refuse it."""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_URL_BYTES = 16 * 1024  # path and query string; the API's longest real URL is far shorter
MAX_HEADER_BYTES = 64 * 1024  # names and values of one request, together
MAX_HEADERS = 128

_REASONS = {414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


class _Refused(Exception):
    pass


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    _refusal: tuple[int, str] | None = None
    _header_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._refusal, self._header_bytes = None, 0

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > MAX_URL_BYTES:
            self._refuse(414, f"request line too long (max {MAX_URL_BYTES} bytes)")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES or len(self.headers) >= MAX_HEADERS:
            self._refuse(
                431,
                f"request headers too large (max {MAX_HEADERS} headers, {MAX_HEADER_BYTES} bytes)",
            )
        super().on_header(name, value)

    def _refuse(self, status: int, message: str) -> None:
        self._refusal = (status, message)
        raise _Refused(message)  # httptools stops parsing; uvicorn answers and closes

    def send_400_response(self, msg: str) -> None:
        if self._refusal is None:
            super().send_400_response(msg)
            return
        status, message = self._refusal
        body = json.dumps({"error": message}).encode()
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        self.transport.write(head % (status, _REASONS[status], len(body)) + body)
        self.transport.close()
