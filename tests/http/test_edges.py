"""The service's edges against hostile or careless input (issue 14): tokens refused by shape
and a bounded validity cache, no body read before the token is checked, rate-limit settings
that cannot break a token, HEAD that consumes nothing, republish counted as a write, numbers
parsed by an ASCII grammar, 503s that do not show Redis internals, names without a trailing
newline. Through real HTTP (a `cluster-dq serve` process) against a real redis-server, or
in-process against the same real Redis where the question is what the process did."""

from __future__ import annotations

import base64
from typing import Any
import json
import socket
import tempfile
from urllib.parse import urlsplit
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.keys import AdminKeys
from cluster_dq.localredis import Server
from cluster_dq.pools import close_client, make_client
from cluster_dq.server import Runtime
from cluster_dq.settings import PoolSettings, Settings
from cluster_dq.tokens import TokenStore
from tests.support import ADMIN_AUTH, serve

MB = 1024 * 1024


@pytest.fixture(scope="module")
def own_service(redis_server: Server) -> Iterator[tuple[str, str, Path]]:
    """One service for the module; its stderr (the log) kept to look for tracebacks."""
    log = Path(tempfile.mkstemp(prefix="dq-edges-", suffix=".log")[1])
    with log.open("wb") as out:
        svc = serve(f"127.0.0.1:{redis_server.port}", stderr=out)
        base, admin = svc.base, svc.admin
        yield base, admin, log
        svc.stop(timeout=20)
    log.unlink()


@pytest.fixture
def token(own_service: tuple[str, str, Path], standalone_redis: redis.Redis) -> str:
    r = httpx.post(f"{own_service[1]}/token/ns", params={"description": "edges"}, auth=ADMIN_AUTH)
    assert r.status_code == 201
    return str(r.json()["token"])


@pytest.fixture
def api(own_service: tuple[str, str, Path], token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=own_service[0], headers={"X-Token": token}, timeout=30) as client:
        yield client


@pytest.fixture
def admin(own_service: tuple[str, str, Path]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=own_service[1], auth=ADMIN_AUTH, timeout=10) as client:
        yield client


