"""The client's pure core, no I/O: a ``Call`` describes one request (method, path, query,
headers, body, how safe it is to repeat) and carries the decoder of its reply; ``error_from``
turns an error reply into the error tree. The sync and async shells only send calls."""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from cluster_dq import envvars
from cluster_dq.client.errors import (
    BadRequest,
    Conflict,
    Contended,
    DQError,
    IdempotencyMismatch,
    InvalidName,
    LeaseLost,
    NotFound,
    QueueFull,
    RateLimited,
    TooLarge,
    Unauthorized,
    Unavailable,
    WrongState,
)

T = TypeVar("T")


class Safety(enum.Enum):
    """How a request may be repeated after a failure that may have reached the server."""

    IDEMPOTENT = "idempotent"  # repeating it is harmless (reads, acks, a publish with job_id)
    ONCE = "once"  # repeated only when it cannot have been applied


@dataclass(frozen=True, slots=True)
class Reply:
    """What the shells hand the decoders: the status, headers (case-insensitive) and body."""

    status: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content) if self.content else None


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and the decoder of its reply. ``wait``: seconds the server may hold it
    (a long poll), added to the client's timeout."""

    method: str
    path: str
    decode: Callable[[Reply], T]
    params: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    safety: Safety = Safety.IDEMPOTENT
    wait: float = 0.0


# -- building ---------------------------------------------------------------------------------


def segment(value: str, what: str, rule: Callable[[str], str | None]) -> str:
    """One path segment: a name ``rule`` (``cluster_dq/names.py``, the service's own rules)
    accepts, else a ValueError before anything is sent. A name the service refuses could
    also reach another route: "." and ".." are folded by the URL into the parent route
    (``ack(q, "..")`` would be ``DELETE`` of the queue itself), and the service refuses an
    encoded '/' (``destroy("wk/deadletter")`` was a dead-letter delete)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")
    problem = rule(value)
    if problem:
        raise InvalidName(f"{what} {value!r} is not a name the service accepts: {problem}", 400)
    return quote(value, safe="")


def millis(seconds: float, what: str) -> str:
    """Float seconds as the service's whole milliseconds: rounded to the nearest, but a time
    above 0 is never 0 ms (a ttl of 0 is "never expires", a ttr of 0 no reservation)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {seconds!r}")
    try:
        finite = math.isfinite(seconds)  # an int beyond a float's range: OverflowError
    except OverflowError:
        finite = False
    if not finite or seconds < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {seconds!r}")
    ms = round(seconds * 1000)
    return str(1 if ms == 0 and seconds > 0 else ms)


def _whole_ms(seconds: float, what: str) -> tuple[int, float]:
    """(nearest whole ms, exact ms); a float's noise (1.001 * 1000 = 1000.9999…) is no
    fraction."""
    ms = int(millis(seconds, what))
    exact = seconds * 1000
    return ms, (ms if abs(exact - ms) < 1e-6 else exact)


def millis_up(seconds: float, what: str) -> str:
    """The first whole ms at or after ``seconds``: an inclusive lower bound never widened."""
    ms, exact = _whole_ms(seconds, what)
    return str(math.ceil(exact) if exact != ms else ms)


def millis_down(seconds: float, what: str) -> str:
    """The last whole ms at or before ``seconds``: an inclusive upper bound never widened."""
    ms, exact = _whole_ms(seconds, what)
    return str(math.floor(exact) if exact != ms else ms)


