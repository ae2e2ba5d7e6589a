"""Helpers of the HTTP fuzz run (tests/http/test_fuzz.py): a raw HTTP/1.1 client that sends the bytes
it is given (httpx refuses many of them), request strategies built from the real route tables,
and a snapshot of the Redis keyspace to show that a refused request wrote nothing."""

from __future__ import annotations

import base64
import json
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

import redis
from hypothesis import strategies as st

from cluster_dq.http.admin import AdminAPI
from cluster_dq.http.app import DataAPI
from cluster_dq.models import encode_id

NS = "fz"  # the namespace the fuzz token is valid for
QUEUES = ("q1", "q2", "q3")  # most requests name these, so the keyspace stays small
ADMIN_AUTH = ("admin", "s3cret")

# The route tables themselves (handlers are never called here): a new route is fuzzed too.
_NONE = cast(Any, None)
DATA_ROUTES = [(r.path, sorted(r.methods or ())) for r in DataAPI(_NONE, _NONE).routes()]
ADMIN_ROUTES = [
    (r.path, sorted(r.methods or ())) for r in AdminAPI(_NONE, _NONE, _NONE, _NONE).routes()
]
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE")
PARAMS = (
    "delay",
    "delay_ms",
    "ttl",
    "ttl_ms",
    "tries",
    "ttr",
    "ttr_ms",
    "timeout",
    "timeout_ms",
    "count",
    "priority",
    "job_id",
    "limit",
    "lease",
    "token",
    "pool",
    "description",
    "status",
    "force_update",
)

# -- placeholders resolved at send time (they name the run's live state) ---------------------


@dataclass(frozen=True)
class Known:
    """A value of the live run: ``token`` (the valid one; index 1: as ``default:<token>``),
    ``victim`` (a second valid token the admin routes may delete), ``job`` (an id some 2xx
    answer returned; ``job\n`` with a newline), ``auth`` (the admin's basic auth)."""

    kind: str
    index: int = 0


Part = str | bytes | Known  # text is percent-encoded when sent, bytes are sent as they are


@dataclass
class State:
    """What the run knows that the strategies cannot: the tokens and the ids it saw."""

    token: str = ""
    victim: str = ""
    jobs: list[str] = field(default_factory=list)

    def resolve(self, part: Part) -> bytes:
        if isinstance(part, bytes):
            return part
        if isinstance(part, str):
            return quote(part, safe="", errors="surrogatepass").encode()
        if part.kind == "token":
            return (f"default:{self.token}" if part.index else self.token).encode()
        if part.kind == "victim":
            return self.victim.encode()
        if part.kind == "auth":
            return b"Basic " + base64.b64encode(f"{ADMIN_AUTH[0]}:{ADMIN_AUTH[1]}".encode())
        job = (
            self.jobs[part.index % len(self.jobs)]
            if self.jobs
            else encode_id(part.index.to_bytes(16, "big"))
        )
        return quote(job + ("\n" if part.kind == "job\n" else ""), safe="").encode()

    def learn(self, body: bytes) -> None:
        """Keeps the job ids a 2xx answer names (bounded), for later requests to use."""
        try:
            data = json.loads(body)
        except ValueError:
            return
        found: list[Any] = []
        for item in data if isinstance(data, list) else [data]:
            if isinstance(item, dict):
                found += [item.get("job_id"), *(item.get("job_ids") or [])]
        self.jobs += [i for i in found if isinstance(i, str) and i not in self.jobs]
        del self.jobs[:-32]


