"""The load profile: locust through nginx (L7 load balancer) to several `cluster-dq serve`
instances, with millions of delayed jobs resident in Redis.

    python loadtest/load_profile.py                         # 10 M resident, 1,500 req/s for 10 min
    python loadtest/load_profile.py --jobs 1000000 --seconds 120
    python loadtest/load_profile.py --step 500 --step-seconds 30   # find the saturation point
    options: --instances 2 --cluster --rate 1500 (requests/s) --keep (leave it all running)

1. Starts Redis (standalone, or a 3+3 Cluster with --cluster) and preloads ``--jobs`` delayed
   jobs (64-byte bodies, due in 2-3 hours) in the load queues, with 2 processes through the
   engine's publish script; reports Redis bytes per job.
2. Starts ``--instances`` service instances and nginx in front of them (the config is rendered
   from ``deploy/nginx/cluster-dq.conf``), on loopback ports.
3. Runs locust headless (``loadtest/locustfile.py``): producers publish at a third of the
   request rate, long-polling consumers consume and ack every job, so requests are ~1/3 each.
4. Reports requests/s achieved, latency percentiles and errors per request kind, lateness
   (delivery - due) percentiles, CPU used by each component, and checks that every resident
   job is still there.

Step mode runs the mix at increasing rates and reports each step, up to saturation (the rate
achieved falls below 90 % of the rate asked, or requests fail).
nginx is installed with apt-get when missing (Debian's service is kept from starting).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from cluster_dq.localredis import Cluster, Server, free_port, start_cluster, start_server
from cluster_dq.settings import PoolSettings
from cluster_dq.testing.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
NS, QUEUES = "load", 8
BODY = b"r" * 64
TARGET_P99_MS = 25.0


# -- components -----------------------------------------------------------------------------


def nginx_binary() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )
    if found:
        return found
    print("profile: installing nginx (apt-get)", flush=True)
    subprocess.run([str(ROOT / "deploy/dev/apt-install"), "nginx-light:nginx"], check=True)
    return shutil.which("nginx") or "/usr/sbin/nginx"


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def start_instance(pool: PoolSettings, root: Path | None = None) -> ServiceProcess:
    """A service instance with one worker, once it is ready; in a process group of its own.
    ``root``: the checkout whose code it runs (default: this one), for a before/after."""
    return ServiceProcess.start(
        pool,
        env={"CLUSTER_DQ_LOGLEVEL": "warning", "CLUSTER_DQ_WORKERS": "1"},
        first_port=18000,
        ready="/readyz",
        session=True,
        root=root,
    )


class BareInstance:
    """One ``loadtest/bare_queue.py`` under uvicorn with the service's options, in a process
    group of its own: the stand-in for a service instance in ``stack(bare=True)``."""

    def __init__(self, root: Path | None = None) -> None:
        self.port = free_port(18000, 18500)
        self.base = self.admin = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "uvicorn", "loadtest.bare_queue:app", "--port", str(self.port)]
        cmd += ["--host", "127.0.0.1", "--loop", "uvloop", "--http", "httptools"]
        cmd += ["--no-access-log", "--log-level", "warning"]
        where = root or ROOT
        self._proc = Proc(
            "bare",
            subprocess.Popen(
                cmd, cwd=where, env={**os.environ, "PYTHONPATH": str(where)}, start_new_session=True
            ),
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                httpx.get(f"{self.base}/readyz")
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the bare queue did not start")

    @property
    def pid(self) -> int:
        return self._proc.popen.pid

    def stop(self) -> None:
        self._proc.stop()


def render_nginx(workdir: Path, listen: int, upstreams: list[int]) -> Path:
    """``deploy/nginx/cluster-dq.conf`` with this run's ports and a private prefix."""
    text = (ROOT / "deploy/nginx/cluster-dq.conf").read_text()
    servers = re.findall(r"^ *server 127\.0\.0\.1:\d+ .*;\n", text, flags=re.M)
    text = text.replace(
        "".join(servers), "".join(servers[0].replace(":7777 ", f":{p} ") for p in upstreams)
    )
    text = text.replace("listen 127.0.0.1:8080;", f"listen 127.0.0.1:{listen};")
    text = text.replace("/var/lib/cluster-dq-nginx", str(workdir))
    conf = workdir / "nginx.conf"
    conf.write_text(text)
    (workdir / "tmp").mkdir(exist_ok=True)
    workdir.chmod(0o755)  # nginx's workers run as nobody when started by root
    (workdir / "tmp").chmod(0o777)
    return conf


