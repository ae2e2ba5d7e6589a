"""The HTTP/1.1 protocol the workers serve with: uvicorn's httptools protocol with a bound on
the request line and on the headers. httptools has none, so a 40 MB query string was
buffered whole (and parsed) before any handler, or the token check, could refuse it."""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_URL_BYTES = 16 * 1024  # path and query string; the API's longest real URL is far shorter
MAX_HEADER_BYTES = 64 * 1024  # names and values of one request, together
MAX_HEADERS = 128
# What a request head that passes those checks can take on the wire: the request line, the
# headers with their ": " and CRLFs, the blank line. Counted as it arrives (below).
MAX_HEAD_BYTES = MAX_URL_BYTES + MAX_HEADER_BYTES + 4 * MAX_HEADERS + 1024
TOO_LARGE = f"request headers too large (max {MAX_HEADERS} headers, {MAX_HEADER_BYTES} bytes)"

_REASONS = {414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


class _Refused(Exception):
    pass


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """httptools hands a header to ``on_header`` only once its name and value are complete,
    buffering them across reads: the checks there come after a 32 MiB field was read whole.
    So the bytes fed to the parser while a request head is incomplete are counted too, and a
    head past ``MAX_HEAD_BYTES`` is refused (431) before the parser sees more of it."""

    _refusal: tuple[int, str] | None = None
    _header_bytes = 0
    _in_head = True  # the parser is between requests or inside a request head
    _head_bytes = 0  # bytes fed while in a head (an undercount by at most one read, never more)
    _message_ended = False

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            super().data_received(data)
            return
        room = MAX_HEAD_BYTES - self._head_bytes
        if len(data) > room:  # feed only what a head may take; what follows, once it ended
            self._message_ended = False
            super().data_received(data[:room])
            if self._in_head and not self._message_ended:
                if not self.transport.is_closing():
                    self._refusal = (431, TOO_LARGE)
                    self.send_400_response(TOO_LARGE)
                return
            self.data_received(data[room:])
            return
        self._message_ended = False
        super().data_received(data)
        if self._in_head and not self._message_ended:
            self._head_bytes += len(data)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes, self._message_ended = True, 0, True
        super().on_message_complete()

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
            self._refuse(431, TOO_LARGE)
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
