"""The fleet-scaling benchmark: what one unit of work costs as the fleet grows.

    python loadtest/bench_scale.py                           # both tables, 30 s per point
    python loadtest/bench_scale.py --only instances --seconds 20 --rounds 3
    python loadtest/bench_scale.py --only masters --queues 24

1. **Instances**: the same total load (the load profile's mix, ``--rate`` req/s through nginx,
   ``--jobs`` delayed jobs resident) over 1, 2, 4 and 8 service instances on one Redis. Per
   point: the service's CPU per request (every instance summed), Redis's CPU per delivered job,
   the lateness p99 and max, the p99 of publish and ack, and what the instances cost with no
   request at all (``--idle-seconds`` before the load). Growth is against 1 instance.
2. **Masters**: the same load from 2 instances on a Redis Cluster of 1, 3 and 6 masters (no
   replicas: on 2 cores a replica's copy would be charged to the box, not to the work). Per
   point: Redis CPU per delivered job summed over the masters, and how evenly the masters share
   the keys, the script calls, the CPU and the pump leaders (spread: the largest share over the
   mean, minus 1; 0 is perfectly even).

On 2 cores these are costs per unit of work, not throughput: 8 instances, 6 masters, nginx and
locust share the same two cores. Rounds interleave the points (1, 2, 4, 8, 1, 2, ...), and each
figure is the median over the rounds: this machine is noisy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import redis

if __package__ in (None, ""):  # run as a script (python loadtest/bench_scale.py): find loadtest
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_dq.engine.commands import EngineConfig  # noqa: E402
from cluster_dq.keys import ShardKeys  # noqa: E402
from cluster_dq.localredis import Cluster, Server  # noqa: E402
from loadtest.load_profile import Stack, cpu_seconds, measure, stack  # noqa: E402

SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


def _median(points: Sequence[dict[str, Any]], key: str) -> float:
    values = [p[key] for p in points if p.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def _per_request(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures one table row shows, from one ``measure``."""
    delivered = max(figures["delivered"], 1)
    return {
        "rps": figures["rps"],
        "failures": figures["failures"],
        "service_us": figures["service_cpu"] / max(figures["requests"], 1) * 1e6,
        "redis_us": figures["cpu"]["redis"] / delivered * 1e6,
        "late_p99": figures["lateness_p99"],
        "late_max": figures["lateness_max"],
        "worst_p99": figures["worst_p99"],
        "late_q_p99": max(figures["lateness_p99_by_queue"].values(), default=None),
    }


# -- instances ------------------------------------------------------------------------------


def instances_table(counts: list[int], a: argparse.Namespace) -> None:
    def point(n: int, variant: Variant) -> dict[str, Any]:
        _, root, bare = variant
        with (
            stack(0 if bare else a.jobs, n, queues=a.queues, root=root, bare=bare) as st,
            tempfile.TemporaryDirectory() as tmp,
        ):
            idle = _idle_share(st, a.idle_seconds)
            figures = _per_request(measure(st, a.rate, a.seconds, Path(tmp) / "locust"))
            return figures | {"idle": idle}

    runs = _rounds(counts, a, point, "{} instance(s)")
    print(
        f"\nscale: the same load ({a.rate:,.0f} req/s asked, the profile's mix, {a.jobs:,} "
        f"resident, {a.queues} queues) over more instances; medians of {a.rounds} round(s)"
    )
    print(
        f"  {'code':>6} {'instances':>9} {'req/s':>7} {'fail':>5} {'service µs/req':>15} "
        f"{'growth':>7} {'redis µs/job':>13} {'lateness p99':>13} {'worst queue p99':>16} "
        f"{'max':>6} {'publish/ack p99':>16} {'idle, % of a core':>18}"
    )
    for label, n, pts, us, growth in _rows(runs, counts, a, "service_us"):
        print(
            f"  {label:>6} {n:>9} {_median(pts, 'rps'):7,.0f} "
            f"{sum(p['failures'] for p in pts):5,} {us:15,.0f} {growth:+7.0%} "
            f"{_median(pts, 'redis_us'):13,.0f} {_median(pts, 'late_p99'):10,.0f} ms "
            f"{_median(pts, 'late_q_p99'):13,.0f} ms {_median(pts, 'late_max'):3,.0f} ms "
            f"{_median(pts, 'worst_p99'):13,.0f} ms {_median(pts, 'idle'):17.1f}%"
        )


