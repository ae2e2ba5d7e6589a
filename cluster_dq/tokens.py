"""Namespace tokens and per-token rate limits, stored in Redis (the default pool).

Checks are cached per instance for ``TokenCacheSecond`` (positive and negative alike), so a
deleted token stops working on every instance within that many seconds (lmstfy caches
positive answers forever, on every instance but the one that served the DELETE).

Nobody unauthenticated can make a process grow: a token is refused by its shape before any
lookup (``[pool:]token``, each 1 to 64 characters of ``[-_A-Za-z0-9]``; server-made tokens
are 26, custom ones 20 to 64), and the answers are kept in two LRUs (valid tokens, refused
tokens) bounded in entries and bytes, so a flood of junk cannot push valid tokens out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass

from cluster_dq.clock import now_ms
from cluster_dq.engine import admin
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.errors import BadRequest, NotFound, RateLimited, RedisFailure
from cluster_dq.models import check_names
from cluster_dq.keys import AdminKeys
from cluster_dq.names import ROUTE_NAME_RE
from cluster_dq.models import encode_id

log = logging.getLogger(__name__)
MAX_DESCRIPTION = 1000  # characters of a token's description
MIN_CUSTOM_TOKEN = 20
MAX_TOKEN = 64
_PART_RE = ROUTE_NAME_RE  # a token, or the pool (ring) name before ':': one grammar
_CUSTOM_RE = re.compile(r"[-_A-Za-z0-9]{%d,%d}" % (MIN_CUSTOM_TOKEN, MAX_TOKEN))
# What one cached answer costs, beyond its three strings: the key tuple, the value tuple, the
# float and the dict slot (measured with sys.getsizeof: ~ 230 bytes on CPython 3.12).
ENTRY_OVERHEAD = 256
CACHE_ENTRIES = 10_000  # per LRU (valid answers, refusals)
CACHE_BYTES = 4 * 1024 * 1024  # per LRU
MASK_CHARS = 6  # what a page or a log line shows of a token: its first characters, then "…"


def mask(token: str) -> str:
    """A token as a page or a log line shows it: its first ``MASK_CHARS`` characters and an
    ellipsis (a server-made token's are its creation time; a ``pool:`` prefix is kept)."""
    pool, sep, bare = token.rpartition(":")
    return f"{pool}{sep}{bare[:MASK_CHARS]}…"


def reference(pool: str, ns: str, token: str) -> str:
    """An opaque name for one token (the dashboard's forms carry it instead of the token):
    the first 128 bits of a SHA-256 of pool, namespace and token."""
    return hashlib.sha256(f"cluster_dq token\0{pool}\0{ns}\0{token}".encode()).hexdigest()[:32]


def split_token(raw: str) -> tuple[str, str]:
    """lmstfy's ``pool:token``; a bare token belongs to the ``default`` pool."""
    pool, sep, token = raw.partition(":")
    return (pool, token) if sep else ("default", raw)


def custom_route(pool: str | None, token: str | None) -> tuple[str, str | None]:
    """The pool and the custom token a token creation names: the pool asked for (the admin
    API's ``pool`` parameter, the CLI's ``--pool``) and the token's own ``pool:`` prefix, which
    must agree; ``default`` when neither names one. Every creation reads them here, so the
    admin API and the CLI refuse the same requests with the same messages."""
    if token is not None and ":" in token:
        prefix, _, token = token.partition(":")
        if not prefix:
            raise BadRequest("invalid token: no pool before ':'", "token")
        if pool and pool != prefix:
            raise BadRequest("the pool and the token's pool: prefix differ", "pool")
        pool = prefix
    return pool or "default", token


def well_formed(pool: str, token: str) -> bool:
    """The shape every token this service makes or accepts has: refused before any lookup."""
    return _PART_RE.fullmatch(pool) is not None and _PART_RE.fullmatch(token) is not None


def well_formed_raw(raw: str) -> bool:
    """``[pool:]token`` as a client sends it (at most 129 characters)."""
    return len(raw) <= 2 * MAX_TOKEN + 1 and well_formed(*split_token(raw))


class _LRU:
    """Answers by key, the least recently used dropped first, bounded in entries and bytes."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.data: OrderedDict[tuple[str, str, str], tuple[bool, float]] = OrderedDict()
        self.bytes = 0

    @staticmethod
    def cost(key: tuple[str, str, str]) -> int:
        return ENTRY_OVERHEAD + sum(len(k) for k in key)

    def get(self, key: tuple[str, str, str]) -> tuple[bool, float] | None:
        hit = self.data.get(key)
        if hit is not None:
            self.data.move_to_end(key)
        return hit

    def put(self, key: tuple[str, str, str], value: tuple[bool, float]) -> None:
        if key not in self.data:
            self.bytes += self.cost(key)
        self.data[key] = value
        self.data.move_to_end(key)
        while self.data and (len(self.data) > self.max_entries or self.bytes > self.max_bytes):
            old, _ = self.data.popitem(last=False)
            self.bytes -= self.cost(old)

    def pop(self, key: tuple[str, str, str]) -> None:
        if self.data.pop(key, None) is not None:
            self.bytes -= self.cost(key)


def new_token() -> str:
    return encode_id(now_ms().to_bytes(6, "big") + os.urandom(10))


MAX_LIMIT = 2**31 - 1  # requests per window (a Redis counter; any real limit is far below)
MAX_INTERVAL = 86_400 * 30  # seconds: PEXPIRE of a longer window may fail after INCR


@dataclass(frozen=True, slots=True)
class Limit:
    read: int
    write: int
    interval: int  # seconds

    def as_json(self) -> dict[str, int]:
        return {"read": self.read, "write": self.write, "interval": self.interval}

    @classmethod
    def parse(cls, data: object) -> Limit:
        """A limit from JSON: each field a JSON integer in its range, else a 400 naming it
        (``1e309`` is a float, infinite; ``true`` is not a number)."""
        if not isinstance(data, dict):
            raise BadRequest('invalid limit body: {"read","write","interval"}', "limit")
        values = {}
        for name, low, high in (
            ("read", 0, MAX_LIMIT),
            ("write", 0, MAX_LIMIT),
            ("interval", 1, MAX_INTERVAL),
        ):
            v = data.get(name, 0)
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
                raise BadRequest(f"invalid limit: {name} must be an integer {low}..{high}", name)
            values[name] = v
        if values["read"] == 0 and values["write"] == 0:
            raise BadRequest("invalid limit: read and write must not both be 0", "read")
        return cls(**values)


# controls, lone surrogates, line and paragraph breaks, and format characters (text direction
# marks and overrides, zero-width spaces, a BOM), but the joiners emoji sequences use
_NOT_TEXT = ("Cc", "Cs", "Zl", "Zp", "Cf")
_JOINERS = frozenset("\u200c\u200d")


def check_description(text: str) -> None:
    """A token's description: one line of text, 1 to ``MAX_DESCRIPTION`` characters, not
    only spaces (it is listed by the admin API, the dashboard and the CLI)."""
    if not text:
        raise BadRequest("invalid description", "description")
    if len(text) > MAX_DESCRIPTION:
        raise BadRequest(
            f"invalid description: too long (max {MAX_DESCRIPTION} characters)", "description"
        )
    if any(unicodedata.category(c) in _NOT_TEXT and c not in _JOINERS for c in text):
        raise BadRequest("invalid description: a control character", "description")
    if all(c.isspace() or c in _JOINERS for c in text):
        raise BadRequest("invalid description: nothing but spaces", "description")


class TokenStore:
    def __init__(
        self,
        engine: AsyncEngine,
        cache_seconds: float = 2.0,
        routes: Container[str] = ("default",),
        max_entries: int = 2 * CACHE_ENTRIES,
        max_bytes: int = 2 * CACHE_BYTES,
    ) -> None:
        """``max_entries``/``max_bytes`` bound the whole cache; half goes to valid tokens and
        half to refusals, so refusals never evict a valid token. ``routes``: the names a
        token may carry before its ':' (the pools and rings)."""
        self.engine = engine
        self.routes = routes
        self.cache_seconds = cache_seconds
        self._good = _LRU(max_entries - max_entries // 2, max_bytes - max_bytes // 2)
        self._bad = _LRU(max_entries // 2, max_bytes // 2)
        self._limits: dict[str, Limit] = {}
        self._limits_at = 0.0

    def _check(self, pool: str, ns: str) -> None:
        """The namespace and the pool (or ring) a token command names, refused as the admin
        API refuses them: the one check of every caller (admin API, dashboard, CLI)."""
        check_names(ns)
        if pool not in self.routes:
            raise BadRequest("the pool was not exists", "pool")

    async def create(self, pool: str | None, ns: str, description: str, token: str | None) -> str:
        """A new token of ``ns``, custom or made here (``custom_route``: a ``pool:`` prefix of
        ``token`` names its pool); the bare token."""
        check_names(ns)  # first, as the admin API checks it before reading the request's form
        pool, token = custom_route(pool, token)
        self._check(pool, ns)
        check_description(description)
        if token is None:
            token = new_token()
        elif len(token) < MIN_CUSTOM_TOKEN:
            raise BadRequest("the user token was too short", "token")
        elif not _CUSTOM_RE.fullmatch(token):
            raise BadRequest(
                f"invalid token: {MIN_CUSTOM_TOKEN} to {MAX_TOKEN} characters of [-_A-Za-z0-9]",
                "token",
            )
        if not await self.engine.run(admin.add_token(pool, ns, token, description)):
            raise BadRequest("the token has already existed", "token")
        return token

    async def list(self, pool: str, ns: str) -> dict[str, str]:
        self._check(pool, ns)
        return await self.engine.run(admin.tokens(pool, ns))

    async def by_reference(self, pool: str, ns: str, ref: str) -> str:
        """The token of ``ns`` whose ``reference`` is ``ref`` (NotFound: none)."""
        for token in await self.list(pool, ns):
            if reference(pool, ns, token) == ref:
                return token
        raise NotFound("token not found")

    async def delete(self, pool: str, ns: str, token: str) -> bool:
        """False when there was no such token (nothing changed)."""
        self._check(pool, ns)
        existed = await self.engine.run(admin.delete_token(pool, ns, token))
        self._good.pop((pool, ns, token))
        self._bad.pop((pool, ns, token))
        return existed

    def cache_size(self) -> tuple[int, int]:
        """(entries, estimated bytes) the validity cache holds."""
        return len(self._good.data) + len(self._bad.data), self._good.bytes + self._bad.bytes

    def cached(self, pool: str, ns: str, token: str) -> bool | None:
        """The answer of the cache while it is fresh (None: ask ``valid``); no await, no
        Redis: the path nearly every request takes."""
        key = (pool, ns, token)
        hit = self._good.get(key) or self._bad.get(key)
        return hit[0] if hit and hit[1] > time.monotonic() else None

    async def valid(self, pool: str, ns: str, token: str) -> bool:
        if not well_formed(pool, token):
            return False  # no lookup, nothing remembered: junk costs nothing
        key = (pool, ns, token)
        hit = self._good.get(key) or self._bad.get(key)
        now = time.monotonic()
        if hit and hit[1] > now:
            return hit[0]
        # With an answer to fall back on, one quick look: an outage does not spend the
        # request's retry budget here (the request's own steps need it).
        quick = time.monotonic() if hit else None
        try:
            ok = await self.engine.run(admin.token_exists(pool, ns, token), deadline=quick)
        except RedisFailure:
            if hit:  # Redis failing over: the last answer stands until it is back (never a 503)
                return hit[0]
            raise
        (self._good if ok else self._bad).put(key, (ok, now + self.cache_seconds))
        (self._bad if ok else self._good).pop(key)
        return ok

    # -- rate limits ------------------------------------------------------------------------

    async def limits(self, force: bool = False) -> dict[str, Limit]:
        now = time.monotonic()
        if force or now - self._limits_at > self.cache_seconds:
            try:  # (as in ``valid``: with known limits to fall back on, one quick look)
                quick = None if force else time.monotonic()
                raw = await self.engine.run(admin.limits(), deadline=quick)
            except RedisFailure:
                if force:
                    raise
                return self._limits  # Redis failing over: the last known limits stand
            fresh = {}
            for k, v in raw.items():
                try:  # one bad record (written by hand or by an older version) spoils no other
                    fresh[k] = Limit.parse(json.loads(v))
                except (ValueError, BadRequest) as e:
                    where, _, token = k.rpartition("/")
                    log.warning("rate limit %s/%s ignored: %s", where, mask(token), e)
            self._limits, self._limits_at = fresh, now
        return self._limits

    async def get_limit(self, pool: str, ns: str, token: str) -> Limit:
        raw = await self.engine.run(admin.limit(pool, ns, token))
        if raw is None:
            raise NotFound("limit not found")
        d = json.loads(raw)
        return Limit(int(d["read"]), int(d["write"]), int(d["interval"]))

    async def set_limit(self, pool: str, ns: str, token: str, limit: Limit, create: bool) -> None:
        self._check(pool, ns)  # a limit stored for a pool that does not exist could never apply
        limit = Limit.parse(limit.as_json())  # the same bounds for every caller (admin API, CLI)
        blob = json.dumps(limit.as_json())
        if not await self.engine.run(admin.set_limit(pool, ns, token, blob, create)):
            raise BadRequest("the limit already exists", "limit")
        self._limits_at = 0.0

    async def delete_limit(self, pool: str, ns: str, token: str) -> None:
        await self.engine.run(admin.delete_limit(pool, ns, token))
        self._limits_at = 0.0

    async def limits_writes(self, pool: str, ns: str, token: str) -> bool:
        """Whether the token's writes are limited (a limit with ``write`` above 0)."""
        limit = (await self.limits()).get(f"{pool}/{ns}/{token}")
        return limit is not None and limit.write > 0

    async def take(self, pool: str, ns: str, token: str, write: bool) -> float | None:
        """Counts one request against the token's limit. When a unit was taken: until when
        (``time.monotonic()``) it may be given back (``refund``), the end of the window that
        counted it at the earliest; None when nothing was taken."""
        limit = (await self.limits()).get(f"{pool}/{ns}/{token}")
        per = (limit.write if write else limit.read) if limit else 0
        if not limit or per <= 0:
            return None
        kind = "w" if write else "r"
        key = AdminKeys.counter(pool, ns, token, kind)
        asked = time.monotonic()
        left_ms = await self.engine.run(ops.rate_limit(key, per, limit.interval * 1000))
        if not left_ms:
            action = "produce" if write else "consume"
            raise RateLimited(f"token({token}) {action} reach the limit rate, please retry later")
        return asked + left_ms / 1000

    async def refund(self, pool: str, ns: str, token: str, write: bool, until: float) -> None:
        """Gives back a unit ``take`` took, if its window is not over (``until``): a unit given
        to a later window would let requests held open across windows write past the limit."""
        if time.monotonic() >= until:
            return
        key = AdminKeys.counter(pool, ns, token, "w" if write else "r")
        try:
            await self.engine.run(ops.rate_limit(key, 0, 0, refund=True))
        except RedisFailure as e:  # the request's own answer matters more
            log.warning("rate limit refund failed: %s", e)
