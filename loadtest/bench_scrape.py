"""The admin port's ``/metrics`` after odd requests (issue 25, item 5): starts a redis-server and
`cluster-dq serve` (1 worker, so the scrape and the data requests share one event loop), then

1. scrapes once (the series of a fresh service);
2. sends ``--odd`` requests without a token (default 1,000): a random method among the ~35 that
   the HTTP parser accepts, on a random path of either port (random names in the routes'
   templates, and paths no route has);
3. times ``--scrapes`` scrapes (default 50), ``--gap`` seconds apart (default 0.5: longer than
   the time a render is reused, so each one renders);
4. times ``--data`` data requests (the size of a queue, with a valid token) while a thread
   scrapes back to back, and the same number with no scrape running;

and prints the number of series, the size of a scrape, the scrape time (p50/p99/max), the CPU
time of one render of the worker's files (timed in this process: on a loaded machine the
scrape's wall time is mostly waiting for a core) and the data request's latency (p50/p99/max)
with and without scrapes. Figures only; nothing is
asserted. ``--root`` runs another checkout's code (the service only; this script's own code
is this checkout's), e.g. to compare with main:

    python loadtest/bench_scrape.py
    mkdir /tmp/dq-main && git archive main | tar -x -C /tmp/dq-main   # main, as committed
    python loadtest/bench_scrape.py --root /tmp/dq-main
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from cluster_dq import metrics
from cluster_dq.localredis import start_server
from cluster_dq.testing import odd_requests
from cluster_dq.testing.service_process import ServiceProcess


def odd_request(rng: random.Random) -> tuple[str, str, bool]:
    """(method, path, to the admin port?)"""
    method, path = odd_requests.odd_request(rng)
    return method, path, rng.random() < 0.5


def quantiles(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"p50 {statistics.median(ms):8.1f} ms  p99 {p99:8.1f} ms  max {ms[-1]:8.1f} ms"


def multiproc_dir(supervisor: int) -> str:
    """The metrics directory of the supervisor's worker (PROMETHEUS_MULTIPROC_DIR)."""
    for child in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split():
        for var in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
            if var.startswith(metrics.MULTIPROC_ENV.encode() + b"="):
                return var.split(b"=", 1)[1].decode()
    raise RuntimeError("no worker with a metrics directory")


def render_cpu(directory: str, rounds: int = 20) -> float:
    """CPU seconds of one render of ``directory`` (the median of ``rounds``), in this process."""
    os.environ[metrics.MULTIPROC_ENV] = directory
    board = metrics.SizeBoard(directory, 30.0)
    times = []
    for _ in range(rounds):
        started = time.process_time()
        metrics.render(board)
        times.append(time.process_time() - started)
    return statistics.median(times)


def scrape(client: httpx.Client) -> tuple[int, int, float]:
    """(series, bytes, seconds) of one scrape."""
    started = time.perf_counter()
    r = client.get("/metrics")
    took = time.perf_counter() - started
    r.raise_for_status()
    series = sum(1 for line in r.text.splitlines() if line and not line.startswith("#"))
    return series, len(r.content), took


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--odd", type=int, default=1000, help="odd requests before the scrapes")
    ap.add_argument("--scrapes", type=int, default=50, help="scrapes timed one after another")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between timed scrapes")
    ap.add_argument("--data", type=int, default=200, help="data requests timed (each phase)")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--root", type=Path, default=None, help="the checkout the service runs")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    redis_server = start_server()
    service = ServiceProcess.start(
        f"127.0.0.1:{redis_server.port}",
        env={"CLUSTER_DQ_WORKERS": "1", "CLUSTER_DQ_LOGLEVEL": "warning"},
        root=args.root,
    )
    try:
        admin = httpx.Client(base_url=service.admin, timeout=60)
        data = httpx.Client(base_url=service.base, timeout=60)
        token = admin.post("/token/bench", params={"description": "bench"}).json()["token"]
        data.put("/api/bench/q", params={"token": token}, content=b"x").raise_for_status()
        series, size, _ = scrape(admin)
        load = Path("/proc/loadavg").read_text().split()[0]
        print(f"code: {args.root or 'this checkout'}  (load average {load})")
        print(f"fresh service:          {series:6d} series  {size:9,d} bytes")

        statuses: Counter[int] = Counter()
        for _ in range(args.odd):
            method, path, to_admin = odd_request(rng)
            client = admin if to_admin else data
            statuses[client.request(method, path).status_code] += 1
        print(f"{args.odd} odd requests: statuses {dict(sorted(statuses.items()))}")

        times = []
        for _ in range(args.scrapes):
            time.sleep(args.gap)
            series, size, took = scrape(admin)
            times.append(took)
        print(f"after them:             {series:6d} series  {size:9,d} bytes")
        print(f"scrape ({args.scrapes}):            {quantiles(times)}")
        cpu = render_cpu(multiproc_dir(service.pid))
        print(f"render CPU time:        {cpu * 1000:8.1f} ms (median of 20, in this process)")

        def size_requests() -> list[float]:
            out = []
            for _ in range(args.data):
                started = time.perf_counter()
                data.get("/api/bench/q/size", params={"token": token}).raise_for_status()
                out.append(time.perf_counter() - started)
            return out

        print(f"data request, idle:     {quantiles(size_requests())}")
        stop = threading.Event()
        scrapes = [0]

        def scrape_back_to_back() -> None:
            with httpx.Client(base_url=service.admin, timeout=60) as own:
                while not stop.is_set():
                    scrape(own)
                    scrapes[0] += 1

        scraper = threading.Thread(target=scrape_back_to_back)
        scraper.start()
        try:
            during = size_requests()
        finally:
            stop.set()
            scraper.join()
        print(f"data request, scraping: {quantiles(during)}  ({scrapes[0]} scrapes meanwhile)")
    finally:
        service.stop()
        redis_server.stop()


if __name__ == "__main__":
    main()
