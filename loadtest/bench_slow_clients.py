"""A worker under slow clients (issue 25, item 4): starts a redis-server and `cluster-dq serve`
(1 worker, the default timeouts unless given), then

1. idle: the worker's memory and CPU over ``--idle`` seconds;
2. slow: ``--connections`` (200) connections to the data port, each trickling a request head
   that never ends (``--chunk`` bytes every ``--interval`` s) for ``--seconds`` (60); a
   connection the server closes (``HeaderTimeoutSecond``) is opened again at once, so that
   many are held all along, as an attacker would;
3. after: the clients stop sending but keep their sockets; how long until the server has
   closed them all, then the worker's memory and CPU over ``--idle`` seconds.

Prints the worker's VmRSS (and its peak in each phase), CPU (% of one core, from
/proc/<pid>/stat) and what the clients saw. Figures only; nothing is asserted.

    python loadtest/bench_slow_clients.py
    python loadtest/bench_slow_clients.py --connections 200 --seconds 60 --header-timeout 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from cluster_dq.localredis import start_server
from cluster_dq.testing.service_process import ServiceProcess

TICK = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def worker_pid(supervisor: int) -> int:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    for child in children:
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():  # not the tracker
            return int(child)
    raise RuntimeError(f"no worker among {children}")


class Phase:
    """CPU and peak RSS of ``pid`` from now until ``end()``, sampled every ``step`` s."""

    def __init__(self, pid: int) -> None:
        self.pid, self.cpu0, self.t0, self.peak = pid, cpu_s(pid), time.monotonic(), rss_mb(pid)

    def sample(self) -> None:
        self.peak = max(self.peak, rss_mb(self.pid))

    def end(self, label: str, extra: str = "") -> None:
        took = time.monotonic() - self.t0
        cpu = (cpu_s(self.pid) - self.cpu0) / took * 100
        print(
            f"{label:<34} VmRSS {rss_mb(self.pid):6.1f} MB (peak {self.peak:6.1f})  "
            f"CPU {cpu:5.1f} % of a core over {took:4.1f} s{extra}",
            flush=True,
        )


async def idle(phase: Phase, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(min(1.0, seconds))
        phase.sample()


async def slow(
    port: int, phase: Phase, n: int, seconds: float, chunk: int, interval: float
) -> tuple[int, int, list[asyncio.StreamWriter], list[asyncio.StreamReader]]:
    """Holds ``n`` trickling connections for ``seconds``; returns (opened, closed by the
    server) and the sockets open at the end (kept, silent)."""
    opened = closed = 0
    stop = time.monotonic() + seconds
    kept: list[asyncio.StreamWriter] = []
    readers: list[asyncio.StreamReader] = []

    async def one() -> None:
        nonlocal opened, closed
        while time.monotonic() < stop:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            opened += 1
            writer.write(b"GET /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            try:
                while time.monotonic() < stop:
                    await asyncio.sleep(interval)
                    if reader.at_eof() or writer.is_closing():
                        break
                    writer.write(b"a" * chunk)
                    await writer.drain()
                    try:  # the server answered (408) or closed: open another
                        data = await asyncio.wait_for(reader.read(4096), 0.001)
                    except TimeoutError:
                        continue
                    if data or reader.at_eof():
                        break
                else:
                    kept.append(writer)
                    readers.append(reader)
                    return
            except (ConnectionError, OSError):
                pass
            closed += 1
            writer.close()

    async def sampler() -> None:
        while time.monotonic() < stop:
            await asyncio.sleep(1.0)
            phase.sample()

    await asyncio.gather(sampler(), *(one() for _ in range(n)))
    return opened, closed, kept, readers


async def drained(readers: list[asyncio.StreamReader], limit: float) -> tuple[int, float]:
    """Waits until the server closed every kept socket (EOF); (still open, seconds)."""
    t0 = time.monotonic()

    async def eof(reader: asyncio.StreamReader) -> None:
        while await reader.read(4096):
            pass

    results = await asyncio.gather(
        *(asyncio.wait_for(eof(r), limit) for r in readers), return_exceptions=True
    )
    still = sum(1 for r in results if isinstance(r, TimeoutError))
    return still, time.monotonic() - t0


async def run(args: argparse.Namespace, port: int, pid: int) -> None:
    phase = Phase(pid)
    await idle(phase, args.idle)
    phase.end("idle")
    phase = Phase(pid)
    opened, closed, kept, readers = await slow(
        port, phase, args.connections, args.seconds, args.chunk, args.interval
    )
    phase.end(
        f"{args.connections} slow connections",
        f"\n  {opened} connections opened, {closed} closed by the server while trickling",
    )
    phase = Phase(pid)
    still, took = await drained(readers, min(args.header_timeout + 15, 60))
    phase.end(
        "after the clients went silent",
        f"\n  the server closed {len(readers) - still} of {len(readers)} silent connections "
        f"in {took:.1f} s ({still} still open)",
    )
    for w in kept:
        w.close()
    phase = Phase(pid)
    await idle(phase, args.idle)
    phase.end("idle again")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--idle", type=float, default=10.0)
    ap.add_argument("--chunk", type=int, default=1024, help="bytes sent per interval")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--header-timeout", type=float, default=10.0, help="HeaderTimeoutSecond")
    args = ap.parse_args()
    redis = start_server()
    svc = ServiceProcess.start(
        f"127.0.0.1:{redis.port}",
        env={
            "CLUSTER_DQ_LOGLEVEL": "warning",
            "CLUSTER_DQ_HEADERTIMEOUTSECOND": str(args.header_timeout),
        },
        args=["--workers", "1"],
    )
    try:
        pid = worker_pid(svc.pid)
        print(
            f"worker {pid}: HeaderTimeoutSecond {args.header_timeout}, {args.connections} "
            f"connections each sending {args.chunk} B every {args.interval} s",
            flush=True,
        )
        asyncio.run(run(args, svc.port, pid))
    finally:
        svc.stop(timeout=30)
        redis.kill()


if __name__ == "__main__":
    main()
