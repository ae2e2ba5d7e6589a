"""``ServiceProcess``: one ``cluster-dq serve`` run as a subprocess, with its settings given by
``CLUSTER_DQ_*`` environment variables, on free loopback ports, waited for until it answers,
its output captured, and stopped with SIGTERM and then, past a deadline, SIGKILL.

The tests, the drills, the load profile and the benchmarks all start the service this way."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import cluster_dq
from cluster_dq.localredis import free_port
from cluster_dq.settings import ENV_PREFIX, PoolSettings

# The directory that holds the package imported here: the service runs the same code.
ROOT = Path(cluster_dq.__file__).resolve().parents[1]
FIRST_PORT = 18000  # data ports from here, admin ports 500 above


def pool_env(pool: PoolSettings) -> dict[str, str]:
    """The CLUSTER_DQ_POOL__<NAME>__* variables that point a service at ``pool``."""
    prefix = f"{ENV_PREFIX}POOL__{pool.name.upper()}__"
    env = {prefix + "ADDR": pool.Addr}
    if pool.Cluster:
        env[prefix + "CLUSTER"] = "true"
    if pool.MasterName:
        env[prefix + "MASTERNAME"] = pool.MasterName
    if pool.DB:
        env[prefix + "DB"] = str(pool.DB)
    return env


def pick_ports(first_port: int | None = None) -> tuple[int, int]:
    """Free (data, admin) ports: from ``first_port`` on, or from 18000 (admin ports 500 above).
    ``free_port`` starts each scan at a random place, so two suites running at once rarely take
    the same port (both services would then share it through SO_REUSEPORT)."""
    first = FIRST_PORT if first_port is None else first_port
    return free_port(first, first + 500), free_port(first + 500, first + 1000)


class ServiceProcess:
    """A running ``cluster-dq serve``: ``base`` and ``admin`` are its URLs, ``proc`` its
    supervisor process. A context manager: leaving the block stops it."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        port: int,
        admin_port: int,
        log_path: Path | None = None,
        owned: IO[bytes] | None = None,
        session: bool = False,
    ) -> None:
        self.proc = proc
        self.port = port
        self.admin_port = admin_port
        self.base = f"http://127.0.0.1:{port}"
        self.admin = f"http://127.0.0.1:{admin_port}"
        self.log_path = log_path
        self._owned = owned  # the log file this object opened (closed at stop)
        self._session = session

    @classmethod
    def start(
        cls,
        pool: PoolSettings | str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        ports: tuple[int, int] | None = None,
        first_port: int | None = None,
        ready: str | None = "/healthz",
        timeout: float = 30.0,
        log: Path | IO[bytes] | int | None = None,
        stdout: IO[bytes] | IO[str] | int | None = None,
        session: bool = False,
        inherit_settings: bool = True,
        root: Path | None = None,
        cwd: Path | None = None,
    ) -> ServiceProcess:
        """Starts the service against ``pool`` (a standalone address, or none: embedded mode)
        with the settings ``env`` (``CLUSTER_DQ_*``) and extra ``serve`` ``args``, and waits until
        the admin port answers ``ready`` with 200 (None: does not wait).

        ``log``: where its stderr goes: a path (read back with ``logs()``), an open file, or
        None (this process's stderr). ``session``: a process group of its own, signalled
        whole (supervisor and workers). ``inherit_settings=False`` drops the ``CLUSTER_DQ_*``
        variables of this process's environment. ``root``: the checkout whose code the service
        runs (default: the one imported here); it is also the working directory unless ``cwd``."""
        port, admin = ports or pick_ports(first_port)
        environ = {
            k: v for k, v in os.environ.items() if inherit_settings or not k.startswith(ENV_PREFIX)
        }
        if isinstance(pool, str):
            pool = PoolSettings("default", Addr=pool)
        root = root or ROOT
        environ.update(
            {"PYTHONPATH": str(root), **(pool_env(pool) if pool is not None else {}), **(env or {})}
        )
        owned: IO[bytes] | None = None
        log_path: Path | None = None
        stderr: IO[bytes] | int | None
        if isinstance(log, Path):
            log_path, owned = log, log.open("wb")
            stderr = owned
        else:
            stderr = log
        cmd = [
            sys.executable,
            "-m",
            "cluster_dq.cli",
            "serve",
            "--port",
            str(port),
            "--admin-port",
            str(admin),
            *args,
        ]
        try:
            proc = subprocess.Popen(
                cmd,
                env=environ,
                cwd=cwd or root,
                stdout=stdout,
                stderr=stderr,
                start_new_session=session,
            )
        except BaseException:
            if owned is not None:
                owned.close()
            raise
        service = cls(proc, port, admin, log_path, owned, session)
        if ready is not None:
            service.wait_ready(ready, timeout)
        return service

    def mint_token(self, ns: str, description: str = "bench") -> str:
        """A new token of namespace ``ns`` from the admin port (one without admin credentials:
        a service started here has none)."""
        query = urllib.parse.urlencode({"description": description})
        req = urllib.request.Request(f"{self.admin}/token/{ns}?{query}", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return str(json.loads(r.read())["token"])

    def wait_ready(self, path: str = "/healthz", timeout: float = 30.0) -> None:
        """Until ``GET admin + path`` answers 200; stops the service and raises if it exits
        or the time runs out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.answers(path):
                return
            time.sleep(0.1)
        code = self.proc.poll()
        self.kill()
        what = f"exit code {code}" if code is not None else f"not ready after {timeout:.0f} s"
        raise RuntimeError(f"service did not start ({what}){self._tail()}")

    def answers(self, path: str = "/healthz") -> bool:
        try:
            with urllib.request.urlopen(self.admin + path, timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def logs(self) -> str:
        """What it wrote to stderr so far (when ``log`` was a path)."""
        if self.log_path is None:
            return ""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def _tail(self) -> str:
        text = self.logs()
        return f":\n{text[-2000:]}" if text else ""

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self._session:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (the graceful shutdown), then SIGKILL if it has not exited within
        ``timeout``; returns its exit status."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()
        self._close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (with ``session``: the supervisor and its workers)."""
        self._signal(signal.SIGKILL)
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ServiceProcess(pid={self.proc.pid}, base={self.base!r}, admin={self.admin!r})"