@dataclass
class Request:
    port: str  # "data" or "admin"
    method: bytes
    route: str  # the template, or "junk"
    path: list[Part]  # the target, concatenated
    query: list[tuple[Part, Part | None]]  # None: the name alone, no "="
    headers: list[tuple[bytes, Part]]
    body: bytes = b""
    chunked: bool = False
    jobs: bool = False  # the body is a JSON list of live job ids, made when sent
    content_length: bytes | None = None  # a declared length that may lie
    malformed: bool = False  # not valid HTTP/1.1: a protocol-level 400 (or a close) is fine

    def target(self, state: State) -> bytes:
        out = b"".join(state.resolve(p) for p in self.path)
        if self.query:
            pairs = [
                state.resolve(k) + (b"" if v is None else b"=" + state.resolve(v))
                for k, v in self.query
            ]
            out += b"?" + b"&".join(pairs)
        return out

    def wire(self, state: State, host: bytes) -> bytes:
        head = [
            self.method + b" " + self.target(state) + b" HTTP/1.1",
            b"Host: " + host,
            b"Connection: close",
        ]
        head += [name + b": " + state.resolve(value) for name, value in self.headers]
        body = self.payload(state)
        if self.chunked:
            head.append(b"Transfer-Encoding: chunked")
            body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in _chunks(body)) + b"0\r\n\r\n"
        elif self.content_length is not None:
            head.append(b"Content-Length: " + self.content_length)
        elif body or self.method in (b"POST", b"PUT", b"PATCH"):
            head.append(b"Content-Length: %d" % len(body))
        return b"\r\n".join(head) + b"\r\n\r\n" + body

    def payload(self, state: State) -> bytes:
        return json.dumps(state.jobs[:5]).encode() if self.jobs else self.body

    def show(self, state: State) -> str:
        """A short, replayable description for a report (long values abbreviated)."""

        def cut(b: bytes) -> str:
            text = repr(b)[2:-1]
            return text if len(text) <= 160 else f"{text[:120]}...<{len(b)} bytes>"

        lines = [f"{self.port} {self.method.decode('latin-1')} {cut(self.target(state))}"]
        lines += [f"  {n.decode('latin-1')}: {cut(state.resolve(v))}" for n, v in self.headers]
        if self.content_length is not None:
            lines.append(f"  Content-Length: {cut(self.content_length)}")
        if self.chunked:
            lines.append("  Transfer-Encoding: chunked")
        if self.payload(state):
            lines.append(f"  body: {cut(self.payload(state))}")
        return "\n".join(lines)


def _chunks(body: bytes) -> list[bytes]:
    return [body[i : i + 7] for i in range(0, len(body), 7)] or []


# -- the raw client -----------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class NoResponse(Exception):
    """The server closed or reset the connection without an answer, or never answered."""


def send(port: int, request: Request, state: State, timeout: float = 30.0) -> Response:
    wire = request.wire(state, b"127.0.0.1:%d" % port)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(wire)
        except OSError:
            pass  # the server may answer (e.g. 413) and close before reading everything
        if request.content_length is not None and request.malformed:
            # A declared length longer than the body keeps the server waiting for more (no
            # half-close: uvicorn takes it for a client gone and drops the answer).
            sock.settimeout(2.0)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            raise NoResponse(f"no answer within {timeout} s") from None
        except OSError as e:
            if not chunks:
                raise NoResponse(f"{type(e).__name__}: {e}") from None
    return parse(b"".join(chunks), head_only=request.method == b"HEAD")


def parse(raw: bytes, head_only: bool = False) -> Response:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise NoResponse(f"no complete response: {raw[:200]!r}")
    status_line, *lines = head.split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise NoResponse(f"bad status line: {status_line[:200]!r}")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if head_only:
        return Response(int(parts[1]), headers, b"")
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body, i = b"", 0
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            body, rest = body + rest[:size], rest[size + 2 :]
            i += 1
        return Response(int(parts[1]), headers, body)
    length = headers.get(b"content-length")
    return Response(int(parts[1]), headers, rest[: int(length)] if length else rest)


# -- strategies ---------------------------------------------------------------------------------

# Percent-encodings parsers trip on: NUL, newline, a superscript and an Arabic-Indic digit,
# a full-width digit, overlong and invalid UTF-8, a lone surrogate, encoded "/" and "%".
ESCAPES = (
    "%00",
    "%0A",
    "%0D",
    "%09",
    "%20",
    "%C2%B2",
    "%D9%A3",
    "%EF%BC%91",
    "%C0%AF",
    "%E0%80%AF",
    "%FF",
    "%FE%FF",
    "%ED%A0%80",
    "%2F",
    "%25",
    "%2E%2E",
    "%",
    "%G1",
    "+",
    ",",
    ":",
    ";",
    "{",
    "}",
    "~",
    ".",
    "..",
)
VALID_NAME = st.from_regex(r"\A[-_A-Za-z0-9]{1,12}\Z")


