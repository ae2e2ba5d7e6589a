"""The HTTP/1.1 protocol the workers serve with: uvicorn's httptools protocol with the rules
every connection meets before any app sees a request (``Edge``):

- a bound on the request line and on the headers. httptools has none, so a 40 MB query
  string was buffered whole (and parsed) before any handler, or the token check, could
  refuse it;
- the ``Host`` allowlist (``AllowedHosts``, ``http/hosts.py``), checked once the head is
  complete: the hot paths, the router and the dashboard alike never see a foreign ``Host``.
  A request line in absolute form (``GET http://name/path``) names its host itself: RFC 9112
  has the server ignore ``Host`` then, so the check applies to that authority, which the app
  sees as the request's ``Host``;
- no transfer coding but ``chunked``: httptools passes ``gzip, chunked`` and hands over the
  body still compressed (501: not implemented);
- a timeout for receiving a request head (``HeaderTimeoutSecond``, from the connection or
  from the first byte of a request), one between two reads of a body
  (``BodyTimeoutSecond``), and the same in all for the rest of a body once its request was
  answered (401, 413: only dropped); keep-alive is uvicorn's (``KeepAliveTimeoutSecond``). A request
  whose head is complete has no timeout here: a long-poll waits as long as it asked;
- a bound on the open connections of each port in a worker (``MaxConnections``): one more
  is answered 503 and closed at once;
- every refusal here, and a request the parser cannot read, answered as the app answers a
  bad request: a status and a JSON ``error``. A request whose body the parser refuses (a
  chunk size that is not hex) already has its app task: it is cancelled if it has not run
  yet, else its body read ends in a disconnect; it is never answered by the app."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import json
import logging
from collections.abc import Callable
from typing import NoReturn

import httptools  # type: ignore[import-untyped]
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from cluster_dq.http.hosts import AllowedHosts, effective
from cluster_dq.http.middleware import request_id
from cluster_dq.settings import Settings

log = logging.getLogger("cluster_dq.http")

MAX_URL_BYTES = 16 * 1024  # path and query string; the API's longest real URL is far shorter
MAX_HEADER_BYTES = 64 * 1024  # names and values of one request, together
MAX_HEADERS = 128
# What a request head that passes those checks can take on the wire: the request line, the
# headers with their ": " and CRLFs, the blank line. Counted as it arrives (below).
MAX_HEAD_BYTES = MAX_URL_BYTES + MAX_HEADER_BYTES + 4 * MAX_HEADERS + 1024
TOO_LARGE = f"request headers too large (max {MAX_HEADERS} headers, {MAX_HEADER_BYTES} bytes)"
# The answer to a request the parser refuses (a garbled request line, a bad Content-Length, a
# header name with a space): like every other bad request, a 400 with a JSON error.
UNPARSED = "the request could not be parsed as HTTP/1.1: nothing was done"
UNKNOWN_CODING = "Transfer-Encoding: only chunked is supported: nothing was done"
MAX_LOGGED_HOSTS = 64  # refused Host values logged per worker (once each), then silence

_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    501: b"Not Implemented",
    503: b"Service Unavailable",
}


@dataclasses.dataclass(frozen=True)
class Edge:
    """The connection rules of one worker, from its settings."""

    hosts: AllowedHosts
    header_timeout: float
    body_timeout: float
    max_connections: int

    @classmethod
    def of(cls, settings: Settings) -> Edge:
        return cls(
            AllowedHosts(effective(settings)),
            settings.HeaderTimeoutSecond,
            settings.BodyTimeoutSecond,
            settings.MaxConnections,
        )


def protocol(edge: Edge) -> type[BoundedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``edge``."""
    return type("EdgeHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"edge": edge})


def _response(status: int, message: str) -> bytes:
    """A refusal as the app answers one: a JSON error, and a request id of its own (every
    answer carries one, this request's never reached the middleware that gives them)."""
    body = json.dumps({"error": message}).encode()
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"x-request-id: %s\r\nconnection: close\r\n\r\n"
    )
    return head % (status, _REASONS[status], len(body), request_id().encode()) + body


class _Refused(Exception):
    pass


class _OwnRefusals(logging.Filter):
    """uvicorn logs "Invalid HTTP request received." for each parser error, and a refusal
    here is one (``_Refused`` stops the parser): a line for every foreign Host or oversized
    head, whatever ``_log_refused`` limits. Such a request is answered with its reason; the
    line is dropped for it (uvicorn's line for a request it could not parse stays)."""

    pending = False  # a refusal raised and not yet answered (one event loop: no race)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.pending and record.msg == "Invalid HTTP request received.":
            self.pending = False
            return False
        return True


