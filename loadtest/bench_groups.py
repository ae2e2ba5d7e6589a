"""Groups: what fair turns do for light tenants beside a heavy one, and what a group (or a dedup
key) costs Redis in CPU and memory. A real redis-server and ``cluster-dq serve`` (1 worker),
driven over HTTP with aiohttp; each section starts its own and stops them after.

    python loadtest/bench_groups.py                          # about 2 minutes
    python loadtest/bench_groups.py --reps 3 --seconds 30 --scenarios ABCD --rounds 5
    python loadtest/bench_groups.py --only fairness          # or cost, scripts, memory

- **fairness** (``groups_fairness.py``): ten light groups publish one job per request, a heavy
  group 100 times as fast as each (in bulks), and consumers of fixed capacity (each holds a
  job ``--service-ms`` before its ack) that the heavy group alone overloads. Runs of the same
  length, interleaved per repetition (their order rotated): (A) the light groups alone, (B)
  light and heavy, all grouped, (C) the same with no group at all (one FIFO), and with
  ``--scenarios ABCD`` (D) the light jobs without a group beside the grouped heavy one, and with
  E, (E) B with the heavy group's concurrency limited to ``--heavy-limit`` (default: 2 fewer
  than the consumers), so that consumers stay free for the light groups, and with F, (F) E's
  control: the heavy group on a queue of its own served by ``--heavy-limit`` consumers, the
  light groups on theirs by the rest (the same load on the machine, nothing shared).
  Printed: the light jobs' lateness (delivery - publish, delay 0; the publish time rides in
  the body), and how many heavy jobs were delivered while a light one waited.
- **cost**: Redis per publish, consume and ack (the scripts' usec in ``INFO commandstats``, and
  redis-server's CPU) of a plain job, a grouped one, a grouped one whose group has a
  concurrency limit, or a rate, meant never to bind, and one with a dedup key; the variants
  interleaved round by round, one job per request, ``--concurrency`` requests in flight.
- **scripts** (``groups_scripts.py``): the cost variants' Redis per job through the engine
  directly, no HTTP: ``--per-call`` jobs per script call; the least usec over the rounds, and
  the commands the scripts called per job, which noise does not change.
- **memory**: Redis ``used_memory`` per job for ``--memory-jobs`` jobs (64-byte bodies, bulks
  of 64) ready, and delayed (due over an hour), without a group, all in one 8-byte group, and
  spread over 1,000 8-byte groups.

Figures only; nothing is asserted. The load generator, the service and Redis share the
machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import uvloop

if __package__ in (None, ""):  # run as a script (python loadtest/bench_groups.py): find loadtest
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_dq.localredis import Server, start_server  # noqa: E402
from cluster_dq.testing.service_process import ServiceProcess  # noqa: E402
from loadtest.groups_fairness import FairnessRun, Load, fairness_run  # noqa: E402
from loadtest.groups_scripts import scripts  # noqa: E402

NS = "bench"
BODY = os.urandom(32).hex().encode()  # 64 bytes
ELEMENT = b'"' + os.urandom(31).hex().encode() + b'"'  # a bulk's element: 64 bytes, quotes kept
GROUP = "tenant-1"  # 8 bytes, a typical tenant name
# a grouped queue's group settings, meant never to bind
LOOSE_LIMITS: dict[str, dict[str, Any]] = {
    "group+concurrency": {"concurrency": 1_000_000},
    "group+rate": {"rate": "1000000/1s"},
}
COST_VARIANTS = ("plain", "group", *LOOSE_LIMITS, "dedup")


@dataclass
class Stack:
    redis: Server
    base: str
    token: str
    procs: list[psutil.Process]  # the service's supervisor and workers, and redis-server
    ids: dict[str, list[str]] = field(default_factory=dict)  # a queue's reserved jobs (cost)


@asynccontextmanager
async def stack(pin: bool = False) -> AsyncIterator[tuple[Stack, aiohttp.ClientSession]]:
    """A fresh redis-server and service (1 worker), a token, and a session that sends it.
    ``pin``: redis-server alone on the last core, the service and this process on the others
    (a script's usec in commandstats is wall time: shared cores count the time the server was
    descheduled mid-script)."""
    server = start_server()
    try:
        env = {"CLUSTER_DQ_LOGLEVEL": "warning"}
        with ServiceProcess.start(
            f"127.0.0.1:{server.port}", env=env, args=["--workers", "1"]
        ) as svc:
            svc_proc = psutil.Process(svc.pid)
            procs = [svc_proc, *svc_proc.children(recursive=True)]
            procs.append(psutil.Process(server.process.pid))
            if pin:
                pin_apart(server.process.pid, procs)
            st = Stack(server, svc.base, svc.mint_token(NS), procs)
            conn = aiohttp.TCPConnector(limit=256)
            headers = {"X-Token": st.token}
            async with aiohttp.ClientSession(svc.base, headers=headers, connector=conn) as s:
                yield st, s
    finally:
        server.kill()


def pin_apart(redis_pid: int, procs: list[psutil.Process]) -> None:
    """redis-server on the last core alone; the rest of ``procs`` and this process on the
    others (their threads included: affinity is per thread, so each one is set)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs two cores at least")
    alone, rest = {cores[-1]}, set(cores[:-1])
    for p in [*procs, psutil.Process()]:
        where = alone if p.pid == redis_pid else rest
        for t in p.threads():
            os.sched_setaffinity(t.id, where)