def integer(value: int, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, not {value!r}")
    return str(value)


def query(**given: str | None) -> list[tuple[str, str]]:
    """The parameters that were given (None: left to the service's default)."""
    return [(k, v) for k, v in given.items() if v is not None]


def opt(fn: Callable[[Any, str], str], value: Any, what: str) -> str | None:
    return None if value is None else fn(value, what)


def as_bytes(body: bytes | str, what: str = "body") -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    raise ValueError(f"{what} must be bytes or str, not {type(body).__name__}")


def json_text(value: Any) -> bytes:
    """``value`` as the service reads and stores JSON: compact UTF-8, not escaped (its size
    limits count these bytes). Raises ValueError (a NaN, a lone surrogate: no UTF-8) or
    TypeError (not JSON) or RecursionError (too deep)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


def json_body(value: Any, what: str = "value") -> bytes:
    try:
        return json_text(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be JSON (no NaN, no sets or objects): {e}") from None


JSON = {"Content-Type": "application/json"}


# -- decoding ---------------------------------------------------------------------------------


def _message(body: Any, reply: Reply) -> str:
    if isinstance(body, dict):
        for key in ("error", "msg"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return reply.content.decode(errors="replace")[:200] or f"HTTP {reply.status}"


def _seconds(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None  # an HTTP date: the exponential wait applies
    return value if value is not None and math.isfinite(value) else None


# What a 503 of the service says (cluster_dq/service/failures.py ``outcome``, ``not_replicated``).
_SAFE = re.compile(r"repeating (it|the request) is safe")
_NOT_APPLIED = re.compile(r"refused before it ran|nothing was written")


def error_from(reply: Reply) -> DQError:
    """The error tree's exception for an error reply."""
    try:
        body = reply.json()
    except ValueError:
        body = None
    msg, status = _message(body, reply), reply.status
    if status == 400 or status in (414, 431):
        return BadRequest(msg, status, body)
    if status == 401:
        return Unauthorized(msg, status, body)
    if status == 404:
        return NotFound(msg, status, body)
    if status == 409:
        state = body.get("state") if isinstance(body, dict) else None
        if isinstance(body, dict) and "conflicts" in body:
            return LeaseLost(msg, status, body, state)
        if isinstance(body, dict) and "state" in body:
            return WrongState(msg, status, body, state)
        if isinstance(body, dict) and set(body) == {"error"}:  # no job named: a contended write
            return Contended(msg, status, body)
        return Conflict(msg, status, body, state)
    if status == 413:
        return TooLarge(msg, status, body)
    if status == 422:
        return IdempotencyMismatch(msg, status, body)
    if status == 429:
        if " is full" in msg:
            return QueueFull(msg, status, body)
        return RateLimited(msg, status, body, _seconds(reply.headers.get("retry-after")))
    if status in (502, 503, 504):
        return Unavailable(
            msg,
            status,
            body,
            safe_to_repeat=bool(_SAFE.search(msg)),
            maybe_applied=not _NOT_APPLIED.search(msg),
        )
    return DQError(msg, status, body)


def check(reply: Reply, *ok: int) -> None:
    """Raises the reply's error unless its status is one of ``ok``."""
    if reply.status not in ok:
        raise error_from(reply)


def expect(reply: Reply, *ok: int) -> Any:
    """The JSON body of a reply with one of the ``ok`` statuses; else its error."""
    check(reply, *ok)
    try:
        return reply.json()
    except ValueError:  # not the service (a proxy's page?): say so, no decoder traceback
        text = reply.content[:80].decode(errors="replace")
        raise DQError(f"the answer is not JSON: {text!r}", reply.status) from None


_ABSENT = {"no job available", "the queue is empty", "job not found", "schedule not found"}


def absent(reply: Reply) -> bool:
    """A 404 that means "nothing there" (no job, empty queue), not a missing pool or route."""
    if reply.status != 404:
        return False
    try:
        return _message(reply.json(), reply) in _ABSENT
    except ValueError:
        return False


def finish(call: Call[T], reply: Reply) -> T:
    """The call's result from its reply; an answer of an unexpected shape (not the service, or
    another version of it) is a ``DQError`` naming the call, not a decoder's traceback."""
    try:
        return call.decode(reply)
    except DQError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise DQError(
            f"unexpected answer to {call.method} {call.path}: {type(e).__name__}: {e}",
            reply.status,
        ) from e


def ms_to_s(value: Any) -> float | None:
    return None if value is None else value / 1000


# -- configuration and transport failures -----------------------------------------------------

URL_ENV, TOKEN_ENV, NAMESPACE_ENV = envvars.URL, envvars.TOKEN, envvars.NAMESPACE
ADMIN_URL_ENV, ADMIN_AUTH_ENV = envvars.ADMIN_URL, envvars.ADMIN_AUTH


def setting(given: str | None, env: Mapping[str, str], name: str, what: str) -> str:
    """An argument, else its environment variable; neither: a ValueError naming both."""
    value = given if given is not None else env.get(name)
    if not value:
        raise ValueError(f"no {what}: pass it, or set {name}")
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {value!r}")
    if what.endswith("url"):
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{what} must start with http:// or https://, not {value!r}")
        try:
            host = httpx.URL(value).host
        except httpx.InvalidURL as e:
            raise ValueError(f"{what} {value!r} is not a URL: {e}") from None
        if not host or any(c.isspace() or not c.isprintable() for c in value):
            raise ValueError(f"{what} {value!r} names no host, or has spaces")
    elif not _HEADER_SAFE.fullmatch(value):  # sent in a header: a line break would inject one
        shown = "(not shown: a secret)" if what == "token" else repr(value)
        raise ValueError(f"{what} must be printable ASCII with no spaces, not {shown}")
    return value


_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")


MAX_TIMEOUT = 30 * 86_400.0  # seconds; None for no limit


def shell_options(timeout: float | None, max_connections: int, retries: int) -> None:
    """Refuses options a shell cannot work with, naming them."""
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT  # inf or 1e12: the socket's OverflowError
    ):
        raise ValueError(
            f"timeout must be a number of seconds > 0 and <= {MAX_TIMEOUT:.0f}, or None (no "
            f"limit), not {timeout!r}"
        )
    if isinstance(max_connections, bool) or not isinstance(max_connections, int):
        raise ValueError(f"max_connections must be an integer >= 1, not {max_connections!r}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be an integer >= 1, not {max_connections!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, not {retries!r}")


def admin_auth(given: tuple[str, str] | None, env: Mapping[str, str]) -> tuple[str, str] | None:
    """Basic auth: the argument, else CLUSTER_DQ_ADMIN_AUTH as "user:password", else none."""
    if given is not None:
        return given
    raw = env.get(ADMIN_AUTH_ENV)
    if not raw:
        return None
    user, sep, password = raw.partition(":")
    if not sep or not user:
        raise ValueError(f'{ADMIN_AUTH_ENV} must be "user:password"')
    return user, password
