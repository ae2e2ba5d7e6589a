"""ASGI middleware: an ``X-Request-ID`` (ULID) on every response, the HTTP metrics (by route
template, never the raw path; what no route serves is route "unmatched", method "other"), the
request context of every log line, and the access log."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster_dq.clock import now_ms
from cluster_dq.engine import retry
from cluster_dq.logs import current_scope
from cluster_dq.metrics import UNMATCHED, Metrics, http_labels
from cluster_dq.models import encode_id
from cluster_dq.tokens import mask

access = logging.getLogger("cluster_dq.access")
_REQUEST_ID_RE = re.compile(rb"[-_.:/+=A-Za-z0-9]{1,64}")
# The admin API's paths that name a token: /token/{ns}/{token}[/limit], and the odd ways a
# client may spell them (//token/... from a base URL with a trailing slash, any case)
_TOKEN_PATH_RE = re.compile(r"^/+token(?=/)", re.IGNORECASE)


def loggable_path(path: str) -> str:
    """A request's path as a log line shows it: a token in it masked (``tokens.mask``), in a
    path that matches no route as well (every segment after the namespace but ``limit``: an
    encoded ``/`` may have shifted it). The query string (where the data port may carry
    ``?token=``) is never logged."""
    head = _TOKEN_PATH_RE.match(path)
    if head is None:
        return path
    parts = path[head.end() :].split("/")
    ns_seen = False
    for i, part in enumerate(parts):
        if not part:
            continue
        if not ns_seen:
            ns_seen = True
        elif part != "limit":
            parts[i] = mask(part)
    return head.group(0) + "/".join(parts)


_UNMATCHED = (UNMATCHED, frozenset[str]())


def request_id() -> str:
    return encode_id(now_ms().to_bytes(6, "big") + os.urandom(10))


class SharedFlag(Protocol):
    value: int  # a multiprocessing.Value("b") made by the supervisor


class AccessLog:
    """Whether to write one log line per request; switchable at run time (admin API). With a
    shared value (the supervisor's), a switch reaches every worker process."""

    def __init__(self, enabled: bool, shared: SharedFlag | None = None) -> None:
        self._shared = shared
        self._local = enabled
        if shared is not None:
            shared.value = int(enabled)

    @property
    def enabled(self) -> bool:
        return bool(self._shared.value) if self._shared is not None else self._local

    @enabled.setter
    def enabled(self, on: bool) -> None:
        if self._shared is not None:
            self._shared.value = int(on)
        self._local = on


class RequestIdMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        access_log: AccessLog,
        metrics: Metrics,
        port: str = "data",
        templates: Mapping[Any, tuple[str, frozenset[str]]] | None = None,
        *,
        budget_s: float,
    ) -> None:
        self.app = app
        self.budget_s = budget_s  # RetryBudgetSecond
        self.access_log = access_log
        self.metrics = metrics
        self.port = port
        self.templates = templates or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
        # A client's id is kept when it is a sane token (it is echoed and logged); anything
        # else (non-ASCII, control bytes, too long) is replaced by a fresh one.
        rid = raw.decode() if _REQUEST_ID_RE.fullmatch(raw) else request_id()
        scope.setdefault("state", {})["request_id"] = rid
        current_scope.set(scope)
        status = 0
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        try:
            # One retry budget for the whole request, whatever its number of Redis steps
            # (a long-poll consume sets its own: its timeout).
            with retry.request_deadline(time.monotonic() + self.budget_s):
                await self.app(scope, receive, send_with_id)
        except Exception:
            status = status or 500
            raise
        finally:
            took = time.perf_counter() - started
            status = status or 499  # the client went away before an answer
            method = scope["method"]
            route, served = self.templates.get(scope.get("endpoint"), _UNMATCHED)
            self.metrics.http(self.port, *http_labels(route, served, method), status, took)
            if self.access_log.enabled:
                access.info(
                    "request",
                    extra={
                        "method": method,
                        "path": loggable_path(scope["path"]),
                        "route": route,
                        "status": status,
                        "duration_ms": round(took * 1000, 3),
                        "client": (scope.get("client") or ("", 0))[0],
                    },
                )
