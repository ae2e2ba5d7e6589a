"""Cross-site requests: the one decision the admin API and the dashboard share.

A page on any origin can make a browser send a POST (a form, or ``fetch`` in ``no-cors``
mode) with the credentials the browser holds for the admin port, as long as the request is
"simple": its content type one a form can send, or none. Anything else (another method, a
JSON body, a custom header) needs a CORS preflight first, which this server never answers, so
the browser never sends it. A browser says where such a request comes from in ``Origin`` (or,
in older browsers and a few cases, only in ``Referer``); curl and the clients send neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

STATE_CHANGING = frozenset({"POST", "PUT", "DELETE", "PATCH"})
# The content types a page on another origin can send without a preflight
# (https://fetch.spec.whatwg.org/#cors-safelisted-request-header).
SIMPLE_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _where(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, the default port filled in; None: unreadable."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # a bad port, a bad IPv6 literal
        return None
    if not parts.hostname or port is None or parts.username is not None:
        return None
    return scheme, parts.hostname.lower(), port


def foreign(headers: Mapping[str, str]) -> str | None:
    """Why the request comes from a page of another origin than this server: its ``Origin``
    (or, with none, its ``Referer``) is not the scheme://host:port the request was sent to
    (its ``Host``, which the Host allowlist vouches for). None: the same origin, or no page at
    all (neither header: curl, the clients, a worker)."""
    origin = headers.get("origin")
    what, value = ("Origin", origin) if origin is not None else ("Referer", headers.get("referer"))
    if value is None:
        return None
    parts = urlsplit(value.strip()) if value.strip().lower() != "null" else None
    host = headers.get("host", "")
    if parts is not None and parts.scheme in _DEFAULT_PORTS:
        theirs = _where(parts.scheme, parts.netloc)
        if theirs is not None and theirs == _where(parts.scheme, host):
            return None
    return f"{what} is not this server"


def needs_preflight(headers: Mapping[str, str]) -> bool:
    """A browser sends this request from another origin only after a CORS preflight: its
    content type is none a form can send. (No content type: a bodiless ``fetch`` sends none.)"""
    raw = headers.get("content-type")
    return raw is not None and raw.split(";", 1)[0].strip().lower() not in SIMPLE_TYPES


def cross_site(method: str, headers: Mapping[str, str]) -> str | None:
    """Why a request is refused as one a page on another site could have made its visitor's
    browser send: state-changing, with no preflight, from a foreign origin. None: allowed."""
    if method.upper() not in STATE_CHANGING or needs_preflight(headers):
        return None
    return foreign(headers)
