"""OpenAPI 3.1 building blocks: the schemas, responses and parameters the two ports' documents
share, the ``Op`` each route is declared with, and the document and its ``/openapi.json`` route.

Each data-port route is declared beside its handler, in the module of its concept (``http/jobs.py``,
``delivery.py``, ``deadletter.py``, ``control.py``, ``schedules.py``, ``queues.py``: each one's
``*_operations``); ``http/openapi_data.py`` puts them into the data port's document, and
``http/openapi_admin.py`` declares the admin port's. A new route is one more ``Op`` in its
module's list; ``tests/http/test_openapi.py`` fails while a route of an app is missing from its
document, and runs schemathesis against both. Bounds come from the parsers' constants
(``http/params.py``, ``models.py``, ``tokens.py``), defaults from the running settings: one
place for each."""

from __future__ import annotations

import json as jsonlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import cluster_dq
from cluster_dq.http.params import LEASE_RE, U32
from cluster_dq.http.protocol import MAX_URL_BYTES
from cluster_dq.models import (
    CLIENT_ID_MAX_LEN,
    DEATH_REASONS,
    MAX_NAME_LEN,
    MAX_NOTE_TEXT,
    NAME_RE,
    UNKNOWN_REASON,
    JobState,
)
from cluster_dq.tokens import MAX_INTERVAL, MAX_LIMIT

Schema = dict[str, Any]
JSON = "application/json"
OPENAPI_PATH = "/openapi.json"

# -- schemas ------------------------------------------------------------------------------

# JSON Schema patterns are ECMA regexes: ^ and $ for Python's \A and \Z.
NAME = {
    "type": "string",
    "pattern": NAME_RE.pattern.replace("\\A", "^").replace("\\Z", "$"),
    "maxLength": MAX_NAME_LEN,
}
QUEUE_NAME = {**NAME, "pattern": "^[-A-Za-z0-9][-_A-Za-z0-9]*$"}  # not starting with _
# A server id (26 Crockford base32 characters) or a client's own: both fit this.
JOB_ID = {**NAME, "maxLength": CLIENT_ID_MAX_LEN}
LEASE_ID = {"type": "string", "pattern": f"^{LEASE_RE.pattern}$"}
STATE = {"type": "string", "enum": [str(s) for s in JobState]}
REASON = {"type": "string", "enum": [*DEATH_REASONS.values(), UNKNOWN_REASON]}


def obj(required: Iterable[str] = (), **props: Schema) -> Schema:
    return {"type": "object", "properties": props, "required": list(required)}


