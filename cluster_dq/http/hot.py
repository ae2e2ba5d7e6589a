"""The hot paths of the data port, dispatched without Starlette's router.

Nearly every request a queue sees is one of three: publish one job (``PUT /api/{ns}/{q}``),
consume (``GET /api/{ns}/{queues}``) and ack (``DELETE /api/{ns}/{q}/job/{job_id}``).
``HotPaths`` sits innermost among the data app's middleware: it recognises those three by
splitting the path and calls their handlers itself, with the same error table as the rest of
the app (``http/errors.py``), skipping the exception middleware, the router's pattern matching
over every route and the route's own wrappers. Everything else (and a hot path's HEAD, or a
path Starlette would not match, such as an empty segment) goes on to the router unchanged.
What the client sees is the same either way; ``tests/http/test_http.py`` runs through both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class HotPaths:
    def __init__(
        self,
        app: ASGIApp,
        publish: Endpoint,
        consume: Endpoint,
        ack: Endpoint,
        handlers: Mapping[Any, ErrorHandler],
    ) -> None:
        self.app = app
        self.publish, self.consume, self.ack = publish, consume, ack
        self.handlers = {k: v for k, v in handlers.items() if isinstance(k, type)}

    def _match(self, scope: Scope) -> tuple[Endpoint, dict[str, str]] | None:
        path: str = scope["path"]
        if scope["type"] != "http" or not path.startswith("/api/") or scope.get("root_path"):
            return None
        parts = path[5:].split("/")
        if not all(parts):
            return None
        method = scope["method"]
        if len(parts) == 2:
            if method == "PUT":
                return self.publish, {"ns": parts[0], "q": parts[1]}
            if method == "GET" and parts[1] != "_workers":  # (that one lists the workers)
                return self.consume, {"ns": parts[0], "queues": parts[1]}
        elif len(parts) == 4 and parts[2] == "job" and method == "DELETE":
            return self.ack, {"ns": parts[0], "q": parts[1], "job_id": parts[3]}
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._match(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        endpoint, path_params = found
        scope["path_params"] = path_params
        scope["endpoint"] = endpoint  # the metrics' route label, as the router would set it
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise  # a bug: the server error middleware answers 500, as for any route
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> ErrorHandler | None:
        for cls in type(exc).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None
