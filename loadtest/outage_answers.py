"""What each kind of request is answered while the pool's Redis is down, and how long that
takes: a ``cluster-dq serve`` against a redis-server of its own, which is killed (SIGKILL)
once a token, a job and a reservation exist (and the caches have expired). Prints one line per request: verb, status, the
seconds it took, and the advice of a 503.

    .venv/bin/python loadtest/outage_answers.py
"""

from __future__ import annotations

import signal
import time

import httpx

from cluster_dq.localredis import free_port, start_server
from cluster_dq.testing.service_process import ServiceProcess

AUTH = ("admin", "s3cret")


def main() -> None:
    server = start_server(free_port(21000, 22000))
    env = {
        "CLUSTER_DQ_ACCOUNTS__ADMIN": AUTH[1],
        "CLUSTER_DQ_LOGLEVEL": "warning",
        "CLUSTER_DQ_WORKERS": "1",
    }
    svc = ServiceProcess.start(f"127.0.0.1:{server.port}", env=env, timeout=20)
    try:
        got = httpx.post(f"{svc.admin}/token/out", params={"description": "outage"}, auth=AUTH)
        token = got.json()["token"]
        api = httpx.Client(base_url=svc.base, headers={"X-Token": token}, timeout=60)
        job = api.put("/api/out/q", content=b"x").json()["job_id"]
        api.put("/api/out/q", content=b"y")
        api.get("/api/out/q", params={"ttr": 60})
        server.kill(signal.SIGKILL)
        time.sleep(2.5)  # past the token (2 s) and queue settings (1 s) caches, as in an outage
        tries = [
            ("consume timeout=2", "GET", "/api/out/q", {"timeout": 2}),
            ("consume timeout=0", "GET", "/api/out/q", {"timeout": 0}),
            ("consume timeout=10", "GET", "/api/out/q", {"timeout": 10}),
            ("publish", "PUT", "/api/out/q", {}),
            ("ack", "DELETE", f"/api/out/q/job/{job}", {}),
            ("peek job", "GET", f"/api/out/q/job/{job}", {}),
            ("size", "GET", "/api/out/q/size", {}),
            ("release", "POST", f"/api/out/q/job/{job}/release", {}),
        ]
        for what, method, path, params in tries:
            started = time.monotonic()
            r = api.request(method, path, params=params, content=b"z" if method == "PUT" else None)
            took = time.monotonic() - started
            print(f"{what:20} {r.status_code} {took:5.1f} s  {r.text[:220]}")
    finally:
        svc.stop(timeout=20)
        server.stop()


if __name__ == "__main__":
    main()
