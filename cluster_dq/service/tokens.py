"""Tokens as a use case: a request's token checked for its namespace (``authorize``), the
rate limits it is held to, and the admin API's and the dashboard's management of tokens and
limits. Nothing above the service reaches the token store itself."""

from __future__ import annotations

from cluster_dq.errors import Unauthorized
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service.core import ServiceCore
from cluster_dq.service.failures import unavailable
from cluster_dq.tokens import Limit, split_token, well_formed


class Tokens(ServiceCore):
    async def authorize(self, raw_token: str | None, ns: str) -> PoolRoute[RedisPool]:
        """``name:token`` or a bare token (``default``) -> the route the name stands for (a pool,
        a migrating pool or a ring), if the token is valid for that namespace."""
        if not raw_token:
            raise Unauthorized("token not found")
        name, token = split_token(raw_token)
        route = self.route(name)
        ok = self._tokens.cached(name, ns, token) if well_formed(name, token) else False
        if ok is None:
            with unavailable("default", unknown=None, what="token store: "):
                ok = await self._tokens.valid(name, ns, token)
        if not ok:
            raise Unauthorized("invalid token")
        return route

    # -- a request's rate limit (the HTTP guard) ---------------------------------------------

    async def take_rate(self, pool: str, ns: str, token: str, write: bool) -> float | None:
        """Counts one request against the token's limit (``RateLimited`` when used up); until
        when the unit may be given back (``refund_rate``), None when nothing was taken."""
        return await self._tokens.take(pool, ns, token, write)

    async def refund_rate(self, pool: str, ns: str, token: str, write: bool, until: float) -> None:
        await self._tokens.refund(pool, ns, token, write, until)

    async def limits_writes(self, pool: str, ns: str, token: str) -> bool:
        """Whether the token's writes are limited (a limit with ``write`` above 0)."""
        return await self._tokens.limits_writes(pool, ns, token)

    # -- managing tokens and limits (the admin API, the dashboard) ---------------------------

    def token_pools(self) -> list[str]:
        """What a token may name before its ':': the pools and rings."""
        return sorted(self.routes)

    async def create_token(
        self, pool: str | None, ns: str, description: str, token: str | None = None
    ) -> str:
        """A new token, bare (``TokenStore.create``: a ``pool:`` prefix of ``token`` counts)."""
        return await self._tokens.create(pool, ns, description, token)

    async def list_tokens(self, pool: str, ns: str) -> dict[str, str]:
        """The namespace's tokens with their descriptions."""
        return await self._tokens.list(pool, ns)

    async def token_by_reference(self, pool: str, ns: str, ref: str) -> str:
        """The token of ``ns`` whose ``tokens.reference`` is ``ref`` (NotFound: none)."""
        return await self._tokens.by_reference(pool, ns, ref)

    async def token_exists(self, pool: str, ns: str, token: str) -> bool:
        return await self._tokens.valid(pool, ns, token)

    async def delete_token(self, pool: str, ns: str, token: str) -> bool:
        """False when there was no such token (nothing changed)."""
        return await self._tokens.delete(pool, ns, token)

    async def token_limits(self, force: bool = False) -> dict[str, Limit]:
        """Every token's rate limit by ``pool/ns/token``; ``force``: read now, not cached."""
        return await self._tokens.limits(force)

    async def token_limit(self, pool: str, ns: str, token: str) -> Limit:
        return await self._tokens.get_limit(pool, ns, token)

    async def set_token_limit(
        self, pool: str, ns: str, token: str, limit: Limit, create: bool
    ) -> None:
        await self._tokens.set_limit(pool, ns, token, limit, create)

    async def delete_token_limit(self, pool: str, ns: str, token: str) -> None:
        await self._tokens.delete_limit(pool, ns, token)