@st.composite
def junk_segment(draw: st.DrawFn) -> Part:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.text(max_size=12))  # any unicode, percent-encoded as UTF-8
    if kind == 1:
        parts = draw(
            st.lists(st.one_of(st.sampled_from(ESCAPES), VALID_NAME), min_size=1, max_size=4)
        )
        return "".join(parts).encode()
    if kind == 2:
        return "a" * draw(st.sampled_from([65, 129, 200, 256, 1000, 5000, 20000]))
    if kind == 3:
        return draw(st.sampled_from([NS, *QUEUES])) + "\n"  # a name with a trailing newline
    return ""


def name_segment(valid: list[str]) -> st.SearchStrategy[Part]:
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), VALID_NAME, junk_segment())


def job_id_segment() -> st.SearchStrategy[Part]:
    known = st.integers(0, 63).map(lambda i: Known("job", i))
    server_id = st.binary(min_size=16, max_size=16).map(encode_id)
    client_id = st.from_regex(r"\A[-_A-Za-z0-9]{1,64}\Z")
    newline = st.integers(0, 63).map(lambda i: Known("job\n", i))
    return st.one_of(known, known, server_id, client_id, newline, junk_segment())


def token_segment() -> st.SearchStrategy[Part]:
    return st.one_of(
        st.just(Known("victim")),
        st.just(Known("token")),
        VALID_NAME,
        st.just("default:x" * 3),
        st.just("nopool:abcdefghijklmnopqrstu"),
        junk_segment(),
    )


SEGMENTS: dict[str, st.SearchStrategy[Part]] = {
    "ns": name_segment([NS]),
    "q": name_segment(list(QUEUES)),
    "queues": st.one_of(
        name_segment(list(QUEUES)),
        st.lists(st.sampled_from([*QUEUES, "", "_x", "q1\n"]), min_size=1, max_size=40).map(
            lambda qs: quote(",".join(qs), safe=",").encode()
        ),
    ),
    "job_id": job_id_segment(),
    "token": token_segment(),
}


@st.composite
def route_path(
    draw: st.DrawFn, template: str, segments: dict[str, st.SearchStrategy[Part]] | None = None
) -> list[Part]:
    """The template with each ``{param}`` drawn from ``segments`` (by name; junk if unknown)."""
    out: list[Part] = []
    for piece in re.split(r"(\{[a-z_]+\})", template):
        if piece.startswith("{"):
            out.append(draw((segments or SEGMENTS).get(piece[1:-1], junk_segment())))
        elif piece:
            out.append(piece.encode())
    return out


JUNK_TARGETS = (
    b"*",
    b"/",
    b"//api//fz/q1",
    b"/api",
    b"/api/fz",
    b"/api/fz/q1/",
    b"/api/fz/q1#f",
    b"http://127.0.0.1/api/fz/q1",
    b"/api/fz/q1?a=1?b=2",
    b"/api/./fz/../fz/q1",
    b"/token",
    b"/token/",
    b"/metrics/x",
    b"/%2e%2e/%2e%2e/etc/passwd",
)
RAW_TARGETS = (
    b"/api/fz/q1\xff",
    b"/api/fz/q 1",
    b"/api/fz/q1\x00",
    b"/api/f\x7fz/q1",
    b"",
    b"/api/\xd9\xa3/q1",
)

# Numbers as a client may write them: valid, at the bounds, huge, Unicode digits, junk.
NUMBER = st.one_of(
    st.integers(0, 10).map(str),
    st.sampled_from(
        [
            "0",
            "1",
            "64",
            "65",
            "255",
            "256",
            "600",
            "601",
            "65535",
            "65536",
            "4294967295",
            "4294967296",
            "18446744073709551616",
        ]
    ),
    st.integers(20, 6000).map(lambda n: "9" * n),
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=4),
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=4),
    st.integers(4290, 5000).map(lambda n: "1" * n),  # about Python's int() digit limit
    st.sampled_from(
        [
            "-1",
            "+1",
            " 1",
            "1 ",
            "1.5",
            "1e3",
            "0x10",
            "",
            "nan",
            "1_0",
            "\uff11",
            "\u00b2",
            "\u0663",
            "1\x00",
            "007",
            "true",
        ]
    ),
)
# Seconds (ms) a valid time may not be below: a job due, or a reservation ending, during the
# run would make the pump write while a refused request is watched (see test_fuzz.stable).
FAR_S = 86_400
TIME_SECONDS = ("delay", "ttl", "ttr")


