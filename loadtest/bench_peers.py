"""Peer benchmark: cluster_dq (HTTP, `cluster-dq serve`) against BullMQ (Node.js, in-process
producers and Workers), scenario by scenario, each run on a fresh redis-server of its own, the
two systems interleaved round by round; prints the medians over rounds of jobs/s and of the CPU
time per job of each process involved (cluster_dq: the service's processes, this load
generator, Redis; BullMQ: the node process, Redis), then lateness of delayed jobs and Redis
bytes per delayed job.

    python loadtest/bench_peers.py                                   # 3 rounds, 5 s each
    python loadtest/bench_peers.py --seconds 1 --rounds 1 --jobs 2000   # a quick check
    python loadtest/bench_peers.py --only publish --workers 1

BullMQ (pinned in loadtest/peers/package.json) is installed with npm into .cache/peers/ on
the first run; node and npm must be on the PATH. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp
import httpx
import psutil
import uvloop

import cluster_dq
from cluster_dq.localredis import Server, start_server
from cluster_dq.testing.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "loadtest" / "peers"
CACHE = ROOT / ".cache" / "peers"
BODY = os.urandom(32).hex().encode()  # 64 bytes
BULK = json.dumps([BODY.decode()] * 64).encode()
PRECISION_JOBS = 2000  # due over 2 s: 200 steps of 10 ms, 10 jobs due at each
PRECISION_STEPS = 200

Call = Callable[[aiohttp.ClientSession], Awaitable[int | str]]


@dataclass(frozen=True)
class Options:
    seconds: float
    warmup: float
    jobs: int  # the memory scenario's delayed jobs
    workers: int


@dataclass
class Run:
    """One run of one system: jobs done in the measured window, and CPU seconds per process
    kind over that window."""

    jobs: int
    seconds: float
    errors: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    lateness_ms: list[float] = field(default_factory=list)
    memory: int = 0  # Redis used_memory delta, bytes

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def us_per_job(self, kind: str) -> float:
        return self.cpu.get(kind, 0.0) / self.jobs * 1e6 if self.jobs else float("nan")


@dataclass(frozen=True)
class Scenario:
    key: str  # for --only
    name: str
    kind: str  # "rate", "precision" or "memory"
    bullmq: str  # the scenario of loadtest/peers/bullmq_bench.js
    dq_fill: int = 0  # jobs/s of window the queue gets beforehand (cluster_dq)
    bullmq_fill: int = 0  # the same for BullMQ


SCENARIOS = [
    Scenario("publish", "publish, one job per request / add", "rate", "publish"),
    Scenario("bulk", "bulk publish, 64 per request / addBulk", "rate", "bulk"),
    Scenario("consume", "consume + ack one at a time / Worker", "rate", "consume", 8_000, 25_000),
    Scenario("batch", "consume 100 + batch ack / Worker", "rate", "consume", 40_000, 25_000),
    Scenario("e2e", "end to end: bulk 64 + consume 100 + ack / addBulk + Worker", "rate", "e2e"),
    Scenario(
        "precision",
        "precision: 2,000 delayed jobs due over 2 s, in bulks of 10",
        "precision",
        "precision",
    ),
    Scenario("memory", "memory: delayed 64-byte jobs, due in 1-2 h", "memory", "memory"),
]


def precision_schedule() -> list[tuple[float, int]]:
    """(due in ms since the epoch, jobs due then): the first step 2 s from now."""
    first = time.time() * 1000 + 2000
    step_ms, per_step = 2000 // PRECISION_STEPS, PRECISION_JOBS // PRECISION_STEPS
    return [(first + i * step_ms, per_step) for i in range(PRECISION_STEPS)]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


class CpuClock:
    """User + system CPU seconds of groups of processes ("service", "redis", ...)."""

    def __init__(self, groups: dict[str, list[psutil.Process]]) -> None:
        self.groups = groups

    def read(self) -> dict[str, float]:
        return {kind: sum(_cpu(p) for p in procs) for kind, procs in self.groups.items()}

    def since(self, before: dict[str, float]) -> dict[str, float]:
        return {kind: now - before[kind] for kind, now in self.read().items()}


def _cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(t.user + t.system)


def used_memory(redis: Server) -> int:
    with redis.client() as c:
        return int(c.info("memory")["used_memory"])


# --- cluster_dq ------------------------------------------------------------------------------


class DqClient:
    """The HTTP calls of the scenarios; each returns the jobs it completed or an error kind."""

    def __init__(self, base: str, token: str) -> None:
        self.api = f"{base}/api/bench"
        self.h = {"X-Token": token}

    async def put(
        self, s: aiohttp.ClientSession, q: str, data: bytes, jobs: int, query: str = ""
    ) -> int | str:
        async with s.put(f"{self.api}/{q}{query}", data=data, headers=self.h) as r:
            await r.read()
            return jobs if r.status == 201 else f"HTTP {r.status}"

    async def take(
        self, s: aiohttp.ClientSession, q: str, count: int, timeout_ms: int = 100
    ) -> list[dict[str, str]] | str:
        url = f"{self.api}/{q}?ttr=60&timeout_ms={timeout_ms}&count={count}"
        async with s.get(url, headers=self.h) as r:
            if r.status != 200:
                await r.read()
                return [] if r.status == 404 else f"HTTP {r.status}"
            got = await r.json()
        return got if isinstance(got, list) else [got]

    async def ack(self, s: aiohttp.ClientSession, q: str, job_id: str) -> int | str:
        async with s.delete(f"{self.api}/{q}/job/{job_id}", headers=self.h) as r:
            await r.read()
            return 1 if r.status == 204 else f"HTTP {r.status}"

    async def ack_batch(self, s: aiohttp.ClientSession, q: str, ids: list[str]) -> int | str:
        async with s.post(f"{self.api}/{q}/ack", json=ids, headers=self.h) as r:
            answer = await r.json()
            return int(answer["acked"]) if r.status == 200 else f"HTTP {r.status}"

    async def consume(self, s: aiohttp.ClientSession, q: str, count: int) -> int | str:
        jobs = await self.take(s, q, count)
        if isinstance(jobs, str) or not jobs:
            return jobs if isinstance(jobs, str) else 0
        if count == 1:
            return await self.ack(s, q, jobs[0]["job_id"])
        return await self.ack_batch(s, q, [j["job_id"] for j in jobs])

    async def end_to_end(self, s: aiohttp.ClientSession) -> int | str:
        published = await self.put(s, "e2e/bulk", BULK, 64)
        return published if isinstance(published, str) else await self.consume(s, "e2e", 100)

    async def preload(self, q: str, jobs: int) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as s:
            for start in range(0, jobs, 64 * 16):
                n = min(16, (jobs - start + 63) // 64)
                await asyncio.gather(*(self.put(s, f"{q}/bulk", BULK, 64) for _ in range(n)))


async def drive(call: Call, conns: int, o: Options, clock: CpuClock, drain: bool = False) -> Run:
    """Runs ``call`` from ``conns`` connections for the warm-up and then the measured window;
    counts the jobs done in the window. ``drain``: a connection stops when its call did no job
    (the pre-filled queue is empty)."""
    warm = time.perf_counter() + o.warmup
    stop = warm + o.seconds
    run = Run(0, 0.0)
    last = warm
    before: dict[str, float] = {}

    async def mark() -> None:
        await asyncio.sleep(max(0.0, warm - time.perf_counter()))
        before.update(clock.read())

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conns)) as session:

        async def worker() -> None:
            nonlocal last
            while time.perf_counter() < stop:
                try:
                    done = await call(session)
                except aiohttp.ClientError as e:
                    done = type(e).__name__
                now = time.perf_counter()
                if isinstance(done, str):
                    run.errors[done] = run.errors.get(done, 0) + 1
                elif done == 0 and drain:
                    return
                elif now >= warm:
                    run.jobs += done
                    last = now

        await asyncio.gather(mark(), *(worker() for _ in range(conns)))
    run.cpu = clock.since(before)
    run.seconds = last - warm
    return run


async def dq_precision(c: DqClient) -> Run:
    """The precision schedule (see ``precision_schedule``) in one bulk request per step, from
    16 connections; 16 consumers long-poll for up to 100 jobs, note lateness (arrival - due)
    and batch-ack them (one job per request would measure the throughput of this loaded
    machine rather than the scheduler)."""
    lateness: list[float] = []
    steps = iter(precision_schedule())
    deadline = time.monotonic() + 30

    async def publish(s: aiohttp.ClientSession) -> None:
        for due, n in steps:
            delay = max(0, int(due - time.time() * 1000))
            body = json.dumps([{"due": due}] * n).encode()
            await c.put(s, "late/bulk", body, n, f"?delay_ms={delay}")

    async def consume(s: aiohttp.ClientSession) -> None:
        while len(lateness) < PRECISION_JOBS and time.monotonic() < deadline:
            got = await c.take(s, "late", 100, timeout_ms=1000)
            if isinstance(got, list) and got:
                now = time.time() * 1000
                lateness.extend(now - json.loads(base64.b64decode(j["data"]))["due"] for j in got)
                await c.ack_batch(s, "late", [j["job_id"] for j in got])

    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as ps,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as cs,
    ):
        await asyncio.gather(*(publish(ps) for _ in range(16)), *(consume(cs) for _ in range(16)))
    return Run(len(lateness), 0.0, lateness_ms=lateness)


async def dq_memory(c: DqClient, jobs: int) -> Run:
    """``jobs`` delayed jobs in bulks of 64 from 16 connections, each bulk due 1-2 h ahead."""
    left = jobs

    async def publish(s: aiohttp.ClientSession) -> None:
        nonlocal left
        while left > 0:
            n = min(64, left)
            left -= n
            query = f"?delay_ms={3_600_000 + random.randrange(3_600_000)}"
            await c.put(s, "mem/bulk", json.dumps([BODY.decode()] * n).encode(), n, query)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as s:
        await asyncio.gather(*(publish(s) for _ in range(16)))
    return Run(jobs, 0.0)


async def dq_scenario(sc: Scenario, c: DqClient, o: Options, clock: CpuClock) -> Run:
    window = o.warmup + o.seconds
    if sc.key == "publish":
        return await drive(lambda s: c.put(s, "one", BODY, 1), 64, o, clock)
    if sc.key == "bulk":
        return await drive(lambda s: c.put(s, "bulk/bulk", BULK, 64), 16, o, clock)
    if sc.key == "consume":
        await c.preload("one", int(window * sc.dq_fill))
        return await drive(lambda s: c.consume(s, "one", 1), 64, o, clock, drain=True)
    if sc.key == "batch":
        await c.preload("batch", int(window * sc.dq_fill))
        return await drive(lambda s: c.consume(s, "batch", 100), 8, o, clock, drain=True)
    if sc.key == "e2e":
        return await drive(c.end_to_end, 8, o, clock)
    if sc.key == "precision":
        return await dq_precision(c)
    return await dq_memory(c, o.jobs)


def run_dq(sc: Scenario, o: Options) -> Run:
    redis = start_server()
    try:
        env = {"CLUSTER_DQ_LOGLEVEL": "warning"}
        args = ["--workers", str(o.workers)]
        log = redis.workdir / "service.log"  # removed with the Redis directory
        with ServiceProcess.start(
            f"127.0.0.1:{redis.port}", env=env, args=args, log=log, stdout=subprocess.DEVNULL
        ) as svc:
            token = httpx.post(f"{svc.admin}/token/bench", params={"description": "bench"})
            supervisor = psutil.Process(svc.pid)
            clock = CpuClock(
                {
                    "service": [supervisor, *supervisor.children(recursive=True)],
                    "client": [psutil.Process()],
                    "redis": [psutil.Process(redis.process.pid)],
                }
            )
            memory = used_memory(redis)
            client = DqClient(svc.base, token.json()["token"])
            run = uvloop.run(dq_scenario(sc, client, o, clock))
            run.memory = used_memory(redis) - memory
            return run
    finally:
        redis.stop()


# --- BullMQ ----------------------------------------------------------------------------------


def install_bullmq() -> Path:
    """npm-installs the pinned BullMQ into .cache/peers/ unless already there; returns the
    node_modules directory."""
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: install Node.js (Debian: apt-get install nodejs npm)")
    pins = (PEERS / "package.json").read_text()
    done = CACHE / "installed-package.json"  # written once npm install succeeded
    if done.exists() and done.read_text() == pins:
        return CACHE / "node_modules"
    CACHE.mkdir(parents=True, exist_ok=True)
    shutil.copy(PEERS / "package.json", CACHE / "package.json")  # exact pins, no lock file
    print(f"installing {PEERS / 'package.json'} into {CACHE} ...", flush=True)
    cmd = ["npm", "install", "--no-audit", "--no-fund", "--no-package-lock", "--loglevel", "error"]
    subprocess.run(cmd, cwd=CACHE, check=True, stdout=subprocess.DEVNULL)
    done.write_text(pins)
    return CACHE / "node_modules"


def _expect(out: IO[str], key: str) -> dict[str, object]:
    line = out.readline()
    if not line:
        raise RuntimeError(f"bullmq_bench.js exited before {key!r}")
    got: dict[str, object] = json.loads(line)
    if key not in got:
        raise RuntimeError(f"bullmq_bench.js: expected {key!r}, got {line.strip()}")
    return got


def bullmq_fill(sc: Scenario, o: Options) -> int:
    if sc.kind == "precision":
        return PRECISION_JOBS
    if sc.kind == "memory":
        return o.jobs
    return int((o.warmup + o.seconds) * sc.bullmq_fill)


def run_bullmq(sc: Scenario, o: Options, node_modules: Path) -> Run:
    redis = start_server()
    cmd = ["node", str(PEERS / "bullmq_bench.js"), "--port", str(redis.port)]
    cmd += ["--scenario", sc.bullmq, "--seconds", str(o.seconds), "--warmup", str(o.warmup)]
    cmd += ["--jobs", str(bullmq_fill(sc, o)), "--steps", str(PRECISION_STEPS)]
    cmd += ["--concurrency", "64"]
    env = {**os.environ, "NODE_PATH": str(node_modules)}
    node = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert node.stdin is not None and node.stdout is not None
        _expect(node.stdout, "ready")
        clock = CpuClock(
            {"node": [psutil.Process(node.pid)], "redis": [psutil.Process(redis.process.pid)]}
        )
        memory = used_memory(redis)
        node.stdin.write("go\n")
        node.stdin.flush()
        _expect(node.stdout, "warm")
        before = clock.read()
        got = _expect(node.stdout, "jobs")
        cpu = clock.since(before)
        errors = int(got["errors"])  # type: ignore[call-overload]
        return Run(
            int(got["jobs"]),  # type: ignore[call-overload]
            float(got["seconds"]),  # type: ignore[arg-type]
            {"errors": errors} if errors else {},
            cpu,
            list(got.get("lateness_ms", [])),  # type: ignore[call-overload]
            used_memory(redis) - memory,
        )
    finally:
        if node.poll() is None:
            node.kill()
        node.wait()
        redis.stop()


# --- report ----------------------------------------------------------------------------------

SYSTEMS = ("cluster_dq", "BullMQ")
CPU_KINDS = {"cluster_dq": ("service", "client", "redis"), "BullMQ": ("node", "redis")}


def describe(run: Run, sc: Scenario) -> str:
    if sc.kind == "precision":
        late = run.lateness_ms
        early = sum(1 for x in late if x < 0)
        return (
            f"{len(late):,} delivered, lateness p50 {pct(late, 50):.0f} ms, "
            f"p99 {pct(late, 99):.0f} ms, max {max(late, default=float('nan')):.0f} ms, "
            f"{early} early"
        )
    if sc.kind == "memory":
        return f"{run.memory / max(1, run.jobs):.1f} B/job ({run.jobs:,} jobs)"
    cpu = ", ".join(f"{k} {run.cpu.get(k, 0) / run.seconds:.0%}" for k in sorted(run.cpu))
    return f"{run.rate:>9,.0f} jobs/s  CPU of a core: {cpu}  errors {run.errors or 0}"


def median(runs: list[Run], figure: Callable[[Run], float]) -> float:
    return statistics.median(figure(r) for r in runs) if runs else float("nan")


def print_rates(results: dict[tuple[str, str], list[Run]], scenarios: list[Scenario]) -> None:
    if not any(sc.kind == "rate" for sc in scenarios):
        return
    cols = ["dq jobs/s", "BullMQ jobs/s", "dq/BullMQ", "dq service", "dq client", "dq redis"]
    cols += ["node", "BullMQ redis"]
    print(f"\n{'scenario (CPU in µs per job)':<60}" + "".join(f"{c:>14}" for c in cols))
    for sc in scenarios:
        dq, bull = results.get((sc.key, "cluster_dq"), []), results.get((sc.key, "BullMQ"), [])
        if sc.kind != "rate" or not dq or not bull:
            continue
        rate_dq, rate_bull = median(dq, lambda r: r.rate), median(bull, lambda r: r.rate)
        figures = [f"{rate_dq:,.0f}", f"{rate_bull:,.0f}", f"{rate_dq / rate_bull:.2f}"]
        for system, runs in (("cluster_dq", dq), ("BullMQ", bull)):
            figures += [
                f"{statistics.median(r.us_per_job(k) for r in runs):.1f}" for k in CPU_KINDS[system]
            ]
        print(f"{sc.name:<60}" + "".join(f"{f:>14}" for f in figures))


def print_others(results: dict[tuple[str, str], list[Run]], scenarios: list[Scenario]) -> None:
    for sc in scenarios:
        if sc.kind == "rate":
            continue
        for system in SYSTEMS:
            runs = results.get((sc.key, system), [])
            if not runs:
                continue
            if sc.kind == "precision":
                p50 = median(runs, lambda r: pct(r.lateness_ms, 50))
                p99 = median(runs, lambda r: pct(r.lateness_ms, 99))
                figure = f"lateness p50 {p50:.0f} ms, p99 {p99:.0f} ms"
            else:
                figure = f"{median(runs, lambda r: r.memory / max(1, r.jobs)):.1f} B/job"
            print(f"{sc.name:<60} {system:<11} {figure} (median of {len(runs)})")


def versions(node_modules: Path) -> str:
    def out(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

    def package(name: str) -> str:
        return str(json.loads((node_modules / name / "package.json").read_text())["version"])

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    redis = out("redis-server", "--version").split()[2].removeprefix("v=")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {cpu}, {os.cpu_count()} cores"
        f" (load average {load}); redis-server {redis}; cluster_dq {cluster_dq.__version__},"
        f" Python {platform.python_version()}; node {out('node', '--version')}, bullmq"
        f" {package('bullmq')}, ioredis {package('ioredis')}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5, help="measured window per run")
    ap.add_argument("--warmup", type=float, default=1, help="seconds before the window")
    ap.add_argument("--jobs", type=int, default=100_000, help="delayed jobs, memory scenario")
    ap.add_argument("--workers", type=int, default=2, help="cluster_dq service workers")
    ap.add_argument("--only", default="", help="scenarios whose key or name contains this")
    a = ap.parse_args()
    o = Options(a.seconds, a.warmup, a.jobs, a.workers)
    scenarios = [sc for sc in SCENARIOS if a.only in sc.key or a.only in sc.name]
    node_modules = install_bullmq()
    print(versions(node_modules))
    print(
        f"{a.rounds} round(s); {o.warmup:g} s warm-up + {o.seconds:g} s per run; cluster_dq with"
        f" {o.workers} worker(s); each run on a fresh redis-server\n",
        flush=True,
    )
    results: dict[tuple[str, str], list[Run]] = {}
    for sc in scenarios:
        for n in range(1, a.rounds + 1):
            for system in SYSTEMS:
                run = run_dq(sc, o) if system == "cluster_dq" else run_bullmq(sc, o, node_modules)
                results.setdefault((sc.key, system), []).append(run)
                print(f"  {sc.key:<9} round {n}  {system:<10} {describe(run, sc)}", flush=True)
    print_rates(results, scenarios)
    print_others(results, scenarios)


if __name__ == "__main__":
    main()