def _idle_share(st: Stack, seconds: float) -> float:
    """What the instances cost, summed, with no request at all (their pumps, leases, timers),
    in % of one core over ``seconds``."""
    services = [ps for name, ps in st.processes().items() if name.startswith("service-")]
    before = sum(cpu_seconds(ps) for ps in services)
    time.sleep(seconds)
    return (sum(cpu_seconds(ps) for ps in services) - before) / seconds * 100


Runs = dict[tuple[str, int], list[dict[str, Any]]]
Variant = tuple[str, Path | None, bool]  # label, checkout (None: this one), bare


def _rounds(
    counts: list[int],
    a: argparse.Namespace,
    point: Callable[[int, Variant], dict[str, Any]],
    what: str,
) -> Runs:
    """Every point of every round, each count on each code in turn (interleaved: this machine
    drifts); ``what`` names a count in the progress lines."""
    runs: Runs = {}
    for r in range(a.rounds):
        for n in counts:
            for variant in _variants(a):
                label = variant[0]
                print(f"\nscale: round {r + 1}/{a.rounds}, {what.format(n)}, {label}", flush=True)
                runs.setdefault((label, n), []).append(point(n, variant))
    return runs


def _rows(
    runs: Runs, counts: list[int], a: argparse.Namespace, key: str
) -> Iterator[tuple[str, int, list[dict[str, Any]], float, float]]:
    """Per code and count: its points, the median of ``key`` and its growth from the first
    count."""
    for label, _, _ in _variants(a):
        base = _median(runs[(label, counts[0])], key)
        for n in counts:
            pts = runs[(label, n)]
            value = _median(pts, key)
            yield label, n, pts, value, value / base - 1


def _variants(a: argparse.Namespace) -> list[Variant]:
    """The code each point runs: this checkout; with ``--versus`` another one before it; with
    ``--bare`` (instances table only) the bare queue (``loadtest/bare_queue.py``)."""
    out: list[Variant] = [("before", Path(a.versus), False)] if a.versus else []
    out.append(("now", None, False))
    if getattr(a, "bare", False):
        out.append(("bare", None, True))
    return out


# -- masters --------------------------------------------------------------------------------


def _masters(st: Stack) -> list[Server]:
    out = []
    for s in st.redis_servers():
        with s.client() as c:
            if c.info("replication")["role"] == "master":
                out.append(s)
    return out


def _script_calls(server: Server) -> int:
    with server.client() as c:
        stats: dict[str, Any] = c.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPT_COMMANDS)


def _leaders(st: Stack, masters: list[Server]) -> list[int]:
    """How many pump shards each master leads (holds the leader lock of)."""
    counts = [0] * len(masters)
    port_index = {s.port: i for i, s in enumerate(masters)}
    assert isinstance(st.redis, Cluster)
    seed = st.redis.servers[0]
    client = redis.RedisCluster(host="127.0.0.1", port=seed.port)
    try:
        for shard in range(EngineConfig().shards):
            key = ShardKeys(shard).lock
            if client.exists(key):
                node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
                counts[port_index[int(node.port)]] += 1
    finally:
        client.close()
    return counts


def _spread(shares: Sequence[float]) -> float:
    mean = sum(shares) / len(shares) if shares else 0.0
    return max(shares) / mean - 1 if mean else float("nan")


