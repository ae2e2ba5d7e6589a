"""A token's rate limit on the data port (lmstfy's fixed-window throttle): which requests it
counts, and when a counted request is given back. The rule and why: docs/api.md#rate-limits."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from cluster_dq.errors import PoolUnavailable, WriteLimited
from cluster_dq.http import params
from cluster_dq.service import Service, nothing_written
from cluster_dq.tokens import split_token

Handler = Callable[[Request], Awaitable[Response]]


def token_of(request: Request) -> tuple[str, str]:
    """(pool, token) the request carries, as the throttle keys them ('' when none)."""
    return split_token(params.token(request) or "")


class Throttle:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def run(
        self,
        request: Request,
        ns: str,
        write: bool,
        handler: Callable[[], Awaitable[Response]],
    ) -> Response:
        """Count the request, refund it unless it succeeded (2xx), or failed having maybe
        changed something (a 503 that does not say nothing was written)."""
        pool_name, token = token_of(request)
        taken = await self.service.take_rate(pool_name, ns, token, write)
        response: Response | None = None
        applied = False  # a failure after which the request may have been applied
        try:
            response = await handler()
            return response
        except PoolUnavailable as e:
            applied = not nothing_written(e)
            raise
        finally:
            if (
                taken is not None
                and not applied
                and (response is None or not 200 <= response.status_code < 300)
            ):
                await self.service.refund_rate(pool_name, ns, token, write, taken)

    def writes(self, handler: Handler, leased_is_free: bool = False) -> Handler:
        """The route counted as a write against its token's limit, as a publish is (its GET
        and HEAD, which only read, are not). Every verb that changes a queue is a write but
        finishing a delivery (ack, release, touch, progress; with ``leased_is_free``, the
        route given the delivery's lease)."""

        @functools.wraps(handler)
        async def counted(request: Request) -> Response:
            if request.method in ("GET", "HEAD") or (
                leased_is_free and params.early(request, "lease")
            ):
                return await handler(request)
            ns = request.path_params["ns"]
            return await self.run(request, ns, True, lambda: handler(request))

        return counted

    async def refuse_write_limited(self, request: Request, ns: str) -> None:
        """A token with a write limit may not start a schedule: its firings would publish
        without asking the limit."""
        pool_name, token = token_of(request)
        if await self.service.limits_writes(pool_name, ns, token):
            raise WriteLimited(
                f"token({token}) has a write limit: a schedule would publish past it; "
                "ask an operator (a token without a write limit) to create or resume it"
            )