def settle(name: str, value: str) -> str:
    """Keeps the run fast and its keyspace still: a valid long-poll timeout is at most 1 s,
    and a valid delay, ttl or ttr is 0 (delay, ttl: no time) or a day away."""
    if not (value.isascii() and value.isdigit()) or len(value) > 12:
        return value
    n = int(value)
    if name == "timeout":
        return str(min(n, 1)) if n <= 600 else value
    if name == "timeout_ms":
        return str(min(n, 1000)) if n <= 600_000 else value
    base, ms = name.removesuffix("_ms"), name.endswith("_ms")
    if base in TIME_SECONDS and n < FAR_S * (1000 if ms else 1) and (n or base == "ttr"):
        return str(n + FAR_S * (1000 if ms else 1))
    return value


# Which parameters a route reads (a hint that makes junk land where it is parsed; a route not
# named here gets junk in any of PARAMS).
READS = {
    "/api/{ns}/{q}": "delay delay_ms ttl ttl_ms tries priority job_id",
    "/api/{ns}/{q}/bulk": "delay delay_ms ttl ttl_ms tries priority",
    "/api/{ns}/{q}/job/{job_id}": "delay delay_ms ttl ttl_ms tries priority",
    "/api/{ns}/{queues}": "ttr ttr_ms timeout timeout_ms count",
    "/api/{ns}/{q}/job/{job_id}/release": "delay delay_ms lease",
    "/api/{ns}/{q}/job/{job_id}/touch": "ttr ttr_ms lease",
    "/api/{ns}/{q}/deadletter": "limit ttl ttl_ms",
    "/token/{ns}": "description token pool",
    "/token/{ns}/{token}/limit": "pool",
    "/limits": "force_update",
    "/accesslog": "status",
    "/info": "pool",
    "/draining": "pool",
}


@st.composite
def junk_param(draw: st.DrawFn, route: str = "") -> tuple[Part, Part | None]:
    """One parameter a client got wrong: a name the route reads (mostly) with a junk number
    or text, raw escapes, or no value at all."""
    reads = READS.get(route, "").split() or list(PARAMS)
    name = draw(
        st.one_of(
            st.sampled_from(reads),
            st.sampled_from(reads),
            st.sampled_from(PARAMS),
            st.text(max_size=6),
        )
    )
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return name, None
    if kind == 1:
        return name, draw(st.sampled_from(ESCAPES)).encode()
    if kind <= 3:
        return name, draw(st.text(max_size=8))
    return name, settle(name, draw(NUMBER))


@st.composite
def query(draw: st.DrawFn) -> list[tuple[Part, Part | None]]:
    out: list[tuple[Part, Part | None]] = []
    for _ in range(draw(st.integers(0, 5))):
        name = draw(
            st.one_of(st.sampled_from(PARAMS), st.sampled_from(PARAMS), st.text(max_size=6))
        )
        if draw(st.integers(0, 9)) == 0:
            out.append((name, None))  # "?delay" with no "="
            continue
        value: Part = draw(NUMBER) if draw(st.booleans()) else draw(st.text(max_size=8))
        if name == "token" and draw(st.booleans()):
            value = draw(st.sampled_from([Known("token"), Known("token", 1)]))
        elif name == "job_id":
            value = draw(job_id_segment())
        elif isinstance(value, str):
            value = settle(name, value)
            if draw(st.integers(0, 7)) == 0:  # raw escapes, not encoded again
                value = draw(st.sampled_from(ESCAPES)).encode()
        out.append((name, value))
        if draw(st.integers(0, 7)) == 0:
            out.append((name, settle(name, draw(NUMBER))))  # repeated
    return out


CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # not allowed in a field value (HTAB is)


def utf8(text: str) -> bytes:
    """UTF-8, a lone surrogate included (then the bytes are not valid UTF-8: as junk should)."""
    return text.encode(errors="surrogatepass")


def _basic(user: bytes, password: bytes) -> bytes:
    return b"Basic " + base64.b64encode(user + b":" + password)


