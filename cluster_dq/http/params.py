"""Request parsing and validation: every bad parameter is refused with a 400 naming it."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from urllib.parse import parse_qsl
from collections.abc import Mapping
from typing import Any, NamedTuple

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.types import Message

from cluster_dq.backoff import Backoff
from cluster_dq import names, userjson
from cluster_dq.tracing import TRACEPARENT, TRACESTATE
from cluster_dq.errors import BadRequest, BodyTooLarge, Unauthorized
from cluster_dq.models import (
    MAX_ATTR_KEY,
    MAX_ATTR_VALUE,
    MAX_ATTRIBUTES,
    MAX_BATCH_ACK,
    MAX_BATCH_CONSUME,
    MAX_BULK,
    MAX_NAME_LEN,
    MAX_NOTE_BYTES,
    MAX_NOTE_TEXT,
    MAX_SECONDS,
    NAME_RE,
    Dedup,
    Idempotency,
    check_names as check_names,  # (the handlers ask params for it, with the other checks)
)

U32 = MAX_SECONDS
# ASCII digits only, length-bounded before int(): str.isdigit() accepts "²" (int() then
# fails: a 500) and int() accepts "٣" (Arabic-Indic 3) and refuses > 4300 digits.
_UINT_RE = re.compile(r"[0-9]{1,20}")


def ascii_uint(raw: str) -> int | None:
    """``raw`` as a non-negative integer when it is 1 to 20 ASCII digits, else None."""
    return int(raw) if _UINT_RE.fullmatch(raw) else None


LEASE_RE = re.compile(r"[0-9a-fA-F]{16}")
MAX_QUEUES = 32  # queues of one consume
MAX_LIST = 1000  # queues per page of a namespace listing
MAX_AT_MS = 2**48 - 1  # a due time (Unix ms) fits the job record's u48
TRACE_CONTEXT = (TRACEPARENT, TRACESTATE)  # attributes an Idempotency-Key's fingerprint leaves out


def query(request: Request) -> dict[str, str]:
    """The query string's parameters, parsed once per request into a plain dict (Starlette's
    ``QueryParams`` lookups go through ``Mapping.get`` and cost more than the parse itself). A
    name given twice is a 400 naming it: which value would count is no guess (lmstfy read the
    first, Starlette the last)."""
    found = _parsed(request)
    twice = request.scope.get("dq.twice")
    if twice is not None:
        raise BadRequest(f"{twice[:64]} is given twice", twice[:64])
    return found


def _parsed(request: Request) -> dict[str, str]:
    """The query as a dict, parsed once per request; a name given twice is noted beside it
    (``dq.twice``) for ``query`` to refuse."""
    found: dict[str, str] | None = request.scope.get("dq.query")
    if found is None:
        raw = request.scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(raw, keep_blank_values=True)
        found = request.scope["dq.query"] = dict(pairs)
        if len(found) != len(pairs):
            twice = next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
            request.scope["dq.twice"] = twice
    return found


def early(request: Request, name: str) -> str | None:
    """A query parameter read before the token is checked (the token itself, a write's lease
    for its throttle): a bad request without a token is a 401 first, so a parameter given
    twice is refused later, by ``query``."""
    return _parsed(request).get(name)


def token(request: Request) -> str | None:
    """The token a request carries: its ``X-Token`` header, else its ``token`` parameter. Two
    ``X-Token`` headers carry no one token (a proxy that reads the other would authorize the
    request as someone else): a 401."""
    value = header(request, "x-token")
    if "x-token" in request.scope["dq.headers_twice"]:
        raise Unauthorized("invalid token: X-Token given twice")
    return value or early(request, "token")


def exact(request: Request, name: str) -> str | None:
    """The query's ``name`` as sent, for a value the service keeps (a result, a reason):
    ``query`` reads bytes that are not UTF-8 as U+FFFD, which would change it silently, so
    such a value is a 400 naming it."""
    value = query(request).get(name)
    if value is not None and "\ufffd" in value:  # replaced, or sent as U+FFFD: read again
        raw = request.scope.get("query_string", b"").decode("latin-1")
        sent = dict(parse_qsl(raw, keep_blank_values=True, errors="surrogateescape"))
        try:
            sent.get(name, "").encode()
        except UnicodeEncodeError:
            raise BadRequest(f"invalid {name}: not UTF-8", name) from None
    return value


def header(request: Request, name: str) -> str | None:
    """A request header's value (``name`` lower-case; the first of a repeated one, as
    Starlette's ``Headers``), from a dict made once per request (with the set of the names
    given more than once, ``dq.headers_twice``); without the spaces and tabs around it, which are not
    part of a field's value (RFC 9110 5.5): stripped from the one looked up, not from every
    header of the request."""
    found: dict[str, str] | None = request.scope.get("dq.headers")
    if found is None:
        found, twice = {}, set()
        for raw_key, raw_value in request.scope["headers"]:
            key = raw_key.decode("latin-1")
            if key in found:
                twice.add(key)
            else:
                found[key] = raw_value.decode("latin-1")
        request.scope["dq.headers"], request.scope["dq.headers_twice"] = found, twice
    value = found.get(name)
    return value.strip(" \t") if value else value


def uint(query: Mapping[str, str], name: str, default: int, maximum: int = U32) -> int:
    """lmstfy's strconv.ParseUint: a present but empty or malformed value is an error."""
    raw = query.get(name)
    if raw is None:
        return default
    value = ascii_uint(raw)
    if value is None or value > maximum:
        raise BadRequest(f"invalid {name}", name)
    return value


