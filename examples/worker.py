"""A worker for the orders of examples/producer.py: a flaky failure is retried (a try spent),
a rate limit snoozes the job (no try spent), a malformed payload is buried with its reason.
Ctrl-C or SIGTERM stops it gracefully: running handlers finish, nothing stays reserved.

    export CLUSTER_DQ_URL=http://127.0.0.1:7777 CLUSTER_DQ_TOKEN=<token> CLUSTER_DQ_NAMESPACE=demo
    python examples/worker.py [QUEUE]            # QUEUE: orders by default
"""

from __future__ import annotations

import asyncio
import sys
import time

from cluster_dq.client import AsyncClient, Bury, Job, Retry, Snooze, Worker

RATE = 2  # orders per second the (pretend) downstream accepts


class Limiter:
    """At most ``rate`` calls per one-second window."""

    def __init__(self, rate: int) -> None:
        self.rate, self.window, self.used = rate, 0, 0

    def take(self) -> bool:
        now = int(time.monotonic())
        if now != self.window:
            self.window, self.used = now, 0
        self.used += 1
        return self.used <= self.rate


limiter = Limiter(RATE)


async def handle(job: Job) -> None:
    try:
        order = job.json()
    except ValueError:
        print(f"buried {job.id}: not JSON", flush=True)
        raise Bury("bad payload: not JSON") from None
    if not limiter.take():
        print(f"snoozed order {order['order']}: rate limited", flush=True)
        raise Snooze(0.5, "rate limited")
    if order.get("flaky") and job.deliveries == 1:
        print(f"retry order {order['order']}: upstream timed out", flush=True)
        raise Retry(1.0, "upstream timed out")
    await asyncio.sleep(0.05)  # the work
    print(f"done order {order['order']} (delivery {job.deliveries})", flush=True)


async def main() -> None:
    queue = sys.argv[1] if len(sys.argv) > 1 else "orders"
    async with AsyncClient() as client:  # CLUSTER_DQ_URL, CLUSTER_DQ_TOKEN, CLUSTER_DQ_NAMESPACE
        worker = Worker(client, queue, handler=handle, concurrency=4, ttr=30, poll_timeout=1)
        print(f"worker: consuming {queue}", flush=True)
        await worker.serve(signals=True)  # until SIGTERM or Ctrl-C
    print("worker: stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
