"""What every data-port route asks before it acts: the token (is it good for this namespace, on
which pool) and its rate limit (``http/throttle.py``). One ``Guard`` per data app, shared by
every handler group (``Handlers``); and what a guarded route may answer, for the document."""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from cluster_dq.errors import Unauthorized
from cluster_dq.http import params
from cluster_dq.http.openapi import E400, E401, E404_POOL, E503, Schema
from cluster_dq.http.throttle import Throttle
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service import Service
from cluster_dq.settings import Settings
from cluster_dq.tokens import well_formed_raw

# The document's security schemes: the token in a header or the query (``Guard.auth``).
TOKEN = {
    "token": {"type": "apiKey", "in": "header", "name": "X-Token", "description": "[pool:]token"},
    "tokenQuery": {"type": "apiKey", "in": "query", "name": "token", "description": "[pool:]token"},
}
# What any guarded route may answer: a bad name, a bad token, an unknown pool, Redis down.
GUARDED: dict[int, Schema] = {400: E400, 401: E401, 404: E404_POOL, 503: E503}


class Guard:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.throttle = Throttle(service)
        self.write = self.throttle.writes  # a route counted against the token's write limit

    async def auth(
        self, request: Request, ns: str, q: str | None = None, takes: params.Keys = params.NO_KEYS
    ) -> PoolRoute[RedisPool]:
        """The pool the request's token routes ``ns`` to, names checked first; else 400, 401
        or 404 (an unknown pool). A publish's keys the route does not ``take`` (a dedup key,
        an Idempotency-Key) are a 400 naming them, not ignored."""
        route = await self.route(request, ns, q)
        params.refuse_keys(request, takes)
        return route

    async def route(self, request: Request, ns: str, q: str | None = None) -> PoolRoute[RedisPool]:
        """``auth`` without the publish keys' check: names, then the token."""
        params.check_names(ns, q)
        token = params.token(request)
        if token and not well_formed_raw(token):
            raise Unauthorized("invalid token")  # by its shape: no lookup, nothing cached
        return await self.service.authorize(token, ns)


class Handlers:
    """A group of data-port handlers: the service, the settings and the one guard. The guard's
    bound methods are kept here, so a request pays no extra lookup for them."""

    def __init__(self, service: Service, settings: Settings, guard: Guard) -> None:
        self.service = service
        self.s = settings
        self.auth = guard.auth
        self.throttle = guard.throttle
        self.write = guard.write

    def routes(self) -> list[Route]:
        """The group's routes, each handler wrapped as the token's limit counts it."""
        raise NotImplementedError
