"""The OpenAPI 3.1 documents of both ports, served at ``GET /openapi.json`` on each: built from
one declaration per route (``data_operations``, ``admin_operations``) with the bounds the
parsers enforce (``http/params.py``, ``models.py``) and the defaults of the running settings.

A new route is one more ``Op`` in its port's list; ``tests/test_openapi.py`` fails while a
route of an app is missing from its document, and runs schemathesis against both."""

from __future__ import annotations

import json as jsonlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import cluster_dq
from cluster_dq.http.params import LEASE_RE, MAX_QUEUES, U32
from cluster_dq.models import (
    CLIENT_ID_MAX_LEN,
    MAX_BATCH_ACK,
    MAX_BATCH_CONSUME,
    MAX_BULK,
    MAX_NAME_LEN,
    MAX_PRIORITY,
    MAX_TRIES,
)
from cluster_dq.settings import Settings
from cluster_dq.tokens import MAX_INTERVAL, MAX_LIMIT, MAX_TOKEN

Schema = dict[str, Any]
JSON = "application/json"
OPENAPI_PATH = "/openapi.json"

# -- schemas ------------------------------------------------------------------------------

_NAME = {"type": "string", "pattern": "^[-_A-Za-z0-9]+$", "maxLength": MAX_NAME_LEN}
_QUEUE = {**_NAME, "pattern": "^[-A-Za-z0-9][-_A-Za-z0-9]*$"}
# A server id (26 Crockford base32 characters) or a client's own: both fit this.
_JOB_ID = {"type": "string", "pattern": f"^[-_A-Za-z0-9]{{1,{CLIENT_ID_MAX_LEN}}}$"}
_LEASE = {"type": "string", "pattern": f"^{LEASE_RE.pattern}$"}
_STATE = {"type": "string", "enum": ["delayed", "ready", "reserved", "dead"]}


def _obj(required: Iterable[str] = (), **props: Schema) -> Schema:
    return {"type": "object", "properties": props, "required": list(required)}