@pytest.fixture
def no_traceback(own_service: tuple[str, str, Path]) -> Iterator[None]:
    """The test's requests log no traceback (only what the log gained during the test)."""
    start = own_service[2].stat().st_size
    yield
    with own_service[2].open("rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    assert "Traceback" not in text, text[-3000:]


def sizes(api: httpx.Client, q: str = "q") -> dict[str, int]:
    r = api.get(f"/api/ns/{q}/size")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# -- (2) tokens by shape, a bounded cache, no body before auth ---------------------------------


def hexists_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_hexists", {}).get("calls", 0))


@pytest.fixture
async def store(standalone_redis: redis.Redis, redis_server: Server) -> AsyncIterator[TokenStore]:
    client = make_client(PoolSettings("default", Addr=f"127.0.0.1:{redis_server.port}"))
    yield TokenStore(AsyncEngine(client, EngineConfig()), cache_seconds=60)
    await close_client(client)


@pytest.mark.parametrize(
    "bad",
    ["x" * 65, "x" * 100_000, "has space", "tok\n", "t\xffk", "a:b:c", ""],
    ids=["65", "100k", "space", "newline", "xff", "colons", "empty"],
)
async def test_malformed_token_refused_without_lookup_or_cache(
    store: TokenStore, standalone_redis: redis.Redis, bad: str
) -> None:
    before = hexists_calls(standalone_redis)
    assert await store.valid("default", "ns", bad) is False
    assert hexists_calls(standalone_redis) == before  # Redis never asked
    assert store.cache_size() == (0, 0)  # nothing remembered


async def test_token_cache_is_bounded_in_entries_and_bytes(
    standalone_redis: redis.Redis, redis_server: Server
) -> None:
    client = make_client(PoolSettings("default", Addr=f"127.0.0.1:{redis_server.port}"))
    store = TokenStore(
        AsyncEngine(client, EngineConfig()), cache_seconds=60, max_entries=50, max_bytes=8 * 1024
    )
    good = await store.create("default", "ns", "d", None)
    try:
        assert await store.valid("default", "ns", good)
        for i in range(400):  # junk of a valid shape: looked up once, remembered within bounds
            assert not await store.valid("default", "ns" + "n" * (i % 200), f"junk-token-{i:054d}")
            entries, size = store.cache_size()
            assert entries <= 50 and size <= 8 * 1024
        # A flood of refusals does not push the valid token out: positive answers are kept apart.
        before = hexists_calls(standalone_redis)
        assert await store.valid("default", "ns", good)
        assert hexists_calls(standalone_redis) == before
    finally:
        await close_client(client)


@pytest.mark.usefixtures("no_traceback")
def test_huge_or_malformed_token_is_401_over_http(own_service: tuple[str, str, Path]) -> None:
    base = own_service[0]
    for bad in ("x" * 10_000, "tok%0A", "a:b:c", "-" * 65):
        r = httpx.get(
            f"{base}/api/ns/q",
            headers={"X-Token": bad} if "%" not in bad else None,
            params=None if "%" not in bad else {"token": "tok\n"},
        )
        assert (r.status_code, r.json()) == (401, {"error": "invalid token"}), bad
    # past the bound on a request's headers, refused before it is buffered, the token unread
    r = httpx.get(f"{base}/api/ns/q", headers={"X-Token": "x" * 100_000})
    assert r.status_code == 431 and "headers too large" in r.json()["error"]


async def test_body_is_not_read_before_the_token_is_checked(
    standalone_redis: redis.Redis, redis_server: Server
) -> None:
    """In-process (the app itself): how much of a refused request's body the app pulled."""
    settings = Settings(
        Pool={"default": PoolSettings("default", Addr=f"127.0.0.1:{redis_server.port}")}
    )
    runtime = Runtime(settings, run_pump=False)
    await runtime.start()
    try:
        transport = httpx.ASGITransport(app=runtime.data_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for method, path in (
                ("PUT", "/api/ns/q"),
                ("PUT", "/api/ns/q/bulk"),
                ("POST", "/api/ns/q/ack"),
                ("PUT", f"/api/ns/q/job/{'0' * 26}"),
            ):
                for headers in ({"X-Token": "junk-token-000000000000"}, {}):
                    pulled = 0

                    async def body() -> AsyncIterator[bytes]:
                        nonlocal pulled
                        for _ in range(64):
                            pulled += 1
                            yield b"[" + b" " * (64 * 1024)

                    r = await client.request(method, path, content=body(), headers=headers)
                    assert r.status_code == 401, (path, r.text)
                    assert pulled <= 1, (path, pulled)  # not 64 chunks (4 MB) buffered first
    finally:
        await runtime.close()


@pytest.mark.parametrize("path", ["/api/ns/q", "/api/ns/q/bulk"])
@pytest.mark.parametrize("chunked", [False, True])
def test_30mb_unauthenticated_body_answers_401_to_a_real_client(
    own_service: tuple[str, str, Path], path: str, chunked: bool
) -> None:
    data = b"[" + b"x" * (30 * MB)

    def gen() -> Iterator[bytes]:
        for i in range(0, len(data), MB):
            yield data[i : i + MB]

    for headers in ({"X-Token": "junk-token-000000000000"}, {}):
        with httpx.Client(base_url=own_service[0], timeout=30) as client:
            r = client.put(path, content=gen() if chunked else data, headers=headers)
            assert r.status_code == 401, r.text  # the answer, not a reset connection
            assert r.json()["error"] in ("invalid token", "token not found")
            # the same client goes on working (the server did not hang up on it mid-way)
            assert client.get("/api/ns/q", headers=headers).status_code == 401


# -- (3) rate limits ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"read": 1e309, "write": 1, "interval": 1}, "read"),
        ({"read": 1, "write": 1.5, "interval": 1}, "write"),
        ({"read": -1, "write": 1, "interval": 1}, "read"),
        ({"read": 1, "write": 2**63, "interval": 1}, "write"),
        ({"read": 1, "write": 1, "interval": 10**12}, "interval"),
        ({"read": 1, "write": 1, "interval": 0}, "interval"),
        ({"read": 1, "write": 1, "interval": True}, "interval"),
        ({"read": "5", "write": 1, "interval": 1}, "read"),
    ],
)
@pytest.mark.usefixtures("no_traceback")
def test_bad_limit_is_400_naming_the_field(
    own_service: tuple[str, str, Path],
    admin: httpx.Client,
    token: str,
    body: dict[str, object],
    field: str,
) -> None:
    raw = json.dumps(body).replace("Infinity", "1e309")  # the literal a client would send
    r = admin.post(
        f"/token/ns/{token}/limit", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]
    assert admin.get(f"/token/ns/{token}/limit").status_code == 404  # nothing stored


