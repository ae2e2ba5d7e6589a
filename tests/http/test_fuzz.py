"""A fuzz run over the whole HTTP surface (both ports) of a real `cluster-dq serve` (2 workers)
on a real redis-server: requests built from the route tables plus raw junk in methods, paths,
query strings, headers and bodies (tests/support/fuzzing.py). For every request: never a 5xx, an
answer to every well-formed request, a JSON error on every app-level 4xx, no traceback in the
log, and nothing written in Redis by a request answered 4xx.

``DQ_FUZZ_EXAMPLES`` sets the number of examples (CI: 800, under a minute);
``DQ_FUZZ_FINDINGS=<file>`` records every failing request there (JSON lines) and goes on
instead of stopping and shrinking at the first, for a long exploratory run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings

from cluster_dq.keys import AdminKeys
from cluster_dq.localredis import Server, port_share
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ROOT as CHECKOUT
from tests.support import fuzzing
from tests.support.fuzzing import ADMIN_AUTH, NS, NoResponse, Request, Response, State, snapshot
from tests.support.run import examples

# The code the service runs (another checkout, e.g. main, to compare findings before a fix).
ROOT = Path(os.environ.get("DQ_FUZZ_SERVE_ROOT") or CHECKOUT)

EXAMPLES = int(os.environ.get("DQ_FUZZ_EXAMPLES") or examples(800))  # at the tier's size
FINDINGS = os.environ.get("DQ_FUZZ_FINDINGS")
TRACE = os.environ.get("DQ_FUZZ_TRACE")  # count answers by route, status and body (tuning)
# Log lines no user-caused input may produce.
CRASH = re.compile(
    r"Traceback|unexpected error|Exception in ASGI application|\"level\": \"(error|critical)\""
)


class ServerError(AssertionError):
    """A 5xx, or no answer to a well-formed request."""


class NotJsonError(AssertionError):
    """An app-level 4xx whose body is not a JSON error."""


class RefusedWrite(AssertionError):
    """A request answered 4xx changed the keyspace."""


class LoggedCrash(AssertionError):
    """A traceback or an error line in the log after a request."""


@dataclass
class Target:
    ports: dict[str, int]
    redis: redis.Redis
    log: IO[bytes]  # the service's stderr, read as it grows
    state: State
    counts: dict[str, int] = field(default_factory=dict)
    previous: str = ""  # the request before, for a finding that might be its late effect

    def new_log(self) -> str:
        return self.log.read().decode(errors="replace")

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


@pytest.fixture(scope="module")
def target(redis_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    client = redis_server.client()
    client.flushall()
    log_path = tmp_path_factory.mktemp("fuzz") / "serve.log"
    with open(log_path, "wb") as log_out, open(log_path, "rb") as log_in:
        # ttr a day away and no reconcile sweep: nothing falls due while the run watches the
        # keyspace (fuzzing.settle keeps the ttr, delay and ttl a request sets as far).
        svc = start(redis_server, log_out)
        ports, admin = {"data": svc.port, "admin": svc.admin_port}, svc.admin
        try:
            made = [
                httpx.post(f"{admin}/token/{NS}", params={"description": "fuzz"}, auth=ADMIN_AUTH)
                for _ in range(2)
            ]
            assert all(r.status_code == 201 for r in made), [(r.status_code, r.text) for r in made]
            tokens = [r.json()["token"] for r in made]
            yield Target(ports, client, log_in, State(token=tokens[0], victim=tokens[1]))
            assert not CRASH.search(log_in.read().decode(errors="replace"))
        finally:
            svc.stop(timeout=30)
            client.close()


def start(redis_server: Server, log: IO[bytes]) -> ServiceProcess:
    """`cluster-dq serve` with 2 workers (the supervisor path), on random ports that it must
    be seen to own: other test runs on this machine start services too, and junk sent to one
    of theirs would test nothing of ours (and disturb them)."""
    # ttr a day away, no reconcile sweep, no history flush: nothing happens in the background
    # while the run watches the keyspace (fuzzing.settle keeps the ttr, delay and ttl a
    # request sets as far).
    env = {
        "CLUSTER_DQ_ACCOUNTS__ADMIN": ADMIN_AUTH[1],
        "CLUSTER_DQ_TOKENCACHESECOND": "1",
        "CLUSTER_DQ_LOGLEVEL": "warning",
        "CLUSTER_DQ_WORKERS": "2",
        "CLUSTER_DQ_TTRSECOND": str(fuzzing.FAR_S),
        "CLUSTER_DQ_RECONCILESECOND": "0",
        "CLUSTER_DQ_HISTORYFLUSHSECOND": "0",  # (its flush once a minute is no request's write)
    }
    low, high = port_share(21000, 26000)  # this test worker's share
    for _ in range(5):
        ports = (random.randrange(low, high), random.randrange(low, high))
        try:
            svc = ServiceProcess.start(
                f"127.0.0.1:{redis_server.port}", env=env, ports=ports, log=log, root=ROOT
            )
        except RuntimeError:
            continue
        time.sleep(0.5)  # a port taken by another process: the supervisor exits by now
        if svc.proc.poll() is None and all(listens(svc.pid, p) for p in ports):
            return svc
        svc.kill()
    raise RuntimeError("could not start a service of our own")


def listens(pid: int, port: int) -> bool:
    """Whether every socket listening on 127.0.0.1:``port`` is held by ``pid`` or one of its
    children (the workers listen, the supervisor holds the port)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[1] == f"0100007F:{port:04X}" and cols[3] == "0A":  # LISTEN
            inodes.add(f"socket:[{cols[9]}]")
    held = set()
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for p in [pid, *map(int, children)]:
        for fd in Path(f"/proc/{p}/fd").iterdir():
            with contextlib.suppress(OSError):
                held.add(os.readlink(fd))
    return bool(inodes) and inodes <= held


