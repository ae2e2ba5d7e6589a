"""The admin port's OpenAPI document: one ``Op`` per route of ``AdminAPI.routes``
(``http/admin.py``)."""

from __future__ import annotations

import cluster_dq
from cluster_dq.http.openapi import (
    E400,
    E401,
    E413,
    E503,
    NAME,
    NO_CONTENT,
    Op,
    Schema,
    document,
    error,
    json_body,
    obj,
    param,
    ref,
    reply,
)
from cluster_dq.settings import Settings
from cluster_dq.tokens import MAX_TOKEN, MIN_CUSTOM_TOKEN


def admin_document(s: Settings) -> Schema:
    """Basic auth on the guarded routes when ``[Accounts]`` is configured."""
    schemes = {"basic": {"type": "http", "scheme": "basic"}} if s.Accounts else {}
    return document("admin", admin_operations(s), schemes)


def admin_operations(s: Settings) -> list[Op]:
    """Every route of the admin port (``AdminAPI.routes``), with what it can answer."""
    ns = param("ns", "path", NAME, "namespace")
    names = sorted({*s.Pool, *s.Ring})  # what a token may name (``routing.build_routes``)
    prefix = f"(({'|'.join(names)}):)?"
    part = f"[-_A-Za-z0-9]{{1,{MAX_TOKEN}}}"
    token = param(
        "token", "path", {"type": "string", "pattern": f"^{prefix}{part}$"}, "[pool:]token"
    )
    custom = {
        "type": "string",
        "pattern": f"^{prefix}[-_A-Za-z0-9]{{{MIN_CUSTOM_TOKEN},{MAX_TOKEN}}}$",
    }
    pool = param("pool", "query", {"enum": names}, "a pool or ring (default: default)")
    guarded = {400: E400, 503: E503, **({401: E401} if s.Accounts else {})}
    # a change: refused on a read-only port and from a page on another site (http/origin.py)
    e403 = error(
        "a change on a read-only admin port (AdminReadOnly), or one a page on another site"
        " could have sent (a foreign Origin or Referer): nothing changed",
        "cross-site request refused (Origin is not this server; a client sends no Origin):"
        " nothing was changed",
    )
    changes = {**guarded, 403: e403}
    limit = reply("the limit", ref("Limit"), {"read": 100, "write": 50, "interval": 1})
    limiter = reply("the limit", obj(["limiter"], limiter=ref("Limit")))
    limit_body = json_body(ref("Limit"), {"read": 100, "write": 50, "interval": 1})
    accesslog = reply(
        "the access log's state", obj(["status"], status={"enum": ["enabled", "disabled"]})
    )
    ready = reply(
        "ready: every pool answers and has its scripts (each pool's state: to the admin role"
        " only, basic auth when accounts are set)",
        obj(
            ["status"],
            status={"enum": ["ok", "unavailable"]},
            pools={
                "type": "object",
                "additionalProperties": obj(
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
                400: E400,
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
                    obj(
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
                    obj(
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
            {200: reply("ok", obj(["status"], status={"const": "ok"}))},
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
                        "items": obj(
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
            {**changes, 200: accesslog},
            [param("status", "query", {"enum": ["enable", "disable"]}, "the new state", True)],
            tag="admin",
        ),
        Op(
            "GET",
            "/token/{ns}",
            "The namespace's tokens and their descriptions (refused on a read-only port)",
            {
                **guarded,
                **({403: e403} if s.read_only else {}),
                200: reply(
                    "tokens",
                    obj(
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
                **changes,
                201: reply(
                    "the new token",
                    obj(["token"], token={"type": "string"}),
                    {"token": "01M84CYSWQTMWG1VDGQXK7JG0Y"},
                ),
            },
            [
                ns,
                pool,
                param("description", "query", {"type": "string"}, "required here or in the form"),
                param("token", "query", custom, "a custom [pool:]token"),
            ],
            {
                "required": False,
                "content": {
                    "application/x-www-form-urlencoded": {
                        "schema": obj((), description={"type": "string"}, token=custom)
                    }
                },
            },
            tag="tokens",
        ),
        Op(
            "DELETE",
            "/token/{ns}/{token}",
            "Delete a token",
            {**changes, 204: NO_CONTENT},
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
            {**changes, 201: limiter, 413: E413},
            [ns, token],
            limit_body,
            tag="tokens",
        ),
        Op(
            "PUT",
            "/token/{ns}/{token}/limit",
            "Update the token's rate limit",
            {**changes, 200: limiter, 413: E413},
            [ns, token],
            limit_body,
            tag="tokens",
        ),
        Op(
            "DELETE",
            "/token/{ns}/{token}/limit",
            "Delete the token's rate limit",
            {**changes, 200: reply("deleted", ref("Message"), {"msg": "success"})},
            [ns, token],
            tag="tokens",
        ),
    ]