_INT = {"type": "integer", "minimum": 0}
SCHEMAS: dict[str, Schema] = {
    "Error": _obj(["error"], error={"type": "string"}),
    "Message": _obj(["msg"], msg={"type": "string"}),
    "Conflict": _obj(
        ["error", "job_id", "state", "conflicts"],
        error={"type": "string"},
        job_id={"type": "string"},
        state={"type": ["string", "null"]},
        conflicts={
            "type": "array",
            "items": _obj(["job_id", "state"], job_id={"type": "string"}, state={}),
        },
    ),
    "Job": _obj(
        ["namespace", "queue", "job_id", "data", "ttl", "elapsed_ms", "remain_tries"],
        msg={"type": "string", "const": "new job"},
        namespace={"type": "string"},
        queue={"type": "string"},
        job_id={"type": "string"},
        data={"type": "string", "contentEncoding": "base64", "description": "the body"},
        ttl={**_INT, "description": "seconds left before the job expires; 0: never"},
        elapsed_ms=_INT,
        remain_tries=_INT,
        attributes={"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        state=_STATE,
        deliveries=_INT,
        lease=_LEASE,
    ),
    "Published": _obj(
        ["msg", "job_id"],
        msg={"const": "published"},
        job_id={"type": "string"},
        duplicate={"type": "boolean"},
    ),
    "Size": _obj(
        ["namespace", "queue", "size"],
        namespace={"type": "string"},
        queue={"type": "string"},
        size=_INT,
        delayed=_INT,
        reserved=_INT,
        dead=_INT,
    ),
    "Limit": _obj(
        ["read", "write", "interval"],
        read={"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
        write={"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
        interval={"type": "integer", "minimum": 1, "maximum": MAX_INTERVAL},
    ),
}
SCHEMAS["Sizes"] = _obj(
    ["size", "delayed", "reserved", "dead"], size=_INT, delayed=_INT, reserved=_INT, dead=_INT
)
SCHEMAS["OpenAPI"] = _obj(["openapi", "paths"], openapi={"type": "string"}, paths={})


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
    key = "msg" if schema == "Message" else "error"
    return reply(what, ref(schema) if schema != "Either" else _EITHER, {key: example})


_EITHER = {"anyOf": [ref("Error"), ref("Message")]}
E400 = error("a bad parameter, name, id, lease or body; nothing was written", "invalid delay")
E401 = error("no token, or a token unknown for this namespace", "invalid token")
E404_POOL = error("the token names no configured pool or ring", "pool not found")
E413 = error("a body over its limit (checked from Content-Length first)", "body too large")
E429 = error(
    "the token's rate limit", "token(…) produce reach the limit rate, please retry later", "Message"
)
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
NO_CONTENT = {"description": "done", "headers": _REQUEST_ID}
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
PUBLISHED = reply(
    "published", ref("Published"), {"msg": "published", "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM"}
)


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


def seconds(name: str, what: str, default: int, maximum: int = U32) -> list[Schema]:
    """``name`` in seconds and ``name_ms`` in milliseconds (``params.millis``; ms wins)."""
    return [
        uint(name, f"{what} (seconds)", default, maximum),
        uint(f"{name}_ms", f"{what} (milliseconds; wins over `{name}`)", None, maximum * 1000),
    ]


NS = param("ns", "path", _NAME, "namespace")
Q = param("q", "path", _QUEUE, "queue")
JOB = param("job_id", "path", _JOB_ID, "job id")
LEASE = param("lease", "query", _LEASE, "the lease of the delivery that holds the job")


def job_spec(s: Settings, with_id: bool = True) -> list[Schema]:
    """The parameters of a published job (``DataAPI._specs``)."""
    out = [
        *seconds("delay", "the job becomes ready after this", s.DelaySecond),
        *seconds("ttl", "the job expires this long after publishing; 0: never", s.TTLSecond),
        uint("tries", "deliveries allowed", s.TriesNum, MAX_TRIES),
        uint("priority", "higher is delivered first within a queue", 0, MAX_PRIORITY),
    ]
    if with_id:
        out.append(param("job_id", "query", _JOB_ID, "a client-chosen id: idempotent publish"))
    return out


def raw_body(what: str) -> Schema:
    return {
        "required": False,
        "description": what,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }


def json_body(schema: Schema, example: Any, required: bool = True) -> Schema:
    return {"required": required, "content": {JSON: {"schema": schema, "example": example}}}


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


def data_operations(s: Settings) -> list[Op]:
    """Every route of the data port (``DataAPI.routes``), with what it can answer."""
    common = {400: E400, 401: E401, 404: E404_POOL, 503: E503}
    write = {**common, 201: PUBLISHED, 413: E413, 429: E429}
    job_404 = error("no such job, or it is not reserved", "job is not reserved")
    consume_404 = reply(
        "nothing ready within the timeout (msg), or the token's pool is unknown (error)",
        _EITHER,
        {"msg": "no job available"},
    )
    too_many = error("rate-limited, or too many consumers waiting", "retry later", "Message")
    too_many["headers"]["Retry-After"] = {"schema": {"type": "string"}}
    size = reply("sizes", ref("Size"), {"namespace": "demo", "queue": "orders", "size": 0})
    peeked = reply("the job; nothing changes", ref("Job"), PEEKED_EXAMPLE)
    return [
        Op(
            "PUT",
            "/api/{ns}/{q}",
            "Publish one job (the raw body)",
            write,
            [NS, Q, *job_spec(s)],
            raw_body(f"the job, at most MaxBodyBytes ({s.MaxBodyBytes}) bytes"),
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/bulk",
            f"Publish up to {MAX_BULK} jobs, all or nothing",
            {
                **write,
                201: reply(
                    "published",
                    _obj(["msg", "job_ids"], msg={"const": "published"}, job_ids={"type": "array"}),
                    {"msg": "published", "job_ids": ["01M84CYQJ90007ZG2JKZ9W9AQM"]},
                ),
            },
            [NS, Q, *job_spec(s, with_id=False)],
            json_body(
                {"type": "array", "minItems": 1, "maxItems": MAX_BULK, "items": {}},
                ["close order 42", {"order": 43}],
            ),
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/job/{job_id}",
            "Ack a job and publish the body as a new job, atomically",
            {**write, 409: E409},
            [NS, Q, JOB, *job_spec(s), LEASE],
            raw_body("the new job"),
        ),
        Op(
            "GET",
            "/api/{ns}/{queues}",
            "Consume (long-poll) from one or more queues, in priority order",
            {
                **common,
                200: reply(
                    "one job object (count=1) or an array of them",
                    {"anyOf": [ref("Job"), {"type": "array", "items": ref("Job")}]},
                    JOB_EXAMPLE,
                    headers={"X-Lease": {"schema": _LEASE, "description": "count=1: the lease"}},
                ),
                404: consume_404,
                429: too_many,
            },
            [
                NS,
                param(
                    "queues",
                    "path",
                    {
                        "type": "string",
                        "pattern": "^[-_A-Za-z0-9,]+$",
                        "maxLength": MAX_QUEUES * (MAX_NAME_LEN + 1),
                    },
                    f"queue names, comma-separated (at most {MAX_QUEUES}); first is served first",
                ),
                *seconds("ttr", "time to run; ttr=0 means 1 s, ttr_ms=0 is refused", s.TTRSecond),
                *seconds(
                    "timeout",
                    "long-poll: wait this long for a job",
                    s.TimeoutSecond,
                    s.MaxTimeoutSecond,
                ),
                uint("count", "jobs to take at most", 1, MAX_BATCH_CONSUME, 1),
            ],
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}/job/{job_id}",
            "Ack (delete) a job in any state; 204 also when it does not exist",
            {**common, 204: NO_CONTENT, 409: E409},
            [NS, Q, JOB, LEASE],
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/ack",
            "Batch ack, one atomic step",
            {
                **common,
                200: reply(
                    "acked",
                    _obj(
                        ["msg", "acked", "not_found"],
                        msg={"const": "acked"},
                        acked=_INT,
                        not_found={"type": "array", "items": {"type": "string"}},
                    ),
                    {"msg": "acked", "acked": 1, "not_found": []},
                ),
                409: E409,
                413: E413,
            },
            [NS, Q],
            json_body(_ack_body(), [{"job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "lease": None}]),
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/job/{job_id}/touch",
            "Extend (or shorten) a reservation: it now ends ttr from now",
            {
                **common,
                200: reply(
                    "touched",
                    _obj(
                        ["msg", "job_id", "ttr_ms"],
                        msg={"const": "touched"},
                        job_id={"type": "string"},
                        ttr_ms=_INT,
                    ),
                ),
                404: job_404,
                409: E409,
            },
            [NS, Q, JOB, *seconds("ttr", "the new time to run (not 0)", s.TTRSecond), LEASE],
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/job/{job_id}/release",
            "Give a reserved job back (nack), now or after a delay",
            {
                **common,
                200: reply(
                    "released",
                    _obj(
                        ["msg", "job_id", "state"],
                        msg={"const": "released"},
                        job_id={"type": "string"},
                        state={"enum": ["ready", "delayed", "dead", "expired"]},
                    ),
                ),
                404: job_404,
                409: E409,
            },
            [NS, Q, JOB, *seconds("delay", "ready again after this", 0), LEASE],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/peek",
            "The head of the ready queue",
            {
                **common,
                200: peeked,
                404: error("empty queue or unknown pool", "the queue is empty"),
            },
            [NS, Q],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/job/{job_id}",
            "One job by id, in any state",
            {**common, 200: peeked, 404: error("no such job or unknown pool", "job not found")},
            [NS, Q, JOB],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/size",
            "Sizes per state (size: ready)",
            {**common, 200: size},
            [NS, Q],
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}",
            "Destroy the queue: every job in every state",
            {**common, 204: NO_CONTENT},
            [NS, Q],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/deadletter",
            "Dead-letter size and head",
            {
                **common,
                200: reply(
                    "size and head (empty string: none)",
                    _obj(
                        ["namespace", "queue", "deadletter_size", "deadletter_head"],
                        namespace={"type": "string"},
                        queue={"type": "string"},
                        deadletter_size=_INT,
                        deadletter_head={"type": "string"},
                    ),
                ),
            },
            [NS, Q],
            tag="dead letter",
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/deadletter",
            "Respawn up to limit of the oldest dead jobs to ready",
            {
                **common,
                200: reply(
                    "respawned",
                    _obj(["msg", "count"], msg={"const": "respawned"}, count=_INT),
                    {"msg": "respawned", "count": 1},
                ),
            },
            [
                NS,
                Q,
                uint("limit", "dead jobs to respawn at most", 1, U32, 1),
                *seconds("ttl", "the respawned jobs' new ttl", s.TTLSecond),
            ],
            tag="dead letter",
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}/deadletter",
            "Delete up to limit of the oldest dead jobs",
            {**common, 204: NO_CONTENT},
            [NS, Q, uint("limit", "dead jobs to delete at most", 1, U32, 1)],
            tag="dead letter",
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/deadletter/size",
            "Dead-letter size",
            {**common, 200: size},
            [NS, Q],
            tag="dead letter",
        ),
    ]


def _ack_body() -> Schema:
    element = {
        "anyOf": [
            _JOB_ID,
            {
                "type": "object",
                "properties": {"job_id": _JOB_ID, "lease": {"anyOf": [_LEASE, {"type": "null"}]}},
                "required": ["job_id"],
                "additionalProperties": False,
            },
        ]
    }
    ids = {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_ACK, "items": element}
    return {
        "anyOf": [
            ids,
            {
                "type": "object",
                "properties": {"job_ids": ids},
                "required": ["job_ids"],
                "additionalProperties": False,
            },
        ]
    }


def admin_operations(s: Settings) -> list[Op]:
    """Every route of the admin port (``AdminAPI.routes``), with what it can answer."""
    ns = param("ns", "path", _NAME, "namespace")
    token = param(
        "token",
        "path",
        {
            "type": "string",
            "pattern": f"^([-_A-Za-z0-9]{{1,{MAX_TOKEN}}}:)?[-_A-Za-z0-9]{{1,{MAX_TOKEN}}}$",
        },
        "[pool:]token",
    )
    pool = param("pool", "query", {"type": "string"}, "a pool or ring (default: default)")
    guarded = {400: E400, 503: E503, **({401: E401} if s.Accounts else {})}
    limit = reply("the limit", ref("Limit"), {"read": 100, "write": 50, "interval": 1})
    limiter = reply("the limit", _obj(["limiter"], limiter=ref("Limit")))
    limit_body = json_body(ref("Limit"), {"read": 100, "write": 50, "interval": 1})
    accesslog = reply(
        "the access log's state", _obj(["status"], status={"enum": ["enabled", "disabled"]})
    )
    ready = reply(
        "ready: every pool answers and has its scripts",
        _obj(
            ["status", "pools"],
            status={"enum": ["ok", "unavailable"]},
            pools={
                "type": "object",
                "additionalProperties": _obj(
                    ["redis", "scripts"], redis={"type": "boolean"}, scripts={"type": "boolean"}
                ),
            },
        ),
    )
    return [
        Op(
            "GET",
            "/info",
            "Namespaces and their queues on a pool",
            {
                200: reply(
                    "{namespace: [queue]}",
                    {
                        "type": "object",
                        "additionalProperties": {"type": "array", "items": {"type": "string"}},
                    },
                    {"demo": ["orders"]},
                ),
                503: E503,
            },
            [pool],
            auth=False,
            tag="admin",
        ),
        Op(
            "GET",
            "/version",
            "The version",
            {
                200: reply(
                    "version",
                    _obj(
                        ["version", "build_commit", "build_date"],
                        version={"type": "string"},
                        build_commit={"type": "string"},
                        build_date={"type": "string"},
                    ),
                    {"version": cluster_dq.__version__, "build_commit": "", "build_date": ""},
                )
            },
            auth=False,
            tag="admin",
        ),
        Op(
            "GET",
            "/draining",
            "What a migration or ring change still has to drain",
            {
                200: reply(
                    "per old pool, queues still holding jobs",
                    _obj(
                        ["pool", "done", "draining"],
                        pool={"type": "string"},
                        done={"type": "boolean"},
                        draining={
                            "type": "object",
                            "additionalProperties": {
                                "type": "object",
                                "additionalProperties": ref("Sizes"),
                            },
                        },
                    ),
                ),
                400: E400,
                503: E503,
            },
            [pool],
            auth=False,
            tag="admin",
        ),
        Op(
            "GET",
            "/metrics",
            "Prometheus metrics",
            {200: reply("the exposition", {"type": "string"}, media="text/plain")},
            auth=False,
            tag="admin",
        ),
        Op(
            "GET",
            "/pools",
            "The names a token may carry: pools and rings",
            {200: reply("names", {"type": "array", "items": {"type": "string"}}, ["default"])},
            auth=False,
            tag="admin",
        ),
        Op(
            "GET",
            "/healthz",
            "The process serves",
            {200: reply("ok", _obj(["status"], status={"const": "ok"}))},
            auth=False,
            tag="admin",
        ),
        Op(
            "GET",
            "/readyz",
            "Every pool's Redis answers and has every script",
            {200: ready, 503: {**ready, "description": "a pool is not ready"}},
            auth=False,
            tag="admin",
        ),
        Op(
            "GET",
            "/limits",
            "Every token's rate limit",
            {
                **guarded,
                200: reply(
                    "limits",
                    {
                        "type": "array",
                        "items": _obj(
                            ["namespace", "token", "limiter"],
                            namespace={"type": "string"},
                            token={"type": "string"},
                            limiter=ref("Limit"),
                        ),
                    },
                ),
            },
            [param("force_update", "query", {"type": "string"}, "1 or true: reread from Redis")],
            tag="admin",
        ),
        Op(
            "GET",
            "/accesslog",
            "Whether the access log is on",
            {200: accesslog},
            auth=False,
            tag="admin",
        ),
        Op(
            "POST",
            "/accesslog",
            "Switch the access log on every worker",
            {**guarded, 200: accesslog},
            [param("status", "query", {"enum": ["enable", "disable"]}, "the new state", True)],
            tag="admin",
        ),
        Op(
            "GET",
            "/token/{ns}",
            "The namespace's tokens and their descriptions",
            {
                **guarded,
                200: reply(
                    "tokens",
                    _obj(
                        ["tokens"],
                        tokens={"type": "object", "additionalProperties": {"type": "string"}},
                    ),
                ),
            },
            [ns, pool],
            tag="tokens",
        ),
        Op(
            "POST",
            "/token/{ns}",
            "Create a token (query or form fields)",
            {
                **guarded,
                201: reply(
                    "the new token",
                    _obj(["token"], token={"type": "string"}),
                    {"token": "01M84CYSWQTMWG1VDGQXK7JG0Y"},
                ),
            },
            [
                ns,
                pool,
                param("description", "query", {"type": "string"}, "required here or in the form"),
                param("token", "query", {"type": "string"}, "a custom [pool:]token"),
            ],
            {
                "required": False,
                "content": {
                    "application/x-www-form-urlencoded": {
                        "schema": _obj((), description={"type": "string"}, token={"type": "string"})
                    }
                },
            },
            tag="tokens",
        ),
        Op(
            "DELETE",
            "/token/{ns}/{token}",
            "Delete a token",
            {**guarded, 204: NO_CONTENT},
            [ns, token],
            tag="tokens",
        ),
        Op(
            "GET",
            "/token/{ns}/{token}/limit",
            "The token's rate limit",
            {**guarded, 200: limit, 404: error("no limit", "limit not found")},
            [ns, token],
            tag="tokens",
        ),
        Op(
            "POST",
            "/token/{ns}/{token}/limit",
            "Create the token's rate limit",
            {**guarded, 201: limiter, 413: E413},
            [ns, token],
            limit_body,
            tag="tokens",
        ),
        Op(
            "PUT",
            "/token/{ns}/{token}/limit",
            "Update the token's rate limit",
            {**guarded, 200: limiter, 413: E413},
            [ns, token],
            limit_body,
            tag="tokens",
        ),
        Op(
            "DELETE",
            "/token/{ns}/{token}/limit",
            "Delete the token's rate limit",
            {**guarded, 200: reply("deleted", ref("Message"), {"msg": "success"})},
            [ns, token],
            tag="tokens",
        ),
    ]


def _document_op() -> Op:
    return Op(
        "GET",
        OPENAPI_PATH,
        "This document",
        {200: reply("the OpenAPI 3.1 document of this port", ref("OpenAPI"))},
        auth=False,
        tag="meta",
    )


def document(settings: Settings, port: str) -> Schema:
    """The OpenAPI document of ``port`` ("data" or "admin")."""
    data = port == "data"
    ops = [*(data_operations if data else admin_operations)(settings), _document_op()]
    if data:
        schemes = {
            "token": {
                "type": "apiKey",
                "in": "header",
                "name": "X-Token",
                "description": "[pool:]token",
            },
            "tokenQuery": {
                "type": "apiKey",
                "in": "query",
                "name": "token",
                "description": "[pool:]token",
            },
        }
        security: list[Schema] = [{"token": []}, {"tokenQuery": []}]
    else:
        schemes = {"basic": {"type": "http", "scheme": "basic"}} if settings.Accounts else {}
        security = [{"basic": []}] if settings.Accounts else []
    paths: dict[str, Schema] = {}
    for op in ops:
        entry: Schema = {
            "summary": op.summary,
            "tags": [op.tag],
            "parameters": op.params,
            "responses": {str(k): v for k, v in sorted(op.responses.items())},
        }
        if op.body is not None:
            entry["requestBody"] = op.body
        entry["security"] = security if op.auth else []
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"cluster_dq {port} API",
            "version": cluster_dq.__version__,
            "description": "lmstfy-compatible delayed task queue; see docs/api.md",
        },
        "paths": paths,
        "components": {"schemas": SCHEMAS, "securitySchemes": schemes},
    }


def route(settings: Settings, port: str) -> Route:
    """``GET /openapi.json``: the port's document, built once."""
    body = jsonlib.dumps(document(settings, port)).encode()

    async def serve(request: Request) -> Response:
        return Response(body, media_type=JSON)

    return Route(OPENAPI_PATH, serve, methods=["GET"])
