"""Tokens as a use case: a request's token checked for its namespace (``authorize``), the
rate limits it is held to, and the admin API's and the dashboard's management of tokens and
limits. Nothing above the service reaches the token store itself."""

from __future__ import annotations


from cluster_dq.errors import (
    Unauthorized,
)
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.tokens import split_token, well_formed
from cluster_dq.waiters import Look as Look  # (the HTTP layer shares one between two calls)
from cluster_dq.service.core import ServiceCore
from cluster_dq.service.failures import unavailable


class Tokens(ServiceCore):
    async def authorize(self, raw_token: str | None, ns: str) -> PoolRoute[RedisPool]:
        """``name:token`` or a bare token (``default``) -> the route the name stands for (a pool,
        a migrating pool or a ring), if the token is valid for that namespace."""
        if not raw_token:
            raise Unauthorized("token not found")
        name, token = split_token(raw_token)
        route = self.route(name)
        ok = self.tokens.cached(name, ns, token) if well_formed(name, token) else False
        if ok is None:
            with unavailable("default", unknown=None, what="token store: "):
                ok = await self.tokens.valid(name, ns, token)
        if not ok:
            raise Unauthorized("invalid token")
        return route
