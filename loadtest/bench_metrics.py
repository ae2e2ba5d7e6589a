"""What the metrics cost per request: the exact metric updates of one HTTP publish (request
counter, duration histogram, Redis round-trip histogram, published counter), timed in
prometheus-client's multiprocess mode (as `cluster-dq serve` runs) and in one process.

    python loadtest/bench_metrics.py                  # 200,000 updates in each mode
    python loadtest/bench_metrics.py --updates 1000   # a smoke run

The end-to-end comparison is `python loadtest/bench_http.py --wrk-only --workers 2
--metrics on --metrics off` (noisier: load generator, service and Redis share 2 cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CODE = """
import sys
import time
from cluster_dq import metrics
recorder = metrics.Metrics()
pool = recorder.pool("default")
n = int(sys.argv[1])
started = time.perf_counter()
for _ in range(n):
    recorder.http("data", "/api/{ns}/{q}", "PUT", 201, 0.004)
    pool.redis_call(0.0004, None)
    recorder.count(metrics.published, "ns", "q", 1)
print(f"{(time.perf_counter() - started) / n * 1e6:.1f}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--updates", type=int, default=200_000, help="publishes timed in each mode")
    n = str(ap.parse_args().updates)
    with tempfile.TemporaryDirectory() as d:
        multi = subprocess.run(
            [sys.executable, "-c", CODE, n],
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": d},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    single = subprocess.run(
        [sys.executable, "-c", CODE, n], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    print(
        f"metric updates of one HTTP publish: {multi} us (multiprocess mode), {single} us (one process)"
    )


if __name__ == "__main__":
    main()