def test_counter_left_without_ttl_heals_once_the_limit_is_corrected(
    api: httpx.Client, admin: httpx.Client, token: str, standalone_redis: redis.Redis
) -> None:
    """A counter with no expiry (what a failed PEXPIRE left behind) is repaired by the script,
    so the token works again after its (corrected) interval."""
    import time

    assert (
        admin.post(
            f"/token/ns/{token}/limit", json={"read": 0, "write": 2, "interval": 1}
        ).status_code
        == 201
    )
    key = AdminKeys.counter("default", "ns", token, "w")
    standalone_redis.set(key, 1000)  # over the limit, no TTL
    time.sleep(1.2)  # limits are cached for TokenCacheSecond
    assert api.put("/api/ns/q", content=b"x").status_code == 429
    assert standalone_redis.pttl(key) > 0  # the script gave the counter its expiry back
    deadline = time.monotonic() + 5
    while api.put("/api/ns/q", content=b"x").status_code == 429:
        assert time.monotonic() < deadline, "the token stayed refused"
        time.sleep(0.2)


# -- (8) HEAD, (9) republish as a write --------------------------------------------------------


def test_head_on_consume_consumes_nothing(api: httpx.Client) -> None:
    assert api.put("/api/ns/q", content=b"x").status_code == 201
    r = api.head("/api/ns/q", params={"ttr": 30})
    assert r.status_code == 405 and "GET" in r.headers["allow"]
    assert sizes(api)["size"] == 1 and sizes(api)["reserved"] == 0
    assert api.head("/api/ns/q/size").status_code == 200  # harmless elsewhere


def test_republish_counts_as_a_write(api: httpx.Client, admin: httpx.Client, token: str) -> None:
    import time

    jid = api.put("/api/ns/q", content=b"x").json()["job_id"]  # before the limit
    assert (
        admin.post(
            f"/token/ns/{token}/limit", json={"read": 0, "write": 1, "interval": 60}
        ).status_code
        == 201
    )
    time.sleep(1.2)  # limits are cached for TokenCacheSecond
    assert api.get("/api/ns/q").status_code == 200
    r = api.put(f"/api/ns/q/job/{jid}", content=b"y")
    assert r.status_code == 201, r.text  # the one write of the window
    r = api.put(f"/api/ns/q/job/{r.json()['job_id']}", content=b"z")
    assert r.status_code == 429 and "produce reach the limit rate" in r.json()["msg"]
    assert api.put("/api/ns/q", content=b"x").status_code == 429