def millis(query: Mapping[str, str], name: str, default_s: int, maximum_s: int = U32) -> int:
    """``name`` in seconds (lmstfy) or ``name_ms`` in milliseconds (extension); ms wins, and
    the seconds form given beside it is held to its rules all the same."""
    if f"{name}_ms" in query:
        uint(query, name, default_s, maximum_s)
        return uint(query, f"{name}_ms", 0, maximum_s * 1000)
    return uint(query, name, default_s, maximum_s) * 1000


def queue_list(ns: str, raw: str) -> list[str]:
    queues = [q for q in raw.split(",") if q]  # (an empty one skipped, as lmstfy does)
    if not queues:
        raise BadRequest("invalid queue name(s)", "queue")
    for q in queues:
        check_names(ns, q)
    if len(queues) > MAX_QUEUES:
        raise BadRequest(f"too many queues (max {MAX_QUEUES})", "queue")
    return list(dict.fromkeys(queues))


def count(query: Mapping[str, str]) -> int:
    n = uint(query, "count", 1)
    if not 1 <= n <= MAX_BATCH_CONSUME:
        raise BadRequest("invalid count", "count")
    return n


def job_id(raw: str) -> str:
    """A server-made id or a client's (``names.job_id``)."""
    problem = names.job_id(raw)
    if problem:
        raise BadRequest(problem, "job_id")
    return raw


def attributes(request: Request) -> dict[str, str] | None:
    """lmstfy: only with ``Enable-Job-Version: YES``; ``Job-Attr-<Key>`` headers, key
    lower-cased and cut to 32 chars, first value cut to 128 chars, at most 16."""
    if (header(request, "enable-job-version") or "").upper() != "YES":
        return None
    attrs: dict[str, str] = {}
    for key, value in request.headers.items():
        if key.lower().startswith("job-attr-") and len(key) > len("job-attr-"):
            name = key[len("job-attr-") :].lower()[:MAX_ATTR_KEY]
            if name in attrs:  # a header repeated (or two cut to the same 32 characters)
                raise BadRequest(f"job attribute {name[:64]} given twice", "attributes")
            # the server hands header bytes over as latin-1: a value is kept as sent, so one
            # that is not UTF-8 is refused (lmstfy showed it with U+FFFD in its place)
            try:
                text = value.strip(" \t").encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest(f"invalid job attribute {name}: not UTF-8", "attributes") from None
            attrs[name] = text[:MAX_ATTR_VALUE]
    if len(attrs) > MAX_ATTRIBUTES:
        raise BadRequest("too many attributes, cannot exceed 16", "attributes")
    return attrs or None