AUTHS = st.one_of(
    st.just(Known("auth")),
    st.just(Known("auth")),
    st.binary(max_size=20).map(lambda b: b"Basic " + base64.b64encode(b)),
    st.sampled_from(
        [
            _basic(b"admin", "s3cr\u00e9t".encode()),
            _basic(b"admin", b"s3cr\xe9t"),
            _basic("\u00e4dmin".encode(), b"s3cret"),
            b"Basic",
            b"Basic !!!",
            b"Bearer x",
            b"Basic " + base64.b64encode(b"admin"),
            b"basic \xff\xfe",
            "Basic \u00e4".encode(),
        ]
    ),
)
TOKENS = st.one_of(
    st.just(Known("token")),
    st.just(Known("token")),
    st.just(Known("token")),
    st.just(Known("token", 1)),
    st.text(st.characters(min_codepoint=32, exclude_characters="\x7f"), max_size=30).map(utf8),
    st.sampled_from(
        [
            b"a" * 1000,
            b"a" * 70_000,
            b"\xff\xfe",
            "t\u00f6ken".encode(),
            b"",
            b"nopool:abc",
            b"default:",
            b":",
        ]
    ),
)
REQUEST_IDS = st.one_of(
    st.text(st.characters(min_codepoint=32, exclude_characters="\x7f"), max_size=70).map(utf8),
    st.binary(max_size=70).map(lambda b: CTL.sub(b"", b)),
    st.sampled_from([b"\xff", b"a" * 65, b"a" * 64, b"\x80abc"]),
)
CONTENT_TYPES = st.sampled_from(
    [
        b"application/json",
        b"application/x-www-form-urlencoded",
        b"multipart/form-data; boundary=xyz",
        b"multipart/form-data",
        b"text/plain; charset=\xff",
        b"application/json; charset=utf-16",
    ]
)


def _header_safe(value: Part) -> Part:
    """Header values never carry CR/LF (that would be another header, not a bad value)."""
    return value.replace(b"\r", b"").replace(b"\n", b"") if isinstance(value, bytes) else value


@st.composite
def one_bad_header(draw: st.DrawFn, sane: list[tuple[bytes, Part]]) -> list[tuple[bytes, Part]]:
    """The sane headers with one thing wrong: a junk token or basic auth in place of the
    good one, or one junk header more (request id, job attributes, content type, control
    bytes)."""
    out = list(sane)
    kind = draw(st.integers(0, 6))
    if kind == 0:
        out = [(n, v) for n, v in out if n != b"X-Token"] + [
            (b"X-Token", _header_safe(draw(TOKENS)))
        ]
    elif kind == 1:
        out = [(n, v) for n, v in out if n != b"Authorization"] + [
            (b"Authorization", _header_safe(draw(AUTHS)))
        ]
    elif kind == 2:
        out.append((b"X-Request-ID", _header_safe(draw(REQUEST_IDS))))
    elif kind == 3:
        out.append((b"Enable-Job-Version", b"YES"))
        out += draw(attribute_headers())
    elif kind == 4:
        out.append((b"Content-Type", draw(CONTENT_TYPES)))
    elif kind == 5:
        out.append((b"X-Junk", draw(st.sampled_from([b"a\x00b", b"\x7f", b"\x01\x02"]))))
    else:
        out.append((b"X-Token", Known("token")))  # twice
    return out


@st.composite
def attribute_headers(draw: st.DrawFn) -> list[tuple[bytes, Part]]:
    out: list[tuple[bytes, Part]] = []
    for _ in range(draw(st.integers(0, 20))):
        key = draw(st.from_regex(r"\A[-A-Za-z0-9]{0,40}\Z"))
        value = draw(
            st.one_of(
                st.text(st.characters(min_codepoint=32), max_size=200).map(utf8),
                st.binary(max_size=40).map(lambda b: CTL.sub(b"", b)),
                st.sampled_from([b"\x00", b"\x1b[0m"]),
            )
        )
        out.append((b"Job-Attr-" + key.encode(), _header_safe(value)))
    return out