# -- (10) user input that used to be a 500 -----------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("delay=%C2%B2", "delay"),
        ("delay=%D9%A3", "delay"),
        ("ttl=" + "9" * 5000, "ttl"),
        ("tries=%EF%BC%91", "tries"),
        ("delay_ms=" + "1" * 30, "delay_ms"),
        ("priority=+1", "priority"),
        ("delay=%201", "delay"),
        # the seconds form is held to its rules when its _ms form is given too (which wins)
        ("ttl=banana&ttl_ms=60000", "ttl"),
        ("delay=-5&delay_ms=0", "delay"),
        ("backoff=fixed&backoff_ms=10&backoff_jitter=%EF%BC%91", "backoff_jitter"),
        ("backoff=fixed&backoff_ms=10&backoff_jitter=%D9%A0.%D9%A5", "backoff_jitter"),
        ("backoff=fixed&backoff_ms=10&backoff_jitter=0.5%20", "backoff_jitter"),
        ("backoff=fixed&backoff_ms=10&backoff_jitter=+0.5", "backoff_jitter"),
        ("backoff=fixed&backoff_ms=10&backoff_jitter=-0.0", "backoff_jitter"),
    ],
    ids=[
        "superscript",
        "arabic",
        "5000-digits",
        "fullwidth",
        "30-digits",
        "plus",
        "space",
        "seconds-beside-ms",
        "negative-beside-ms",
        "jitter-fullwidth",
        "jitter-arabic",
        "jitter-space",
        "jitter-plus",
        "jitter-minus-zero",
    ],
)
@pytest.mark.usefixtures("no_traceback")
def test_non_ascii_or_huge_numbers_are_400(
    own_service: tuple[str, str, Path], api: httpx.Client, query: str, field: str
) -> None:
    r = api.put(f"/api/ns/q?{query}", content=b"x")
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"invalid {field}"), r.text
    assert sizes(api)["size"] == 0 and sizes(api)["delayed"] == 0


@pytest.mark.usefixtures("no_traceback")
def test_bad_request_id_is_replaced(own_service: tuple[str, str, Path], api: httpx.Client) -> None:
    for rid in (b"abc\xffdef", b"\xc3\xa9t\xc3\xa9", b"with space", b"x" * 65):
        r = api.get("/api/ns/q/size", headers={"X-Request-ID": rid})
        assert r.status_code == 200
        sent = r.headers["x-request-id"]
        assert sent.isascii() and sent.encode() != rid and len(sent) == 26
    r = api.get("/api/ns/q/size", headers={"X-Request-ID": "client-id-123"})
    assert r.headers["x-request-id"] == "client-id-123"  # a sane one is kept


@pytest.mark.usefixtures("no_traceback")
def test_non_ascii_basic_auth_is_401(own_service: tuple[str, str, Path]) -> None:
    admin = own_service[1]
    for user, password in (("admin", "pässwörd"), ("ädmin", "s3cret"), ("admin", "s3cret\xff")):
        blob = base64.b64encode(f"{user}:{password}".encode()).decode()
        r = httpx.get(f"{admin}/token/ns", headers={"Authorization": f"Basic {blob}"})
        assert r.status_code == 401, r.text
    latin = base64.b64encode(b"admin:p\xe4ss").decode()  # not UTF-8 at all
    assert (
        httpx.get(f"{admin}/token/ns", headers={"Authorization": f"Basic {latin}"}).status_code
        == 401
    )
    assert httpx.get(f"{admin}/token/ns", headers={"Authorization": "Basic ###"}).status_code == 401


# -- (12) 503s without Redis internals ---------------------------------------------------------


def test_503_shows_no_redis_address_or_exception(tmp_path: Path) -> None:
    from cluster_dq.localredis import free_port

    dead = free_port(19000, 19500)
    log = tmp_path / "log"
    with log.open("wb") as out:
        svc = serve(f"127.0.0.1:{dead}", stderr=out)
        base = svc.base
        try:
            r = httpx.put(
                f"{base}/api/ns/q",
                headers={"X-Token": "some-token-0123456789"},
                content=b"x",
                timeout=30,  # the retry budget comes first
            )
        finally:
            svc.stop(timeout=20)
    assert r.status_code == 503
    message = r.json()["error"]
    assert "'default'" in message and "redis unavailable" in message
    assert str(dead) not in message and "127.0.0.1" not in message and "Error" not in message
    assert str(dead) in log.read_text()  # the detail is kept for the operator


# -- (13) names and ids with a trailing newline ------------------------------------------------


def test_trailing_newline_in_names_and_ids_is_400(
    api: httpx.Client, standalone_redis: redis.Redis
) -> None:
    assert api.put("/api/ns/q%0A", content=b"x").status_code == 400
    assert api.put("/api/ns%0A/q", content=b"x").status_code == 400
    jid = api.put("/api/ns/q", content=b"x").json()["job_id"]
    assert api.get(f"/api/ns/q/job/{jid}").status_code == 200
    r = api.get(f"/api/ns/q/job/{jid}%0A")
    assert r.status_code == 400 and r.json() == {"error": "invalid job id"}
    assert api.put("/api/ns/q", params={"job_id": "client-id\n"}, content=b"x").status_code == 400
    assert not [k for k in standalone_redis.keys("*") if b"\n" in k]


