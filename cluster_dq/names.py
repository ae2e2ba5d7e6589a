"""The names a path carries (namespaces, queues, job ids, schedule names, tokens) and the
bounds of a job's attributes: what the service accepts, in one place for the service
(``http/params.py``, ``schedules.py``) and the Python client, which refuses before sending
every name the service would refuse. Each check returns why a name is refused (the service's
400 message), or None. Imports nothing but ``re``: the client imports it without the
service's dependencies.
"""

from __future__ import annotations

import re

# The queue label of a namespace's per-queue series past an instance's MetricsMaxQueues (the
# service's metrics write it; the operator's stats reads it): queue names never begin with "_".
OTHER_QUEUE = "_other"

MAX_NAME_LEN = 255  # bytes of a namespace or queue name
CLIENT_ID_MAX_LEN = 64  # a job id chosen by the client (a server-made one has 26 characters)
# \A..\Z with fullmatch: ``$`` would also match before a final newline ("q\n" passing as "q").
NAME_RE = re.compile(r"\A[-_A-Za-z0-9]+\Z")
SCHEDULE_NAME_RE = re.compile(r"\A[-_A-Za-z0-9]{1,64}\Z")
GROUP_RE = re.compile(r"\A[-_A-Za-z0-9]{1,64}\Z")  # a job's group (fair turns, per-group limits)
ROUTE_NAME_RE = re.compile(r"[-_A-Za-z0-9]{1,64}")  # a pool or ring, and a token: one grammar
# A job's attributes: at most this many, keys and values cut to these lengths (characters)
MAX_ATTRIBUTES = 16
MAX_ATTR_KEY = 32
MAX_ATTR_VALUE = 128


def namespace(ns: str) -> str | None:
    if len(ns.encode()) > MAX_NAME_LEN:
        return "namespace or queue name too long"
    if not NAME_RE.fullmatch(ns):
        return "namespace name contains forbidden characters"
    return None


def group(g: str) -> str | None:
    if not GROUP_RE.fullmatch(g):
        return "group must be 1 to 64 of A-Z a-z 0-9 - _"
    return None


def queue(q: str) -> str | None:
    """Also refused: a queue named ``_…`` (the service's own keys use such names)."""
    if len(q.encode()) > MAX_NAME_LEN:
        return "namespace or queue name too long"
    if not NAME_RE.fullmatch(q) or q.startswith("_"):
        return "queue name contains forbidden characters"
    return None


def job_id(jid: str) -> str | None:
    """A server-made id (26 characters of Crockford base32) or a client's (at most 64)."""
    if len(jid) > CLIENT_ID_MAX_LEN or not NAME_RE.fullmatch(jid):
        return "invalid job id"
    return None


def schedule(name: str) -> str | None:
    if not SCHEDULE_NAME_RE.fullmatch(name):
        return "invalid schedule name: 1-64 of [-_A-Za-z0-9]"
    return None


def token(raw: str) -> str | None:
    """``[pool:]token`` as a path carries it (the admin API's token routes)."""
    pool, sep, tok = raw.partition(":")
    if not ROUTE_NAME_RE.fullmatch(tok if sep else pool) or (
        sep and not ROUTE_NAME_RE.fullmatch(pool)
    ):
        return "invalid token: [pool:]token, each 1 to 64 characters of [-_A-Za-z0-9]"
    return None


# Deduplication on publish (``dedup_key``) and the ``Idempotency-Key`` header: docs/api.md
DEDUP_KEY_RE = re.compile(r"\A[-_.:A-Za-z0-9]{1,128}\Z")
DEDUP_MODES = ("simple", "throttle", "debounce")
MAX_DEDUP_TTL_MS = 30 * 86_400_000  # a throttle window: at most 30 days
IDEMPOTENCY_KEY_RE = re.compile(r"\A[\x21-\x7e]{1,255}\Z")  # visible ASCII, as Stripe's


def dedup_key(key: str) -> str | None:
    if not DEDUP_KEY_RE.fullmatch(key):
        return "invalid dedup_key: 1-128 of [-_.:A-Za-z0-9]"
    return None


def idempotency_key(key: str) -> str | None:
    if not IDEMPOTENCY_KEY_RE.fullmatch(key):
        return "invalid Idempotency-Key: 1-255 visible ASCII characters"
    return None
