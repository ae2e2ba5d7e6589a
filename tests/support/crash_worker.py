"""A process that publishes (idempotent client ids), pumps and consumes; the crash test
SIGKILLs it at a random moment and starts another. Every job it handles is recorded in
``test:processed`` *before* the ack, so "processed" means "delivered at least once"."""

from __future__ import annotations

import asyncio
import random
import sys

from redis.asyncio import Redis

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.models import JobSpec
from cluster_dq.pump import Pump
from cluster_dq.waiters import WaiterHub

NS, Q = "crash", "q"


async def main(port: int, jobs: int) -> None:
    client = Redis(host="127.0.0.1", port=port)
    engine = AsyncEngine(client)
    pump = Pump(engine, lease_ms=1_000)
    pump.start()
    hub = WaiterHub(engine)

    async def publisher() -> None:
        for start in range(0, jobs, 50):
            specs = [
                JobSpec(
                    f"{i}".encode(), delay_ms=random.randint(0, 1_500), tries=50, job_id=f"job-{i}"
                )
                for i in range(start, min(start + 50, jobs))
            ]
            await engine.run(ops.publish(engine.config, NS, Q, specs, now_ms()), idempotent=True)

    async def consumer() -> None:
        while True:
            got = await hub.consume(NS, [Q], 1_000, 10, 500)
            for job in got:
                await client.sadd("test:processed", job.job_id)
                await engine.run(ops.ack(NS, Q, [job.job_id]), idempotent=True)

    tasks = [asyncio.create_task(consumer()) for _ in range(4)]
    await publisher()
    await client.set("test:published", 1)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