def test_admin_refuses_a_malformed_token_in_its_paths(
    admin: httpx.Client, standalone_redis: redis.Redis
) -> None:
    """No limit record is stored for a token that could never be used (the data port refuses
    its shape), and the refusal names the token."""
    for bad in ("bad%20token-0123456789", "x" * 65, "a:b:c"):
        r = admin.post(f"/token/ns/{bad}/limit", json={"read": 1, "write": 1, "interval": 1})
        assert r.status_code == 400 and "token" in r.json()["error"], (bad, r.text)
        assert admin.delete(f"/token/ns/{bad}").status_code == 400
    assert not standalone_redis.hlen(AdminKeys.limits())


# -- (11) what a newcomer's careless requests met ---------------------------------------------


@pytest.mark.usefixtures("no_traceback")
def test_a_trailing_slash_is_a_json_404_and_writes_nothing(
    own_service: tuple[str, str, Path], api: httpx.Client, admin: httpx.Client
) -> None:
    """Not a 307 to the path without it: a redirect keeps the method and the body, so a
    client that follows it (curl -L) published through a path that does not exist."""
    for path in ("/api/ns/q/", "/api/ns//", "/api/ns/q/size/", "/api/ns/q/groups/"):
        r = api.put(path, content=b"x", follow_redirects=True)
        assert r.status_code == 404 and r.json() == {"error": "api not found"}, (path, r.text)
    r = admin.get("/healthz/", follow_redirects=False)
    assert r.status_code == 404 and r.json() == {"error": "api not found"}
    assert sizes(api)["size"] == 0
    # the dashboard's address as people type it still goes to its index
    r = admin.get("/ui", follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "/ui/", r.text
    r = admin.delete("/ui/")  # the dashboard's own 405 names its methods too
    assert r.status_code == 405 and "GET" in r.headers.get("allow", ""), r.headers


def test_a_405_names_the_methods_the_path_takes(api: httpx.Client) -> None:
    """Every route of the path counted (a publish's, a consume's, a destroy's), and no HEAD
    where a HEAD is refused (a consume's GET takes jobs)."""
    for method in ("POST", "HEAD"):
        r = api.request(method, "/api/ns/q")
        assert r.status_code == 405, (method, r.text)
        assert {m.strip() for m in r.headers["allow"].split(",")} == {"DELETE", "GET", "PUT"}
    r = api.delete("/api/ns/q/size")
    assert r.status_code == 405 and r.json() == {"error": "method not allowed"}
    assert r.headers["allow"] == "GET, HEAD"


@pytest.mark.usefixtures("no_traceback")
def test_a_query_parameter_given_twice_is_400_naming_it(api: httpx.Client) -> None:
    """Which value counts is no guess (lmstfy read the first, Starlette the last): a
    ``delay`` given twice with a ``ttl`` between them was one rule or the other's."""
    r = api.put("/api/ns/q?delay=100&delay=1&ttl=50", content=b"x")
    assert r.status_code == 400 and r.json() == {"error": "delay is given twice"}, r.text
    r = api.put("/api/ns/q?group=a&group=b", content=b"x")
    assert r.status_code == 400 and r.json() == {"error": "group is given twice"}, r.text
    assert sizes(api)["size"] == 0
    assert api.put("/api/ns/q", content=b"x").status_code == 201
    r = api.get("/api/ns/q?timeout=0&timeout=0")
    assert r.status_code == 400 and r.json() == {"error": "timeout is given twice"}
    assert sizes(api)["size"] == 1
    # the token first: without one, the answer is its 401
    r = httpx.get(str(api.base_url.join("/api/ns/q?timeout=0&timeout=0")))
    assert r.status_code == 401 and r.json() == {"error": "token not found"}, r.text


@pytest.mark.usefixtures("no_traceback")
def test_empty_names_in_a_consumes_queue_list_are_skipped_as_lmstfy_does(
    api: httpx.Client,
) -> None:
    for queues in ("q,,q", "q,", ",q"):
        assert api.put("/api/ns/q", content=b"x").status_code == 201
        r = api.get(f"/api/ns/{queues}", params={"timeout": 0})
        assert r.status_code == 200 and r.json()["queue"] == "q", (queues, r.text)
    r = api.get("/api/ns/,,", params={"timeout": 0})  # none left
    assert r.status_code == 400 and r.json() == {"error": "invalid queue name(s)"}


@pytest.mark.usefixtures("no_traceback")
def test_a_text_body_without_its_json_content_type_is_400_and_changes_nothing(
    api: httpx.Client,
) -> None:
    """A bury's reason or a release's error sent as JSON without ``Content-Type:
    application/json`` (curl -d sends a form's): refused, not acted on with the text dropped."""
    api.put("/api/ns/q", content=b"x")
    job = api.get("/api/ns/q", params={"timeout": 0, "ttr": 60}).json()
    jid, form = job["job_id"], {"Content-Type": "application/x-www-form-urlencoded"}
    for verb, name in (("bury", "reason"), ("release", "error")):
        r = api.post(f"/api/ns/q/job/{jid}/{verb}", content=f'{{"{name}": "why"}}', headers=form)
        assert r.status_code == 400, r.text
        assert "Content-Type: application/json" in r.json()["error"], r.text
        assert api.get(f"/api/ns/q/job/{jid}").json()["state"] == "reserved"
    # the text in the query and in a body: neither is dropped
    for verb, name in (("bury", "reason"), ("release", "error")):
        r = api.post(f"/api/ns/q/job/{jid}/{verb}?{name}=short", json={name: "the whole story"})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == f"{name} in the query or in the body, not both"
        assert api.get(f"/api/ns/q/job/{jid}").json()["state"] == "reserved"
    r = api.post(f"/api/ns/q/job/{jid}/bury", content=b"", headers=form)  # no body: as before
    assert r.status_code == 200, r.text
    r = api.get(f"/api/ns/q/job/{jid}").json()
    assert r["state"] == "dead"


def test_the_spaces_around_a_token_are_not_part_of_it(
    own_service: tuple[str, str, Path], token: str
) -> None:
    """RFC 9110: a field value's leading and trailing spaces and tabs are not part of it."""

    url = urlsplit(own_service[0])
    for value in (f"{token}   ", f"\t{token} \t", f" {token}"):
        with socket.create_connection((url.hostname, url.port), timeout=10) as s:
            s.sendall(
                f"GET /api/ns/q/size HTTP/1.1\r\nHost: {url.netloc}\r\nX-Token: {value}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        assert got.startswith(b"HTTP/1.1 200"), (value, got[:200])


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("description=%FF", "not UTF-8"),
        ("description=a%0Ab", "a control character"),
        ("description=a%E2%80%A8b", "a control character"),
        ("description=abc%E2%80%AEgpj.exe", "a control character"),
        ("description=a%E2%80%8Fb", "a control character"),
        ("description=a%E2%80%8Bb", "a control character"),
        ("description=%EF%BB%BFa", "a control character"),
        ("description=" + "d" * 1001, "too long"),
    ],
    ids=["not-utf8", "control", "line-separator", "bidi", "rlm", "zero-width", "bom", "long"],
)
def test_a_token_description_is_one_line_of_text(admin: httpx.Client, query: str, why: str) -> None:
    before = admin.get("/token/ns").json()["tokens"]
    r = admin.post(f"/token/ns?{query}")
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("invalid description") and why in r.json()["error"]
    assert admin.get("/token/ns").json()["tokens"] == before