def pct(xs: Sequence[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


# --- fairness -------------------------------------------------------------------------------


def print_fairness(runs: list[FairnessRun], load: Load) -> None:
    print()
    print(
        f"fairness: {load.lights} light groups at {load.light_rate:g} jobs/s each, a heavy group "
        f"at {load.heavy_rate:g} jobs/s (bulks of {load.heavy_batch}); {load.consumers} consumers "
        f"holding each job {load.service_ms:g} ms; runs of {load.seconds:g} s, the light jobs of "
        f"the last {load.seconds - load.warmup:g} s measured (lateness = delivery - publish)"
    )
    print(
        f"{'rep':>3}  {'run':<32} {'light jobs':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        f" {'waiting':>7}  {'p99 per light group':>19} {'overtaken p50/p99':>17}"
        f" {'delivered/s':>11} {'heavy left':>10}"
        f" {'CPU: gen':>8} {'service':>7} {'redis':>5}"
    )
    for r in runs:
        late = r.lateness
        spread = f"{min(r.group_p99):.1f}–{max(r.group_p99):.1f}" if r.group_p99 else "–"
        print(
            f"{r.rep:>3}  {r.label:<32} {len(late):>10,} {pct(late, 50):>8.1f}"
            f" {pct(late, 99):>8.1f} {max(late, default=0):>8.1f} {r.waiting:>7,}  {spread:>19}"
            f" {f'{pct(r.overtaken, 50):.0f} / {pct(r.overtaken, 99):.0f}':>17}"
            f" {r.delivered / r.seconds:>11.0f} {r.backlog:>10,} {r.cpu[0]:>8.0%} {r.cpu[1]:>7.0%}"
            f" {r.cpu[2]:>5.0%}"
        )
    print(
        "(waiting: light jobs not delivered by the end, counted as late as they had waited, so "
        "that run's figures are lower bounds; overtaken: heavy jobs delivered after a light job's "
        "publish was answered and before it was delivered; delivered/s: every job, while "
        "publishing; heavy "
        "left: the heavy backlog when publishing stopped; CPU: this process (the load "
        "generator), the service and redis-server, each in % of one core)"
    )
    by: dict[str, list[FairnessRun]] = {}
    for r in runs:
        by.setdefault(r.scenario, []).append(r)
    for s, runs_s in sorted(by.items()):
        every = [x for r in runs_s for x in r.lateness]
        print(
            f"all repetitions, {runs_s[0].label}: p50 {pct(every, 50):.1f} ms, "
            f"p99 {pct(every, 99):.1f} ms ({len(every):,} light jobs)"
        )
    if "A" in by and "B" in by:
        # In B every consumer is busy: a light job at the head of READY still waits for the
        # first of them to come free. With each busy `cycle` s a job at random phases, that
        # wait's p99 is cycle * (1 - 0.01 ** (1 / consumers)): what no order of READY removes.
        for a, b in zip(by["A"], by["B"], strict=True):
            cycle = load.consumers * b.seconds / max(b.delivered, 1)
            floor = pct(a.lateness, 99) + cycle * (1 - 0.01 ** (1 / load.consumers)) * 1000
            ratio = pct(b.lateness, 99) / pct(a.lateness, 99)
            print(
                f"rep {b.rep}: B's light p99 ÷ A's {ratio:.2f}; A's p99 + the p99 wait for the "
                f"first of {load.consumers} busy consumers to come free (each {cycle * 1000:.1f} "
                f"ms a job, at random phases): {floor:.1f} ms"
            )
    held = f"the heavy group held to {load.heavy_limit} of {load.consumers} consumers"
    against = {
        ("E", "A"): held,
        ("E", "F"): f"{held}, against on a queue of its own with as many consumers",
    }
    for (x, y), what in against.items():
        if x not in by or y not in by:
            continue
        for rx, ry in zip(by[x], by[y], strict=True):
            ratio = pct(rx.lateness, 99) / pct(ry.lateness, 99)
            print(f"rep {rx.rep}: {x}'s light p99 ÷ {y}'s {ratio:.2f} ({what})")
        px, py = ([v for r in by[s] for v in r.lateness] for s in (x, y))
        print(f"all repetitions: {x}'s light p99 ÷ {y}'s {pct(px, 99) / pct(py, 99):.2f}")


async def fairness(a: argparse.Namespace) -> None:
    load = Load(
        lights=a.lights,
        light_rate=a.heavy_rate / a.ratio,
        heavy_rate=a.heavy_rate,
        heavy_batch=a.heavy_batch,
        consumers=a.consumers,
        service_ms=a.service_ms,
        heavy_limit=a.heavy_limit if a.heavy_limit is not None else max(a.consumers - 2, 1),
        seconds=a.seconds,
        warmup=a.warmup,
        drain=a.drain,
    )
    if "F" in a.scenarios and load.heavy_limit >= load.consumers:
        raise SystemExit("F: --heavy-limit must leave the light queue a consumer")
    order = list(a.scenarios)
    runs: list[FairnessRun] = []
    async with stack() as (st, s):
        for rep in range(a.reps):
            k = rep % len(order)
            for scenario in order[k:] + order[:k]:  # each repetition starts one further
                run = await fairness_run(s, NS, f"fair-{rep}-{scenario}", scenario, load, st.procs)
                run.rep = rep + 1
                runs.append(run)
                print(
                    f"rep {rep + 1} {scenario}: {len(run.lateness):,} light jobs, "
                    f"p99 {pct(run.lateness, 99):.1f} ms",
                    flush=True,
                )
    print_fairness(runs, load)


# --- cost -----------------------------------------------------------------------------------


SCRIPTS = {
    f"cmdstat_{c}" for c in ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
}


def redis_work(server: Server) -> tuple[float, int, float]:
    """(usec of the script calls, their number, redis-server CPU seconds) so far. A script's
    usec includes the commands it calls, which commandstats also counts under their own names:
    only the scripts' figures are summed (the service sends little else per request)."""
    with server.client() as c:
        stats: dict[str, Any] = c.info("commandstats")
        cpu: dict[str, Any] = c.info("cpu")
    usec = sum(float(v["usec"]) for k, v in stats.items() if k in SCRIPTS)
    calls = sum(int(v["calls"]) for k, v in stats.items() if k in SCRIPTS)
    return usec, calls, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


async def spread(n: int, inflight: int, one: Callable[[int], Awaitable[None]]) -> None:
    """Calls ``one(i)`` for i in 0..n-1, ``inflight`` at a time."""
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            await one(i)

    await asyncio.gather(*(worker() for _ in range(inflight)))


async def check(r: aiohttp.ClientResponse, *ok: int) -> Any:
    """The reply's JSON (None when empty); a status not in ``ok`` stops the benchmark."""
    body = await r.read()
    if r.status not in ok:
        raise RuntimeError(f"{r.method} {r.url}: {r.status} {body.decode(errors='replace')}")
    return json.loads(body) if body else None


@dataclass(frozen=True)
class Cost:
    """One op of one variant in one round, per job."""

    us: float  # the scripts' usec (commandstats)
    scripts: float  # script calls
    cpu_us: float  # redis-server CPU (INFO cpu)
    empty: float  # consumes answered "no job available" while the queue held the jobs


async def cost_phase(
    st: Stack, s: aiohttp.ClientSession, op: str, variant: str, q: str, n: int, inflight: int
) -> Cost:
    path = f"/api/{NS}/{q}"
    ids = st.ids.setdefault(q, [])
    empty = 0

    async def publish(i: int) -> None:
        qp = {"group": GROUP} if variant.startswith("group") else {}
        if variant == "dedup":
            qp = {"dedup_key": f"k{i}"}
        async with s.put(path, params=qp, data=BODY) as r:
            await check(r, 201)

    async def consume(i: int) -> None:
        nonlocal empty
        while True:  # every job is ready: a 404 is a job held back (a limit), asked again
            async with s.get(path, params={"timeout": "0", "ttr": "600"}) as r:
                job = await check(r, 200, 404)
            if r.status == 200:
                ids.append(job["job_id"])
                return
            empty += 1

    async def ack(i: int) -> None:
        async with s.delete(f"{path}/job/{ids[i]}") as r:
            await check(r, 204, 200)

    one = {"publish": publish, "consume": consume, "ack": ack}[op]
    before = redis_work(st.redis)
    await spread(n, inflight, one)
    after = redis_work(st.redis)
    us, calls, cpu = ((x - y) / n for x, y in zip(after, before, strict=True))
    return Cost(us, calls, cpu * 1e6, empty / n)


async def cost_round(
    st: Stack, s: aiohttp.ClientSession, name: str, k: int, n: int, inflight: int
) -> dict[tuple[str, str], Cost]:
    """Every op of every variant on fresh queues, the variants in turn from the k-th."""
    order = COST_VARIANTS[k:] + COST_VARIANTS[:k]
    queue = {v: f"cost-{name}-{v.replace('+', '-')}" for v in order}
    for v, limits in LOOSE_LIMITS.items():
        async with s.patch(f"/api/{NS}/{queue[v]}/groups/{GROUP}", json=limits) as r:
            await check(r, 200)
    return {
        (op, v): await cost_phase(st, s, op, v, queue[v], n, inflight)
        for op in ("publish", "consume", "ack")
        for v in order
    }


async def cost(a: argparse.Namespace) -> None:
    got: dict[tuple[str, str], list[Cost]] = {}
    async with stack(a.pin) as (st, s):
        await cost_round(st, s, "warm", 0, min(a.cost_jobs, 500), a.concurrency)  # not counted
        idle = redis_work(st.redis)
        await asyncio.sleep(1)
        idle_us = redis_work(st.redis)[0] - idle[0]
        for rnd in range(a.rounds):
            one = await cost_round(
                st, s, str(rnd), rnd % len(COST_VARIANTS), a.cost_jobs, a.concurrency
            )
            for key, res in one.items():
                got.setdefault(key, []).append(res)
            line = ", ".join(f"{op} {v} {res.us:.1f}" for (op, v), res in one.items())
            print(f"round {rnd + 1}: {line} µs", flush=True)
    print()
    print(
        f"cost: Redis per job, {a.cost_jobs:,} jobs per variant and round, one per request, "
        f"{a.concurrency} in flight, medians of {a.rounds} round(s)"
        + (", redis-server alone on a core" if a.pin else "")
    )
    print(
        f"{'op':<8} {'variant':<17} {'µs/job':>7} {'vs plain':>9}  {'rounds':<29}"
        f" {'scripts/job':>11} {'redis-server CPU µs/job':>23} {'404s/job':>8}"
    )
    for op in ("publish", "consume", "ack"):
        plain = statistics.median(x.us for x in got[(op, "plain")])
        for v in COST_VARIANTS:
            xs = got[(op, v)]
            us = statistics.median(x.us for x in xs)
            rounds = " ".join(f"{x.us:.1f}" for x in xs)
            vs = "" if v == "plain" else f"{(us / plain - 1) * 100:+.0f} %"
            print(
                f"{op:<8} {v:<17} {us:>7.1f} {vs:>9}  {rounds:<29}"
                f" {statistics.median(x.scripts for x in xs):>11.2f}"
                f" {statistics.median(x.cpu_us for x in xs):>23.0f}"
                f" {statistics.median(x.empty for x in xs):>8.2f}"
            )
    print(
        "(µs/job: the scripts' usec in INFO commandstats over the jobs, rounds in the order they "
        f"ran; idle, the pump's scripts took {idle_us:.0f} µs a second. redis-server CPU: INFO "
        "cpu, everything the server did meanwhile, the pump and the network included. 404s: "
        "consumes answered 'no job available' while every job was ready, asked again)"
    )


# --- memory ---------------------------------------------------------------------------------


def used_memory(server: Server) -> int:
    with server.client() as c:
        return int(c.info("memory")["used_memory"])


async def fill(
    s: aiohttp.ClientSession,
    q: str,
    n: int,
    delay: Callable[[int], int],
    group_of: Callable[[int], str | None],
) -> None:
    """``n`` jobs of 64 bytes into ``q`` in bulks of 64, the i-th bulk delayed ``delay(i)``
    seconds and in group ``group_of(i)``."""

    async def bulk(i: int) -> None:
        qp = {"delay": str(delay(i))}
        if (g := group_of(i)) is not None:
            qp["group"] = g
        body = b"[" + b",".join([ELEMENT] * min(64, n - i * 64)) + b"]"
        async with s.put(f"/api/{NS}/{q}/bulk", params=qp, data=body) as r:
            await check(r, 201)

    await spread((n + 63) // 64, 8, bulk)


async def memory(a: argparse.Namespace) -> None:
    n = a.memory_jobs
    groups: dict[str, Callable[[int], str | None]] = {
        "no group": lambda i: None,
        f'one group, "{GROUP}"': lambda i: GROUP,
        "1,000 groups of 8 bytes": lambda i: f"t-{i % 1000:06d}",
    }
    # Delayed: the bulks spread over the 360 10-s windows of an hour, 1 to 2 h ahead, in turn
    # (bulks sent at once into one window can fill its lane: the overflow rests outside the
    # wheel, which would make the figure depend on timing).
    states: dict[str, Callable[[int], int]] = {
        "ready": lambda i: 0,
        "delayed": lambda i: 3600 + i % 360 * 10,
    }
    rows: dict[str, dict[str, float]] = {label: {} for label in groups}
    async with stack() as (st, s):
        # every path once first (scripts loaded, the service's own keys made), not counted
        for state, delay in states.items():
            for label, group_of in groups.items():
                await fill(s, "warm", 640, delay, group_of)
        for si, (state, delay) in enumerate(states.items()):
            for gi, (label, group_of) in enumerate(groups.items()):
                base = used_memory(st.redis)
                await fill(s, f"mem-{si}-{gi}", n, delay, group_of)
                rows[label][state] = (used_memory(st.redis) - base) / n
                print(f"memory: {label}, {state}: {rows[label][state]:.1f} B/job", flush=True)
    print()
    print(
        f"memory: Redis used_memory per job, {n:,} jobs of 64 B per cell (bulks of 64; delayed: "
        "due over an hour, 1 to 2 h ahead)"
    )
    print(f"{'':<26} {'ready B/job':>12} {'delayed B/job':>14}   vs no group")
    plain = rows["no group"]
    for label, row in rows.items():
        ready, delayed = row["ready"], row["delayed"]
        vs = f"{ready - plain['ready']:+.1f} / {delayed - plain['delayed']:+.1f}"
        print(f"{label:<26} {ready:>12.1f} {delayed:>14.1f}   {'' if row is plain else vs}")


async def bench(a: argparse.Namespace) -> None:
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} cores",
        flush=True,
    )
    if a.only in (None, "memory"):
        await memory(a)
    if a.only in (None, "cost"):
        await cost(a)
    if a.only in (None, "scripts"):
        await scripts(a.rounds, a.script_calls, a.per_call)
    if a.only in (None, "fairness"):
        await fairness(a)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", choices=["fairness", "cost", "scripts", "memory"])
    f = ap.add_argument_group("fairness")
    f.add_argument("--reps", type=int, default=1, help="repetitions of the runs")
    f.add_argument(
        "--scenarios",
        default="ABC",
        type=lambda raw: "".join(dict.fromkeys(raw.upper())),
        help="which runs: A, B, C, D (light jobs with no group beside a grouped heavy one), E "
        "(B with the heavy group's concurrency limited: --heavy-limit) and F (E's control: the "
        "heavy group on a queue of its own with --heavy-limit consumers)",
    )
    f.add_argument("--seconds", type=float, default=15.0, help="publishing, per run")
    f.add_argument("--warmup", type=float, default=2.0, help="light jobs before this not counted")
    f.add_argument("--drain", type=float, default=3.0, help="wait at most this for light jobs")
    f.add_argument("--heavy-rate", type=float, default=500.0, help="the heavy group's jobs/s")
    f.add_argument("--heavy-batch", type=int, default=10, help="heavy jobs per bulk request")
    f.add_argument("--ratio", type=float, default=100.0, help="heavy rate ÷ one light's rate")
    f.add_argument("--lights", type=int, default=10)
    f.add_argument("--consumers", type=int, default=8)
    f.add_argument("--service-ms", type=float, default=20.0, help="each job held before its ack")
    f.add_argument(
        "--heavy-limit",
        type=int,
        help="E: the heavy group's concurrency limit, F: its queue's consumers (default: 2 "
        "fewer than the consumers)",
    )
    c = ap.add_argument_group("cost")
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--cost-jobs", type=int, default=3000, help="per variant, op and round")
    c.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    c.add_argument(
        "--pin",
        action="store_true",
        help="redis-server alone on the last core, the service and the load on the others",
    )
    sc = ap.add_argument_group("scripts (--rounds as cost's)")
    sc.add_argument("--script-calls", type=int, default=300, help="per variant, op and round")
    sc.add_argument("--per-call", type=int, default=6, help="jobs per script call")
    m = ap.add_argument_group("memory")
    m.add_argument("--memory-jobs", type=int, default=100_000, help="per cell")
    uvloop.run(bench(ap.parse_args()))


if __name__ == "__main__":
    main()
