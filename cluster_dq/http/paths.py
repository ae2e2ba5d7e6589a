"""Refuses a path that hides a separator in a segment, on both ports, before any routing.

The router and the hot paths (``http/hot.py``) route on the decoded path, so an encoded ``/``
moved a name into another route: ``PUT /api/demo/victim%2Fjob%2F<id>`` was a republish that
acked ``<id>`` without its lease, ``DELETE /api/demo/wk%2Fdeadletter`` deleted a dead job. No
name the service accepts holds a ``/``, a ``\\`` or a ``.`` (``cluster_dq/names.py``), so a path
whose raw form encodes one of them (``%2F``, ``%5C``, ``%2E``, either case) is refused whole
with a 400; a path's other encodings still reach the route, whose checks name the parameter.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from cluster_dq.http.responses import error

_HIDDEN = re.compile(rb"%(?:2f|5c|2e)", re.IGNORECASE)
MESSAGE = "invalid path: an encoded '/', '\\' or '.' (%2F, %5C, %2E) in a path segment"


class EncodedSeparators:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw: bytes = scope.get("raw_path") or b""
            if b"%" in raw and _HIDDEN.search(raw):
                await error(MESSAGE, 400)(scope, receive, send)
                return
        await self.app(scope, receive, send)
