"""The running service: a supervisor process that holds the ports (and, in embedded mode, a
local redis-server) and N worker processes, each serving the data and admin ports with
uvicorn and running its share of the pump (leadership is per shard, via Redis).

Each worker listens on its own SO_REUSEPORT socket, so the kernel spreads new connections
over the workers evenly. One listening socket shared by all workers does not: the worker
that wakes first accepts every connection waiting, and a burst of keep-alive connections
(a load balancer's upstream pool) then lands on one worker while the others idle."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import resource
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from cluster_dq import embedded, logs, metrics
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.errors import ConfigError
from cluster_dq.http import hosts
from cluster_dq.http.admin import create_admin_app
from cluster_dq.http.app import create_data_app
from cluster_dq.http.middleware import AccessLog, SharedFlag
from cluster_dq.http.protocol import Edge, protocol
from cluster_dq.lifecycle import LifecycleLog
from cluster_dq.localredis import Server as RedisServer
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import Settings

METRICS_FLUSH_SECONDS = 1.0  # how stale a scrape of another worker's counts may be

log = logging.getLogger("cluster_dq.server")


class Runtime:
    """Pools, service and apps of one worker process."""

    def __init__(
        self, settings: Settings, run_pump: bool = True, access_flag: SharedFlag | None = None
    ) -> None:
        self.settings = settings
        self.run_pump = run_pump
        # Buffered: a request's counts reach the exposition within a second (or at a scrape).
        self.metrics = metrics.Metrics.from_settings(settings, buffered=True)
        self._flusher: asyncio.Task[None] | None = None
        config = EngineConfig.from_settings(settings)
        self.events = LifecycleLog(settings.LifecycleDir) if settings.LifecycleDir else None
        self.pools = {
            n: RedisPool.create(p, config, self.events, self.metrics)
            for n, p in settings.Pool.items()
        }
        self.service = Service(settings, self.pools, self.events, self.metrics)
        self.access_log = AccessLog(settings.EnableAccessLog, access_flag)
        # Posts older than three rounds belong to a shard that another instance leads now.
        self.board = metrics.SizeBoard(
            metrics.multiproc_dir(), 3 * settings.SizeIntervalSecond + 5, self.metrics
        )
        self.data_app = create_data_app(self.service, settings, self.access_log)
        self.admin_app = create_admin_app(self.service, settings, self.access_log, self.board)

    async def start(self) -> None:
        self._flusher = asyncio.create_task(self.metrics.flush_every(METRICS_FLUSH_SECONDS))
        for pool in self.pools.values():
            target = pool.settings.MigrateTo
            await pool.start(
                self.run_pump,
                self.board,
                self.settings.SizeIntervalSecond,
                self.settings.ReconcileSecond,
                migrate_to=self.pools[target] if target else None,
            )

    def stop_consuming(self) -> None:
        """Shutdown, first step: waiting long-polls are answered now, nothing more is reserved."""
        for pool in self.pools.values():
            pool.hub.stop()
        self.admin_app.state.dashboard.stop()  # its live streams end, not holding the stop up

    async def close(self) -> bool:
        """Pumps stopped, jobs of gone consumers given back, lifecycle events flushed. True
        when all of that happened."""
        clean = True
        for pool in self.pools.values():
            try:
                clean = await pool.close() and clean
            except Exception:
                log.exception("pool %s did not close cleanly", pool.name)
                clean = False
        if self._flusher is not None:
            self._flusher.cancel()  # its last flush runs as it ends
            await asyncio.gather(self._flusher, return_exceptions=True)
        if self.events:
            try:
                self.events.flush()
            except OSError as e:
                log.error("lifecycle events not flushed: %s", e)
                clean = False
        return clean


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the worker handles signals itself
        yield


def _uvicorn(app: object, sock: socket.socket, settings: Settings, edge: Edge) -> _Server:
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        log_config=None,
        access_log=False,
        lifespan="off",
        loop="uvloop",
        http=protocol(edge),
        timeout_keep_alive=settings.KeepAliveTimeoutSecond,
        proxy_headers=False,
        server_header=False,
    )
    server = _Server(config)
    server.sock = sock  # type: ignore[attr-defined]
    return server


async def _serve(settings: Settings, ports: Ports, access_flag: SharedFlag) -> bool:
    """One worker's life. On SIGTERM/SIGINT: waiting long-polls are answered at once ("no job
    available") and nothing more is reserved; requests in flight get ``ShutdownGraceSecond``
    to finish (then they are cancelled); then the pumps stop, reserved jobs of gone consumers
    go back, lifecycle events are flushed. True when all of that happened in time."""
    data_sock, admin_sock = ports.listeners()
    runtime = Runtime(settings, access_flag=access_flag)
    await runtime.start()
    edge = Edge.of(settings)
    servers = [
        _uvicorn(runtime.data_app, data_sock, settings, edge),
        _uvicorn(runtime.admin_app, admin_sock, settings, edge),
    ]
    loop = asyncio.get_running_loop()

    def stop() -> None:
        if not servers[0].should_exit:
            log.info("worker stopping", extra={"grace_s": settings.ShutdownGraceSecond})
        runtime.stop_consuming()
        for s in servers:
            s.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    parent = os.getppid()

    async def orphan_watch() -> None:  # the supervisor was SIGKILLed: do not linger
        while os.getppid() == parent:
            await asyncio.sleep(1.0)
        log.warning("supervisor gone; stopping")
        stop()

    watchdog = asyncio.create_task(orphan_watch())
    log.info("worker started", extra={"pid": os.getpid()})
    tasks = [asyncio.create_task(s.serve(sockets=[s.sock])) for s in servers]  # type: ignore[attr-defined]
    clean = True
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stop()
        _, pending = await asyncio.wait(tasks, timeout=settings.ShutdownGraceSecond)
        if pending:
            clean = False
            running = sum(len(s.server_state.tasks) for s in servers)
            log.error(
                "shutdown grace period (%s s) over: cancelling %d request(s) still running",
                settings.ShutdownGraceSecond,
                running,
            )
            for s in servers:
                s.force_exit = True
                for t in list(s.server_state.tasks):
                    t.cancel()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, BaseException):
                clean = False
                log.error("server failed", exc_info=result)
    finally:
        watchdog.cancel()
        clean = await runtime.close() and clean
        log.info("worker stopped", extra={"clean": clean})
    return clean


def _file_limit(settings: Settings) -> None:
    """Room for ``MaxConnections`` on the data port (and Redis, files; the admin port is the
    operators'): the soft limit on open files is raised toward the hard one; what is still
    short is said once."""
    need = settings.MaxConnections + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < need:
        log.warning(
            "open files limited to %d: MaxConnections (%d) needs %d; past the limit, "
            "accepting a connection fails",
            soft,
            settings.MaxConnections,
            need,
        )


def _worker(settings: Settings, ports: Ports, access_flag: SharedFlag) -> None:
    logs.setup(settings.LogLevel, settings.LogFormat)
    _file_limit(settings)
    import uvloop

    if not uvloop.run(_serve(settings, ports, access_flag)):
        sys.exit(1)  # the supervisor then exits non-zero: something was cut short


REUSE_PORT = hasattr(socket, "SO_REUSEPORT") and os.uname().sysname == "Linux"  # Linux balances


def _socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


@dataclasses.dataclass
class Ports:
    """The data and admin addresses, held by the supervisor for its whole life.

    With SO_REUSEPORT the supervisor binds a socket per port without listening on it (it
    holds the port; a socket that does not listen gets no connections) and every worker
    binds and listens on its own. A port already in use, even by another process's
    SO_REUSEPORT sockets, is found first by a plain bind, so two instances configured with
    the same port fail to start instead of silently sharing it: the supervisor keeps the
    socket of that bind (SO_REUSEPORT set, SO_REUSEADDR cleared once bound), so the port is
    never free, nor open to another plain bind, before its workers listen. Without SO_REUSEPORT the
    supervisor listens and the workers inherit its sockets."""

    data: tuple[str, int]
    admin: tuple[str, int]
    shared: list[socket.socket]  # the listening sockets, when the workers share them

    @classmethod
    def bind(cls, settings: Settings, holders: list[socket.socket]) -> Ports:
        addresses = []
        for key, host, port in (
            ("Port", settings.Host, settings.Port),
            ("AdminPort", settings.AdminHost, settings.AdminPort),
        ):
            try:
                probe = _socket(host, port, reuse_port=False)
            except OSError as e:
                raise ConfigError(
                    f"{key}: cannot listen on {host}:{port}: {e.strerror or e}"
                ) from None
            port = probe.getsockname()[1]
            if REUSE_PORT:  # kept, never let go: no moment for another instance to bind
                # SO_REUSEADDR let it bind past a last run's TIME_WAIT; kept on a socket that
                # does not listen, it would let another instance's plain bind succeed too
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the workers'
            else:
                probe.listen(2048)
                probe.set_inheritable(True)
            holders.append(probe)
            addresses.append((host, port))
        return cls(addresses[0], addresses[1], [] if REUSE_PORT else list(holders))

    def listeners(self) -> tuple[socket.socket, socket.socket]:
        """In a worker: its listening sockets for the data and the admin port."""
        if self.shared:
            return self.shared[0], self.shared[1]
        socks = []
        for host, port in (self.data, self.admin):
            sock = _socket(host, port, reuse_port=True)
            sock.listen(2048)
            socks.append(sock)
        return socks[0], socks[1]


async def _preflight(settings: Settings) -> None:
    """Refuses to start against an evicting Redis; an unreachable one only warns."""
    from redis.exceptions import RedisError

    from cluster_dq.pools import check_redis, close_client, make_client

    for name, pool in settings.Pool.items():
        client = make_client(pool)
        try:
            for warning in await check_redis(name, client):
                log.warning(warning)
        except (RedisError, OSError) as e:
            log.error("pool %s unreachable at start-up: %s", name, e)
        finally:
            await close_client(client)


def run(settings: Settings, on_ready: object = None) -> int:
    """Supervisor: binds both ports, starts the workers, stops everything on SIGINT/SIGTERM."""
    redis: RedisServer | None = None
    instance: embedded.Instance | None = None  # embedded mode: this serve's state file
    workers: list[multiprocessing.process.BaseProcess] = []
    metrics_dir: Path | None = None
    holders: list[socket.socket] = []  # the ports, held until the end
    stopping: list[int] = []
    failed = False  # exit status 1: a worker was killed, crashed at the end, or crash-looped

    def on_signal(signum: int, frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        if settings.embedded:
            settings, redis = embedded.start(settings)
        asyncio.run(_preflight(settings))
        ports = Ports.bind(settings, holders)
        if redis is not None:
            instance = embedded.Instance(
                os.getpid(), ports.data[1], ports.admin[1], settings.Pool["default"].Addr
            )
            instance.record()
        ctx = multiprocessing.get_context("spawn")
        # Workers sum their metrics through this directory (prometheus-client multiprocess).
        metrics_dir = Path(tempfile.mkdtemp(prefix="cluster-dq-metrics-"))
        os.environ[metrics.MULTIPROC_ENV] = str(metrics_dir)
        access_flag = ctx.Value("b", settings.EnableAccessLog, lock=False)

        def spawn() -> multiprocessing.process.BaseProcess:
            w = ctx.Process(target=_worker, args=(settings, ports, access_flag))
            w.start()
            return w

        workers = [spawn() for _ in range(settings.Workers)]
        log.info(
            "serving",
            extra={
                "data": f"http://{settings.Host}:{ports.data[1]}",
                "admin": f"http://{settings.AdminHost}:{ports.admin[1]}",
                "workers": settings.Workers,
            },
        )
        if (warning := hosts.start_warning(settings)) is not None:
            log.warning(warning)
        if callable(on_ready):
            try:
                on_ready(settings, ports.data[1], ports.admin[1], redis is not None)
            except Exception:  # a banner must never take the service down
                log.exception("start-up banner failed")
        restarts: list[float] = []  # when workers were restarted (a crash loop gives up)
        while not stopping:
            signal.sigtimedwait({signal.SIGCHLD}, 1.0)
            for i, w in enumerate(workers):
                if w.is_alive() or stopping:
                    continue
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < RESTART_WINDOW_S] + [now]
                if len(restarts) > MAX_RESTARTS:
                    log.error(
                        "worker (pid %s) %s; %d restarts within %d s: stopping the instance",
                        w.pid,
                        _exit_status(w.exitcode),
                        MAX_RESTARTS,
                        RESTART_WINDOW_S,
                    )
                    failed = True
                    stopping.append(0)
                    break
                log.error("worker (pid %s) %s; restarting it", w.pid, _exit_status(w.exitcode))
                _forget_worker(metrics_dir, w.pid)
                workers[i] = spawn()
    finally:
        for w in workers:
            if w.pid and w.is_alive():
                os.kill(w.pid, signal.SIGTERM)
        deadline = time.monotonic() + settings.ShutdownGraceSecond + SUPERVISOR_EXTRA_S
        for w in workers:
            w.join(timeout=max(deadline - time.monotonic(), 0.1))
            if w.is_alive():
                log.error(
                    "worker (pid %s) still running after %.0f s: killed",
                    w.pid,
                    settings.ShutdownGraceSecond + SUPERVISOR_EXTRA_S,
                )
                w.kill()
                w.join()
                failed = True
            elif w.exitcode:
                log.error("worker (pid %s) %s", w.pid, _exit_status(w.exitcode))
                failed = True
        for sock in holders:
            sock.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        try:
            if instance is not None:
                instance.forget()
        finally:
            if redis is not None:
                redis.kill(signal.SIGTERM)
    return 1 if failed else 0


MAX_RESTARTS = 5  # worker restarts within RESTART_WINDOW_S before the instance gives up
RESTART_WINDOW_S = 60
SUPERVISOR_EXTRA_S = 15  # beyond a worker's grace: pumps stopped, jobs given back, flushed


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:  # a real-time signal has no name
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _forget_worker(metrics_dir: Path | None, pid: int | None) -> None:
    """A dead worker's live gauges (pump leadership) must not be summed any more."""
    if metrics_dir is not None and pid is not None:
        from prometheus_client.multiprocess import mark_process_dead

        mark_process_dead(pid, str(metrics_dir))  # type: ignore[no-untyped-call]
