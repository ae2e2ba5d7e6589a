"""A queue's own settings (its CONF hash, lua/README.md): paused, default ttr and tries, retry
backoff, max size. Parsing of the API's JSON, the hash fields the ``configure`` script
writes, and the answer. No I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster_dq import userjson
from cluster_dq.backoff import KIND_NAMES, MAX_BACKOFF_MS, Backoff
from cluster_dq.errors import BadRequest
from cluster_dq.models import MAX_SECONDS, MAX_TRIES

MAX_SIZE = 2**53  # exact in Lua's numbers
BACKOFF_FIELDS = ("backoff", "backoff_ms", "backoff_cap_ms", "backoff_jitter")
FIELDS = ("paused", "ttr_ms", "tries", "max_size", *BACKOFF_FIELDS)


@dataclass(frozen=True, slots=True)
class QueueSettings:
    paused: bool = False
    ttr_ms: int | None = None  # a consume that gives no ttr gets this (else the service's)
    tries: int | None = None  # a publish that gives no tries gets this (else the service's)
    max_size: int | None = None  # jobs in all states; a publish beyond it: 429
    backoff: Backoff | None = None  # retry backoff of jobs that have none of their own

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> QueueSettings:
        h = {_text(k): _text(v) for k, v in raw.items()}

        def num(name: str) -> int | None:
            return int(h[name]) if name in h else None

        backoff = None
        kind = {v: k for k, v in KIND_NAMES.items()}.get(h.get("backoff", ""), 0)
        if kind:
            backoff = Backoff(
                kind,
                int(h.get("backoff_ms", 0)),
                int(h.get("backoff_cap_ms", 0)),
                int(h.get("backoff_jitter", 0)),
            )
        return cls(h.get("paused") == "1", num("ttr"), num("tries"), num("max_size"), backoff)

    def as_changes(self) -> list[tuple[str, str]]:
        """The changes that set exactly these settings (``configure``), e.g. to write them on
        the pool a queue is moving to. (No backoff: the backoff alone, null, removes it with
        its parameters; given with them, it was refused, and no setting moved.)"""
        body = self.as_json()
        if self.backoff is None:
            body = {k: v for k, v in body.items() if k not in BACKOFF_FIELDS or k == "backoff"}
        return parse_changes(json.dumps(body).encode())

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "paused": self.paused,
            "ttr_ms": self.ttr_ms,
            "tries": self.tries,
            "max_size": self.max_size,
        }
        if self.backoff is None:
            out.update(dict.fromkeys(BACKOFF_FIELDS))
        else:
            out.update(self.backoff.as_json())
        return out


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _int(body: Mapping[str, Any], name: str, low: int, high: int) -> str:
    """A JSON integer low..high as the hash stores it; null: '' (remove the setting)."""
    v = body[name]
    if v is None:
        return ""
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise BadRequest(f"invalid {name}: an integer {low}..{high}, or null", name)
    return str(v)


def parse_changes(data: bytes) -> list[tuple[str, str]]:
    """A settings request's JSON object -> (CONF field, value) pairs, '' = remove. Refuses
    anything unknown or out of range, naming it, before anything is written. ``backoff``
    and its parameters change together: a backoff is given whole, or removed with null."""
    body = userjson.parse(data or b"{}", "body", "the body must be a JSON object", by_field=True)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", "body")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BadRequest(f"unknown setting {unknown[0]!r}; known: {', '.join(FIELDS)}", unknown[0])
    out: list[tuple[str, str]] = []
    if "paused" in body:
        if not isinstance(body["paused"], bool):
            raise BadRequest("invalid paused: true or false", "paused")
        out.append(("paused", "1" if body["paused"] else ""))
    if "ttr_ms" in body:
        out.append(("ttr", _int(body, "ttr_ms", 1, MAX_SECONDS * 1000)))
    if "tries" in body:
        out.append(("tries", _int(body, "tries", 1, MAX_TRIES)))
    if "max_size" in body:
        out.append(("max_size", _int(body, "max_size", 1, MAX_SIZE)))
    given = [f for f in BACKOFF_FIELDS if f in body]
    if given:
        if "backoff" not in body:
            raise BadRequest("backoff parameters need backoff (the kind)", given[0])
        kind = body["backoff"]
        if kind is None or kind == "none":
            if len(given) > 1:
                raise BadRequest("a removed backoff takes no parameters", given[1])
            return out + [(f, "") for f in BACKOFF_FIELDS]
        for name in ("backoff_ms", "backoff_cap_ms"):
            if name in body:
                _int(body, name, 0, MAX_BACKOFF_MS)  # a JSON integer (parse checks its range)
        jitter = body.get("backoff_jitter")
        if jitter is not None and (isinstance(jitter, bool) or not isinstance(jitter, int | float)):
            raise BadRequest("invalid backoff_jitter: a number 0..1", "backoff_jitter")
        b = Backoff.parse(
            kind if isinstance(kind, str) else "?",
            _opt(body.get("backoff_ms")),
            _opt(body.get("backoff_cap_ms")),
            None if jitter is None else repr(float(jitter) + 0.0),  # (+ 0.0: -0.0 is 0.0)
        )
        out += [
            ("backoff", KIND_NAMES[b.kind]),
            ("backoff_ms", str(b.base_ms)),
            ("backoff_cap_ms", str(b.cap_ms)),
            ("backoff_jitter", str(b.jitter_pm)),
        ]
    return out


def _opt(v: Any) -> str | None:
    return None if v is None else str(v)