INT = {"type": "integer", "minimum": 0}
SCHEMAS: dict[str, Schema] = {
    "Error": obj(["error"], error={"type": "string"}),
    "Message": obj(["msg"], msg={"type": "string"}),
    "Conflict": obj(
        ["error", "job_id", "state", "conflicts"],
        error={"type": "string"},
        job_id={"type": "string"},
        state={"type": ["string", "null"]},
        conflicts={
            "type": "array",
            "items": obj(["job_id", "state"], job_id={"type": "string"}, state={}),
        },
    ),
    "Job": obj(
        ["namespace", "queue", "job_id", "data", "ttl", "elapsed_ms", "remain_tries"],
        msg={"type": "string", "const": "new job"},
        namespace={"type": "string"},
        queue={"type": "string"},
        job_id={"type": "string"},
        data={"type": "string", "contentEncoding": "base64", "description": "the body"},
        ttl={**INT, "description": "seconds left before the job expires; 0: never"},
        elapsed_ms=INT,
        remain_tries=INT,
        attributes={"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        state=STATE,
        deliveries=INT,
        lease=LEASE_ID,
        progress={"description": "the last progress a consumer recorded (any JSON value)"},
        next_attempt_at={
            **INT,
            "description": "a delayed job that was delivered before: when it is due again "
            "(a retry backoff or a release delay), Unix ms",
        },
        reason={**REASON, "description": "a dead job: why it died"},
        died_at={**INT, "description": "a dead job: when it died, Unix ms"},
        last_error={
            "type": ["string", "null"],
            "description": "the last error text a release or a bury gave it",
        },
        dedup_key={
            "type": "string",
            "description": "a lookup by id: the dedup key it was published under (a simple or "
            "debounce key; a dead job's is taken over by the next publish under it)",
        },
        group={
            "type": "string",
            "description": "the group it was published in (absent: none); consumers are served "
            "the queue's groups in turn",
        },
    ),
    "WrongState": obj(
        ["error", "job_id", "state"],
        error={"type": "string"},
        job_id={"type": "string"},
        state={"anyOf": [STATE, {"type": "null"}], "description": "where the job is"},
    ),
    "DeadLetter": obj(
        ["job_id", "reason", "died_at", "deliveries", "last_error", "size", "published_at"],
        job_id={"type": "string"},
        reason=REASON,
        died_at={**INT, "description": "Unix ms"},
        deliveries=INT,
        last_error={"type": ["string", "null"]},
        size={**INT, "description": "the body's size in bytes"},
        published_at={**INT, "description": "Unix ms"},
        attributes={"type": "object", "additionalProperties": {"type": "string"}},
    ),
    "Acked": obj(
        ["namespace", "queue", "job_id", "state", "result", "acked_at_ms"],
        namespace={"type": "string"},
        queue={"type": "string"},
        job_id={"type": "string"},
        state={"const": "acked"},
        result={"description": "the result given on ack (any JSON value)"},
        acked_at_ms={**INT, "description": "the ack's time, Unix milliseconds"},
    ),
    "Published": obj(
        ["msg", "job_id"],
        msg={"const": "published"},
        job_id={"type": "string"},
        duplicate={"type": "boolean"},
        dedup={
            "enum": ["new", "existing", "replaced"],
            "description": "with a dedup_key: a new job, the key's job answered (nothing "
            "written), or the key's waiting job replaced (debounce)",
        },
    ),
    "Size": obj(
        ["namespace", "queue", "size"],
        namespace={"type": "string"},
        queue={"type": "string"},
        size=INT,
        delayed=INT,
        reserved=INT,
        dead=INT,
    ),
    "Limit": obj(
        ["read", "write", "interval"],
        read={"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
        write={"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
        interval={"type": "integer", "minimum": 1, "maximum": MAX_INTERVAL},
    ),
}
SCHEMAS["Sizes"] = obj(
    ["size", "delayed", "reserved", "dead"], size=INT, delayed=INT, reserved=INT, dead=INT
)
SCHEMAS["OpenAPI"] = obj(["openapi", "paths"], openapi={"type": "string"}, paths={})


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


# -- responses ----------------------------------------------------------------------------

_REQUEST_ID = {
    "X-Request-ID": {
        "description": "the client's own id, when it is a sane token, or a fresh one",
        "required": True,
        "schema": {"type": "string"},
    }
}


def reply(
    what: str,
    schema: Schema | None = None,
    example: Any = None,
    media: str = JSON,
    headers: dict[str, Any] | None = None,
) -> Schema:
    out: Schema = {"description": what, "headers": {**_REQUEST_ID, **(headers or {})}}
    if schema is not None:
        content: Schema = {"schema": schema}
        if example is not None:
            content["example"] = example
        out["content"] = {media: content}
    return out


def error(what: str, example: str, schema: str = "Error") -> Schema:
    """A 4xx/5xx: ``{"error": …}``, or lmstfy's ``{"msg": …}`` (schema "Message")."""
    return reply(what, ref(schema), {"msg" if schema == "Message" else "error": example})


EITHER = {"anyOf": [ref("Error"), ref("Message")]}
E400 = error("a bad parameter, name, id, lease or body; nothing was written", "invalid delay")
E401 = error("no token, or a token unknown for this namespace", "invalid token")
E404_POOL = error("the token names no configured pool or ring", "pool not found")
E413 = error("a body over its limit (checked from Content-Length first)", "body too large")
# Refused by the HTTP parser (``http/protocol.py``), before the app (with a request id of its own).
E414 = {
    "description": f"a request line over {MAX_URL_BYTES} bytes (path and query, percent-encoded)",
    "content": {
        JSON: {
            "schema": ref("Error"),
            "example": {"error": f"request line too long (max {MAX_URL_BYTES} bytes)"},
        }
    },
}
E503 = error(
    "Redis unreachable or failing over: says whether the request may have been applied",
    "pool 'default' unavailable: redis unavailable (unreachable or failing over)",
)
E409 = reply(
    "a lease that no longer holds its job: nothing was changed",
    ref("Conflict"),
    {
        "error": "lease does not hold job 01M84CYQJ90007ZG2JKZ9W9AQM: gone; nothing was changed",
        "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
        "state": None,
        "conflicts": [{"job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "state": None}],
    },
)
E409_STATE = reply(
    "the job's state forbids the operation: nothing was changed",
    ref("WrongState"),
    {
        "error": "cannot kick job 01M84CYQJ90007ZG2JKZ9W9AQM: it is ready, kick needs dead; "
        "nothing was changed",
        "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
        "state": "ready",
    },
)
E409_BUSY = error(
    "others kept changing it meanwhile: nothing was changed; repeating is safe",
    "the schedule kept being changed by others meanwhile; nothing was changed, try again",
)
NO_CONTENT = {"description": "done", "headers": _REQUEST_ID}


# -- parameters ---------------------------------------------------------------------------


def param(name: str, where: str, schema: Schema, what: str, required: bool = False) -> Schema:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "description": what,
        "schema": schema,
    }


def uint(name: str, what: str, default: int | None, maximum: int, minimum: int = 0) -> Schema:
    """A query integer as ``params.uint`` reads it: 1 to 20 ASCII digits, within bounds."""
    schema: Schema = {"type": "integer", "minimum": minimum, "maximum": maximum}
    if default is not None:
        schema["default"] = default
    return param(name, "query", schema, what)


def seconds(
    name: str, what: str, default: int, maximum: int = U32, minimum: int = 0, ms_minimum: int = 0
) -> list[Schema]:
    """``name`` in seconds and ``name_ms`` in milliseconds (``params.millis``; ms wins)."""
    ms_what = f"{what} (milliseconds; wins over `{name}`)"
    return [
        uint(name, f"{what} (seconds)", default, maximum, minimum),
        uint(f"{name}_ms", ms_what, None, maximum * 1000, ms_minimum),
    ]


def raw_body(what: str) -> Schema:
    return {
        "required": False,
        "description": what,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }


def json_body(schema: Schema, example: Any, required: bool = True) -> Schema:
    return {"required": required, "content": {JSON: {"schema": schema, "example": example}}}


def text_param(name: str, what: str) -> Schema:
    return param(
        name,
        "query",
        {"type": "string", "maxLength": MAX_NOTE_TEXT},
        f"{what}: at most {MAX_NOTE_TEXT} bytes of UTF-8 (in the query or the body, not both)",
    )


def text_body(name: str, example: str) -> Schema:
    """``params.text``'s body: a JSON Content-Type required."""
    return json_body(
        {
            "type": "object",
            "properties": {name: {"type": ["string", "null"], "maxLength": MAX_NOTE_TEXT}},
            "additionalProperties": False,
        },
        {name: example},
        required=False,
    )


# -- the data port: what its concepts' declarations share -------------------------------

NS = param("ns", "path", NAME, "namespace")
Q = param("q", "path", QUEUE_NAME, "queue")
JOB = param("job_id", "path", JOB_ID, "job id")
LEASE = param("lease", "query", LEASE_ID, "the lease of the delivery that holds the job")
JOB_EXAMPLE = {
    "msg": "new job",
    "namespace": "demo",
    "queue": "orders",
    "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
    "data": "Y2xvc2Ugb3JkZXIgNDI=",
    "ttl": 3598,
    "elapsed_ms": 2003,
    "remain_tries": 2,
    "attributes": None,
    "state": "reserved",
    "deliveries": 1,
    "lease": "2c37b9d38f700001",
}
PEEKED_EXAMPLE = {k: v for k, v in JOB_EXAMPLE.items() if k not in ("msg", "lease")}
SIZE = reply("sizes", ref("Size"), {"namespace": "demo", "queue": "orders", "size": 0})
# The routes that take a job's id, each (path, method): the targets of the links from a publish
# (``http/jobs.py``) and a consume (``http/delivery.py``).
JOB_PATH = "/api/{ns}/{q}/job/{job_id}"
PEEK, ACK, REPUBLISH = (JOB_PATH, "get"), (JOB_PATH, "delete"), (JOB_PATH, "put")
TOUCH, RELEASE = (JOB_PATH + "/touch", "post"), (JOB_PATH + "/release", "post")
PROGRESS = (JOB_PATH + "/progress", "put")
BURY, RESCHEDULE = (JOB_PATH + "/bury", "post"), (JOB_PATH + "/reschedule", "post")
CONSUME = ("/api/{ns}/{queues}", "get")
ID_LINK = {"ns": "$request.path.ns", "job_id": "$response.body#/job_id"}  # the id answered


def links(values: dict[str, object], *targets: tuple[str, str]) -> Schema:
    """What a client does next with the id it was given (schemathesis follows these)."""
    return {
        f"{method} {path}": {
            "operationRef": "#/paths/" + path.replace("/", "~1") + "/" + method,
            "parameters": values,
        }
        for path, method in targets
    }


# No links from a POST: schemathesis starts its sequences from the operations with links,
# and only from the POSTs among them when there are any (its "reliable roots"): links from
# bury, kick or reschedule would leave publish and consume out of every sequence.


# -- operations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One method of one route: what the document says about it."""

    method: str
    path: str
    summary: str
    responses: dict[int, Schema]
    params: list[Schema] = field(default_factory=list)
    body: Schema | None = None
    auth: bool = True  # data port: the token; admin port: basic auth when accounts exist
    tag: str = "jobs"


def _document_op() -> Op:
    return Op(
        "GET",
        OPENAPI_PATH,
        "This document",
        {200: reply("the OpenAPI 3.1 document of this port", ref("OpenAPI"))},
        auth=False,
        tag="meta",
    )


def document(port: str, ops: list[Op], schemes: dict[str, Schema]) -> Schema:
    """The OpenAPI document of one port: its operations (and this document's own route);
    an operation with ``auth`` takes any one of ``schemes``."""
    security: list[Schema] = [{name: []} for name in schemes]
    paths: dict[str, Schema] = {}
    for op in [*ops, _document_op()]:
        entry: Schema = {
            "summary": op.summary,
            "tags": [op.tag],
            "parameters": op.params,
            "responses": {str(k): v for k, v in sorted(op.responses.items())},
            "security": security if op.auth else [],
        }
        if op.body is not None:
            entry["requestBody"] = op.body
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"cluster_dq {port} API",
            "version": cluster_dq.__version__,
            "description": "A delayed task queue, lmstfy-compatible: docs/api.md",
        },
        "paths": paths,
        "components": {"schemas": SCHEMAS, "securitySchemes": schemes},
    }


def route(doc: Schema) -> Route:
    """``GET /openapi.json``: ``doc``, serialised once."""
    body = jsonlib.dumps(doc).encode()

    async def serve(request: Request) -> Response:
        return Response(body, media_type=JSON)

    return Route(OPENAPI_PATH, serve, methods=["GET"])
