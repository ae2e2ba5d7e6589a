"""Locust's own cost per request with the profile's FastHttpUser (``loadtest/locustfile.py``)
and with the same users on ``cluster_dq.client.Client`` (``loadtest/locust_client.py``):

    python loadtest/bench_locust.py [--seconds 15] [--rate 60]

starts a redis-server and one ``cluster-dq serve``, runs locust headless with each locustfile in
turn at the same rate (4 producers at ``--rate`` jobs/s, 4 long-polling consumers), and prints
per request kind the count and latency percentiles, and locust's CPU per request. Figures only.
"""

from __future__ import annotations

import argparse
import csv
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


from cluster_dq.localredis import start_server
from cluster_dq.testing.service_process import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
NS = "load"  # the locustfiles' namespace


def run(locustfile: str, host: str, token: str, rate: float, seconds: int, prefix: str) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / locustfile),
        "--headless",
        "--host",
        host,
        "-u",
        "8",
        "-r",
        "8",
        "--run-time",
        f"{seconds}s",
        "--csv",
        prefix,
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--stop-timeout",
        "3",
        "--dq-token",
        token,
        "--dq-publish-rate",
        str(rate),
        "--dq-producers",
        "4",
        "--dq-consumers",
        "4",
    ]
    subprocess.run(cmd, cwd=ROOT, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    requests = 0
    print(f"{locustfile}:")
    with open(f"{prefix}_stats.csv") as f:
        for r in csv.DictReader(f):
            if r["Name"] == "Aggregated" or r["Name"].startswith("deliver "):
                continue
            if r["Type"] != "LATENESS":
                requests += int(r["Request Count"])
            print(
                f"  {r['Type']:8} {r['Name'][:32]:32} n={r['Request Count']:>6} "
                f"fail={r['Failure Count']} p50={r['50%']} p95={r['95%']} p99={r['99%']} ms"
            )
    print(
        f"  locust CPU: {cpu:.2f} s for {requests:,} requests, {cpu / max(requests, 1) * 1e6:.0f} us each"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--rate", type=float, default=60.0, help="jobs/s published")
    args = ap.parse_args()
    server = start_server()
    try:
        with ServiceProcess.start(f"127.0.0.1:{server.port}") as svc:
            token = svc.mint_token(NS, "compare")
            with tempfile.TemporaryDirectory() as tmp:
                for name in ("loadtest/locustfile.py", "loadtest/locust_client.py"):
                    run(name, svc.base, token, args.rate, args.seconds, f"{tmp}/{Path(name).stem}")
    finally:
        server.kill()


if __name__ == "__main__":
    main()