@st.composite
def headers(draw: st.DrawFn) -> tuple[list[tuple[bytes, Part]], bool]:
    out: list[tuple[bytes, Part]] = []
    malformed = False
    if draw(st.integers(0, 9)) < 8:
        token = draw(TOKENS)
        out.append((b"X-Token", _header_safe(token)))
    if draw(st.integers(0, 3)) == 0:
        out.append((b"X-Request-ID", _header_safe(draw(REQUEST_IDS))))  # may hold CTLs: malformed
    if draw(st.integers(0, 2)) == 0:
        auth = draw(AUTHS)
        out.append((b"Authorization", _header_safe(auth)))
    if draw(st.integers(0, 3)) == 0:
        out.append((b"Enable-Job-Version", draw(st.sampled_from([b"YES", b"yes", b"no", b"\xff"]))))
        out += draw(attribute_headers())
    if draw(st.integers(0, 4)) == 0:
        out.append((b"Content-Type", draw(CONTENT_TYPES)))
    if draw(st.integers(0, 29)) == 0:  # control bytes in a value: not valid HTTP
        out.append((b"X-Junk", draw(st.sampled_from([b"a\x00b", b"\x7f", b"\x01\x02"]))))
        malformed = True
    return out, malformed


JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
    max_leaves=8,
)
LIMIT_NUMBER = st.one_of(
    st.integers(-5, 10),
    st.sampled_from(
        [
            "1e309",
            "-1e309",
            "1.5",
            "1e18",
            '"1"',
            "null",
            "9" * 5000,
            "[]",
            '"\u0663"',
            "4294967296",
            "9223372036854775808",
        ]
    ),
)


