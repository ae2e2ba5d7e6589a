"""Service CPU per request, the figure that a noisy 2-core machine still measures well: the CPU
time the service's worker processes spend (user + system, from /proc) divided by the requests
they answered, for the hot routes, beside a bare Starlette endpoint (``loadtest/bare_app.py``:
route, read the body, answer JSON) served by uvicorn with the same options in the same run.

    python loadtest/bench_cpu.py                     # 3 rounds of 5 s per scenario
    python loadtest/bench_cpu.py --rounds 5 --seconds 10 --connections 32
    python loadtest/bench_cpu.py --metrics off       # the same with EnableMetrics=0
    python loadtest/bench_cpu.py --py-spy /tmp/spy   # and where the time goes (py-spy)
    python loadtest/bench_cpu.py --before ../old     # beside an older checkout, interleaved
    python loadtest/bench_cpu.py --granian           # and both sides served by Granian too

Scenarios (one worker process each side; wrk drives them from 2 threads):

- ``bare``: ``PUT`` a 64-byte body to the bare endpoint;
- ``publish``: ``PUT /api/bench/p`` one 64-byte job per request;
- ``publish_dedup``: the same with a ``dedup_key``, a new key per request (its own script
  call, outside the group commit);
- ``consume``: ``GET /api/bench/c?timeout=0&ttr=600``, one job per request from a full queue;
- ``ack``: ``DELETE /api/bench/a/job/{id}`` of reserved jobs, one per request;
- ``bulk``: ``PUT /api/bench/b/bulk`` of 64 jobs per request (its CPU per job is the request's
  divided by 64).

The scenarios are interleaved round by round and the medians printed, with each route's ratio
to ``bare`` and Redis's CPU per request. Figures only; nothing is asserted. wrk is installed
with apt-get when missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from cluster_dq.localredis import free_port, start_server
from cluster_dq.settings import PoolSettings
from cluster_dq.testing import default_sigint
from cluster_dq.testing.service_process import ServiceProcess, pool_env

ROOT = Path(__file__).resolve().parents[1]
BODY = os.urandom(32).hex().encode()  # 64 bytes
THREADS = 2


@dataclass
class Sample:
    requests: int
    non2xx: int
    seconds: float
    cpu: float  # the server's worker processes, seconds
    redis_cpu: float

    @property
    def us_per_request(self) -> float:
        return self.cpu / max(self.requests, 1) * 1e6

    @property
    def redis_us_per_request(self) -> float:
        return self.redis_cpu / max(self.requests, 1) * 1e6

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    print("installing wrk (apt-get)", file=sys.stderr, flush=True)
    subprocess.run([str(ROOT / "deploy" / "dev" / "apt-install"), "wrk"], check=True)
    return shutil.which("wrk") or "wrk"


def run_wrk(
    url: str,
    method: str,
    token: str,
    seconds: float,
    conns: int,
    body: bytes | None = None,
    ids: list[str] | None = None,
) -> tuple[int, int]:
    """Requests answered, and how many were not 2xx."""
    with tempfile.TemporaryDirectory(prefix="cluster-dq-bench-cpu-") as tmp:
        env = {
            **os.environ,
            "WRK_METHOD": method,
            "WRK_TOKEN": token,
            "WRK_THREADS": str(THREADS),
        }
        if body is not None:
            Path(tmp, "body").write_bytes(body)
            env["WRK_BODY_FILE"] = str(Path(tmp, "body"))
        if ids is not None:
            Path(tmp, "ids").write_text("\n".join(ids) + "\n")
            env["WRK_IDS_FILE"] = str(Path(tmp, "ids"))
        cmd = [wrk_binary(), f"-t{THREADS}", f"-c{conns}", f"-d{seconds:.0f}s"]
        cmd += ["-s", str(ROOT / "loadtest" / "wrk_cpu.lua"), url]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return total, int(bad.group(1)) if bad else 0


@contextmanager
def py_spy(pid: int, out: Path | None) -> Iterator[None]:
    """Samples ``pid`` with py-spy (collapsed stacks in ``out``) while the block runs."""
    if out is None:
        yield
        return
    cmd = [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(pid), "-f", "raw"]
    cmd += ["-r", "250", "--nonblocking", "-o", str(out)]
    spy = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=out.with_suffix(".log").open("w"),
        preexec_fn=default_sigint,  # stopped by SIGINT below, even when this runs under nohup
    )
    time.sleep(0.5)  # attached before the load starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        spy.wait(30)


LAYERS = (  # (name, what a sampled frame's file path contains), the first match wins
    ("request middleware (ids, metrics, access log)", "cluster_dq/http/middleware.py"),
    ("hot-path dispatch", "cluster_dq/http/hot.py"),
    ("handlers, parameters, responses", "cluster_dq/http/"),
    ("engine (operations, executor, replies)", "cluster_dq/engine/"),
    ("metrics", "cluster_dq/metrics.py"),
    ("service, group commit, tokens, waiters, models", "cluster_dq/"),
    ("Starlette (middleware, router, requests)", "starlette/"),
    ("uvicorn (HTTP parsing, writes)", "uvicorn/"),
    ("redis-py (commands, connections, parsing)", "redis/"),
    ("prometheus-client", "prometheus_client/"),
    ("asyncio and the event loop", "asyncio/"),
)


def layer_of(frame: str) -> str:
    path = frame[frame.find("(") + 1 :]
    return next((name for name, part in LAYERS if part in path), "other (stdlib)")


def summarize(path: Path, top: int = 12) -> None:
    """Where the sampled time went, by layer (a sample counts for the layer of its innermost
    frame: time spent in a layer's own code) and the functions with the most samples of their
    own, from py-spy's collapsed stacks."""
    layers: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        innermost = re.sub(r":\d+\)$", ")", stack.split(";")[-1])
        count = int(n)
        total += count
        own[innermost] += count
        layers[layer_of(innermost)] += count
    print(f"\n{path.stem}: {total} samples")
    for name, c in layers.most_common():
        print(f"    {100 * c / max(total, 1):5.1f} %  {name}")
    print("  functions, own samples:")
    for f, c in own.most_common(top):
        print(f"    {100 * c / max(total, 1):5.1f} %  {f}")


def _until_up(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx.put(url, content=b"{}")
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url}: no answer in {seconds:.0f} s")


@contextmanager
def asgi_server(
    target: str, server: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, list[psutil.Process]]]:
    """``target`` (module:app) under uvicorn with the service's options, or under Granian
    (one worker, uvloop; its CPU is every process of its tree): base URL and processes."""
    port = free_port()
    if server == "uvicorn":
        cmd = [sys.executable, "-m", "uvicorn", target, "--port", str(port), "--host", "127.0.0.1"]
        cmd += ["--loop", "uvloop", "--http", "httptools", "--no-access-log"]
    else:
        cmd = [str(Path(sys.executable).with_name("granian")), "--interface", "asgi", target]
        cmd += ["--port", str(port), "--host", "127.0.0.1", "--loop", "uvloop", "--workers", "1"]
        cmd += ["--no-ws", "--no-access-log"]
    cmd += ["--log-level", "warning"]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=environ)
    try:
        _until_up(f"http://127.0.0.1:{port}/api/x/y")
        main = psutil.Process(proc.pid)
        yield f"http://127.0.0.1:{port}", [main, *main.children(recursive=True)]
    finally:
        proc.terminate()
        proc.wait(10)