def restore(target: Target) -> None:
    """Gives the next example its valid tokens back, unlimited (an admin request that deleted
    one, or limited it, was fine: it just must not blind the rest of the run)."""
    store = target.redis
    for token in (target.state.token, target.state.victim):
        store.hsetnx(AdminKeys.tokens("default", NS), token, "fuzz")
        store.hdel(AdminKeys.limits(), f"default/{NS}/{token}")


def problems(target: Target, request: Request) -> tuple[Response | None, list[AssertionError]]:
    """Sends ``request``; returns the answer and what is wrong with it."""
    state = target.state
    before = snapshot(target.redis)
    found: list[AssertionError] = []
    try:
        response: Response | None = fuzzing.send(target.ports[request.port], request, state)
    except NoResponse as e:
        response = None
        if not request.malformed:
            found.append(ServerError(f"no answer: {e}"))
    if response is not None:
        status = response.status
        target.count(f"{status // 100}xx")
        if TRACE and not request.malformed:
            target.count(f"{request.port} {request.route} {status} {response.body[:60]!r}")
        if status >= 500:
            found.append(ServerError(f"{status}: {response.body[:300]!r}"))
        elif 400 <= status < 500:  # the parser's refusals too
            found += json_error(request, response)
        if 200 <= status < 300:
            state.learn(response.body)
        if 400 <= status < 500 or 200 <= status < 300:
            after = snapshot(target.redis)
            if not (before.still and after.still):
                target.count("unstill")  # something fell due: the pair says nothing
            elif 400 <= status < 500:
                target.count("4xx checked")
                if changed := before.diff(after, target.redis):
                    found.append(
                        RefusedWrite(f"{status} changed: {changed[:8]}\nafter: {target.previous}")
                    )
            elif before.diff(after):
                target.count("2xx wrote")
    if request.content_length is not None and request.malformed:
        time.sleep(0.3)  # the client gave up on its body: what the server logs comes late
    logged = target.new_log()
    if CRASH.search(logged):
        found.append(LoggedCrash(f"{logged[-3000:]}\nafter: {target.previous}"))
    target.previous = f"{response.status if response else None}: {request.show(state)}"
    return response, found


def json_error(request: Request, response: Response) -> list[AssertionError]:
    kind = response.headers.get(b"content-type", b"")
    if not kind.startswith(b"application/json"):
        return [NotJsonError(f"{response.status} {kind!r}: {response.body[:200]!r}")]
    if request.method == b"HEAD":
        return []
    try:
        data = response.json()
    except ValueError:
        return [NotJsonError(f"{response.status} not JSON: {response.body[:200]!r}")]
    if not isinstance(data, dict) or not any(
        isinstance(data.get(k), str) and data[k] for k in ("error", "msg")
    ):
        return [NotJsonError(f"{response.status} no error message: {data!r}"[:300])]
    return []


def record(
    request: Request, response: Response | None, found: list[AssertionError], state: State
) -> None:
    assert FINDINGS
    with open(FINDINGS, "a") as out:
        for problem in found:
            out.write(
                json.dumps(
                    {
                        "kind": type(problem).__name__,
                        "route": request.route,
                        "method": request.method.decode("latin-1"),
                        "status": response.status if response else None,
                        "problem": str(problem)[:3000],
                        "request": request.show(state),
                    }
                )
                + "\n"
            )


def test_snapshot_sees_a_publish_and_not_a_refused_one(target: Target) -> None:
    """The write check cannot pass vacuously: a publish changes the snapshot, a request
    refused for its token does not."""
    data = f"http://127.0.0.1:{target.ports['data']}/api/{NS}/q1"
    before = snapshot(target.redis)
    assert httpx.put(data, headers={"X-Token": "bad-token"}, content=b"x").status_code == 401
    assert not before.diff(snapshot(target.redis))
    assert httpx.put(data, headers={"X-Token": target.state.token}, content=b"x").status_code == 201
    after = snapshot(target.redis)
    assert before.still and after.still
    assert any(d.startswith("added dq:{fz/q1}") for d in before.diff(after)), before.diff(after)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=False,
    report_multiple_bugs=True,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(request=fuzzing.requests())
