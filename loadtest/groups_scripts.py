"""The ``scripts`` section of ``bench_groups.py``: Redis per job of each variant (no group, a
group, a group with a concurrency limit or a rate meant never to bind, a dedup key, a debounce
that replaces the job waiting under its key) through the engine directly, without HTTP:
``per_call`` jobs per script call (as the group commit shares a call among concurrent
requests), for publish, consume and ack. Two figures per cell: the
scripts' usec in ``INFO commandstats`` per job (the minimum over the rounds, the round least
disturbed by the rest of the machine, and the median), and the Redis commands the scripts
called per job, which no noise changes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.groups import configure_group, parse_changes
from cluster_dq.engine.steps import EngineConfig
from cluster_dq.localredis import start_server
from cluster_dq.models import JobSpec

VARIANTS = ("plain", "group", "group+concurrency", "group+rate", "dedup", "debounce")
LIMITS: dict[str, dict[str, Any]] = {
    "group+concurrency": {"concurrency": 1_000_000},
    "group+rate": {"rate": "1000000/1s"},
}
GROUP = "tenant-1"
BODY = b"x" * 64
SCRIPT_STATS = ("eval", "evalsha", "eval_ro", "evalsha_ro")


@dataclass(frozen=True)
class Cell:
    us: float  # the scripts' usec per job
    commands: float  # commands the scripts called per job


def _work(c: redis.Redis) -> tuple[float, int]:
    stats: dict[str, Any] = c.info("commandstats")
    us, commands = 0.0, 0
    for name, v in stats.items():
        cmd = name.removeprefix("cmdstat_")
        if cmd in SCRIPT_STATS:
            us += float(v["usec"])
        elif cmd not in ("info", "config|resetstat"):
            commands += int(v["calls"])
    return us, commands


async def _round(
    eng: AsyncEngine, c: redis.Redis, rnd: int, calls: int, per_call: int
) -> dict[tuple[str, str], Cell]:
    cfg, out = eng.config, {}
    k = rnd % len(VARIANTS)
    for v in VARIANTS[k:] + VARIANTS[:k]:
        q = f"scripts-{rnd}-{v.replace('+', '-')}"
        if v in LIMITS:
            await eng.run(configure_group(cfg, "bench", q, GROUP, parse_changes(LIMITS[v]), 0))
        group = GROUP if v.startswith("group") else None

        def keyed(i: int, mode: str) -> list[ops.KeyedRequest]:
            dedup = [ops.Dedup(f"k{i}-{j}", mode) for j in range(per_call)]
            return [ops.KeyedRequest([JobSpec(BODY)], d, None) for d in dedup]

        if v == "debounce":  # each publish measured replaces a job waiting under its key
            for i in range(calls):
                await eng.run(ops.publish_keyed_many(cfg, "bench", q, keyed(i, v), now_ms()))
        before = _work(c)
        for i in range(calls):
            if v in ("dedup", "debounce"):
                mode = "simple" if v == "dedup" else v
                await eng.run(ops.publish_keyed_many(cfg, "bench", q, keyed(i, mode), now_ms()))
            else:
                specs = [JobSpec(BODY, group=group) for _ in range(per_call)]
                await eng.run(ops.publish(cfg, "bench", q, specs, now_ms()))
        n = calls * per_call
        out["publish", v] = _cell(before, _work(c), n)
        ids: list[str] = []
        before = _work(c)
        for _ in range(calls):
            jobs = await eng.run(ops.consume(cfg, "bench", (q,), 600_000, per_call, now_ms()))
            ids += [j.job_id for j in jobs]
        if len(ids) != n:
            raise RuntimeError(f"{v}: consumed {len(ids)} of {n} jobs")
        out["consume", v] = _cell(before, _work(c), n)
        before = _work(c)
        for i in range(0, n, per_call):
            await eng.run(ops.ack("bench", q, ids[i : i + per_call]))
        out["ack", v] = _cell(before, _work(c), n)
    return out


def _cell(before: tuple[float, int], after: tuple[float, int], n: int) -> Cell:
    return Cell((after[0] - before[0]) / n, (after[1] - before[1]) / n)


async def scripts(rounds: int, calls: int, per_call: int) -> None:
    server = start_server()
    client = aredis.Redis(port=server.port)
    try:
        with server.client() as c:
            eng = AsyncEngine(client, EngineConfig())
            got: dict[tuple[str, str], list[Cell]] = {}
            for rnd in range(rounds):
                for key, cell in (await _round(eng, c, rnd, calls, per_call)).items():
                    got.setdefault(key, []).append(cell)
    finally:
        await client.aclose()
        server.stop()
    print()
    print(
        f"scripts: Redis per job through the engine (no HTTP), {per_call} jobs per script call, "
        f"{calls} calls per variant, op and round, {rounds} rounds"
    )
    print(
        f"{'op':<8} {'variant':<17} {'min µs/job':>10} {'vs plain':>9} {'median':>7}"
        f" {'commands/job':>12} {'vs plain':>9}"
    )
    for op in ("publish", "consume", "ack"):
        base = got[op, "plain"]
        base_us, base_cmd = min(x.us for x in base), base[0].commands
        for v in VARIANTS:
            xs = got[op, v]
            us, cmd = min(x.us for x in xs), xs[0].commands
            vs_us = "" if v == "plain" else f"{(us / base_us - 1) * 100:+.0f} %"
            vs_cmd = "" if v == "plain" else f"{cmd - base_cmd:+.2f}"
            print(
                f"{op:<8} {v:<17} {us:>10.2f} {vs_us:>9} "
                f"{statistics.median(x.us for x in xs):>7.2f} {cmd:>12.2f} {vs_cmd:>9}"
            )
    print(
        "(min µs/job: the scripts' usec in INFO commandstats, the least of the rounds; commands: "
        "those the scripts called, from the same stats)"
    )