class Bench:
    """One service (one worker) on one redis-server, and the bare endpoint beside it."""

    def __init__(self, base: str, admin: str, workers: list[psutil.Process], redis_pid: int):
        self.base = base
        self.workers = workers
        self.redis = [psutil.Process(redis_pid)]
        self.token = httpx.post(f"{admin}/token/bench", params={"description": "bench"}).json()[
            "token"
        ]
        self.http = httpx.Client(base_url=base, headers={"X-Token": self.token}, timeout=60)
        self.round = 0

    def measure(
        self,
        procs: list[psutil.Process],
        drive: Callable[[], tuple[int, int]],
        profile: Path | None = None,
    ) -> Sample:
        cpu0, rcpu0, t0 = cpu_seconds(procs), cpu_seconds(self.redis), time.perf_counter()
        with py_spy(procs[0].pid, profile):
            requests, non2xx = drive()
        took = time.perf_counter() - t0
        cpu, rcpu = cpu_seconds(procs) - cpu0, cpu_seconds(self.redis) - rcpu0
        return Sample(requests, non2xx, took, cpu, rcpu)

    def fill(self, queue: str, jobs: int) -> None:
        bulk = json.dumps([BODY.decode()] * 64).encode()
        for _ in range((jobs + 63) // 64):
            r = self.http.put(f"/api/bench/{queue}/bulk?ttl=0&tries=1", content=bulk)
            r.raise_for_status()

    def reserved_ids(self, queue: str, jobs: int) -> list[str]:
        self.fill(queue, jobs)
        ids: list[str] = []
        while len(ids) < jobs:
            r = self.http.get(f"/api/bench/{queue}?timeout=0&ttr=600&count=100")
            if r.status_code == 404:
                break
            ids += [j["job_id"] for j in r.json()]
        return ids

    def scenario(
        self, name: str, seconds: float, conns: int, expect: int, profile: Path | None = None
    ) -> Sample:
        """``expect``: requests per second it may reach, to size the queues it needs."""
        self.round += 1
        q = f"{name[0]}{self.round}"
        need = int(expect * seconds * 1.5)
        ids: list[str] | None = None
        body: bytes | None = None
        if name == "publish":
            method, url, body = "PUT", f"{self.base}/api/bench/{q}?delay=3600", BODY
        elif name == "publish_dedup":  # each request a new key (a new job under it)
            method, body = "PUT", BODY
            url = f"{self.base}/api/bench/{q}?delay=3600&dedup_key="
            ids = [f"k{i}" for i in range(need)]
        elif name == "bulk":
            method, url = "PUT", f"{self.base}/api/bench/{q}/bulk?delay=3600"
            body = json.dumps([BODY.decode()] * 64).encode()
        elif name == "consume":
            self.fill(q, need)
            method, url = "GET", f"{self.base}/api/bench/{q}?timeout=0&ttr=600"
        elif name == "ack":
            ids = self.reserved_ids(q, need)
            method, url = "DELETE", f"{self.base}/api/bench/{q}/job/"
        else:
            raise ValueError(name)
        return self.measure(
            self.workers,
            lambda: run_wrk(url, method, self.token, seconds, conns, body=body, ids=ids),
            profile,
        )


def median(samples: list[Sample], key: Callable[[Sample], float]) -> float:
    return statistics.median(key(s) for s in samples)


def report(results: dict[str, list[Sample]]) -> None:
    """Medians; each route's ratio is to the bare endpoint under the same server."""
    bares = {k: median(v, lambda s: s.us_per_request) for k, v in results.items() if "bare" in k}
    print()
    print(
        f"{'scenario':<18} {'req/s':>9} {'µs CPU/req':>11} {'× bare':>7} {'Redis µs/req':>13}"
        f" {'non-2xx':>8}  (medians of {len(results['bare'])} rounds)"
    )
    for name, samples in results.items():
        us = median(samples, lambda s: s.us_per_request)
        bare = bares["bare (granian)" if name.endswith("(granian)") else "bare"]
        print(
            f"{name:<18} {median(samples, lambda s: s.rate):>9,.0f} {us:>11.0f} "
            f"{us / bare:>7.2f} {median(samples, lambda s: s.redis_us_per_request):>13.0f} "
            f"{sum(s.non2xx for s in samples):>8}"
        )
    print("  per round (µs CPU/req):")
    for name, samples in results.items():
        print(f"    {name:<18} " + "  ".join(f"{s.us_per_request:.0f}" for s in samples))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--metrics", choices=["on", "off"], default="on")
    ap.add_argument("--only", default="", help="the scenarios whose name contains this text")
    ap.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="only print the summary of py-spy files recorded before, and exit",
    )
    ap.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="sample the service worker with py-spy in the last round; stacks and a summary",
    )
    ap.add_argument(
        "--before",
        type=Path,
        metavar="CHECKOUT",
        help="also run the service of another checkout (an older commit), interleaved",
    )
    ap.add_argument(
        "--granian",
        action="store_true",
        help="also serve the bare endpoint and the service's data app under Granian",
    )
    a = ap.parse_args()
    if a.summarize:
        for path in a.summarize:
            summarize(path)
        return
    wrk_binary()
    if a.granian and not Path(sys.executable).with_name("granian").exists():
        sys.exit("--granian: install it first (.venv/bin/pip install granian==2.8.9)")
    if a.py_spy:
        a.py_spy.mkdir(parents=True, exist_ok=True)
    names = [n for n in ("publish", "publish_dedup", "consume", "ack", "bulk") if a.only in n]
    results: dict[str, list[Sample]] = {"bare": []}
    env = {
        "CLUSTER_DQ_LOGLEVEL": "warning",
        "CLUSTER_DQ_ENABLEMETRICS": "1" if a.metrics == "on" else "0",
    }
    with contextlib.ExitStack() as stack:
        benches: list[tuple[str, Bench]] = []
        for suffix, root in [("", ROOT)] + ([(" (before)", a.before)] if a.before else []):
            redis = start_server()
            stack.callback(redis.kill)
            svc = ServiceProcess.start(
                f"127.0.0.1:{redis.port}", env=env, args=["--workers", "1"], root=root
            )
            stack.callback(svc.stop, 30)
            workers = [  # not multiprocessing's resource tracker
                p
                for p in psutil.Process(svc.pid).children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())
            ]
            benches.append((suffix, Bench(svc.base, svc.admin, workers, redis.process.pid)))
            results.update({n + suffix: [] for n in names})
        if a.granian:
            redis = start_server()
            stack.callback(redis.kill)
            pool = pool_env(PoolSettings("default", Addr=f"127.0.0.1:{redis.port}"))
            base, procs = stack.enter_context(
                asgi_server("loadtest.granian_service:app", "granian", {**env, **pool})
            )
            benches.append((" (granian)", Bench(base, base, procs, redis.process.pid)))
            results.update({n + " (granian)": [] for n in names})
        print(
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
            f"{a.rounds} rounds of {a.seconds:.0f} s, {a.connections} connections, "
            f"metrics {a.metrics}" + (f", before: {a.before}" if a.before else ""),
            flush=True,
        )
        bares = {"bare": stack.enter_context(asgi_server("loadtest.bare_app:app", "uvicorn"))}
        if a.granian:
            bares["bare (granian)"] = stack.enter_context(
                asgi_server("loadtest.bare_app:app", "granian")
            )
            results["bare (granian)"] = []
        for r in range(a.rounds):
            for key, (bare_base, bare_procs) in bares.items():
                url = f"{bare_base}/api/bench/bare"
                results[key].append(
                    benches[0][1].measure(
                        bare_procs,
                        lambda: run_wrk(url, "PUT", "", a.seconds, a.connections, body=BODY),
                    )
                )
            for name in names:
                for suffix, bench in benches:
                    key = name + suffix
                    expect = results[key][-1].rate if results[key] else 10_000
                    last = a.py_spy and r == a.rounds - 1 and not suffix
                    spy = a.py_spy / f"{name}.txt" if last else None
                    results[key].append(
                        bench.scenario(name, a.seconds, a.connections, int(expect), spy)
                    )
            print(
                f"round {r + 1}: "
                + ", ".join(f"{n} {s[-1].us_per_request:.0f} µs" for n, s in results.items()),
                flush=True,
            )
    report(results)
    if a.py_spy:
        for name in names:
            if (a.py_spy / f"{name}.txt").exists():
                summarize(a.py_spy / f"{name}.txt")


if __name__ == "__main__":
    main()