def fuzz_one(target: Target, request: Request) -> None:
    """One generated request (Hypothesis draws ``request``; ``target`` is passed through)."""
    target.count("examples")
    response, found = problems(target, request)
    restore(target)
    if FINDINGS:
        if found:
            record(request, response, found, target.state)
        return
    for problem in found:  # one exception class per kind: Hypothesis shrinks each apart
        problem.args = (f"{problem.args[0]}\n{request.show(target.state)}",)
        raise problem


def test_http_surface(target: Target) -> None:
    """The fuzz run, then a check that it was not vacuous: refused requests were checked
    against the keyspace, and requests were answered with successes and refusals alike (the
    valid token and ids were used); few checks were given up for a pump step falling due.
    (One test, not two: a second test reading the first's counts ran on another worker.)"""
    try:
        fuzz_one(target)
    finally:
        for what, n in sorted(target.counts.items(), key=lambda kv: -kv[1]):
            print(f"{n:6d} {what}")
    run = target.counts.get("examples", 0)
    assert run >= min(EXAMPLES, 50), target.counts
    assert target.counts.get("4xx checked", 0) >= run // 5, target.counts
    assert target.counts.get("2xx wrote", 0) >= run // 50, target.counts
    assert target.counts.get("unstill", 0) <= run // 10, target.counts


@pytest.mark.parametrize(
    ("port", "method", "path"),
    [
        ("data", "PUT", f"/api/{NS}/q1"),
        ("data", "PUT", f"/api/{NS}/q1/bulk"),
        ("data", "POST", f"/api/{NS}/q1/ack"),
        ("data", "PUT", f"/api/{NS}/q1/job/{{job}}"),
        ("admin", "POST", f"/token/{NS}"),
        ("admin", "POST", f"/token/{NS}/{{token}}/limit"),
    ],
)
def test_a_client_gone_mid_body_leaves_no_traceback(
    target: Target, port: str, method: str, path: str
) -> None:
    """A client that declares a body, sends part of it and hangs up (a client timeout during
    an upload) is user-caused: the log says nothing or one line, never a traceback. Found by
    the fuzz run (a Content-Length longer than the body)."""
    state = target.state
    job = state.jobs[0] if state.jobs else "01M8443BME0003DD22WFJXSMEV"
    head = (
        [b"Authorization", fuzzing.Known("auth")]
        if port == "admin"
        else [b"X-Token", fuzzing.Known("token")]
    )
    request = Request(
        port,
        method.encode(),
        "explicit",
        [path.format(job=job, token=state.victim).encode()],
        [],
        [(head[0], head[1])],
        b"[1",
        content_length=b"10",
        malformed=True,
    )
    target.new_log()  # what earlier tests logged is theirs
    with contextlib.suppress(NoResponse):
        fuzzing.send(target.ports[port], request, state)
    time.sleep(0.5)
    logged = target.new_log()
    assert not CRASH.search(logged), logged[-2000:]


@pytest.mark.parametrize(
    "request_",
    [
        # Found by the fuzz run: a raw non-ASCII byte in the basic-auth blob (b64decode raises
        # ValueError, not binascii.Error): 500 and a traceback.
        Request(
            "admin",
            b"GET",
            "explicit",
            [f"/token/{NS}/x/limit".encode()],
            [],
            [(b"Authorization", b"Basic \xc3\xa4")],
        ),
        Request(
            "admin",
            b"POST",
            "explicit",
            [f"/token/{NS}".encode()],
            [("description", "d")],
            [(b"Authorization", b"Basic \xff")],
        ),
        # HEAD on the consume route: refused (it would consume), but with a JSON error's headers
        # as every other 4xx (a HEAD answer has no body).
        Request(
            "data",
            b"HEAD",
            "explicit",
            [f"/api/{NS}/q1".encode()],
            [],
            [(b"X-Token", fuzzing.Known("token"))],
        ),
        # A JSON body holding an integer of more than 4,300 digits: json raises ValueError (int
        # conversion limit), not JSONDecodeError: 500 and a traceback.
        Request(
            "data",
            b"POST",
            "explicit",
            [f"/api/{NS}/q1/ack".encode()],
            [],
            [(b"X-Token", fuzzing.Known("token"))],
            b'{"job_ids": [' + b"9" * 5000 + b"]}",
        ),
        Request(
            "data",
            b"PUT",
            "explicit",
            [f"/api/{NS}/q1/bulk".encode()],
            [],
            [(b"X-Token", fuzzing.Known("token"))],
            b"[" + b"9" * 5000 + b"]",
        ),
    ],
    ids=[
        "non-ascii-basic-blob-get",
        "non-ascii-basic-blob-post",
        "head-on-consume",
        "huge-int-ack",
        "huge-int-bulk",
    ],
)
def test_fuzz_findings_stay_fixed(target: Target, request_: Request) -> None:
    """Shrunk reproductions of what the fuzz run found, checked on every run."""
    response, found = problems(target, request_)
    assert response is not None and 400 <= response.status < 500 and not found, (response, found)
