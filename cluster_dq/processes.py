"""What the supervisor and its worker processes share: the ports the supervisor holds for
the workers (``Ports``) and the signals that stop them all (``stop_signals``). Light on
purpose: the supervisor imports it without the serving modules, a worker (``server``) too."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket

from cluster_dq.errors import ConfigError
from cluster_dq.settings import Settings


def stop_signals() -> tuple[signal.Signals, ...]:
    """What stops an instance, supervisor and workers alike: SIGTERM (a service manager),
    SIGINT (Ctrl-C, sent to every process of the terminal's group; taken even when ignored,
    as a script's background job has it) and SIGHUP (the terminal closed), unless SIGHUP is
    ignored: started under ``nohup``, the instance is to outlive its terminal."""
    hup = signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN
    return (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hup else ()))


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
