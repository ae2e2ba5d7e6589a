"""The admin port's verbs as pure functions (arguments -> ``Call``): tokens, rate limits,
info, health and metrics."""

from __future__ import annotations

from typing import Any

from cluster_dq import names as rules
from cluster_dq.client._core import (
    JSON,
    Call,
    Reply,
    Safety,
    check,
    expect,
    json_body,
    query,
    segment,
)
from cluster_dq.client._verbs import no_content
from cluster_dq.client.models import TokenLimit


def _token_path(namespace: str, token: str) -> str:
    return f"/token/{segment(namespace, 'namespace', rules.namespace)}/{segment(token, 'token', rules.token)}"


def info(pool: str | None = None) -> Call[dict[str, list[str]]]:
    """The namespaces of a pool and their queues."""
    return Call("GET", "/info", lambda r: dict(expect(r, 200)), query(pool=pool))


def pools() -> Call[list[str]]:
    return Call("GET", "/pools", lambda r: list(expect(r, 200)))


def _limit(o: dict[str, Any]) -> TokenLimit:
    lim = o["limiter"]
    return TokenLimit(o["namespace"], o["token"], lim["read"], lim["write"], lim["interval"])


def limits() -> Call[list[TokenLimit]]:
    return Call("GET", "/limits", lambda r: [_limit(o) for o in expect(r, 200)])


def set_limit(
    namespace: str, token: str, *, read: int, write: int, interval: int, create: bool = True
) -> Call[TokenLimit]:
    def decode(r: Reply) -> TokenLimit:
        lim = expect(r, 200, 201)["limiter"]
        return TokenLimit(namespace, token, lim["read"], lim["write"], lim["interval"])

    body = json_body({"read": read, "write": write, "interval": interval})
    path = f"{_token_path(namespace, token)}/limit"
    return Call("POST" if create else "PUT", path, decode, [], JSON, body)


def delete_limit(namespace: str, token: str) -> Call[None]:
    return Call("DELETE", f"{_token_path(namespace, token)}/limit", no_content)


def create_token(
    namespace: str, description: str, *, token: str | None = None, pool: str | None = None
) -> Call[str]:
    params = query(description=description, token=token, pool=pool)
    path = f"/token/{segment(namespace, 'namespace', rules.namespace)}"
    # a repeat after a lost reply would make a second token
    return Call("POST", path, lambda r: str(expect(r, 201)["token"]), params, safety=Safety.ONCE)


def tokens(namespace: str, *, pool: str | None = None) -> Call[dict[str, str]]:
    def decode(r: Reply) -> dict[str, str]:
        return dict(expect(r, 200)["tokens"])

    return Call(
        "GET",
        f"/token/{segment(namespace, 'namespace', rules.namespace)}",
        decode,
        query(pool=pool),
    )


def delete_token(namespace: str, token: str) -> Call[None]:
    return Call("DELETE", _token_path(namespace, token), no_content)


def metrics_text() -> Call[str]:
    def decode(r: Reply) -> str:
        check(r, 200)
        return r.content.decode()

    return Call("GET", "/metrics", decode)


def healthz() -> Call[bool]:
    return Call("GET", "/healthz", lambda r: expect(r, 200)["status"] == "ok")


def readyz() -> Call[dict[str, Any]]:
    """Ready or not (``status``) and, to the admin role (the client's basic auth when the
    server has accounts), every pool's readiness (``pools``); a pool that is not ready
    answers 503 (``Unavailable``)."""
    return Call("GET", "/readyz", lambda r: dict(expect(r, 200)))


def version() -> Call[str]:
    return Call("GET", "/version", lambda r: str(expect(r, 200)["version"]))
