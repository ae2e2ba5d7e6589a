"""Namespace tokens and per-token rate limits, stored in Redis (the default pool).

Checks are cached per instance for ``TokenCacheSecond`` (positive and negative alike), so a
deleted token stops working on every instance within that many seconds (lmstfy caches
positive answers forever, on every instance but the one that served the DELETE).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

from redis.exceptions import RedisError

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine, transport_safe
from cluster_dq.errors import BadRequest, NotFound, RateLimited
from cluster_dq.keys import AdminKeys
from cluster_dq.models import encode_id

log = logging.getLogger(__name__)
MIN_CUSTOM_TOKEN = 20


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def split_token(raw: str) -> tuple[str, str]:
    """lmstfy's ``pool:token``; a bare token belongs to the ``default`` pool."""
    pool, sep, token = raw.partition(":")
    return (pool, token) if sep else ("default", raw)


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
        for name, low, high in (("read", 0, MAX_LIMIT), ("write", 0, MAX_LIMIT), ("interval", 1, MAX_INTERVAL)):
            v = data.get(name, 0)
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
                raise BadRequest(f"invalid limit: {name} must be an integer {low}..{high}", name)
            values[name] = v
        if values["read"] == 0 and values["write"] == 0:
            raise BadRequest("invalid limit: read and write must not both be 0", "read")
        return cls(**values)


class TokenStore:
    def __init__(self, engine: AsyncEngine, cache_seconds: float = 2.0) -> None:
        self.engine = engine
        self.client = engine.client
        self.cache_seconds = cache_seconds
        self._valid: dict[tuple[str, str, str], tuple[bool, float]] = {}
        self._limits: dict[str, Limit] = {}
        self._limits_at = 0.0

    async def create(self, pool: str, ns: str, description: str, token: str | None) -> str:
        if token is None:
            token = new_token()
        elif len(token) < MIN_CUSTOM_TOKEN:
            raise BadRequest("the user token was too short", "token")
        if not await transport_safe(self.client.hsetnx(AdminKeys.tokens(pool, ns), token, description)):
            raise BadRequest("the token has already existed", "token")
        return token

    async def list(self, pool: str, ns: str) -> dict[str, str]:
        raw = await transport_safe(self.client.hgetall(AdminKeys.tokens(pool, ns)))
        return {_text(k): _text(v) for k, v in raw.items()}

    async def delete(self, pool: str, ns: str, token: str) -> None:
        await transport_safe(self.client.hdel(AdminKeys.tokens(pool, ns), token))
        await transport_safe(self.client.hdel(AdminKeys.limits(), f"{pool}/{ns}/{token}"))
        self._valid.pop((pool, ns, token), None)

    async def valid(self, pool: str, ns: str, token: str) -> bool:
        key = (pool, ns, token)
        hit = self._valid.get(key)
        now = time.monotonic()
        if hit and hit[1] > now:
            return hit[0]
        try:
            ok = bool(await transport_safe(self.client.hexists(AdminKeys.tokens(pool, ns), token)))
        except (RedisError, OSError):
            if hit:  # Redis failing over: the last answer stands until it is back (never a 503)
                return hit[0]
            raise
        if len(self._valid) > 100_000:
            self._valid.clear()
        self._valid[key] = (ok, now + self.cache_seconds)
        return ok

    # -- rate limits ------------------------------------------------------------------------

    async def limits(self, force: bool = False) -> dict[str, Limit]:
        now = time.monotonic()
        if force or now - self._limits_at > self.cache_seconds:
            try:
                raw = await transport_safe(self.client.hgetall(AdminKeys.limits()))
            except (RedisError, OSError):
                if force:
                    raise
                return self._limits  # Redis failing over: the last known limits stand
            fresh = {}
            for k, v in raw.items():
                try:  # one bad record (written by hand or by an older version) spoils no other
                    fresh[_text(k)] = Limit.parse(json.loads(v))
                except (ValueError, BadRequest) as e:
                    log.warning("rate limit %s ignored: %s", _text(k), e)
            self._limits, self._limits_at = fresh, now
        return self._limits

    async def get_limit(self, pool: str, ns: str, token: str) -> Limit:
        raw = await transport_safe(self.client.hget(AdminKeys.limits(), f"{pool}/{ns}/{token}"))
        if raw is None:
            raise NotFound("limit not found")
        d = json.loads(raw)
        return Limit(int(d["read"]), int(d["write"]), int(d["interval"]))

    async def set_limit(self, pool: str, ns: str, token: str, limit: Limit, create: bool) -> None:
        limit = Limit.parse(limit.as_json())  # the same bounds for every caller (admin API, CLI)
        blob = json.dumps(limit.as_json())
        key, field = AdminKeys.limits(), f"{pool}/{ns}/{token}"
        if create:
            if not await transport_safe(self.client.hsetnx(key, field, blob)):
                raise BadRequest("the limit already exists", "limit")
        else:
            await transport_safe(self.client.hset(key, field, blob))
        self._limits_at = 0.0

    async def delete_limit(self, pool: str, ns: str, token: str) -> None:
        await transport_safe(self.client.hdel(AdminKeys.limits(), f"{pool}/{ns}/{token}"))
        self._limits_at = 0.0

    async def take(self, pool: str, ns: str, token: str, write: bool) -> bool:
        """Counts one request against the token's limit; True when a unit was taken."""
        limit = (await self.limits()).get(f"{pool}/{ns}/{token}")
        per = (limit.write if write else limit.read) if limit else 0
        if not limit or per <= 0:
            return False
        kind = "w" if write else "r"
        key = AdminKeys.counter(pool, ns, token, kind)
        if not await self.engine.run(ops.rate_limit(key, per, limit.interval * 1000)):
            action = "produce" if write else "consume"
            raise RateLimited(f"token({token}) {action} reach the limit rate, please retry later")
        return True

    async def refund(self, pool: str, ns: str, token: str, write: bool) -> None:
        key = AdminKeys.counter(pool, ns, token, "w" if write else "r")
        try:
            await self.engine.run(ops.rate_limit(key, 0, 0, refund=True))
        except (RedisError, OSError) as e:  # the request's own answer matters more
            log.warning("rate limit refund failed: %s", e)
