"""A worker's announcement of itself (who is running what, ``GET /api/{ns}/_workers``): every
``EVERY`` seconds while it runs, with the jobs it holds, lasting ``TTL``; retired when it
stops, so a worker that dies drops out of the list within ``TTL``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import cluster_dq
from cluster_dq.client._async.client import AsyncClient
from cluster_dq.client._iterform import Delivery
from cluster_dq.client.errors import BadRequest, DQError, NotFound

log = logging.getLogger("cluster_dq.worker")
EVERY, TTL = 10.0, 30.0
RETRY_REFUSED = 60.0  # seconds between announcements a service refused (404, 400)
MAX_BYTES = 100 * 1024  # of one announcement (the service takes 128 KiB)
MAX_HELD = 1_000  # jobs one announcement lists (the service's bound)
MAX_QUEUES = 100  # queues it lists (the service's bound)


# the host as the service takes it: 255 bytes of UTF-8 at most, no control character
HOST = (
    "".join(c for c in socket.gethostname() if c.isprintable())
    .encode()[:255]
    .decode(errors="ignore")
)


def worker_id() -> str:
    """``host-pid-random``, in the service's grammar (1-64 of [-_A-Za-z0-9])."""
    host = re.sub(r"[^-_A-Za-z0-9]", "-", HOST)[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class Announcer:
    def __init__(
        self,
        client: AsyncClient,
        queues: list[str],
        concurrency: int,
        held: Callable[[], Iterable[Delivery]],
    ) -> None:
        self.client, self.queues, self.concurrency, self.held = client, queues, concurrency, held
        self.id = worker_id()
        self.started_ms = int(time.time() * 1000)
        self._said = False  # a failure is logged once until an announcement goes through

    def info(self) -> dict[str, Any]:
        now_s, now_perf = time.time(), time.perf_counter()
        in_flight: list[dict[str, Any]] = []
        for d in self.held():
            if d.settled or len(in_flight) >= MAX_HELD:
                continue
            held: dict[str, Any] = {"queue": d.job.queue, "job_id": d.job.id}
            if d.started:
                held["started_ms"] = int((now_s - (now_perf - d.started)) * 1000)
            in_flight.append(held)
        while in_flight and len(json.dumps(in_flight)) > MAX_BYTES:  # (long queue names)
            del in_flight[len(in_flight) // 2 :]
        return {
            "host": HOST,
            "pid": os.getpid(),
            "version": cluster_dq.__version__,
            "started_ms": self.started_ms,
            "queues": self.queues[:MAX_QUEUES],
            "concurrency": self.concurrency,
            "in_flight": in_flight,
        }

    async def run(self) -> None:
        while True:
            try:
                await self.client.announce_worker(self.id, self.info(), ttl=TTL)
                self._said = False
            except (NotFound, BadRequest) as e:  # a service without the registry (an older
                # instance during an upgrade, a proxy's page): asked again, less often
                if not self._said:
                    log.warning(
                        "worker %s not announced (asked again every minute): %s", self.id, e
                    )
                    self._said = True
                await asyncio.sleep(RETRY_REFUSED - EVERY)
            except DQError as e:  # the service away for a moment: the next one may go through
                if not self._said:
                    log.warning("worker %s not announced: %s", self.id, e)
                    self._said = True
            except Exception:  # a bug of its own: never the worker's end, said once
                if not self._said:
                    log.exception("worker %s not announced", self.id)
                    self._said = True
            await asyncio.sleep(EVERY)

    async def retire(self) -> None:
        """Best effort: a worker that cannot say it stops drops out when its ttl ends."""
        try:
            await asyncio.wait_for(self.client.retire_worker(self.id), 5.0)
        except (DQError, TimeoutError) as e:
            why = str(e) or type(e).__name__
            log.info("worker %s not retired (it drops out within %g s): %s", self.id, TTL, why)
