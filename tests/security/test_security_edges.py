"""The service's edges against hostile clients and careless setups (issue 25): the Host
allowlist on both ports (DNS rebinding), one header field bounded before it is buffered, slow
and idle connections closed by the header, body and keep-alive timeouts, open connections
bounded per worker, and uvicorn's log lines written once. Through real sockets against a real
``cluster-dq serve`` process and a real redis-server."""

from __future__ import annotations

import json
import select
import socket
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from cluster_dq.errors import ConfigError
from cluster_dq.http import hosts
from cluster_dq.http.hosts import LOOPBACK, AllowedHosts, effective
from cluster_dq.localredis import Server
from cluster_dq.settings import Settings, load
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH, serve


def worker_pids(svc: ServiceProcess) -> list[int]:
    """The supervisor's worker processes (spawned children; not its resource tracker)."""
    text = Path(f"/proc/{svc.pid}/task/{svc.pid}/children").read_text()
    pids = [int(p) for p in text.split()]
    return [p for p in pids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


# -- (21) every uvicorn log line once ---------------------------------------------------------


def test_no_log_line_is_written_twice(redis_server: Server, standalone_redis: redis.Redis) -> None:
    """Each worker serves two ports with two uvicorn servers: their start and stop lines were
    both written ("Started server process [pid]" twice, "Shutting down" twice, ...). On a
    flushed Redis: another test's schedule would be fired and logged here."""
    log = Path(tempfile.mkstemp(prefix="dq-edge-log-", suffix=".log")[1])
    try:
        svc = serve(
            f"127.0.0.1:{redis_server.port}",
            stderr=log,
            CLUSTER_DQ_LOGLEVEL="info",
            CLUSTER_DQ_ENABLEACCESSLOG="true",
        )
        try:
            assert httpx.get(f"{svc.admin}/healthz").status_code == 200
            r = httpx.get(f"{svc.admin}/token/edge", auth=ADMIN_AUTH)
            assert r.status_code == 200
        finally:
            assert svc.stop(timeout=20) == 0
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        seen: dict[str, int] = {}
        for line in lines:
            key = json.dumps({k: v for k, v in line.items() if k != "ts"}, sort_keys=True)
            seen[key] = seen.get(key, 0) + 1
        twice = [k for k, n in seen.items() if n > 1]
        assert not twice, twice
        assert not [line for line in lines if "color_message" in line]  # terminal escapes
        # the requests and the worker's life are still logged
        assert sum(1 for line in lines if line.get("path") == "/token/edge") == 1
        assert any(line["msg"] == "worker started" for line in lines)
        assert any(line["msg"] == "worker stopped" for line in lines)
    finally:
        log.unlink()


# -- raw sockets ------------------------------------------------------------------------------

MB = 1024 * 1024


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_until_closed(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (b"" if it closed without a
    word); raises TimeoutError if it is still open after ``timeout``."""
    sock.settimeout(timeout)
    out = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not data:
            return out
        out += data


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def own_service(redis_server: Server) -> Iterator[ServiceProcess]:
    """One service for the module, one worker, default settings."""
    svc = serve(f"127.0.0.1:{redis_server.port}", CLUSTER_DQ_WORKERS="1")
    yield svc
    svc.stop(timeout=20)


# -- (3) one header field bounded before it is buffered ---------------------------------------


def test_a_huge_header_field_is_refused_after_little_data(own_service: ServiceProcess) -> None:
    """httptools buffers a header name or value across reads and hands it over only when it
    is complete: the 64 KiB check came after the whole field (32 MiB: 1.8 s of CPU)."""
    sock = connect(own_service.base)
    with sock:
        sock.sendall(b"GET /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Huge: ")
        sent, chunk = 0, b"a" * 16384
        while sent < 4 * MB:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            if select.select([sock], [], [], 0.05)[0]:
                break  # answered
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert b"too large" in answer.split(b"\r\n\r\n", 1)[1]
    assert sent <= 256 * 1024  # refused soon after 64 KiB, not at the end of the field


def test_a_huge_trailer_field_is_cut_after_little_data(own_service: ServiceProcess) -> None:
    """A chunked body's trailer fields are headers too, buffered the same way by httptools,
    after the head: 16 MiB of one trailer field were read (and held) whole."""
    (worker,) = worker_pids(own_service)
    before = rss_kib(worker)
    with connect(own_service.base) as sock:
        sock.sendall(
            b"PUT /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Token: junk-token-0000000000\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: "
        )
        sent, cut = 0, False
        while sent < 16 * MB:
            try:
                sock.sendall(b"t" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            sent += 65536
        grown = rss_kib(worker) - before
    assert cut and sent <= 4 * MB, sent  # closed soon after the bound, not at the field's end
    assert grown < 8 * 1024, f"worker RSS grew by {grown} KiB"


def test_unfinished_huge_headers_do_not_grow_the_worker(own_service: ServiceProcess) -> None:
    """Four unfinished 16 MiB header fields held +80 MiB in the worker."""
    (worker,) = worker_pids(own_service)
    assert httpx.get(f"{own_service.base}/healthz").status_code in (200, 404)
    before = rss_kib(worker)
    socks = [connect(own_service.base) for _ in range(4)]
    try:
        for sock in socks:
            sock.sendall(b"PUT /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Huge: ")
            try:
                for _ in range(16):
                    sock.sendall(b"b" * MB)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed: what should happen
        time.sleep(0.5)
        grown = rss_kib(worker) - before
    finally:
        for sock in socks:
            sock.close()
    assert grown < 16 * 1024, f"worker RSS grew by {grown} KiB"


# -- (2) the Host allowlist on both ports -----------------------------------------------------

REBIND = "rebind.attacker.example"


@pytest.fixture(scope="module")
def token(own_service: ServiceProcess) -> str:
    r = httpx.post(f"{own_service.admin}/token/edge", params={"description": "x"}, auth=ADMIN_AUTH)
    assert r.status_code == 201
    return str(r.json()["token"])


def refused_host(r: httpx.Response) -> bool:
    return r.status_code == 400 and "Host" in r.json()["error"]


def test_a_foreign_host_is_refused_on_the_data_port_hot_paths_included(
    own_service: ServiceProcess, token: str
) -> None:
    """DNS rebinding: a page whose name now points at 127.0.0.1 sends its own Host."""
    headers = {"X-Token": token, "Host": f"{REBIND}:{own_service.port}"}
    r = httpx.put(f"{own_service.base}/api/edge/q", content=b"x", headers=headers)
    assert refused_host(r), r.text  # publish: a hot path, past Starlette's router
    assert refused_host(httpx.get(f"{own_service.base}/api/edge/q", headers=headers))  # consume
    r = httpx.delete(
        f"{own_service.base}/api/edge/q/job/01M8DSGZ1K27127VBJD3RMCRF0", headers=headers
    )
    assert refused_host(r)  # ack
    assert refused_host(httpx.get(f"{own_service.base}/api/edge/q/size", headers=headers))  # routed
    # nothing was published: the same requests with this server's name work
    r = httpx.get(f"{own_service.base}/api/edge/q/size", headers={"X-Token": token})
    assert r.status_code == 200 and r.json()["size"] == 0, r.text


def test_a_foreign_host_is_refused_on_the_admin_port_and_the_dashboard(
    own_service: ServiceProcess,
) -> None:
    host = {"Host": f"{REBIND}:{own_service.admin_port}"}
    assert refused_host(httpx.get(f"{own_service.admin}/token/shop", headers=host, auth=ADMIN_AUTH))
    assert refused_host(httpx.get(f"{own_service.admin}/ui/", headers=host, auth=ADMIN_AUTH))
    # the dashboard's CSRF check compared Origin with this Host: same "origin", so it passed
    assert refused_host(httpx.get(f"{own_service.admin}/ui/tokens", headers=host, auth=ADMIN_AUTH))
    r = httpx.post(
        f"{own_service.admin}/ui/tokens/shop/create",
        headers={**host, "Origin": f"http://{REBIND}:{own_service.admin_port}"},
        data={"namespace": "shop"},
        auth=ADMIN_AUTH,
    )
    assert refused_host(r)
    assert httpx.get(f"{own_service.admin}/token/shop", auth=ADMIN_AUTH).status_code == 200


@pytest.mark.parametrize(
    "host", ["localhost", "LocalHost", "127.0.0.1", "[::1]", "localhost.", "127.0.0.1:{port}"]
)
def test_the_loopback_names_with_or_without_a_port_are_served(
    own_service: ServiceProcess, host: str
) -> None:
    for port in (own_service.port, own_service.admin_port):
        name = host.format(port=port)
        for value in (name, f"{name}:{port}") if "{" not in host else (name,):
            r = httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"Host": value})
            assert r.status_code in (200, 404) and "Host" not in r.text, (value, r.text)


@pytest.mark.parametrize(
    "value",
    [b"", b"localhost:x", b"localhost:1:2", b"[::1", b"[::1]x", b"127.0.0.1.evil", b"evil:7777"],
)
def test_a_malformed_or_foreign_host_value_is_refused(
    own_service: ServiceProcess, value: bytes
) -> None:
    with connect(own_service.admin) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: " + value + b"\r\n\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"Host" in answer, answer


def test_a_pipelined_foreign_host_does_not_take_the_answer_of_the_request_before_it(
    own_service: ServiceProcess, token: str
) -> None:
    """Two requests in one write, the second with a foreign Host: the refusal was written at
    once, before the first request's answer, which was lost, so a publish that was done (17
    times in 20) was answered 400 "nothing was done" (a client repeats it: published twice)."""
    head = f"PUT /api/edge/pipelined HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Token: {token}\r\n"
    with connect(own_service.base) as sock:
        sock.sendall(
            head.encode() + b"Content-Length: 1\r\n\r\nx"
            b"GET /healthz HTTP/1.1\r\nHost: " + REBIND.encode() + b"\r\n\r\n"
        )
        answer = read_until_closed(sock)
    first, _, second = answer.partition(b"HTTP/1.1 400 ")
    assert first.startswith(b"HTTP/1.1 201 ") and b"job_id" in first, answer
    assert b"Host not allowed" in second, answer
    r = httpx.get(f"{own_service.base}/api/edge/pipelined/size", headers={"X-Token": token})
    assert r.json()["size"] == 1, r.text


def test_a_missing_or_doubled_host_is_refused_in_http_1_1(own_service: ServiceProcess) -> None:
    for head in (
        b"GET /healthz HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: " + REBIND.encode() + b"\r\n\r\n",
    ):
        with connect(own_service.admin) as sock:
            sock.sendall(head)
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 400 ") and b"Host" in answer, answer
    with connect(own_service.admin) as sock:  # HTTP/1.0 has no Host; browsers always send one
        sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "head",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /api/ns/q HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
        b"PUT /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ten\r\n\r\n",
        b"PUT /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /api/ns/q HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: x\r\n\r\n",
    ],
    ids=["request-line", "version", "content-length", "two-lengths", "header-name"],
)
def test_a_request_that_cannot_be_parsed_gets_a_json_400(
    own_service: ServiceProcess, head: bytes
) -> None:
    """Below the app, a request the HTTP parser refuses is answered like every other bad
    request: a 400 with a JSON ``error`` (it was uvicorn's plain text)."""
    for port in (own_service.base, own_service.admin):
        with connect(port) as sock:
            sock.sendall(head)
            answer = read_until_closed(sock)
        status, _, rest = answer.partition(b"\r\n")
        head_part, _, body = rest.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 400 "), answer
        assert b"content-type: application/json" in head_part.lower(), answer
        assert "could not be parsed" in json.loads(body)["error"], body


def json_error(answer: bytes, status: int) -> str:
    """The ``error`` of a JSON answer with ``status``, the connection closed after it, with a
    request id as every answer has (the admin OpenAPI document requires one on a 400)."""
    status_line, _, rest = answer.partition(b"\r\n")
    head_part, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.startswith(b"HTTP/1.1 %d " % status), answer
    assert b"content-type: application/json" in head_part.lower(), answer
    assert b"connection: close" in head_part.lower(), answer
    assert b"x-request-id: " in head_part.lower(), answer
    return str(json.loads(body)["error"])


def queue_size(svc: ServiceProcess, token: str, q: str) -> int:
    r = httpx.get(f"{svc.base}/api/edge/{q}/size", headers={"X-Token": token})
    assert r.status_code == 200, r.text
    return int(r.json()["size"])


@pytest.mark.parametrize(
    ("coding", "status", "says"),
    [(b"chunked", 400, "could not be parsed"), (b"xchunked", 501, "only chunked")],
    ids=["chunk-size", "coding"],
)
@pytest.mark.parametrize("pipelined", [False, True], ids=["alone", "pipelined"])
def test_a_body_the_parser_refuses_is_answered_at_once_and_nothing_is_done(
    own_service: ServiceProcess, token: str, coding: bytes, status: int, says: str, pipelined: bool
) -> None:
    """A chunk size that is not hex (or a coding httptools refused after the head): the
    request's app was already waiting for its body, so the refusal waited for its answer, and
    the app for a body that never came: nothing was written and BodyTimeoutSecond (30 s)
    closed the connection."""
    q = f"badchunk-{coding.decode()}-{pipelined}"
    head = f"PUT /api/edge/{q} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Token: {token}\r\n".encode()
    bad = head + b"Transfer-Encoding: " + coding + b"\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    before = head.replace(q.encode(), f"{q}-first".encode()) + b"Content-Length: 1\r\n\r\nx"
    started = time.monotonic()
    with connect(own_service.base) as sock:
        sock.sendall(before + bad if pipelined else bad)
        answer = read_until_closed(sock, timeout=10)
    assert time.monotonic() - started < 5
    if pipelined:
        first, _, answer = answer.partition(b"HTTP/1.1 %d " % status)
        assert first.startswith(b"HTTP/1.1 201 ") and b"job_id" in first, first
        answer = b"HTTP/1.1 %d " % status + answer
        assert queue_size(own_service, token, f"{q}-first") == 1
    assert says in json_error(answer, status)
    assert queue_size(own_service, token, q) == 0


def test_a_body_refused_while_its_app_reads_it_ends_the_read(
    own_service: ServiceProcess, token: str
) -> None:
    """The bad chunk comes in a later read: the app is waiting for the body by then; its read
    ends in a disconnect (nothing published) and the refusal is written at once."""
    head = f"PUT /api/edge/badchunk-later HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Token: {token}\r\n"
    with connect(own_service.base) as sock:
        sock.sendall(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        time.sleep(0.5)
        started = time.monotonic()
        sock.sendall(b"zz\r\nabc\r\n0\r\n\r\n")
        answer = read_until_closed(sock, timeout=10)
    assert time.monotonic() - started < 5
    assert "could not be parsed" in json_error(answer, 400)
    assert queue_size(own_service, token, "badchunk-later") == 0


@pytest.mark.parametrize(
    "codings",
    [b"Transfer-Encoding: gzip, chunked", b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked"],
    ids=["one-field", "two-fields"],
)
def test_a_transfer_coding_other_than_chunked_is_501(
    own_service: ServiceProcess, token: str, codings: bytes
) -> None:
    """httptools takes any coding before the last ``chunked``: the body was published still
    gzipped, as if it were the job's."""
    head = f"PUT /api/edge/gzipped HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Token: {token}\r\n"
    with connect(own_service.base) as sock:
        sock.sendall(head.encode() + codings + b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        answer = read_until_closed(sock)
    assert "chunked" in json_error(answer, 501)
    assert queue_size(own_service, token, "gzipped") == 0


def test_an_absolute_form_request_line_is_checked_by_its_authority(
    own_service: ServiceProcess, token: str
) -> None:
    """RFC 9112: a request line in absolute form names the host; the server ignores ``Host``.
    The check looked at ``Host`` alone, so ``GET http://evil.com/...`` was served."""
    for url in (own_service.base, own_service.admin):
        port = url.rsplit(":", 1)[1]
        for target in (f"http://{REBIND}/healthz", f"http://{REBIND}:{port}/healthz"):
            with connect(url) as sock:
                sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                answer = read_until_closed(sock)
            assert "Host not allowed" in json_error(answer, 400), target
    target = f"http://{REBIND}/api/edge/q/size"
    with connect(own_service.base) as sock:
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Token: {token}\r\n\r\n".encode()
        )
        assert "Host not allowed" in json_error(read_until_closed(sock), 400)
    # the authority is the host: a foreign Host with an allowed authority is served
    target = f"http://127.0.0.1:{own_service.port}/api/edge/q/size"
    head = f"GET {target} HTTP/1.1\r\nHost: {REBIND}\r\nX-Token: {token}\r\nConnection: close\r\n"
    with connect(own_service.base) as sock:
        sock.sendall(head.encode() + b"\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"size"' in answer, answer


def test_allowed_hosts_lists_the_names_a_load_balancer_sends(
    redis_server: Server, tmp_path: Path
) -> None:
    svc = serve(
        f"127.0.0.1:{redis_server.port}",
        stderr=tmp_path / "serve.log",
        CLUSTER_DQ_ALLOWEDHOSTS="dq.example.com, *.lb.example, 127.0.0.1, admin.example:8443",
    )
    try:
        for host, ok in [
            ("dq.example.com", True),
            ("DQ.example.com:8080", True),
            ("a.lb.example", True),
            ("b.a.lb.example:80", True),
            ("lb.example", False),  # *.domain: the names under it
            ("admin.example:8443", True),
            ("admin.example", False),  # that port only
            ("admin.example:443", False),
            (f"127.0.0.1:{svc.admin_port}", True),
            ("localhost", False),  # the list replaces the default
        ]:
            r = httpx.get(f"{svc.admin}/healthz", headers={"Host": host})
            assert (r.status_code == 200) is ok, (host, r.status_code, r.text)
        for _ in range(3):
            assert httpx.get(f"{svc.admin}/healthz", headers={"Host": "other"}).status_code == 400
    finally:
        svc.stop(timeout=20)
    # an operator sees which names were refused: each once, and no other line per refusal
    # (uvicorn's "Invalid HTTP request received." was written for every one of them)
    assert "Invalid HTTP request" not in svc.logs()
    refused = [json.loads(line) for line in svc.logs().splitlines() if "AllowedHosts" in line]
    assert sorted(r["host"] for r in refused) == sorted(
        ["lb.example", "admin.example", "admin.example:443", "localhost", "other"]
    ), refused


def test_the_default_allowed_hosts_are_loopback_and_the_listen_hosts() -> None:
    assert effective(Settings()) == LOOPBACK
    assert effective(Settings(Host="0.0.0.0", AdminHost="::")) == LOOPBACK  # wildcards: no name
    assert effective(Settings(Host="10.0.0.5", AdminHost="fd00::5")) == (
        *LOOPBACK,
        "10.0.0.5",
        "[fd00::5]",
    )
    assert effective(Settings(AllowedHosts=("DQ.example",))) == ("dq.example",)
    assert AllowedHosts(["*"]).permits(None) and AllowedHosts(["*"]).permits(b"anything")


@pytest.mark.parametrize("bad", ["dq example", "http://dq", "dq/x", "*.", "a:b:c", "**"])
def test_a_bad_allowed_hosts_entry_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigError, match="AllowedHosts"):
        load(environ={"CLUSTER_DQ_ALLOWEDHOSTS": f"localhost,{bad}"})


def test_a_wildcard_listen_host_with_the_default_list_warns_at_start() -> None:
    assert hosts.start_warning(Settings()) is None
    assert hosts.start_warning(Settings(Host="0.0.0.0", AllowedHosts=("dq",))) is None
    warning = hosts.start_warning(Settings(AdminHost="0.0.0.0"))
    assert warning is not None and "AllowedHosts" in warning


# -- (4) slow and idle connections ------------------------------------------------------------


@pytest.fixture(scope="module")
def timed(redis_server: Server) -> Iterator[tuple[ServiceProcess, str]]:
    """A service with one-second header, body and keep-alive timeouts, and a token."""
    svc = serve(
        f"127.0.0.1:{redis_server.port}",
        CLUSTER_DQ_HEADERTIMEOUTSECOND="1",
        CLUSTER_DQ_BODYTIMEOUTSECOND="1",
        CLUSTER_DQ_KEEPALIVETIMEOUTSECOND="1",
    )
    r = httpx.post(f"{svc.admin}/token/slow", params={"description": "x"}, auth=ADMIN_AUTH)
    assert r.status_code == 201
    yield svc, str(r.json()["token"])
    svc.stop(timeout=20)


def test_a_connection_that_sends_nothing_is_closed(timed: tuple[ServiceProcess, str]) -> None:
    for url in (timed[0].base, timed[0].admin):
        with connect(url) as sock:
            assert read_until_closed(sock, timeout=10) == b""  # closed, not answered


def test_a_request_head_trickled_past_the_header_timeout_is_408(
    timed: tuple[ServiceProcess, str],
) -> None:
    """Slowloris: a byte now and then keeps no connection open past HeaderTimeoutSecond."""
    with connect(timed[0].base) as sock:
        sock.sendall(b"GET /api/slow/q HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for _ in range(40):
            if select.select([sock], [], [], 0.25)[0]:
                break
            try:
                sock.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                break
        answer = read_until_closed(sock, timeout=10)
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_second_request_head_on_a_kept_connection_is_timed_too(
    timed: tuple[ServiceProcess, str],
) -> None:
    with connect(timed[0].admin) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):  # the whole first answer (a JSON body)
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for _ in range(40):  # past the keep-alive timeout too: only the head timeout ends it
            if select.select([sock], [], [], 0.25)[0]:
                break
            sock.sendall(b"a")
        answer = read_until_closed(sock, timeout=10)
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_request_head_begun_in_the_read_that_ended_the_last_request_is_timed(
    timed: tuple[ServiceProcess, str],
) -> None:
    """A complete request and the start of the next in one write: the bytes of that read were
    not counted as a head, so no head timer ran and only the keep-alive timeout (75 s by
    default, not HeaderTimeoutSecond) closed the connection, without a 408."""
    with connect(timed[0].admin) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a"
        )
        answer = read_until_closed(sock, timeout=10)
    first, _, second = answer.partition(b"HTTP/1.1 408 ")
    assert first.startswith(b"HTTP/1.1 200 ") and second, answer


def test_a_body_that_stops_coming_is_cut_and_nothing_is_published(
    timed: tuple[ServiceProcess, str],
) -> None:
    svc, token = timed
    with connect(svc.base) as sock:
        sock.sendall(
            b"PUT /api/slow/body HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Token: "
            + token.encode()
            + b"\r\nContent-Length: 100\r\n\r\n0123456789"
        )
        read_until_closed(sock, timeout=10)  # closed (the app saw a disconnect)
    r = httpx.get(f"{svc.base}/api/slow/body/size", headers={"X-Token": token})
    assert r.json()["size"] == 0


def test_a_body_trickled_after_its_answer_is_not_read_forever(
    timed: tuple[ServiceProcess, str],
) -> None:
    """A request answered before its body ended (401 without a token, 413): the rest of the
    body is only read to be dropped, and each read restarted the body timeout: one byte a
    little under BodyTimeoutSecond held the connection forever, without a token."""
    for length in (b"1000", b"999999999999"):
        with connect(timed[0].base) as sock:
            sock.sendall(
                b"PUT /api/slow/q HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + length
            )
            sock.sendall(b"\r\n\r\n")
            answer, closed = b"", False
            for _ in range(40):  # 10 s, ten times BodyTimeoutSecond, a byte every 0.25 s
                if select.select([sock], [], [], 0.25)[0]:
                    try:
                        data = sock.recv(65536)
                    except ConnectionResetError:
                        data = b""
                    if not data:
                        closed = True
                        break
                    answer += data
                try:
                    sock.sendall(b"a")
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
        assert answer.startswith(b"HTTP/1.1 401 "), answer
        assert closed, "a body trickled after its answer kept the connection open"


def test_an_idle_keep_alive_connection_is_closed(timed: tuple[ServiceProcess, str]) -> None:
    with connect(timed[0].admin) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = read_until_closed(sock, timeout=10)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1


def test_a_long_poll_outlives_every_connection_timeout(timed: tuple[ServiceProcess, str]) -> None:
    """A long-poll has a complete request: it waits its own timeout (3 s here, three times
    each connection timeout), and gets the job published while it waits."""
    svc, token = timed
    headers = {"X-Token": token}
    with httpx.Client(base_url=svc.base, headers=headers, timeout=30) as client:
        with ThreadPoolExecutor(1) as pool:
            # the second long-poll waits beside the first (its own connection), so that the
            # first's 3 s are also its wait before the publish (2.5 s at the least)
            started = time.monotonic()
            waiting = pool.submit(client.get, "/api/slow/poll", params={"timeout": 10})
            r = client.get("/api/slow/poll", params={"timeout": 3})
            assert r.status_code == 404, r.text  # lmstfy: no job within the timeout
            time.sleep(max(0.0, started + 2.5 - time.monotonic()))
            assert httpx.put(f"{svc.base}/api/slow/poll", content=b"late", headers=headers)
            r = waiting.result()
        assert r.status_code == 200 and r.json()["data"] == "bGF0ZQ==", r.text  # base64("late")


def test_connections_beyond_max_connections_are_refused(redis_server: Server) -> None:
    svc = serve(f"127.0.0.1:{redis_server.port}", CLUSTER_DQ_MAXCONNECTIONS="5")
    held: list[socket.socket] = []
    try:
        held = [connect(svc.base) for _ in range(5)]
        for sock in held:  # each is served
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 404 ")
        with connect(svc.base) as extra:
            answer = read_until_closed(extra, timeout=10)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"MaxConnections" in answer, answer
        # the admin port has its own bound: operators still get in
        assert httpx.get(f"{svc.admin}/healthz").status_code == 200
        held.pop().close()
        time.sleep(0.3)
        assert httpx.get(f"{svc.base}/healthz").status_code == 404  # room again
    finally:
        for sock in held:
            sock.close()
        svc.stop(timeout=20)


@pytest.mark.parametrize("method", ["OPTIONS", "PATCH", "POST", "HEAD"])
@pytest.mark.parametrize("path", ["/api/edge/q/size", "/api/edge/q", "/api/edge/q/job/x"])
def test_a_method_a_route_does_not_take_asks_for_the_token_first(
    own_service: ServiceProcess, token: str, method: str, path: str
) -> None:
    """Every data route but /openapi.json answers 401 first: a method the path does not take
    was a 405 (with its Allow) to a client without a token."""
    url = f"{own_service.base}{path}"
    for headers in ({}, {"X-Token": "junk-token-0000000000"}):
        r = httpx.request(method, url, headers=headers)
        assert r.status_code == 401 and "allow" not in r.headers, (headers, r.text)
    r = httpx.request(method, url, headers={"X-Token": token})
    assert r.status_code != 401, r.text
    if r.status_code == 405:
        assert r.headers["allow"], r.headers
        # a publish's keys on a method the path does not take: still its 405, not a 400
        keyed = httpx.request(
            method,
            url,
            params={"dedup_key": "k"},
            headers={"X-Token": token, "Idempotency-Key": "i"},
        )
        assert keyed.status_code == 405, keyed.text
    assert httpx.request(method, f"{own_service.base}/openapi.json").status_code in (200, 405)