@pytest.mark.usefixtures("no_traceback")
def test_a_json_object_naming_a_key_twice_is_400_and_changes_nothing(api: httpx.Client) -> None:
    """Which value would count is a guess (Python keeps the last): refused wherever the
    service reads JSON, here a group's settings and a job's progress."""
    r = api.patch("/api/ns/q/groups/g", content=b'{"concurrency": 3, "concurrency": 4}')
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid body: concurrency is given twice"
    assert api.get("/api/ns/q/groups/g").json()["concurrency"] is None
    api.put("/api/ns/q", content=b"x")
    jid = api.get("/api/ns/q", params={"timeout": 0, "ttr": 60}).json()["job_id"]
    r = api.put(f"/api/ns/q/job/{jid}/progress", content=b'{"step": 1, "n": {"a": 1, "a": 2}}')
    assert r.status_code == 400 and "a is given twice" in r.json()["error"], r.text
    assert "progress" not in api.get(f"/api/ns/q/job/{jid}").json()


@pytest.mark.usefixtures("no_traceback")
def test_a_backoff_value_without_a_backoff_is_400(api: httpx.Client) -> None:
    for extra in ("backoff_ms=5", "backoff_cap_ms=9", "backoff_jitter=0.5"):
        r = api.put(f"/api/ns/q?backoff=none&{extra}", content=b"x")
        name = extra.partition("=")[0]
        assert r.status_code == 400, (extra, r.text)
        assert r.json() == {"error": f"{name} needs backoff fixed or exponential"}
    assert api.put("/api/ns/q?backoff=none", content=b"x").status_code == 201
    assert sizes(api)["size"] == 1


