"""Structured logging: one JSON object per line (or plain text), with any ``extra`` fields."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any

# The ASGI scope of the request being served (set by the HTTP middleware), for log records.
current_scope: contextvars.ContextVar[MutableMapping[str, Any] | None] = contextvars.ContextVar(
    "current_scope", default=None
)

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_STANDARD.add("color_message")  # uvicorn's copy of a message with terminal colour escapes


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class RequestContext(logging.Filter):
    """Adds the request id, namespace and queue of the request being served to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        scope = current_scope.get()
        if scope is not None:
            record.request_id = scope.get("state", {}).get("request_id")
            path_params = scope.get("path_params") or {}
            if "ns" in path_params:
                record.namespace = path_params["ns"]
            q = path_params.get("q") or path_params.get("queues")
            if q:
                record.queue = q
        return True


def setup(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RequestContext())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own lines: its access log is ours (cluster_dq.access); its info lines are the
    # start and stop of each server, and a worker runs two (data and admin port), so each was
    # written twice. The worker logs its own start and stop; uvicorn's warnings and errors stay.
    for noisy in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The dashboard's audit trail is written whatever the level: it is a record, not noise.
    logging.getLogger("cluster_dq.audit").setLevel(logging.INFO)
