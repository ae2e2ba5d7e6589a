"""Pure operations on the admin keys (tokens and rate limits, ``keys.AdminKeys``): steps for
the executors, like the other operations (steps.py), so the token store goes through the engine too."""

from __future__ import annotations

from typing import Any

from cluster_dq.engine import replies
from cluster_dq.engine.steps import Cmd, Op, lua
from cluster_dq.keys import AdminKeys


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pairs(reply: Any) -> dict[str, Any]:
    """HGETALL as redis-py parses it (a dict), or flat (RESP without a callback)."""
    items = reply.items() if isinstance(reply, dict) else zip(reply[0::2], reply[1::2])
    return {_text(k): v for k, v in items}


def limit_field(pool: str, ns: str, token: str) -> str:
    return f"{pool}/{ns}/{token}"


def add_token(pool: str, ns: str, token: str, description: str) -> Op[bool]:
    """False when the token exists already (nothing changed)."""
    return bool((yield Cmd(("HSETNX", AdminKeys.tokens(pool, ns), token, description))))


def tokens(pool: str, ns: str) -> Op[dict[str, str]]:
    return {
        k: _text(v) for k, v in _pairs((yield Cmd(("HGETALL", AdminKeys.tokens(pool, ns))))).items()
    }


def token_exists(pool: str, ns: str, token: str) -> Op[bool]:
    return bool(int((yield Cmd(("HEXISTS", AdminKeys.tokens(pool, ns), token)))))


def delete_token(pool: str, ns: str, token: str) -> Op[bool]:
    """The token and its rate limit; False when there was no such token."""
    existed = bool((yield Cmd(("HDEL", AdminKeys.tokens(pool, ns), token))))
    yield Cmd(("HDEL", AdminKeys.limits(), limit_field(pool, ns, token)))
    return existed


def limits() -> Op[dict[str, Any]]:
    """Every rate limit, raw (``pool/ns/token`` -> JSON)."""
    return _pairs((yield Cmd(("HGETALL", AdminKeys.limits()))))


def limit(pool: str, ns: str, token: str) -> Op[Any]:
    """One rate limit, raw JSON (None: none)."""
    return (yield Cmd(("HGET", AdminKeys.limits(), limit_field(pool, ns, token))))


def set_limit(pool: str, ns: str, token: str, blob: str, create: bool) -> Op[bool]:
    """False when ``create`` and the limit exists already (nothing changed)."""
    key, field = AdminKeys.limits(), limit_field(pool, ns, token)
    if create:
        return bool((yield Cmd(("HSETNX", key, field, blob))))
    yield Cmd(("HSET", key, field, blob))
    return True


def delete_limit(pool: str, ns: str, token: str) -> Op[None]:
    yield Cmd(("HDEL", AdminKeys.limits(), limit_field(pool, ns, token)))


def audit_append(entry: str, cap: int) -> Op[None]:
    """One audit entry (JSON) at the head of the pool's audit list, kept to ``cap`` entries."""
    yield (Cmd(("LPUSH", AdminKeys.audit(), entry)), Cmd(("LTRIM", AdminKeys.audit(), 0, cap - 1)))


def audit_entries(limit: int) -> Op[list[str]]:
    """The newest ``limit`` audit entries of the pool (JSON), newest first."""
    return [_text(v) for v in (yield Cmd(("LRANGE", AdminKeys.audit(), 0, limit - 1)))]


def rate_limit(key: str, per_window: int, window_ms: int, refund: bool = False) -> Op[int]:
    """Takes (or gives back) one unit of a fixed-window limit: the ms left in the window
    when taken, 0 when it is used up (a refund: 1)."""
    call = lua(
        "rate_limit",
        {"counter": key},
        limit=per_window,
        window=window_ms,
        refund="1" if refund else "0",
    )
    return replies.decode_count((yield call))