def test_a_touch_of_no_time_names_the_parameter_given(api: httpx.Client) -> None:
    api.put("/api/ns/q", content=b"x")
    jid = api.get("/api/ns/q", params={"timeout": 0, "ttr": 60}).json()["job_id"]
    for name in ("ttr", "ttr_ms"):
        r = api.post(f"/api/ns/q/job/{jid}/touch", params={name: 0})
        assert r.status_code == 400 and r.json() == {"error": f"invalid {name}"}, r.text


@pytest.mark.parametrize("path", ["/api/ns/q/groups", "/api/ns", "/api/ns/q/schedules"])
@pytest.mark.parametrize("bad", ["0", "100001", "-1", "abc", ""])
def test_a_listing_limit_out_of_range_names_its_range(
    api: httpx.Client, path: str, bad: str
) -> None:
    """Every bad ``limit`` of a listing gets one answer naming its range (``0`` named it,
    ``1001``, ``-1`` and ``abc`` did not). Failed before."""
    r = api.get(path, params={"limit": bad})
    assert r.status_code == 400 and "invalid limit: an integer 1 to " in r.json()["error"], r.text


def test_a_parameter_given_twice_on_the_admin_port_is_400_and_changes_nothing(
    admin: httpx.Client,
) -> None:
    """The admin routes read Starlette's query (the last value wins): ``status=enable&status=
    disable`` switched the access log off. A review found it; failed before (200)."""
    before = admin.post("/accesslog", params={"status": "enable"}).json()
    for path in ("/accesslog?status=enable&status=disable", "/accesslog?status=disable&status=x"):
        r = admin.post(path)
        assert r.status_code == 400 and r.json() == {"error": "status is given twice"}, r.text
    assert admin.post("/accesslog", params={"status": "enable"}).json() == before
    r = admin.get("/draining?pool=nope&pool=default")
    assert r.status_code == 400 and r.json() == {"error": "pool is given twice"}, r.text


def test_a_lease_given_twice_without_a_token_is_its_401(api: httpx.Client) -> None:
    """A write route's throttle read the query (refusing a name given twice) before the token
    was looked at: 400 for a request whose answer is its 401. Failed before."""
    url = str(api.base_url.join("/api/ns/q/job/x/bury?lease=a&lease=b"))
    r = httpx.post(url)
    assert r.status_code == 401 and r.json() == {"error": "token not found"}, r.text


def test_a_name_given_twice_is_named_short(api: httpx.Client) -> None:
    """The refusal echoed a name of any length (7 kB back for a 7 kB name)."""
    name = "n" * 5000
    r = api.put(f"/api/ns/q?{name}=1&{name}=2", content=b"x")
    assert r.status_code == 400 and len(r.text) < 200, r.text[:100]


