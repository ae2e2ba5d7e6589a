"""The README's run command: with no pool configured, `cluster-dq serve` starts its own
redis-server, prints a working token and curl lines, serves, and stops its Redis on exit."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from cluster_dq.keys import AdminKeys
from cluster_dq.localredis import free_port, start_server
from cluster_dq.testing.service_process import ServiceProcess, pick_ports

from tests.support import ROOT

CONSOLE_SCRIPT = Path(sys.executable).parent / "cluster-dq"


def console(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """``.venv/bin/cluster-dq argv`` in a shell whose environment is ``env`` (and nothing of
    this process's ``CLUSTER_DQ_*``), as the README runs it."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTER_DQ_")}
    environ.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *argv], env=environ, capture_output=True, text=True, timeout=120
    )


def test_embedded_mode_end_to_end(tmp_path: Path) -> None:
    with (tmp_path / "out").open("w") as out:  # no pool, none of our CLUSTER_DQ_* settings
        svc = ServiceProcess.start(
            env={"CLUSTER_DQ_LOGLEVEL": "warning"},
            inherit_settings=False,
            ready=None,
            stdout=out,
            log=subprocess.STDOUT,
            cwd=tmp_path,
        )
    proc, port = svc.proc, svc.port
    try:
        deadline = time.monotonic() + 30
        text = ""
        while "Stop with Ctrl-C" not in text and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "out").read_text()
            time.sleep(0.1)
            text = (tmp_path / "out").read_text()
        token = re.search(r'namespace "demo": (\S+)', text)
        redis_addr = re.search(r"redis \(pool default\): 127\.0\.0\.1:(\d+)", text)
        assert token and redis_addr, text
        assert f"curl -X PUT -H 'X-Token: {token.group(1)}'" in text
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"X-Token": token.group(1)}
        ) as api:
            for _ in range(100):  # the worker may still be starting
                try:
                    r = api.put("/api/demo/hello", params={"delay_ms": 200}, content=b"hi")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            assert r.status_code == 201
            job = api.get("/api/demo/hello", params={"timeout": 5}).json()
            assert job["job_id"] == r.json()["job_id"] and job["elapsed_ms"] >= 200
        redis_pid = subprocess.run(
            ["pgrep", "-f", f"redis-server 127.0.0.1:{redis_addr.group(1)}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert redis_pid, "the embedded redis-server is not running"
    finally:
        svc.stop(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(int(redis_pid[0]), 0)
            time.sleep(0.1)
        except ProcessLookupError:
            break
    else:
        raise AssertionError("the embedded redis-server outlived the service")


@pytest.mark.parametrize("reuse_port", [False, True])
def test_a_port_in_use_is_refused_by_name_and_the_embedded_redis_stopped(
    tmp_path: Path, reuse_port: bool
) -> None:
    """Workers listen with SO_REUSEPORT; a port another process holds (even with
    SO_REUSEPORT, as a second instance's workers would) must still refuse the start."""
    port, admin = free_port(18000, 18500), free_port(18500, 19000)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTER_DQ_")}
    own_tmp = tmp_path / "tmp"  # its embedded Redis works in here: other tests' are elsewhere
    own_tmp.mkdir()
    env.update(PYTHONPATH=str(ROOT), CLUSTER_DQ_LOGLEVEL="warning", TMPDIR=str(own_tmp))
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may be in TIME_WAIT
        if reuse_port:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "cluster_dq.cli",
                "serve",
                "--port",
                str(port),
                "--admin-port",
                str(admin),
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2, out.stderr
    assert (
        f"cluster-dq: Port: cannot listen on 127.0.0.1:{port}: Address already in use" in out.stderr
    )
    assert "Traceback" not in out.stderr
    assert not embedded_redis_pids(own_tmp)  # it started one (embedded mode), and stopped it


def embedded_redis_pids(under: Path | None = None) -> set[int]:
    """redis-server processes working in an embedded-mode directory (Redis chdirs there),
    anywhere or ``under`` a directory."""
    out = set()
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "comm").read_text().strip() == "redis-server"
                and "cluster-dq-embedded-" in str(cwd := (proc / "cwd").readlink())
                and (under is None or cwd.is_relative_to(under))
            ):
                out.add(int(proc.name))
        except OSError:
            continue
    return out


def test_the_readme_sequence_with_the_client_variables_exported(tmp_path: Path) -> None:
    """The README exports CLUSTER_DQ_URL, _TOKEN, _NAMESPACE, _ADMIN_URL (and _ADMIN_AUTH)
    for the client and the operator commands; the same shell runs `serve` and `token`."""
    port, admin = pick_ports()
    shell = {
        "CLUSTER_DQ_URL": f"http://127.0.0.1:{port}",
        "CLUSTER_DQ_TOKEN": "01M84CYB1XRC6XC6YRM8P6CD3H",
        "CLUSTER_DQ_NAMESPACE": "demo",
        "CLUSTER_DQ_ADMIN_URL": f"http://127.0.0.1:{admin}",
        "CLUSTER_DQ_ADMIN_AUTH": "ops:secret",
        "CLUSTER_DQ_LOGLEVEL": "warning",
        "TMPDIR": str(tmp_path),  # this serve's embedded state, apart from other test runs'
    }
    with ServiceProcess.start(
        env=shell, inherit_settings=False, ports=(port, admin), log=tmp_path / "serve.log"
    ) as svc:
        created = console(shell, "token", "create", "demo", "--description", "readme")
        assert created.returncode == 0, created.stderr
        shell["CLUSTER_DQ_TOKEN"] = token = created.stdout.strip()
        listed = console(shell, "token", "list", "demo")
        assert listed.returncode == 0 and f"{token}\treadme" in listed.stdout, listed.stderr
        r = httpx.put(f"{svc.base}/api/demo/orders", headers={"X-Token": token}, content=b"x")
        assert r.status_code == 201, r.text
        stats = console(shell, "stats", "--json")
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["queues"][0]["ready"] == 1


def test_two_embedded_serves_each_with_its_own_redis_and_state(tmp_path: Path) -> None:
    """Two `serve`s without a pool at once, one on a Redis port given with --redis-port:
    `token` reaches the Redis of the serve whose data port it names (--port or
    CLUSTER_DQ_PORT), refuses to guess between two, and stopping one leaves the other's."""
    shell = {"CLUSTER_DQ_LOGLEVEL": "warning", "TMPDIR": str(tmp_path)}  # one state dir
    redis_port = free_port(19_000, 19_500)
    first = ServiceProcess.start(env=shell, inherit_settings=False, log=tmp_path / "1.log")
    try:
        second = ServiceProcess.start(
            env=shell,
            inherit_settings=False,
            args=["--redis-port", str(redis_port)],
            log=tmp_path / "2.log",
        )
        try:
            tokens = {}
            for svc, how in ((first, ["--port", str(first.port)]), (second, [])):
                env = {**shell, "CLUSTER_DQ_PORT": str(second.port)} if not how else shell
                made = console(env, "token", "create", "demo", *how)
                assert made.returncode == 0, made.stderr
                tokens[svc.port] = made.stdout.strip()
            with redis.Redis(port=redis_port) as own:  # the second's token is in its Redis
                held = own.hkeys(AdminKeys.tokens("default", "demo"))  # and the banner's
                assert tokens[second.port].encode() in held
                assert tokens[first.port].encode() not in held
            for svc in (first, second):  # each token works on its own serve only
                for port, token in tokens.items():
                    r = httpx.put(
                        f"{svc.base}/api/demo/q", headers={"X-Token": token}, content=b"x"
                    )
                    assert r.status_code == (201 if port == svc.port else 401), r.text
            taken = console(shell, "serve", "--port", "0", "--redis-port", str(redis_port))
            assert (taken.returncode, taken.stderr) == (
                2,
                f"cluster-dq: EmbeddedRedisPort: 127.0.0.1:{redis_port} is in use\n",
            )
            guess = console(shell, "token", "list", "demo")
            assert guess.returncode == 2 and guess.stdout == "", guess.stderr
            assert guess.stderr == (
                f"cluster-dq: embedded servers run on data ports "
                f"{', '.join(str(p) for p in sorted(tokens))}: "
                "name one with --port or CLUSTER_DQ_PORT\n"
            )
        finally:
            assert second.stop(timeout=30) == 0
        listed = console(shell, "token", "list", "demo")  # the only one left
        assert listed.returncode == 0, listed.stderr
        shown = [line.split("\t")[0] for line in listed.stdout.splitlines()]
        assert tokens[first.port] in shown and tokens[second.port] not in shown
        gone = console(shell, "token", "list", "demo", "--port", str(second.port))
        assert gone.returncode == 2 and "no embedded server on data port" in gone.stderr
    finally:
        first.stop(timeout=30)
    none = console(shell, "token", "list", "demo")
    assert none.returncode == 2, none.stderr
    assert none.stderr == "cluster-dq: no pool configured and no embedded server running\n"


def test_a_state_file_of_a_process_that_is_no_serve_is_ignored(tmp_path: Path) -> None:
    """A serve killed with SIGKILL leaves its state file; its pid may later be another
    process's (a container restarted counts pids from 1 again). Such a file names no serve:
    `token` ignores it (before: a live pid was taken for a serve, and `token` used the dead
    Redis the file names, or refused to choose between it and the real serve)."""
    state = tmp_path / f"cluster-dq-{os.getuid()}"
    state.mkdir(mode=0o700)
    other = subprocess.Popen(["sleep", "60"])  # alive, of this user, and no serve
    try:
        planted = {"pid": other.pid, "port": 7777, "admin_port": 7778, "addr": "127.0.0.1:1"}
        (state / f"embedded-{other.pid}.json").write_text(json.dumps(planted))
        shell = {"TMPDIR": str(tmp_path)}
        for argv in (["token", "list", "demo"], ["token", "list", "demo", "--port", "7777"]):
            found = console(shell, *argv)
            assert found.returncode == 2 and found.stdout == "", found.stderr
            assert "no embedded server" in found.stderr, found.stderr
    finally:
        other.kill()
        other.wait()


def test_a_state_dir_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """Anyone can create a file in a shared /tmp with the name of another user's state dir:
    refused by name, as a directory of someone else's is (before: a FileExistsError
    traceback from `token` and `serve`)."""
    (tmp_path / f"cluster-dq-{os.getuid()}").write_text("")
    for argv in (["token", "list", "demo"], ["serve", "--port", "0", "--admin-port", "0"]):
        done = console({"TMPDIR": str(tmp_path)}, *argv)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert "is not a private directory of this user" in done.stderr, done.stderr
    # the refused serve started no Redis (in TMPDIR): the state directory is checked first
    assert not embedded_redis_pids(under=tmp_path)


def test_a_redis_port_taken_between_the_check_and_the_start_is_refused() -> None:
    """Two serves started at once with the same --redis-port (or the same free port drawn):
    both find it free, both start a redis-server, one of them cannot bind. The one whose
    redis-server exited is refused (before: the other's Redis answered the readiness ping,
    so both serves shared one Redis, and the first to stop took it from the other)."""
    first = start_server(free_port(19_500, 20_000))
    try:
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{first.port}"):
            start_server(first.port)  # as after a port_free() that raced
        assert first.process.poll() is None
    finally:
        first.stop()


def test_a_port_is_held_without_a_gap_while_a_serve_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two serves started at once on the same ports: the second must find them taken. A
    second serve's plain bind is tried each time the first asks for a socket on its port
    after its first (the moment it could have let go): it always fails (before: the
    supervisor closed its probe and bound again with SO_REUSEPORT, and a serve arriving in
    between took the same port; both then shared it, each with its own Redis)."""
    from cluster_dq import processes
    from cluster_dq.settings import Settings

    if not processes.REUSE_PORT:
        pytest.skip("no SO_REUSEPORT: the supervisor listens and never lets go")
    taken: list[int] = []
    seen: set[int] = set()
    real = processes._socket

    def socket_with_a_rival(host: str, port: int, reuse_port: bool) -> socket.socket:
        if port in seen:
            rival = socket.socket()
            rival.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                rival.bind((host, port))
                taken.append(port)
            except OSError:
                pass
            finally:
                rival.close()
        sock = real(host, port, reuse_port)
        seen.add(sock.getsockname()[1])
        return sock

    monkeypatch.setattr(processes, "_socket", socket_with_a_rival)
    holders: list[socket.socket] = []
    try:
        ports = processes.Ports.bind(Settings(Port=0, AdminPort=0), holders)
        for sock in ports.listeners():  # as each worker binds its own
            sock.close()
    finally:
        for sock in holders:
            sock.close()
    assert taken == []
