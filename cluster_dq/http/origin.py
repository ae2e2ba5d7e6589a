"""Cross-site requests: the one decision the admin API and the dashboard share.

A page on any origin can make a browser send a POST (a form, ``fetch`` in ``no-cors`` mode)
with the credentials the browser holds for the admin port. The content type proves nothing:
besides the three a form can send, the browser sends POSTs of its own to a URL the page names
with types no page could set (a link's ``ping``: ``text/ping``; a CSP violation report:
``application/csp-report``), all without a preflight. A browser says where a POST comes from
in ``Origin`` (or, in older browsers and a few cases, only in ``Referer``); curl and the
clients send neither. So a state-changing request with a foreign one is refused, whatever its
content type (a page that sent JSON after a preflight would be refused too: this server
answers no preflight, so no browser sends one).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

STATE_CHANGING = frozenset({"POST", "PUT", "DELETE", "PATCH"})
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


def cross_site(method: str, headers: Mapping[str, str]) -> str | None:
    """Why a request is refused as one a page on another site could have made its visitor's
    browser send: state-changing, from a foreign origin (whatever its content type: see
    above). None: allowed."""
    if method.upper() not in STATE_CHANGING:
        return None
    return foreign(headers)