def test_an_attributes_surrounding_spaces_are_not_part_of_it(api: httpx.Client) -> None:
    """A header's surrounding spaces and tabs are not its value (RFC 9110): a job attribute
    kept them (``'bar  \\t '``; lmstfy, on Go's net/http, keeps ``bar``). Failed before."""
    url = api.base_url.join("/api/ns/q")
    token = api.headers["X-Token"]
    head = (
        f"PUT {url.raw_path.decode()} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"X-Token: {token}\r\nEnable-Job-Version: YES\r\nJob-Attr-Foo:   bar  \t \r\n"
        "Content-Length: 1\r\nConnection: close\r\n\r\nx"
    )
    with socket.create_connection((url.host, url.port), timeout=10) as s:
        s.sendall(head.encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 201"), answer[:300]
    published = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    job = api.get(f"/api/ns/q/job/{published['job_id']}").json()
    assert job["attributes"] == {"foo": "bar"}, job


@pytest.mark.parametrize("blank", ["%20%20%20", "%E3%80%80", "%E2%80%8D", "%09"])
def test_a_token_description_has_something_to_read(admin: httpx.Client, blank: str) -> None:
    """Spaces alone, an ideographic space, a joiner alone: nothing to tell the token by.
    Failed before (201)."""
    before = admin.get("/token/ns").json()["tokens"]
    r = admin.post(f"/token/ns?description={blank}")
    assert r.status_code == 400 and r.json()["error"].startswith("invalid description"), r.text
    assert admin.get("/token/ns").json()["tokens"] == before


def test_a_dashboard_path_with_a_trailing_slash_is_not_redirected(admin: httpx.Client) -> None:
    """A redirect keeps the method and the body; the data and admin apps answer 404, and the
    dashboard's own app redirected (307). Failed before."""
    r = admin.get("/ui/workers/", follow_redirects=False)
    assert r.status_code == 404, (r.status_code, r.headers.get("location"))


@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        ([("Job-Attr-A", b"\xff\xfe x")], 400, "invalid job attribute a: not UTF-8"),
        ([("Job-Attr-A", "1"), ("Job-Attr-A", "2")], 400, "job attribute a given twice"),
        ([("Job-Attr-" + "k" * 40, "1"), ("Job-Attr-" + "k" * 41, "2")], 400, "given twice"),
        ([("X-Token", "same")], 401, "X-Token given twice"),
    ],
    ids=["attribute-not-utf8", "attribute-twice", "attributes-cut-alike", "token-twice"],
)
def test_headers_are_held_to_the_querys_rules(
    api: httpx.Client, headers: list[tuple[str, Any]], status: int, says: str
) -> None:
    """A header value the service keeps is kept as sent: not UTF-8 is a 400, not U+FFFD in its
    place; a header given twice names no one value: a 400 (an attribute) or a 401 (X-Token,
    which a proxy reading the other copy would take for someone else's)."""
    token = api.headers["X-Token"]
    sent = [("Enable-Job-Version", "YES")] + [(k, token if v == "same" else v) for k, v in headers]
    if status == 401:
        sent.append(("X-Token", token))
    r = api.put("/api/ns/q", headers=sent, content=b"x")
    assert r.status_code == status, r.text
    assert says in r.json()["error"], r.text
    assert sizes(api)["size"] == 0


@pytest.mark.parametrize(
    "jitter", ["1e%2B00", "5.000000e-01", "0.000012345678901234567", "1.", ".25", "1e-05"]
)
def test_a_jitter_written_as_other_languages_write_a_number_is_taken(
    api: httpx.Client, jitter: str
) -> None:
    """Go's and C's %e write an exponent's sign (1e+00); Go's shortest form writes more than
    20 fraction digits; a JSON -0.0 is 0 (the settings' schema says minimum 0)."""
    r = api.put(f"/api/ns/jit?backoff=fixed&backoff_ms=10&backoff_jitter={jitter}", content=b"x")
    assert r.status_code == 201, r.text
    body = {"backoff": "fixed", "backoff_ms": 100, "backoff_jitter": -0.0}
    r = api.patch("/api/ns/jit/settings", json=body)
    assert r.status_code == 200 and r.json()["backoff_jitter"] == 0, r.text