_own_refusals = _OwnRefusals()
logging.getLogger("uvicorn.error").addFilter(_own_refusals)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """One connection. httptools hands a header to ``on_header`` only once its name and value
    are complete, buffering them across reads: the checks there came after a 32 MiB field was
    read whole. So the bytes fed to the parser while a request head is incomplete are counted
    too, and a head past ``MAX_HEAD_BYTES`` is refused (431) before the parser sees more. The
    trailer fields of a chunked body are buffered the same way: reads in a body that bring no
    body byte are counted, and past ``MAX_HEAD_BYTES`` the connection is closed."""

    edge: Edge | None = None  # set by ``protocol(edge)``; None: no host, time or count rules
    _refusal: tuple[int, str] | None = None
    _header_bytes = 0
    _in_head = True  # the parser is between requests or inside a request head
    _head_bytes = 0  # bytes fed while in a head (an undercount by at most one read, never more)
    _message_ended = False
    _head_begun = False  # the parser has the start of a request head (from on_message_begin)
    _body_seen = False  # the last read brought body bytes
    _framing = 0  # bytes read in a body since its last body byte (chunk framing, trailers)
    _timer: asyncio.TimerHandle | None = None  # the head or body timeout, when one runs
    _draining = False  # answered before its body ended: the rest is read to be dropped
    _deferred: bytes | None = None  # a refusal waiting for the answers before it (pipelined)
    _parsing: RequestResponseCycle | None = None  # the cycle whose body the parser is reading
    _active: RequestResponseCycle | None = None  # the cycle whose app task was started last
    _task: asyncio.Task[None] | None = None  # that task

    # -- connections --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.edge is None:
            return
        if len(self.connections) > self.edge.max_connections:
            transport.write(_response(503, "too many connections (MaxConnections); try again"))
            transport.close()
            return
        self._arm(self.edge.header_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self.edge is None:
            return
        if self.flow.read_paused or (self.cycle is not None and not self.cycle.response_complete):
            self._arm(self.edge.header_timeout, self._head_timed_out)  # a response is running
            return
        if self._head_bytes or self._head_begun:  # a request had begun: told why it ends
            self.transport.write(_response(408, "request head not received in time"))
        self.transport.close()

    def _body_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self.edge is None:
            return
        if self.flow.read_paused:  # the app is not reading the body: not the client's delay
            self._arm(self.edge.body_timeout, self._body_timed_out)
            return
        self.transport.close()  # the request's app sees a disconnect

    # -- bytes --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._deferred is not None:
            return  # the parser stopped at a refused request: nothing after it is read
        if not self._in_head:
            self._body_seen = False
            super().data_received(data)
            if self._in_head or self.transport.is_closing():
                return
            # still in the body: reads that bring no body byte are framing, or the trailer
            # fields of a chunked body, which httptools buffers like headers: bounded alike
            self._framing = 0 if self._body_seen else self._framing + len(data)
            if self._framing > MAX_HEAD_BYTES:
                self.transport.close()  # the response may have begun: no answer, a cut
                return
            if self.edge is not None and not self._draining and self._deferred is None:
                self._arm(self.edge.body_timeout, self._body_timed_out)  # more body to come
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
        if self._in_head:
            if not self._message_ended:
                self._head_bytes += len(data)
            # a head begun and not complete: its time runs from now (a head that comes
            # whole in one read, the usual case, never sets a timer)
            begun = self._head_bytes or self._head_begun  # begun in the read that ended one
            if begun and self._timer is None and self.edge is not None:
                if not self.transport.is_closing():
                    self._arm(self.edge.header_timeout, self._head_timed_out)
        elif self.edge is not None and not self.transport.is_closing() and self._deferred is None:
            self._arm(self.edge.body_timeout, self._body_timed_out)  # a body is to come

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._refusal, self._header_bytes, self._draining = None, 0, False
        self._head_begun, self._parsing = True, None

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > MAX_URL_BYTES:
            self._refuse(414, f"request line too long (max {MAX_URL_BYTES} bytes)")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES or len(self.headers) >= MAX_HEADERS:
            self._refuse(431, TOO_LARGE)
        super().on_header(name, value)  # (it keeps the name lower-cased)
        if self.headers[-1][0] == b"transfer-encoding" and value.strip().lower() != b"chunked":
            # httptools refuses a last coding other than chunked but takes any before it
            # (``gzip, chunked``): the body would reach the app still coded
            self._refuse(501, UNKNOWN_CODING)

    def on_body(self, body: bytes) -> None:
        self._body_seen = True
        super().on_body(body)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes, self._framing = False, 0, 0
        self._head_begun = False
        if self.edge is not None:
            self._disarm()
            self._check_host()
        earlier = self.cycle
        super().on_headers_complete()
        if self.cycle is not earlier:  # a request for the app (not an upgrade)
            self._parsing = self.cycle

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes, self._message_ended = True, 0, True
        self._draining, self._parsing = False, None
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self._deferred is not None and not self._answering():
            self.transport.write(self._deferred)  # the refusal, after the answers before it
            self.transport.close()
            return
        # Answered before its body ended (401, 413): what is left of the body is dropped as
        # it comes, within one BodyTimeoutSecond in all (reads do not restart it); one byte a
        # little under the timeout each time held the connection forever, token or not.
        if self.edge is None or self._in_head:
            return
        if self.cycle is not None and self.cycle.response_complete and not self._draining:
            self._draining = True
            self._arm(self.edge.body_timeout, self._body_timed_out)

    def _check_host(self) -> None:
        assert self.edge is not None
        host: bytes | None = None
        at = -1
        for i, (name, value) in enumerate(self.headers):
            if name == b"host":
                if host is not None:
                    self._refuse(400, "more than one Host header")
                host, at = value, i
        if self.url[:1] != b"/" and self.url != b"*":
            # absolute form: the URI's authority is the request's host (RFC 9112 3.2.2), and
            # what the app (the dashboard's CSRF check) sees as its Host
            if host is None and self.parser.get_http_version() != "1.0":
                self._refuse(400, "missing Host header")
            host = self._authority()
            if at < 0:
                self.headers.append((b"host", host))
            else:
                self.headers[at] = (b"host", host)
        if self.edge.hosts.permits(host):
            return
        if host is None and self.parser.get_http_version() == "1.0":
            return  # HTTP/1.0 has no Host; a browser (DNS rebinding) always sends one
        if host is None:
            self._refuse(400, "missing Host header")
        _log_refused(host)
        self._refuse(400, "Host not allowed (AllowedHosts): nothing was done")

    def _authority(self) -> bytes:
        """The host and port of an absolute-form request line, as a ``Host`` names them."""
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            self._refuse(400, UNPARSED)
        if url.host is None or url.userinfo is not None:
            self._refuse(400, UNPARSED)
        host = b"[%s]" % url.host if b":" in url.host else url.host
        return host if url.port is None else b"%s:%d" % (host, url.port)

    def _refuse(self, status: int, message: str) -> NoReturn:
        self._refusal = (status, message)
        _own_refusals.pending = True
        raise _Refused(message)  # httptools stops parsing; uvicorn answers and closes

    def send_400_response(self, msg: str) -> None:
        _own_refusals.pending = False
        if self._parsing is not None:  # the parser refused this request's body
            if not self._abandon(self._parsing):
                return
        if self._answering():  # pipelined after a request still answering: wait for it
            self._deferred = _response(*(self._refusal or (400, UNPARSED)))
            self.flow.pause_reading()
            self._disarm()
            return
        self.transport.write(_response(*(self._refusal or (400, UNPARSED))))
        self.transport.close()

    def _abandon(self, cycle: RequestResponseCycle) -> bool:
        """Takes from its app a request whose body cannot be read: a pipelined one is never
        started, one not run yet is cancelled, a running one reads a disconnect and its answer
        is dropped. False: it had begun answering, so the connection is cut without a word."""
        self._parsing = None
        if cycle.response_started:
            self.transport.close()  # its app sees a disconnect
            return False
        queued = [entry for entry in self.pipeline if entry[0] is not cycle]
        if len(queued) < len(self.pipeline):
            self.pipeline.clear()
            self.pipeline.extend(queued)
            return True
        if self._task is not None and cycle is self._active:
            coro = self._task.get_coro()
            if inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == "CORO_CREATED":
                self._task.cancel()  # its app never runs: nothing was done
        cycle.disconnected = True
        cycle.message_event.set()
        return True

    def _answering(self) -> bool:
        """An earlier request of this connection is still being answered (or waits its turn):
        a refusal written now would come before its answer, which would be lost."""
        if self.transport.is_closing():
            return False
        active = self._active
        if self.pipeline:
            return True
        return active is not None and not active.response_complete and not active.disconnected

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        # uvicorn's, keeping the task (``_abandon`` cancels one that has not run)
        context = contextvars.Context() if self.config.reset_contextvars else None
        task = self.loop.create_task(cycle.run_asgi(app), context=context)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._active, self._task = cycle, task


_logged_hosts: set[bytes] = set()


def _log_refused(host: bytes | None) -> None:
    """The first refusals of each Host value, for an operator whose AllowedHosts lacks a name
    (behind a load balancer): each value once, at most ``MAX_LOGGED_HOSTS`` per worker."""
    if host is None or host in _logged_hosts or len(_logged_hosts) >= MAX_LOGGED_HOSTS:
        return
    _logged_hosts.add(host)
    log.warning(
        "request refused: Host not in AllowedHosts (logged once per value)",
        extra={"host": host[:200].decode("latin-1")},
    )
