"""Who is running what: workers announce themselves (``cluster_dq/workers.py``), and the
namespace's announcements are listed. They live with the reserved queue ``_workers`` of the
namespace: its write pool takes them, and a listing reads every pool it may be in."""

from __future__ import annotations

from typing import Any

from cluster_dq.engine import workers as workers_ops
from cluster_dq.errors import RateLimited
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service.core import ServiceCore
from cluster_dq.workers import LISTING_BYTES, MAX_WORKERS, WORKERS_QUEUE, listed, stored


class Workers(ServiceCore):
    async def announce_worker(
        self,
        route: PoolRoute[RedisPool],
        ns: str,
        worker_id: str,
        info: dict[str, Any],
        ttl_ms: int,
    ) -> int:
        """Keeps a worker's announcement (checked: ``workers.parse_announcement``) for
        ``ttl_ms``, its last-seen time now; when it runs out (ms). Safe to repeat."""
        pool = route.place(ns, WORKERS_QUEUE).write
        now = pool.engine.clock()
        blob = stored({**info, "last_seen_ms": now})
        op = workers_ops.announce(ns, worker_id, blob, now, ttl_ms, MAX_WORKERS)
        if not await self._run(pool, op, idempotent=True):
            raise RateLimited(
                f"namespace {ns} has {MAX_WORKERS} workers announced: nothing was written"
            )
        return now + ttl_ms

    async def list_workers(
        self, route: PoolRoute[RedisPool], ns: str
    ) -> tuple[list[dict[str, Any]], bool]:
        """The namespace's workers announced and not run out, by id; and whether the listing
        stopped at ``LISTING_BYTES`` with some left unread."""
        found: dict[str, dict[str, Any]] = {}
        truncated = False
        budget = LISTING_BYTES  # over every pool the registry may be in
        for pool in route.place(ns, WORKERS_QUEUE).reads:
            op = workers_ops.workers(ns, pool.engine.clock(), MAX_WORKERS, budget)
            got, cut = await self._run(pool, op, idempotent=True)
            truncated = truncated or cut
            budget -= sum(len(blob) for _, _, blob in got)
            for worker_id, expires, blob in got:
                seen = found.get(worker_id)
                if seen is None or seen["expires_ms"] < expires:
                    found[worker_id] = listed(worker_id, expires, blob)
        return [found[k] for k in sorted(found)], truncated

    async def retire_worker(self, route: PoolRoute[RedisPool], ns: str, worker_id: str) -> bool:
        """A worker that stops: its announcement goes at once. False: none was there."""
        gone = False
        for pool in route.place(ns, WORKERS_QUEUE).reads:
            gone = await self._run(pool, workers_ops.retire(ns, worker_id), idempotent=True) or gone
        return gone