@st.composite
def body(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind <= 1:
        return b""
    if kind == 2:
        return json.dumps(draw(st.lists(JSON_VALUE, max_size=70))).encode()
    if kind == 3:
        return json.dumps(draw(JSON_VALUE)).encode()
    if kind == 4:
        fields = {
            k: draw(LIMIT_NUMBER) for k in ("read", "write", "interval") if draw(st.booleans())
        }
        return ("{" + ",".join(f'"{k}": {v}' for k, v in fields.items()) + "}").encode()
    if kind == 5:
        ids = draw(
            st.lists(
                st.one_of(st.from_regex(r"\A[-_A-Za-z0-9]{1,70}\Z"), st.text(max_size=5)),
                max_size=1100,
            )
        )
        return json.dumps(draw(st.sampled_from([ids, {"job_ids": ids}]))).encode()
    if kind == 6:
        return draw(st.binary(max_size=200))
    if kind == 7:
        size = draw(
            st.sampled_from([1024 * 1024 - 1, 1024 * 1024, 1024 * 1024 + 1, 3 * 1024 * 1024])
        )
        return b"[" + b"1," * (size // 2 - 1) + b"1]" if draw(st.booleans()) else b"x" * size
    if kind == 8:
        return b"description=d&token=" + draw(st.binary(max_size=30)).replace(b"&", b"")
    return b'--xyz\r\nContent-Disposition: form-data; name="description"\r\n\r\n' + draw(
        st.binary(max_size=30)
    )


# A sane request, per piece: what a correct client sends (so that successes, and the code
# behind them, are reached), before at most one piece is replaced by junk.
SANE_SEGMENTS: dict[str, st.SearchStrategy[Part]] = {
    "ns": st.just(NS),
    "q": st.sampled_from(QUEUES),
    "queues": st.sampled_from(["q1", "q1,q2", "q3,q2,q1"]),
    "job_id": st.integers(0, 63).map(lambda i: Known("job", i)),
    "token": st.just(Known("victim")),
}
SANE_VALUES: dict[str, st.SearchStrategy[str]] = {
    "delay": st.sampled_from(["0", str(FAR_S), "4294967295"]),
    "delay_ms": st.sampled_from(["0", str(FAR_S * 1000)]),
    "ttl": st.sampled_from(["0", str(FAR_S * 2)]),
    "ttl_ms": st.sampled_from(["0", str(FAR_S * 2000)]),
    "tries": st.integers(0, 5).map(str),
    "ttr": st.sampled_from([str(FAR_S), "4294967295"]),
    "ttr_ms": st.just(str(FAR_S * 1000)),
    "timeout": st.sampled_from(["0", "1"]),
    "timeout_ms": st.sampled_from(["0", "200"]),
    "count": st.integers(1, 5).map(str),
    "priority": st.integers(0, 255).map(str),
    "limit": st.integers(1, 3).map(str),
    "job_id": st.from_regex(r"\A[-_A-Za-z0-9]{1,20}\Z"),
    "description": st.just("fuzz"),
    "status": st.sampled_from(["enable", "disable"]),
    "pool": st.sampled_from(["default", ""]),
    "force_update": st.sampled_from(["1", "true", "0"]),
}


@st.composite
def sane_query(draw: st.DrawFn) -> list[tuple[Part, Part | None]]:
    names = draw(st.lists(st.sampled_from(sorted(SANE_VALUES)), max_size=3, unique=True))
    return [(n, draw(SANE_VALUES[n])) for n in names]


@st.composite
def sane_body(draw: st.DrawFn, route: str, method: str) -> tuple[bytes, bool]:
    """The body the route expects; True: a JSON list of live job ids, filled in when sent."""
    if route.endswith("/ack"):
        return b"", True
    if route.endswith("/bulk"):
        return json.dumps(draw(st.lists(JSON_VALUE, min_size=1, max_size=5))).encode(), False
    if route.endswith("/limit"):
        lim = {k: draw(st.integers(1, 100)) for k in ("read", "write", "interval")}
        return json.dumps(lim).encode(), False
    if route == "/token/{ns}" and method == "POST":
        return b"description=fuzz", False
    if method in ("PUT", "POST"):
        return draw(st.binary(max_size=40)), False
    return b"", False


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """One request: a sane request to a real route with at most one piece (route, method,
    path segment, query, headers, body, framing) replaced by junk; or junk everywhere."""
    port = draw(st.sampled_from(["data", "data", "admin"]))
    table = DATA_ROUTES if port == "data" else ADMIN_ROUTES
    route, methods = draw(st.sampled_from(table))
    sane = draw(st.integers(0, 3)) > 0  # else every piece is junk
    wrong = draw(
        st.sampled_from(
            [
                "none",
                "none",
                "route",
                "method",
                "path",
                "query",
                "query",
                "query",
                "headers",
                "headers",
                "body",
                "framing",
            ]
        )
    )
    malformed = False
    method = draw(st.sampled_from([m for m in methods if m != "HEAD"] or methods))
    if not sane or wrong == "method":
        method = draw(st.sampled_from([*METHODS, "FOO", "get", "M-SEARCH", "G\xe9T"]))
        malformed = method in ("FOO", "get", "G\xe9T")  # not a method the parser knows: a 400
    if not sane or wrong == "path":
        path = draw(route_path(route))
    else:
        path = draw(route_path(route, SANE_SEGMENTS))
    if not sane or wrong == "route":
        route = "junk"
        if draw(st.integers(0, 3)) == 0:
            path = [draw(st.sampled_from(RAW_TARGETS))]
            malformed = True
        else:
            path = [draw(st.sampled_from(JUNK_TARGETS))]
    params = draw(query()) if not sane else draw(sane_query())
    if sane and wrong == "query":  # one or two junk parameters among sane ones
        for _ in range(draw(st.integers(1, 2))):
            params.insert(draw(st.integers(0, len(params))), draw(junk_param(route)))
    hdrs: list[tuple[bytes, Part]]
    if not sane:
        hdrs, malformed_headers = draw(headers())
        malformed = malformed or malformed_headers
    else:
        hdrs = (
            [(b"X-Token", Known("token"))]
            if port == "data"
            else [(b"Authorization", Known("auth"))]
        )
        if wrong == "headers":
            hdrs = draw(one_bad_header(hdrs))
    malformed = malformed or any(isinstance(v, bytes) and CTL.search(v) for _, v in hdrs)
    jobs = False
    if not sane or wrong == "body":
        payload = draw(body())
    else:
        payload, jobs = draw(sane_body(route, method))
    req = Request(port, method.encode("latin-1"), route, path, params, hdrs, payload, jobs=jobs)
    req.malformed = malformed
    if not sane or wrong == "framing":
        mode = draw(st.integers(0, 3 if sane else 9))  # a lie costs a 2-s wait: not too often
        if mode == 0:
            req.chunked = True
        elif mode == 1:
            lie = draw(
                st.sampled_from([b"-1", b"abc", b"99999999999999999999", b"1e3", b"", b" 5"])
            )
            req.content_length, req.malformed = lie, True
        elif mode == 2:
            declared = max(len(req.body) + draw(st.integers(-5, 5)), 0)
            req.content_length = b"%d" % declared
            req.malformed = req.malformed or declared != len(req.body) or req.jobs
    return req


# -- the keyspace --------------------------------------------------------------------------------

# Keys that change without any request: rate-limit counters (a refused request counts and is
# refunded) and the pump's leadership.
IGNORED = re.compile(rb"^dq:\{admin\}:rl:|^dq:\{shard-\d+\}:(leader|epoch)$")
STILL_MS = 5_000  # nothing may fall due this soon for a snapshot pair to be comparable


@dataclass
class Snapshot:
    values: dict[bytes, bytes]  # key -> DUMP (type, encoding and content) + whether it expires
    still: bool  # no key expires and no pump step falls due within STILL_MS

    def diff(self, later: Snapshot, client: redis.Redis | None = None) -> list[str]:
        """The keys added, removed or changed. Two DUMPs of one hash can differ while its
        content does not (a read steps an incremental rehash, which reorders a hashtable), so
        with ``client`` a changed key is read back and compared by content, and the fields
        that changed are named."""
        out = []
        for key in sorted(self.values.keys() | later.values.keys()):
            before, after = self.values.get(key), later.values.get(key)
            if before == after:
                continue
            if before is None or after is None:
                out.append(
                    f"{'added' if before is None else 'removed'} {key.decode(errors='replace')}"
                )
            elif client is None:
                out.append(f"changed {key.decode(errors='replace')}")
            elif fields := changed_fields(client, before, after):
                out.append(f"changed {key.decode(errors='replace')}: {fields}")
        return out


def changed_fields(client: redis.Redis, before: bytes, after: bytes) -> str:
    """What differs between two DUMPs of a key, by content (RESTOREd in a scratch database,
    so the live keyspace is not touched); "" when only the encoding's order differs."""
    if before[-1:] != after[-1:]:
        return "expiry set or removed"
    where = client.connection_pool.connection_kwargs
    scratch = redis.Redis(host=where["host"], port=where["port"], db=15)
    try:
        contents: list[dict[Any, Any]] = []
        for n, dumped in enumerate((before[:-1], after[:-1])):
            name = f"fuzz:scratch:{n}"
            scratch.restore(name, 0, dumped, replace=True)
            kind = scratch.type(name)
            found: dict[Any, Any]
            if kind == b"hash":
                found = cast(dict[Any, Any], scratch.hgetall(name))
            elif kind == b"zset":
                found = dict(cast(Any, scratch.zrange(name, 0, -1, withscores=True)))
            elif kind == b"set":
                found = {m: 1 for m in cast(Any, scratch.smembers(name))}
            else:
                found = {b"": scratch.dump(name)}
            contents.append(found)
        old, new = contents
        return "; ".join(
            f"{f!r}: {old.get(f)!r} -> {new.get(f)!r}"[:300]
            for f in sorted(old.keys() | new.keys())
            if old.get(f) != new.get(f)
        )[:2000]
    finally:
        scratch.flushdb()
        scratch.close()


def snapshot(client: redis.Redis) -> Snapshot:
    keys = sorted(k for k in client.scan_iter(count=1000) if not IGNORED.match(k))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.dump(key)
        pipe.pttl(key)
    schedules = [k for k in keys if k.endswith(b":schedule")]
    for key in schedules:
        pipe.zrange(key, 0, 0, withscores=True)
    replies = pipe.execute()
    now = time.time() * 1000
    values = {
        k: replies[2 * i] + (b"1" if replies[2 * i + 1] >= 0 else b"0")
        for i, k in enumerate(keys)
        if replies[2 * i] is not None
    }
    expiring = any(0 <= replies[2 * i + 1] <= STILL_MS for i in range(len(keys)))
    heads = [head[0][1] for head in replies[2 * len(keys) :] if head]
    due = any(score <= now + STILL_MS for score in heads)
    return Snapshot(values, still=not expiring and not due)
