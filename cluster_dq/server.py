"""A worker process of the running service: it serves the data and admin ports with uvicorn
and runs its share of the pump (leadership is per shard, via Redis). ``supervisor`` holds
the ports (and, in embedded mode, a local redis-server) and starts N of them.

Each worker listens on its own SO_REUSEPORT socket, so the kernel spreads new connections
over the workers evenly. One listening socket shared by all workers does not: the worker
that wakes first accepts every connection waiting, and a burst of keep-alive connections
(a load balancer's upstream pool) then lands on one worker while the others idle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import os
import socket
import sys
from collections.abc import Iterator

import uvicorn

from cluster_dq import history, logs, metrics
from cluster_dq import tracing
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.http.admin import create_admin_app
from cluster_dq.http.app import create_data_app
from cluster_dq.http.middleware import AccessLog, SharedFlag
from cluster_dq.http.protocol import Edge, protocol
from cluster_dq.lifecycle import LifecycleLog
from cluster_dq.pools import RedisPool
from cluster_dq.processes import Ports, stop_signals
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
        self._history: asyncio.Task[None] | None = None
        if settings.HistoryFlushSecond and settings.EnableMetrics:
            self.metrics.tally = history.Tally()  # the queues' 24-h history, flushed by start()
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
        if self.metrics.tally is not None:
            every = self.settings.HistoryFlushSecond
            self._history = asyncio.create_task(self.service.keep_history(every))
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
        if self._history is not None:  # its last flush, while the pools are open
            self._history.cancel()
            await asyncio.gather(self._history, return_exceptions=True)
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


async def _serve(
    settings: Settings, ports: Ports, access_flag: SharedFlag, early: list[int], parent: int
) -> bool:
    """One worker's life. On SIGTERM/SIGINT: waiting long-polls are answered at once ("no job
    available") and nothing more is reserved; requests in flight get ``ShutdownGraceSecond``
    to finish (then they are cancelled); then the pumps stop, reserved jobs of gone consumers
    go back, lifecycle events are flushed. True when all of that happened in time. ``early``:
    the stop signals that arrived while it started (it stops at once)."""
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

    for sig in stop_signals():
        loop.add_signal_handler(sig, stop)
    if early:
        stop()

    async def orphan_watch() -> None:  # the supervisor was SIGKILLed: do not linger
        # (its pid from the supervisor itself: one that died before this worker started
        # would be read here as init's, and the worker would serve on for good)
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


def work(
    settings: Settings, ports: Ports, access_flag: SharedFlag, early: list[int], parent: int
) -> None:
    """A worker process: serves both ports until SIGTERM/SIGINT (``supervisor`` starts it)."""
    logs.setup(settings.LogLevel, settings.LogFormat)
    _file_limit(settings)
    import uvloop

    # (each worker its own provider and export thread, flushed as it ends)
    flush_spans = tracing.configure_service() if settings.EnableTracing else None
    try:
        clean = uvloop.run(_serve(settings, ports, access_flag, early, parent))
    finally:
        if flush_spans is not None:
            flush_spans()
    if not clean:
        sys.exit(1)  # the supervisor then exits non-zero: something was cut short
