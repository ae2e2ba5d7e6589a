"""The ``Host`` allowlist of both ports (``AllowedHosts``), against DNS rebinding: a page on
``http://rebind.attacker.example:7778`` whose name the attacker then points at 127.0.0.1 is
same-origin with the admin port for the browser, but its requests say ``Host:
rebind.attacker.example``; refused before any routing, they reach neither the admin API, the
dashboard (whose CSRF check compares ``Origin`` with a ``Host`` that passed here) nor the
data routes, hot paths included (``http/protocol.py`` checks every request head).

Entries: a name or address (any port), ``name:port`` (that port only), ``[v6addr]``,
``*.example.com`` (any name under it), or ``*`` (any host: no check)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from cluster_dq.settings import Settings

LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_LISTEN = ("", "0.0.0.0", "::", "[::]")
_PORT_RE = re.compile(rb"[0-9]{1,5}")
MAX_SEEN = 1024  # permitted Host values remembered as sent, per worker


def bracketed(host: str) -> str:
    """A listen address as a ``Host`` header names it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def effective(settings: Settings) -> tuple[str, ...]:
    """``AllowedHosts`` when set; else the loopback names and the configured listen hosts
    that are not wildcard addresses."""
    if settings.AllowedHosts:
        return tuple(h.lower() for h in settings.AllowedHosts)
    out = list(LOOPBACK)
    for listen in (settings.Host, settings.AdminHost):
        name = bracketed(listen.lower())
        if listen not in WILDCARD_LISTEN and name not in out:
            out.append(name)
    return tuple(out)


def start_warning(settings: Settings) -> str | None:
    """What to tell an operator whose port listens on every address while the list is the
    default: clients that use the machine's name or address are refused until it is set."""
    if settings.AllowedHosts:
        return None
    wild = [k for k in ("Host", "AdminHost") if getattr(settings, k) in WILDCARD_LISTEN]
    if not wild:
        return None
    return (
        f"{' and '.join(wild)} listen on every address but AllowedHosts is not set: only "
        f"requests naming {', '.join(effective(settings))} are served (else 400); list the "
        "names clients use (a load balancer's name) in AllowedHosts"
    )


class AllowedHosts:
    """``permits(host)``: one set lookup for a value permitted before, as sent."""

    def __init__(self, entries: Iterable[str]) -> None:
        entries = [e.lower() for e in entries]
        self.any = "*" in entries
        self.names = {
            e.rstrip(".").encode() for e in entries if not _has_port(e) and not e.startswith("*.")
        }
        self.with_port = {e.encode() for e in entries if _has_port(e)}
        self.suffixes = tuple(e[1:].encode() for e in entries if e.startswith("*."))
        self.seen: set[bytes] = set()  # raw values permitted so far (refusals are not kept)

    def permits(self, host: bytes | None) -> bool:
        """``host``: the request's ``Host`` header (None: there was none)."""
        if self.any:
            return True
        if host is None:
            return False
        if host in self.seen:  # a value permitted before, as sent: the usual case
            return True
        if self._permits(host):
            if len(self.seen) < MAX_SEEN:
                self.seen.add(host)
            return True
        return False

    def _permits(self, host: bytes) -> bool:
        host = host.lower()
        if host.startswith(b"["):
            end = host.find(b"]") + 1
            name, port = host[:end], host[end + 1 :] if host[end : end + 1] == b":" else b""
            if not end or len(host) > end and not port:
                return False
        else:
            name, _, port = host.partition(b":")
        if port and not _PORT_RE.fullmatch(port):
            return False
        if name.endswith(b"."):  # the fully qualified form of the same name
            name = name[:-1]
        return (
            name in self.names
            or (bool(port) and host in self.with_port)
            or (bool(self.suffixes) and name.endswith(self.suffixes))
        )


def _has_port(entry: str) -> bool:
    return entry.rpartition("]")[2].count(":") == 1 if entry.startswith("[") else ":" in entry