async def body(request: Request, limit: int, what: str = "body too large") -> bytes:
    """Reads the body, never buffering more than ``limit`` bytes."""
    declared = ascii_uint(header(request, "content-length") or "")
    if declared is not None and declared > limit:
        raise BodyTooLarge(what, "body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(what, "body")
        chunks.append(chunk)
    return b"".join(chunks)


async def form(request: Request, limit: int, max_part_size: int) -> FormData:
    """The request's form (url-encoded or multipart), its body read within ``limit`` first
    (413 from ``Content-Length`` alone): Starlette's form parser would buffer a url-encoded
    body of any size."""
    data = await body(request, limit, f"form too large (max {limit} bytes)")

    async def replay() -> Message:
        return {"type": "http.request", "body": data, "more_body": False}

    try:
        return await Request(request.scope, replay).form(max_part_size=max_part_size)
    except Exception as e:  # python-multipart's and starlette's parse errors alike
        raise BadRequest(f"unreadable form: {e}", "form") from None


def bulk_elements(data: bytes, element_limit: int) -> list[bytes]:
    """A JSON array; each *raw* element becomes one body (a string keeps its quotes)."""
    err = BadRequest("request body should be an array of objects", "body")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise err from None
    decoder = userjson.DECODER  # strict: no NaN, Infinity nor 1e999
    i, n = 0, len(text)

    def skip(j: int) -> int:
        while j < n and text[j] in " \t\r\n":
            j += 1
        return j

    i = skip(i)
    if i >= n or text[i] != "[":
        raise err
    i = skip(i + 1)
    out: list[bytes] = []
    if i < n and text[i] == "]":
        i += 1
    else:
        while True:
            try:
                value, end = decoder.raw_decode(text, i)
                userjson.check_ints(text[i:end])
                userjson.check_text(text[i:end], value)
            except (userjson.NotFinite, userjson.DuplicateKey, userjson.NotText) as e:
                raise BadRequest(f"invalid body: {e}", "body") from None
            except (ValueError, RecursionError):  # bad JSON, deep nesting, a 5,000-digit number
                raise err from None
            element = text[i:end].encode()
            if len(element) > element_limit:
                raise BodyTooLarge("job too large", "body")
            out.append(element)
            if len(out) > MAX_BULK:
                raise BadRequest("too many jobs", "body")
            i = skip(end)
            if i < n and text[i] == ",":
                i = skip(i + 1)
                continue
            if i < n and text[i] == "]":
                i += 1
                break
            raise err
    if skip(i) != n:
        raise err
    if not out:
        raise BadRequest("no jobs", "body")
    return out


def lease(query: Mapping[str, str]) -> str | None:
    """The ``lease`` a delivery came with (16 hex digits), if the client sent one."""
    raw = query.get("lease")
    if raw is None:
        return None
    if not LEASE_RE.fullmatch(raw):
        raise BadRequest("invalid lease", "lease")
    return raw.lower()


ACK_FIELDS = frozenset(("job_id", "lease", "result"))  # an object of a batch ack


def id_list(data: bytes) -> tuple[list[str], list[str | None], list[bytes | None]]:
    """A batch ack body: a JSON array (1 to MAX_BATCH_ACK) of job ids, or of objects
    ``{"job_id": ..., "lease": ..., "result": ...}`` (lease and result optional; the result
    any JSON value), or an object holding the array as ``job_ids``. Repeated ids count once.
    Returns the ids, their leases (None: none) and results (compact JSON; None: none)."""
    message = "request body should be a JSON array of job ids"
    err = BadRequest(message, "body")
    parsed = userjson.parse(data, "body", message, by_field=True)
    if isinstance(parsed, dict) and set(parsed) == {"job_ids"}:
        parsed = parsed["job_ids"]
    if not isinstance(parsed, list):
        raise err
    if not parsed:
        raise BadRequest("no job ids", "body")
    if len(parsed) > MAX_BATCH_ACK:
        raise BadRequest(f"too many job ids (max {MAX_BATCH_ACK})", "body")
    leases: dict[str, str | None] = {}
    results: dict[str, bytes] = {}
    for item in parsed:
        if isinstance(item, str):
            leases.setdefault(job_id(item), None)
        elif (
            isinstance(item, dict)
            and isinstance(item.get("job_id"), str)
            and set(item) <= ACK_FIELDS
        ):
            given = item.get("lease")
            if given is not None and not (isinstance(given, str) and LEASE_RE.fullmatch(given)):
                raise BadRequest("invalid lease", "lease")
            jid = job_id(item["job_id"])
            if jid in leases and given and leases[jid] not in (None, given.lower()):
                raise BadRequest(f"job {jid} is given twice with different leases", "lease")
            leases[jid] = given.lower() if given else leases.get(jid)
            if "result" in item:
                result = _compact(item["result"], "result")
                if results.setdefault(jid, result) != result:
                    raise BadRequest(f"job {jid} is given twice with different results", "result")
        elif isinstance(item, dict) and isinstance(item.get("job_id"), str):
            unknown = sorted(set(item) - ACK_FIELDS)[0]
            known = ", ".join(sorted(ACK_FIELDS))
            raise BadRequest(f"unknown field {unknown!r} in an acked job; known: {known}", unknown)
        else:
            raise err
    return list(leases), list(leases.values()), [results.get(i) for i in leases]


def note(raw: bytes | str, what: str) -> bytes:
    """A job's progress or result: one JSON value of at most ``MAX_NOTE_BYTES`` (as given),
    returned as compact JSON (what is stored). Too big: 413; not JSON: 400 naming ``what``."""
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > MAX_NOTE_BYTES:
        raise BodyTooLarge(f"{what} too large (max {MAX_NOTE_BYTES} bytes)", what)
    value = userjson.parse(data, what, f"invalid {what}: must be JSON")
    return _compact(value, what)


def _compact(value: Any, what: str) -> bytes:
    """A parsed JSON value as stored: compact UTF-8, at most ``MAX_NOTE_BYTES``."""
    try:
        out = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except (ValueError, RecursionError):  # a lone surrogate (no UTF-8), deep nesting
        raise BadRequest(f"invalid {what}: must be JSON", what) from None
    if len(out) > MAX_NOTE_BYTES:
        raise BodyTooLarge(f"{what} too large (max {MAX_NOTE_BYTES} bytes)", what)
    return out


def result(request: Request) -> bytes | None:
    """The ``result`` an ack carries (a JSON value in the query), if the client sent one."""
    raw = exact(request, "result")
    return None if raw is None else note(raw, "result")


def backoff(query: Mapping[str, str]) -> Backoff | None:
    """A job's own retry backoff (``backoff=none|fixed|exponential``, ``backoff_ms``,
    ``backoff_cap_ms``, ``backoff_jitter`` 0..1); None when the request gives none."""
    if "backoff" not in query:
        for name in ("backoff_ms", "backoff_cap_ms", "backoff_jitter"):
            if name in query:
                raise BadRequest(f"{name} needs backoff (none, fixed or exponential)", name)
        return None
    return Backoff.parse(
        query["backoff"],
        query.get("backoff_ms"),
        query.get("backoff_cap_ms"),
        query.get("backoff_jitter"),
    )


def group(query: Mapping[str, str], name: str = "group") -> str | None:
    """A job's group (``names.GROUP_RE``); None when the query names none."""
    raw = query.get(name)
    if raw is None:
        return None
    if why := names.group(raw):
        raise BadRequest(why, name)
    return raw


def cursor(query: Mapping[str, str]) -> str:
    """A listing's cursor: '' or the name the previous page ended with."""
    raw = query.get("cursor", "")
    if raw and (len(raw.encode()) > MAX_NAME_LEN or not NAME_RE.fullmatch(raw)):
        raise BadRequest("invalid cursor", "cursor")
    return raw


async def text(request: Request, name: str) -> str:
    """A short free text (a bury reason, a release's error): the query's ``name``, or the
    member ``name`` of a JSON object body (``Content-Type: application/json``), not both; ''
    when neither has it. At most ``MAX_NOTE_TEXT`` bytes of UTF-8."""
    value: object = exact(request, name)
    data = (await body(request, MAX_NOTE_TEXT * 6 + 1024)).strip()
    if data and value is not None:  # neither one dropped silently
        raise BadRequest(f"{name} in the query or in the body, not both", name)
    if data:
        if "json" not in (header(request, "content-type") or ""):  # (curl -d sends a form's)
            raise BadRequest(f"a body with {name} needs Content-Type: application/json", "body")
        parsed = userjson.parse(
            data, "body", f"request body should be a JSON object with {name}", by_field=True
        )
        if not isinstance(parsed, dict) or not set(parsed) <= {name}:
            raise BadRequest(f"request body should be a JSON object with {name}", "body")
        value = parsed.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"invalid {name}: a string", name)
    if len(value.encode("utf-8", "surrogatepass")) > MAX_NOTE_TEXT:
        raise BadRequest(f"{name} too long (max {MAX_NOTE_TEXT} bytes of UTF-8)", name)
    try:
        value.encode()
    except UnicodeEncodeError:
        raise BadRequest(f"invalid {name}: not UTF-8", name) from None
    return value