def masters_table(counts: list[int], a: argparse.Namespace) -> None:
    runs = _rounds(
        counts, a, lambda m, variant: _masters_point(m, a, variant[1]), "a Cluster of {} master(s)"
    )
    print(
        f"\nscale: the same load ({a.rate:,.0f} req/s asked, {a.instances} instances, {a.jobs:,} "
        f"resident, {a.queues} queues) on a Cluster of more masters; medians of {a.rounds} "
        "round(s); spread = the busiest master's share over the mean, minus 1"
    )
    print(
        f"  {'code':>6} {'masters':>7} {'req/s':>7} {'fail':>5} {'redis µs/job':>13} "
        f"{'growth':>7} {'service µs/req':>15} {'lateness p99':>13} {'spread: keys':>13} "
        f"{'scripts':>8} {'CPU':>6} {'leaders':>8}  leaders per master"
    )
    for label, m, pts, us, growth in _rows(runs, counts, a, "redis_us"):
        spread = {k: f"{_median(pts, k):+.0%}" for k in ("keys", "scripts", "cpu", "leaders")}
        print(
            f"  {label:>6} {m:>7} {_median(pts, 'rps'):7,.0f} "
            f"{sum(p['failures'] for p in pts):5,} {us:13,.0f} {growth:+7.0%} "
            f"{_median(pts, 'service_us'):15,.0f} {_median(pts, 'late_p99'):10,.0f} ms "
            f"{spread['keys']:>13} {spread['scripts']:>8} {spread['cpu']:>6} "
            f"{spread['leaders']:>8}  {pts[-1]['leader_counts']}"
        )


def _masters_point(m: int, a: argparse.Namespace, root: Path | None) -> dict[str, Any]:
    with (
        stack(
            a.jobs, a.instances, cluster=True, masters=m, replicas=0, queues=a.queues, root=root
        ) as st,
        tempfile.TemporaryDirectory() as tmp,
    ):
        masters = _masters(st)
        procs = [psutil.Process(s.process.pid) for s in masters]
        cpu0 = [cpu_seconds([p]) for p in procs]
        calls0 = [_script_calls(s) for s in masters]
        figures = measure(st, a.rate, a.seconds, Path(tmp) / "locust")
        cpu = [cpu_seconds([p]) - c for p, c in zip(procs, cpu0)]
        calls = [_script_calls(s) - c for s, c in zip(masters, calls0)]
        keys = []
        for s in masters:
            with s.client() as c:
                keys.append(int(c.dbsize()))
        leaders = _leaders(st, masters)
    return _per_request(figures) | {
        "keys": _spread(keys),
        "scripts": _spread(calls),
        "cpu": _spread(cpu),
        "leaders": _spread(leaders),
        "leader_counts": leaders,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", choices=["instances", "masters"], help="one table only")
    ap.add_argument("--rate", type=float, default=1000, help="HTTP requests/s asked, in all")
    ap.add_argument("--seconds", type=float, default=30, help="per point")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=100_000, help="resident delayed jobs")
    ap.add_argument("--queues", type=int, default=8, help="queues the mix spreads over")
    ap.add_argument("--instance-counts", default="1,2,4,8")
    ap.add_argument(
        "--idle-seconds", type=float, default=10, help="per instances point, before the load"
    )
    ap.add_argument("--master-counts", default="1,3,6")
    ap.add_argument("--instances", type=int, default=2, help="service instances (masters table)")
    ap.add_argument(
        "--versus",
        metavar="CHECKOUT",
        help="also run each point on that checkout's code, interleaved",
    )
    ap.add_argument(
        "--bare",
        action="store_true",
        help="instances table: also run each point on the bare queue (loadtest/bare_queue.py), "
        "the least an instance can do for the same requests",
    )
    a = ap.parse_args()
    if a.only in (None, "instances"):
        instances_table([int(n) for n in a.instance_counts.split(",")], a)
    a.bare = False  # the masters table has no Redis work to compare with a bare queue
    if a.only in (None, "masters"):
        masters_table([int(m) for m in a.master_counts.split(",")], a)


if __name__ == "__main__":
    main()
