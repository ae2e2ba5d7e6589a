"""What a Cluster master that is down costs the commands to the healthy ones, in the service's
own client (``cluster_dq.pools.make_client``: redis-py's asyncio Cluster client with the
service's connections and retry settings), on a private Cluster of 3 masters without replicas
(its node timeout long, so that nothing fails over meanwhile).

    python loadtest/bench_cluster_refresh.py                 # 3 s per phase, 10 tasks
    python loadtest/bench_cluster_refresh.py --seconds 5 --failing 20

Three phases, each ``--seconds`` long, in which one task reads 6 keys on the healthy masters
in a loop (one gather at a time) and reports the latency of each gather: before the kill;
with one master killed and nothing else asking it; and with ``--failing`` tasks asking a key
of the killed master every 10 ms (as watchers, the pump and notices do). After every command
that could not reach its node, redis-py refreshes the whole topology (CLUSTER SLOTS, every
connection marked for reconnect, COMMAND from its default node). It prints the latency
percentiles, the errors, and how many CLUSTER SLOTS the healthy masters answered. Figures
only.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from cluster_dq.keys import QueueKeys
from cluster_dq.localredis import Cluster, start_cluster
from cluster_dq.pools import close_client, make_client


def refreshes(cluster: Cluster, down_port: int) -> int:
    total = 0
    for s in cluster.servers:
        if s.port != down_port:
            with s.client() as r:
                stats = r.info("commandstats").get("cmdstat_cluster|slots", {})
                total += int(stats.get("calls", 0))
    return total


async def run(seconds: float, failing: int) -> None:
    cluster = start_cluster(node_timeout_ms=60_000, replicas=0)
    client = make_client(cluster.pool_settings())
    try:
        await client.initialize()
        sync = cluster.sync_client()
        names = [f"q{i}" for i in range(64)]
        try:
            port = {n: sync.get_node_from_key(QueueKeys("bench", n).ready).port for n in names}
        finally:
            sync.close()
        down = names[0]
        healthy = [n for n in names if port[n] != port[down]][:6]

        async def phase(label: str) -> None:
            latencies, errors = [], 0
            before = refreshes(cluster, port[down])
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.monotonic()
                got = await asyncio.gather(
                    *(client.get(QueueKeys("bench", q).ready) for q in healthy),
                    return_exceptions=True,
                )
                errors += sum(isinstance(g, Exception) for g in got)
                latencies.append((time.monotonic() - started) * 1000)
                await asyncio.sleep(0.01)
            latencies.sort()
            n = len(latencies)
            print(
                f"{label:<44} {n:>5} reads of 6 keys: p50 {latencies[n // 2]:6.1f} ms, "
                f"p99 {latencies[int(n * 0.99)]:6.1f} ms, max {latencies[-1]:6.1f} ms; "
                f"errors {errors}; CLUSTER SLOTS answered {refreshes(cluster, port[down]) - before}",
                flush=True,
            )

        stop = asyncio.Event()

        async def ask_the_dead_one() -> None:
            while not stop.is_set():
                try:
                    await client.get(QueueKeys("bench", down).ready)
                except Exception:  # the point: it cannot be reached
                    pass
                await asyncio.sleep(0.01)

        await phase("before the kill")
        cluster.server_on(port[down]).kill()
        await phase("one master killed, nothing asking it")
        tasks = [asyncio.create_task(ask_the_dead_one()) for _ in range(failing)]
        await phase(f"one master killed, {failing} tasks asking it")
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        await close_client(client)
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each phase")
    ap.add_argument("--failing", type=int, default=10, help="tasks asking the killed master")
    a = ap.parse_args()
    asyncio.run(run(a.seconds, a.failing))


if __name__ == "__main__":
    main()
