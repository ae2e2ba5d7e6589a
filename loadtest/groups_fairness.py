"""One fairness run of ``bench_groups.py``: light groups (and a heavy one) publishing at fixed
rates over HTTP into one queue, consumers of fixed capacity, and the light jobs' lateness.

Lateness is delivery time - publish time (delay 0: the job is due when published): the publish
time, taken just before the request is sent, rides in the body with the job's light group
(scenarios C and D send the light jobs without one, so the reply cannot say it); the delivery
time is when the consume reply has been read. Publishers and consumers share this process's
event loop and clock.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any
from dataclasses import dataclass, field

import aiohttp
import psutil

LABELS = {
    "A": "A light alone, grouped",
    "B": "B light + heavy, grouped",
    "C": "C light + heavy, no groups",
    "D": "D light no group + heavy grouped",
    "E": "E light + heavy capped, grouped",
    "F": "F light, heavy on its own queue",
}


@dataclass(frozen=True)
class Load:
    lights: int
    light_rate: float  # jobs/s, each light group
    heavy_rate: float  # jobs/s
    heavy_batch: int  # heavy jobs per bulk request
    consumers: int
    service_ms: float  # each job held this long before its ack
    heavy_limit: int  # E: the heavy group's concurrency limit (its jobs reserved at once); F: its
    # queue's consumers
    seconds: float  # publishing
    warmup: float  # light jobs published before this are not counted
    drain: float  # after publishing, wait at most this long for the counted light jobs


@dataclass
class FairnessRun:
    scenario: str
    seconds: float
    lateness: list[float] = field(default_factory=list)  # ms, counted light jobs
    overtaken: list[int] = field(default_factory=list)  # heavy jobs delivered while one waited
    group_p99: list[float] = field(default_factory=list)  # ms, per light group
    waiting: int = 0  # counted light jobs not delivered by the end (lateness: waited so far)
    delivered: int = 0  # every job, during the publishing
    backlog: int = 0  # heavy jobs published and not delivered at the end of publishing
    cpu: tuple[float, ...] = ()  # this process, the service, Redis: CPU over the run's wall time
    rep: int = 0

    @property
    def label(self) -> str:
        return LABELS[self.scenario]


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else float("nan")


def _cpu(procs: list[psutil.Process]) -> tuple[float, float, float]:
    """CPU seconds so far: this process, the service (all but the last of ``procs``), Redis."""

    def of(p: psutil.Process) -> float:
        t = p.cpu_times()
        return float(t.user + t.system)

    return time.process_time(), sum(of(p) for p in procs[:-1]), of(procs[-1])


async def paced(rate: float, until: float, send: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Calls ``send`` ``rate`` times a second until ``until`` (monotonic), at a random phase,
    each call a task of its own so that a slow reply does not hold the next one back."""
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic() + random.random() / rate
    n = 0
    while (at := start + n / rate) < until:
        if (wait := at - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        t = asyncio.create_task(send())
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)


