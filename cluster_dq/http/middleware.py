"""ASGI middleware: an ``X-Request-ID`` (ULID) on every response, and the access log."""

from __future__ import annotations

import logging
import os
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster_dq.clock import now_ms
from cluster_dq.models import encode_id

access = logging.getLogger("cluster_dq.access")


def request_id() -> str:
    return encode_id(now_ms().to_bytes(6, "big") + os.urandom(10))


class AccessLog:
    """Whether to write one log line per request; switchable at run time (admin API)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp, access_log: AccessLog) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v.decode() for k, v in scope["headers"] if k == b"x-request-id"), None)
        rid = rid if rid and len(rid) <= 64 else request_id()
        scope.setdefault("state", {})["request_id"] = rid
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
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log.enabled:
                access.info("request", extra={
                    "request_id": rid, "method": scope["method"], "path": scope["path"],
                    "status": status, "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    "client": (scope.get("client") or ("", 0))[0],
                })  # fmt: skip
