"""The dashboard's audit log: every change made through it (who, action, target, outcome,
when), written to the logger ``cluster_dq.audit`` and to a capped list in Redis per pool, so
that every instance shows the same log."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from cluster_dq.clock import now_ms
from cluster_dq.errors import ClusterDQError
from cluster_dq.service import Service

log = logging.getLogger("cluster_dq.audit")
CAP = 1000  # entries kept per pool
SHOWN = 200  # entries the audit page shows


@dataclass(frozen=True, slots=True)
class Entry:
    at_ms: int
    user: str
    action: str  # e.g. "job.bury", "queue.pause", "token.create"
    target: str  # e.g. "demo/orders/01M84…", "demo/orders", "token demo/01M8…"
    outcome: str  # "ok: …", "refused: …", "failed: …"
    pool: str = "default"


async def record(
    service: Service, user: str, action: str, target: str, outcome: str, pool: str = "default"
) -> Entry:
    """Logs one change and keeps it in ``pool``'s audit list. A Redis failure here loses the
    Redis copy only (the log line is written first) and never fails the action itself."""
    entry = Entry(now_ms(), user, action, target, outcome, pool)
    log.info(
        "%s %s %s: %s",
        user,
        action,
        target,
        outcome,
        extra={"user": user, "action": action, "target": target, "outcome": outcome},
    )
    try:
        await service.record_audit(pool, json.dumps(asdict(entry)), CAP)
    except ClusterDQError as e:
        log.warning("audit entry not kept in redis (pool %s): %s", pool, e)
    return entry


async def entries(service: Service, limit: int = SHOWN) -> list[Entry]:
    """The newest ``limit`` entries of every pool, newest first."""
    out: list[Entry] = []
    for raw in await service.audit_log(limit):
        try:
            out.append(Entry(**json.loads(raw)))
        except (ValueError, TypeError):
            continue  # not an entry this version wrote
    out.sort(key=lambda e: e.at_ms, reverse=True)
    return out[:limit]
