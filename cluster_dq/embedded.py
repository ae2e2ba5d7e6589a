"""Embedded mode: with no pool configured, ``cluster-dq serve`` starts its own redis-server,
and ``cluster-dq token`` (and ``pipeline``) find it.

Each serve records its instance in a state file of its own, named after its pid, in a
directory of the user's (``$TMPDIR/cluster-dq-<uid>``, mode 0700): its data and admin ports
and its Redis address. Only that serve removes its file, when it stops, so any number of
embedded serves run side by side. It holds a lock on its file while it runs: the kernel drops
the lock when the serve dies, SIGKILL included, so a file nobody locks is a dead serve's, even
once its pid is another process's. A command finds the one serving the data port it names
(``--port``, ``CLUSTER_DQ_PORT``, ``Port``), or the only one running; with several running
and none named it refuses, naming their ports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import stat
import tempfile
from pathlib import Path

from cluster_dq.errors import ConfigError
from cluster_dq.localredis import Server as RedisServer
from cluster_dq.localredis import free_port, port_free, start_server
from cluster_dq.settings import PoolSettings, Settings


def state_dir() -> Path:
    """This user's directory of state files, made private if new; refused when another user
    could write to it (a file planted there would point ``token`` at another Redis)."""
    path = Path(tempfile.gettempdir()) / f"cluster-dq-{os.getuid()}"
    with contextlib.suppress(FileExistsError):  # whatever is there is checked below
        path.mkdir(mode=0o700)
    info = path.lstat()
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.getuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise ConfigError(f"embedded state: {path} is not a private directory of this user")
    return path


@dataclasses.dataclass(frozen=True)
class Instance:
    """One running embedded serve."""

    pid: int
    port: int  # data port
    admin_port: int
    addr: str  # its Redis, host:port

    @property
    def path(self) -> Path:
        return state_dir() / f"embedded-{self.pid}.json"

    def record(self) -> None:
        """Written whole (a reader never sees half a file), and locked before it appears; the
        lock is held until ``forget`` or this process's end."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self)))
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)  # not inherited by children (PEP 446)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[self.pid] = fd
        os.replace(tmp, self.path)

    def forget(self) -> None:
        with contextlib.suppress(OSError, ConfigError):  # never recorded: a state dir refused
            self.path.unlink()
        fd = _held.pop(self.pid, None)
        if fd is not None:
            os.close(fd)


_held: dict[int, int] = {}  # pid -> the descriptor holding the lock of its state file


def _alive(path: Path) -> Instance | None:
    """The instance a state file records, if the serve that wrote it still holds its lock."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: its serve runs
        else:
            return None  # nobody holds it: its serve is dead
        with os.fdopen(os.dup(fd)) as f:
            return Instance(**json.loads(f.read()))
    finally:
        os.close(fd)


def start(settings: Settings) -> tuple[Settings, RedisServer]:
    """A local redis-server (AOF on, in a temporary directory) on ``EmbeddedRedisPort``, or on
    a free loopback port; the settings with it as the default pool."""
    state_dir()  # refused before a Redis is started, not after
    port = settings.EmbeddedRedisPort
    if port and not port_free(port):
        raise ConfigError(f"EmbeddedRedisPort: 127.0.0.1:{port} is in use")
    workdir = Path(tempfile.mkdtemp(prefix="cluster-dq-embedded-"))
    try:
        redis = start_server(port or free_port(), workdir=workdir, extra=["--appendonly", "yes"])
    except RuntimeError as e:  # the port taken since it was found free (another serve's)
        raise ConfigError(f"embedded Redis: {e}") from None
    pool = PoolSettings("default", Addr=f"127.0.0.1:{redis.port}")
    return dataclasses.replace(settings, Pool={"default": pool}), redis


def running() -> list[Instance]:
    """The embedded serves of this user that are alive, by data port."""
    found = []
    for path in state_dir().glob("embedded-*.json"):
        try:
            instance = _alive(path)
        except (OSError, ValueError, TypeError):
            continue  # not a regular file of ours, or not a state file
        if instance is not None:  # else: its serve died without removing it (SIGKILL)
            found.append(instance)
    return sorted(found, key=lambda i: i.port)


def find(port: int | None) -> Instance:
    """The running embedded serve of data port ``port``; with ``port`` None, the only one."""
    live = running()
    ports = ", ".join(str(i.port) for i in live)
    if port is not None:
        for instance in live:
            if instance.port == port:
                return instance
        also = f" (embedded servers run on data ports {ports})" if live else ""
        raise ConfigError(f"no pool configured and no embedded server on data port {port}{also}")
    if len(live) == 1:
        return live[0]
    if not live:
        raise ConfigError("no pool configured and no embedded server running")
    raise ConfigError(
        f"embedded servers run on data ports {ports}: name one with --port or CLUSTER_DQ_PORT"
    )