def flag(query: Mapping[str, str], name: str) -> bool:
    """A switch read as an integer (``uint``): 1 on, 0 or absent off; else a 400 naming it."""
    return uint(query, name, 0, 1) == 1


def bounded(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """An integer parameter in ``low..high``: a 400 naming it and the range otherwise (out of
    range, negative or not a number alike)."""
    raw = query.get(name)
    if raw is None:
        return default
    value = ascii_uint(raw)
    if value is None or not low <= value <= high:
        raise BadRequest(f"invalid {name}: an integer {low} to {high}", name)
    return value


def dedup(query: Mapping[str, str]) -> Dedup | None:
    """``dedup_key`` with ``dedup_mode`` (default simple) and ``dedup_ttl`` (ms, throttle);
    checked whole by ``models.validate_keys``. Without ``dedup_key`` the other two are a 400."""
    key = query.get("dedup_key")
    if key is None:
        for name in ("dedup_mode", "dedup_ttl"):
            if name in query:
                raise BadRequest(f"{name} needs a dedup_key", name)
        return None
    mode = query.get("dedup_mode", "simple")
    if mode in names.DEDUP_MODES and mode != "throttle" and "dedup_ttl" in query:
        # refused whatever its value (dedup_ttl=0 included: as absent to Dedup)
        raise BadRequest("dedup_ttl is for dedup_mode=throttle only", "dedup_ttl")
    return Dedup(key, mode, uint(query, "dedup_ttl", 0, names.MAX_DEDUP_TTL_MS))


class Keys(NamedTuple):
    """The publish keys a data route takes (``refuse_keys``)."""

    dedup: bool
    idempotency: bool


NO_KEYS, PUBLISH_KEYS, BULK_KEYS = Keys(False, False), Keys(True, True), Keys(False, True)
DEDUP_PARAMS = ("dedup_key", "dedup_mode", "dedup_ttl")


def refuse_keys(request: Request, takes: Keys) -> None:
    """A dedup parameter on a route but a one-job publish, an Idempotency-Key on a route but a
    publish or bulk publish, or two Idempotency-Key headers: a 400 naming it (not ignored, so
    that a client never takes a write for deduplicated or idempotent when it is not)."""
    if not takes.dedup:
        qp = query(request)
        for name in DEDUP_PARAMS:
            if name in qp:
                raise BadRequest(f"{name} is taken by a one-job publish only", name)
    if header(request, "idempotency-key") is None:
        return
    if not takes.idempotency:
        raise BadRequest(
            "Idempotency-Key is taken by a publish or bulk publish only", "Idempotency-Key"
        )
    if sum(1 for name, _ in request.scope["headers"] if name.lower() == b"idempotency-key") > 1:
        raise BadRequest("invalid Idempotency-Key: sent more than once", "Idempotency-Key")


# A fingerprint's parts, escaped so that one sequence of bytes reads back one way only: a NUL
# in a name or a value is doubled (a separator is a NUL then q, a or b), an '=' in a name is
# escaped (the first bare '=' ends it). Names and values without either, every real request's,
# are their bytes as they are, so the answers kept before this escaping still match.
def _fp_value(text: str) -> bytes:
    return text.encode().replace(b"\0", b"\0\0")


def _fp_name(text: str) -> bytes:
    return _fp_value(text).replace(b"=", b"\0=")


def idempotency(request: Request, kind: bytes, body: bytes) -> Idempotency | None:
    """The ``Idempotency-Key`` header, with the fingerprint of the request it came with: the
    route (``kind``), its query but the token, the job attributes' headers but the trace
    context's, and the body. A repeat must send the same of each (else 422). The
    ``traceparent`` and ``tracestate`` attributes are left out: a traced client puts a new
    span's context into each attempt, so a repeat of the very same call would differ."""
    key = header(request, "idempotency-key")
    if key is None:
        return None
    digest = hashlib.blake2b(kind, digest_size=16)
    for name, value in sorted(query(request).items()):
        if name != "token":
            digest.update(b"\0q%s=%s" % (_fp_name(name), _fp_value(value)))
    for name, value in sorted((attributes(request) or {}).items()):
        if name not in TRACE_CONTEXT:
            digest.update(b"\0a%s=%s" % (_fp_name(name), _fp_value(value)))
    digest.update(b"\0b")
    digest.update(body)
    return Idempotency(key, digest.digest())