def start_nginx(workdir: Path, listen: int, upstreams: list[int]) -> Proc:
    conf = render_nginx(workdir, listen, upstreams)
    binary = nginx_binary()
    common = [binary, "-p", str(workdir), "-e", str(workdir / "error.log"), "-c", str(conf)]
    subprocess.run([*common, "-t", "-q"], check=True)
    popen = subprocess.Popen([*common, "-g", "daemon off;"], start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{listen}/api/x/y/size")  # any answer: nginx is up
            return Proc("nginx", popen)
        time.sleep(0.05)
    Proc("", popen).stop()
    raise RuntimeError(f"nginx did not start (see {workdir}/error.log)")


# -- resident jobs --------------------------------------------------------------------------


def _preload_slice(pool: PoolSettings, start: int, n: int, now: int, queues: int) -> int:
    from cluster_dq.engine import commands as ops
    from cluster_dq.engine.sync import SyncEngine
    from cluster_dq.models import JobSpec
    from cluster_dq.pools import make_sync_client

    client = make_sync_client(pool)
    engine = SyncEngine(client)
    done = 0
    try:
        while done < n:
            batches = []
            for _ in range(32):
                k = min(64, n - done)
                if k <= 0:
                    break
                i = start + done
                q = f"q{(i // 64) % queues}"
                # due 2-3 hours from now, spread over the hour: thousands of wheel buckets
                specs = [
                    JobSpec(BODY, delay_ms=7_200_000 + (i + j) * 7919 % 3_600_000, ttl_ms=0)
                    for j in range(k)
                ]
                batches.append((NS, q, specs))
                done += k
            engine.run(ops.publish_many(engine.config, batches, now), idempotent=True)
    finally:
        client.close()
    return done


def used_memory(d: Server | Cluster) -> int:
    """Bytes used by the masters (replicas hold copies)."""
    total = 0
    for s in d.servers if isinstance(d, Cluster) else [d]:
        with s.client() as c:
            info: Any = c.info()
        total += int(info["used_memory"]) if info["role"] == "master" else 0
    return total


def preload(
    d: Server | Cluster, n: int, procs: int = 2, queues: int = QUEUES
) -> tuple[float, float]:
    """Returns (seconds, Redis bytes per job)."""
    before = used_memory(d)
    t = time.monotonic()
    now = int(time.time() * 1000)
    share = -(-n // procs)
    with ProcessPoolExecutor(procs) as pool_ex:
        futures = [
            pool_ex.submit(
                _preload_slice, d.pool_settings(), k * share, min(share, n - k * share), now, queues
            )
            for k in range(procs)
            if n - k * share > 0
        ]
        total = sum(f.result() for f in futures)
    took = time.monotonic() - t
    return took, (used_memory(d) - before) / max(total, 1)


def resident(d: Server | Cluster, queues: int = QUEUES) -> int:
    from cluster_dq.engine import commands as ops
    from cluster_dq.engine.sync import SyncEngine
    from cluster_dq.pools import make_sync_client

    client = make_sync_client(d.pool_settings())
    try:
        engine = SyncEngine(client)
        return sum(engine.run(ops.sizes(engine.config, NS, f"q{i}")).delayed for i in range(queues))
    finally:
        client.close()


# -- locust ---------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    requests: int
    failures: int
    rps: float
    p50: float
    p95: float
    p99: float
    p999: float
    maximum: float


def run_locust(
    host: str, token: str, rate: float, seconds: float, prefix: Path, queues: int = QUEUES
) -> dict[str, Row]:
    jobs_per_s = rate / 3  # publish, consume, ack per job
    producers = max(1, min(50, int(jobs_per_s // 20)))
    consumers = max(4, min(60, int(jobs_per_s // 25)))
    users = producers + consumers
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / "loadtest/locustfile.py"),
        "--headless",
        "--host",
        host,
        "-u",
        str(users),
        "-r",
        str(users),
        "--run-time",
        f"{int(seconds)}s",
        "--csv",
        str(prefix),
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--stop-timeout",
        "3",
        "--dq-token",
        token,
        "--dq-queues",
        str(queues),
        "--dq-publish-rate",
        str(jobs_per_s),
        "--dq-producers",
        str(producers),
        "--dq-consumers",
        str(consumers),
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode not in (0, 1):  # 1: some requests failed (reported below)
        raise RuntimeError(f"locust failed ({out.returncode}): {out.stderr[-2000:]}")
    rows = {}
    with open(f"{prefix}_stats.csv") as f:
        for r in csv.DictReader(f):
            name = f"{r['Type']} {r['Name']}".strip()
            rows[name] = Row(
                name,
                int(r["Request Count"]),
                int(r["Failure Count"]),
                float(r["Requests/s"]),
                _f(r["50%"]),
                _f(r["95%"]),
                _f(r["99%"]),
                _f(r["99.9%"]),
                _f(r["100%"]),
            )
    failures_path = Path(f"{prefix}_failures.csv")
    if failures_path.exists():
        with failures_path.open() as f:
            for r in csv.DictReader(f):
                print(
                    f"  failures: {r['Occurrences']} x {r['Method']} {r['Name']}: {r['Error'][:120]}"
                )
    return rows


def _f(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
            for c in p.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    ct = c.cpu_times()
                    total += ct.user + ct.system
    return total


def report(rows: dict[str, Row], seconds: float, cpu: dict[str, float]) -> dict[str, Any]:
    """Prints a step's figures. A long poll's time includes its wait for work, so the latency
    target (p99 <= 25 ms) is checked on the requests that never wait: publish and ack."""
    api = [r for n, r in rows.items() if not n.startswith("LATENESS") and r.name != "Aggregated"]
    requests = sum(r.requests for r in api)
    failures = sum(r.failures for r in api)
    print(
        f"  {'request':48} {'count':>9} {'fail':>6} {'req/s':>7} {'p50':>5} {'p95':>5} {'p99':>5} {'p99.9':>6} {'max':>6} ms"
    )
    for r in rows.values():
        if r.name != "Aggregated" and not r.name.startswith("LATENESS deliver q"):
            print(
                f"  {r.name:48} {r.requests:9,} {r.failures:6,} {r.rps:7.1f} {r.p50:5.0f} {r.p95:5.0f} "
                f"{r.p99:5.0f} {r.p999:6.0f} {r.maximum:6.0f}"
            )
    direct = [r for r in api if "long poll" not in r.name]
    worst_p99 = max((r.p99 for r in direct), default=float("nan"))
    late = rows.get("LATENESS deliver")
    print(
        f"  all API requests: {requests:,} in {seconds:.0f} s = {requests / seconds:,.0f} req/s, failures "
        f"{failures:,}; p99 of publish and ack {worst_p99:.0f} ms (target <= {TARGET_P99_MS:.0f} ms, 0 errors)"
    )
    if late:
        print(
            f"  lateness (delivery - due): p50 {late.p50:.0f} ms, p99 {late.p99:.0f} ms, "
            f"p99.9 {late.p999:.0f} ms, max {late.maximum:.0f} ms"
        )
        per_queue = sorted(
            (r for n, r in rows.items() if n.startswith("LATENESS deliver q")),
            key=lambda r: int(r.name.rsplit("q", 1)[1]),
        )
        if per_queue:  # consumes try q0 first: a backlog waits in the last queues
            print(
                "  lateness p99 / p99.9 / max by queue, in the order consumes try them: "
                + ", ".join(
                    f"{r.name.rsplit(' ', 1)[1]} {r.p99:.0f} / {r.p999:.0f} / {r.maximum:.0f}"
                    for r in per_queue
                )
                + " ms"
            )
    print(
        "  CPU used (share of one core): "
        + ", ".join(f"{k} {v / seconds:.0%}" for k, v in cpu.items())
    )
    return {
        "requests": requests,
        "failures": failures,
        "rps": requests / seconds,
        "worst_p99": worst_p99,
        "lateness_p99": late.p99 if late else None,
        "lateness_max": late.maximum if late else None,
        "delivered": late.requests if late else 0,
        "lateness_p99_by_queue": {
            n.rsplit(" ", 1)[1]: r.p99
            for n, r in rows.items()
            if n.startswith("LATENESS deliver q")
        },
    }


# -- the profile ----------------------------------------------------------------------------


@dataclass
class Stack:
    """Redis (with its resident jobs), the service instances and nginx in front of them."""

    redis: Server | Cluster
    services: dict[str, ServiceProcess | BareInstance]
    front: Proc
    listen: int  # nginx's port
    token: str  # of the load namespace
    bytes_per_job: float
    queues: int  # the load spreads over q0, q1, ...

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen}"

    def redis_servers(self) -> list[Server]:
        return self.redis.servers if isinstance(self.redis, Cluster) else [self.redis]

    def processes(self) -> dict[str, list[psutil.Process]]:
        """The processes whose CPU a step reports, by component."""
        out = {name: [psutil.Process(svc.pid)] for name, svc in self.services.items()}
        out["nginx"] = [psutil.Process(self.front.popen.pid)]
        out["redis"] = [psutil.Process(s.process.pid) for s in self.redis_servers()]
        return out


@contextlib.contextmanager
def stack(
    jobs: int,
    instances: int = 2,
    cluster: bool = False,
    *,
    masters: int = 3,
    replicas: int = 1,
    queues: int = QUEUES,
    root: Path | None = None,
    bare: bool = False,
) -> Iterator[Stack]:
    """Starts it all (a Cluster of ``masters`` x ``replicas`` when ``cluster``), preloads
    ``jobs`` delayed jobs, and stops it all on the way out. ``root``: the checkout whose code
    the instances run (default: this one). ``bare``: the instances are ``BareInstance``s (no
    Redis reaches them; pass ``jobs=0``)."""
    workdir = Path(tempfile.mkdtemp(prefix="cluster-dq-profile-"))
    d: Server | Cluster = (
        start_cluster(masters=masters, replicas=replicas) if cluster else start_server()
    )
    services: dict[str, ServiceProcess | BareInstance] = {}
    front: Proc | None = None
    try:
        where = f"Cluster {masters}+{masters * replicas}" if cluster else "standalone"
        print(
            f"profile: Redis {where}; preloading {jobs:,} delayed jobs "
            f"(64-B bodies, due in 2-3 h) ...",
            flush=True,
        )
        took, per_job = preload(d, jobs, queues=queues) if jobs else (0.0, 0.0)
        if jobs:
            print(
                f"  preloaded in {took:.1f} s ({jobs / took:,.0f} jobs/s); Redis {per_job:.1f} B/job "
                f"(target <= 120)",
                flush=True,
            )
        pool = d.pool_settings()
        for i in range(instances):
            services[f"service-{i}"] = BareInstance(root) if bare else start_instance(pool, root)
        admin = next(iter(services.values())).admin
        token = httpx.post(f"{admin}/token/{NS}", params={"description": "load"}).json()["token"]
        listen = free_port(19000, 19500)
        ports = [svc.port for svc in services.values()]
        front = start_nginx(workdir, listen, ports)
        print(f"profile: nginx 127.0.0.1:{listen} -> {instances} instances {ports}", flush=True)
        yield Stack(d, services, front, listen, token, per_job, queues)
    finally:
        if front is not None:
            front.stop()
        for svc in services.values():
            svc.stop()
        d.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def measure(st: Stack, rate: float, seconds: float, prefix: Path) -> dict[str, Any]:
    """One run of the mix at ``rate`` req/s: prints it (``report``) and returns its figures,
    with the CPU seconds of each component (``cpu``: each service, nginx, redis, locust)."""
    print(f"profile: locust, {rate:,.0f} req/s asked for {seconds:.0f} s ...", flush=True)
    watched = st.processes()
    cpu0 = {n: cpu_seconds(ps) for n, ps in watched.items()}
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = run_locust(st.url, st.token, rate, seconds, prefix, st.queues)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # locust, once it was reaped
    cpu = {n: cpu_seconds(ps) - cpu0[n] for n, ps in watched.items()}
    cpu["locust"] = children.ru_utime + children.ru_stime - children0.ru_utime - children0.ru_stime
    figures = report(rows, seconds, cpu)
    service = sum(v for n, v in cpu.items() if n.startswith("service-"))
    figures |= {"asked": rate, "cpu": cpu, "service_cpu": service}
    return figures


def profile(
    jobs: int,
    rate: float,
    seconds: float,
    instances: int = 2,
    cluster: bool = False,
    step: float = 0.0,
    step_seconds: float = 30.0,
    keep: bool = False,
) -> dict[str, Any]:
    with stack(jobs, instances, cluster) as st, tempfile.TemporaryDirectory() as tmp:
        rates = [rate] if not step else [step * k for k in range(1, 100) if step * k <= rate * 10]
        steps = []
        for target in rates:
            figures = measure(
                st,
                target,
                seconds if not step else step_seconds,
                Path(tmp) / f"locust-{int(target)}",
            )
            steps.append(figures)
            if step and (
                figures["rps"] < 0.9 * target or figures["failures"] > 0.001 * figures["requests"]
            ):
                break
        if step:
            print(
                "profile: steps (asked -> achieved req/s, p99 of publish and ack, lateness p99, failures)"
            )
            for s in steps:
                print(
                    f"  {s['asked']:7,.0f} -> {s['rps']:7,.0f}   p99 {s['worst_p99']:5.0f} ms   lateness p99 "
                    f"{s['lateness_p99'] or float('nan'):6.0f} ms   failures {s['failures']:,}"
                )
            ok = [s for s in steps if s["failures"] == 0 and s["worst_p99"] <= TARGET_P99_MS]
            print(
                f"  highest step within p99 <= {TARGET_P99_MS:.0f} ms and 0 errors: "
                f"{ok[-1]['rps']:,.0f} req/s"
                if ok
                else "  no step met p99 <= 25 ms with 0 errors"
            )
        time.sleep(2.5)  # the last live jobs (due <= 2 s after publish) leave the delayed set
        left = resident(st.redis, st.queues)
        print(
            f"profile: resident delayed jobs after the load: {left:,} of {jobs:,}"
            f"{'' if left >= jobs else '  <-- MISSING'}"
        )
        if keep:
            print(f"profile: left running (nginx {st.url}, token {st.token}); Ctrl-C stops it all")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        return {"bytes_per_job": st.bytes_per_job, "steps": steps, "resident_left": left}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=10_000_000, help="resident delayed jobs")
    ap.add_argument(
        "--rate", type=float, default=1500, help="HTTP requests/s (publish, consume, ack ~1/3 each)"
    )
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument(
        "--cluster", action="store_true", help="a 3+3 Redis Cluster instead of one server"
    )
    ap.add_argument(
        "--step", type=float, default=0.0, help="step mode: raise the rate by this much per step"
    )
    ap.add_argument("--step-seconds", type=float, default=30.0)
    ap.add_argument("--keep", action="store_true", help="leave everything running after the report")
    a = ap.parse_args()
    profile(a.jobs, a.rate, a.seconds, a.instances, a.cluster, a.step, a.step_seconds, a.keep)


if __name__ == "__main__":
    main()