async def fairness_run(
    s: aiohttp.ClientSession,
    ns: str,
    q: str,
    scenario: str,
    load: Load,
    procs: list[psutil.Process],
) -> FairnessRun:
    """The run's figures; ``procs``: the service's processes and redis-server, whose CPU over
    the run it reports beside this process's."""
    run = FairnessRun(scenario, load.seconds)
    path = f"/api/{ns}/{q}"
    # F, the control for E: the heavy group on a queue of its own with E's share of the
    # consumers, the light groups on theirs with the rest (the same load on the machine, no
    # queue shared)
    heavy_path = f"{path}-heavy" if scenario == "F" else path
    light_grouped, heavy_grouped = scenario in "ABEF", scenario in "BDEF"
    heavy = scenario != "A"
    t0 = time.monotonic()
    counted_from, stop_at = t0 + load.warmup, t0 + load.seconds
    outstanding: dict[str, float] = {}  # counted light jobs not delivered yet: publish time
    # heavy deliveries seen so far, and when each counted light job's publish was answered
    # (it was in READY then): the heavy jobs delivered after it, before it, overtook it
    heavy_seen = 0
    seen_at: dict[str, int] = {}
    late: dict[str, list[float]] = {f"light-{i}": [] for i in range(load.lights)}
    seq = 0
    heavy_sent = heavy_got = 0
    publishing = True

    async def put(params: dict[str, str], body: bytes, url: str = path) -> None:
        async with s.put(url, params=params, data=body) as r:
            if r.status != 201:
                raise RuntimeError(f"publish: {r.status} {await r.text()}")

    def light(name: str) -> Callable[[], Coroutine[Any, Any, None]]:
        async def send() -> None:
            nonlocal seq
            seq += 1
            key, now = f"{name}:{seq}", time.monotonic()
            if now >= counted_from:
                outstanding[key] = now
            await put({"group": name} if light_grouped else {}, f"{key} {now!r}".encode())
            if key in outstanding:  # (not delivered before its publish was answered)
                seen_at[key] = heavy_seen

        return send

    async def heavy_send() -> None:
        nonlocal heavy_sent
        heavy_sent += load.heavy_batch
        body = b"[" + b",".join([b'"heavy"'] * load.heavy_batch) + b"]"
        await put({"group": "heavy"} if heavy_grouped else {}, body, f"{heavy_path}/bulk")

    async def consumer(polled: str) -> None:
        nonlocal heavy_got, heavy_seen
        while True:
            async with s.get(polled, params={"timeout": "1", "ttr": "60"}) as r:
                if r.status == 404:
                    continue
                if r.status != 200:
                    raise RuntimeError(f"consume: {r.status} {await r.text()}")
                job = await r.json()
            got = time.monotonic()
            data = base64.b64decode(job["data"]).decode()
            if data == '"heavy"':  # (a bulk's element keeps its quotes)
                heavy_got += 1 if publishing else 0
                heavy_seen += 1 if polled == path else 0  # (F: none overtakes from its queue)
            else:
                key, sent = data.split(" ")
                if outstanding.pop(key, None) is not None:
                    late[key.split(":")[0]].append((got - float(sent)) * 1000)
                    run.overtaken.append(heavy_seen - seen_at.pop(key, heavy_seen))
            if publishing:
                run.delivered += 1
            await asyncio.sleep(load.service_ms / 1000)
            async with s.delete(f"{polled}/job/{job['job_id']}") as r:
                if r.status not in (200, 204):
                    raise RuntimeError(f"ack: {r.status} {await r.text()}")

    if scenario == "E":  # the heavy group may hold only so many consumers: the rest stay free
        limits = {"concurrency": load.heavy_limit}
        async with s.patch(f"{path}/groups/heavy", json=limits) as r:
            if r.status != 200:
                raise RuntimeError(f"group settings: {r.status} {await r.text()}")
    cpu = _cpu(procs)
    held = load.heavy_limit if scenario == "F" else 0  # consumers of the heavy queue
    consumers = [
        asyncio.create_task(consumer(heavy_path if i < held else path))
        for i in range(load.consumers)
    ]
    pacers = [paced(load.light_rate, stop_at, light(name)) for name in late]
    if heavy:
        pacers.append(paced(load.heavy_rate / load.heavy_batch, stop_at, heavy_send))
    try:
        await asyncio.gather(*pacers)
        publishing = False
        run.backlog = heavy_sent - heavy_got
        drain_until = time.monotonic() + load.drain
        while outstanding and time.monotonic() < drain_until:
            if any(c.done() for c in consumers):
                break
            await asyncio.sleep(0.01)
        end = time.monotonic()
    finally:
        for c in consumers:
            c.cancel()
        results = await asyncio.gather(*consumers, return_exceptions=True)
    for x in results:
        if isinstance(x, BaseException) and not isinstance(x, asyncio.CancelledError):
            raise x
    run.cpu = tuple((b - a) / (end - t0) for a, b in zip(cpu, _cpu(procs), strict=True))
    run.waiting = len(outstanding)
    for key, sent in outstanding.items():  # still waiting: as late as the wait so far, at least
        late[key.split(":")[0]].append((end - sent) * 1000)
        run.overtaken.append(heavy_seen - seen_at.get(key, heavy_seen))
    run.lateness = [x for xs in late.values() for x in xs]
    run.group_p99 = [_p99(xs) for xs in late.values() if xs]
    for p in {path, heavy_path}:  # the run's queues and their backlog go
        async with s.delete(p) as r:
            await r.read()
    return run
