"""Job lifecycle events, for analysis (``cluster-dq pipeline analyze``), when
``LifecycleDir`` is set: one JSON line per event in ``<LifecycleDir>/events-<host>-<pid>.jsonl``,
written in batches (at most every second, or every 1,000 events) by each worker process.

Events: ``published`` (id, due), ``delivered`` (id, due, n = delivery number), ``acked`` (id),
and, counted inside the Lua scripts and so without ids, ``ttr_expired``, ``dead_lettered``,
``ttl_expired`` and ``respawned`` (n = how many). ``t`` is the service's clock in ms.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from cluster_dq.models import Job, id_due_ms, id_to_member, is_wheel_member


class LifecycleLog:
    def __init__(
        self, directory: str | Path, flush_every_s: float = 1.0, flush_at: int = 1_000
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"events-{socket.gethostname()}-{os.getpid()}.jsonl"
        self._buffer: list[str] = []
        self._flushed = time.monotonic()
        self.flush_every_s = flush_every_s
        self.flush_at = flush_at

    def record(self, event: str, ns: str, q: str, t: int, **fields: Any) -> None:
        self._buffer.append(
            json.dumps({"ev": event, "ns": ns, "q": q, "t": t, **fields}, separators=(",", ":"))
        )
        if (
            len(self._buffer) >= self.flush_at
            or time.monotonic() - self._flushed >= self.flush_every_s
        ):
            self.flush()

    def published(self, ns: str, q: str, t: int, job_ids: list[str]) -> None:
        for jid in job_ids:
            self.record("published", ns, q, t, id=jid, due=_due(jid))

    def delivered(self, jobs: list[Job], t: int) -> None:
        for j in jobs:
            self.record(
                "delivered",
                j.namespace,
                j.queue,
                t,
                id=j.job_id,
                due=j.scheduled_ms,
                n=j.deliveries,
            )

    def acked(self, ns: str, q: str, t: int, job_ids: list[str]) -> None:
        for jid in job_ids:
            self.record("acked", ns, q, t, id=jid)

    def moved(self, ns: str, q: str, promoted: int, retried: int, dead: int, expired: int) -> None:
        """The engine's MoveSink: expiries counted inside the scripts (no ids)."""
        t = int(time.time() * 1000)
        if retried or dead:
            self.record("ttr_expired", ns, q, t, n=retried + dead)
        if dead:
            self.record("dead_lettered", ns, q, t, n=dead)
        if expired:
            self.record("ttl_expired", ns, q, t, n=expired)

    def flush(self) -> None:
        self._flushed = time.monotonic()
        if not self._buffer:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n".join(self._buffer) + "\n")
        self._buffer.clear()


def _due(job_id: str) -> int | None:
    """The due time carried by a server-made id (client ids carry none)."""
    member = id_to_member(job_id)
    return id_due_ms(member) if is_wheel_member(member) else None
