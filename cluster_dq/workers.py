"""Who is running what: a worker's announcement (the Python ``Worker`` sends one every few
seconds; any consumer may), as the data port takes it. It says who the worker is (host, pid,
version, since when), what it consumes (queues, concurrency) and the jobs it holds (queue, id,
since when), and it lasts its ttl: a worker that stops says so, one that dies drops out.
Everything is bounded, and a field the port does not know is refused."""

from __future__ import annotations

import json
from typing import Any

from cluster_dq import names
from cluster_dq.errors import BadRequest

WORKERS_QUEUE = "_workers"  # the reserved queue name whose tag the registry's keys carry
MAX_WORKERS = 2_000  # announced at once per namespace
MAX_IN_FLIGHT = 1_000  # jobs one announcement lists
MAX_ANNOUNCEMENT = 128 * 1024  # bytes of its JSON: at most 256 MB of a namespace's in all
LISTING_BYTES = 4 * 1024 * 1024  # announcements one listing answers at most: then "truncated"
TTL_S, MAX_TTL_S = 30, 3_600  # how long one lasts unless renewed
MAX_TEXT = 255
MAX_MS = 2**48 - 1
MAX_LISTED_QUEUES = 100

_FIELDS = {"host", "pid", "version", "started_ms", "queues", "concurrency", "in_flight"}
_JOB_FIELDS = {"queue", "job_id", "started_ms"}


def _utf8(value: str) -> bytes | None:
    """Its UTF-8, or None for a text no page or terminal should show: a lone surrogate (JSON
    can carry ``\ud800``; UTF-8 cannot) or a control character (a terminal's escapes)."""
    if any(c < " " or "\x7f" <= c <= "\x9f" for c in value):
        return None
    try:
        return value.encode()
    except UnicodeEncodeError:
        return None


def _text(data: dict[str, Any], key: str, most: int = MAX_TEXT) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    raw = _utf8(value) if isinstance(value, str) else None
    if raw is None or len(raw) > most:
        raise BadRequest(f"invalid {key}: text of at most {most} bytes, no control character", key)
    return str(value)


def _int(data: dict[str, Any], key: str, most: int) -> int | None:
    value = data.get(key)
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most
    ):
        raise BadRequest(f"invalid {key}: an integer 0..{most}", key)
    return value


def _queue(value: Any, key: str) -> str:
    ok = isinstance(value, str) and _utf8(value) is not None
    problem = names.queue(value) if ok else "not a queue name"
    if problem:
        raise BadRequest(f"invalid {key}: {problem}", key)
    return str(value)


def parse_announcement(data: Any) -> dict[str, Any]:
    """The announcement as the port keeps it (the fields given, checked), else ``BadRequest``
    naming the field."""
    if not isinstance(data, dict):
        raise BadRequest("invalid announcement: a JSON object", "body")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:  # (its name as JSON would write it: a lone surrogate is no UTF-8)
        name = json.dumps(unknown[0])
        raise BadRequest(f"invalid announcement: unknown field {name}", "body")
    out: dict[str, Any] = {
        "host": _text(data, "host"),
        "pid": _int(data, "pid", 2**32 - 1),
        "version": _text(data, "version", 64),
        "started_ms": _int(data, "started_ms", MAX_MS),
        "concurrency": _int(data, "concurrency", 1_000_000),
    }
    queues = data.get("queues")
    if queues is not None:
        if not isinstance(queues, list) or len(queues) > MAX_LISTED_QUEUES:
            raise BadRequest(f"invalid queues: a list of at most {MAX_LISTED_QUEUES}", "queues")
        queues = [_queue(q, "queues") for q in queues]
    out["queues"] = queues
    jobs = data.get("in_flight")
    if jobs is not None:
        if not isinstance(jobs, list) or len(jobs) > MAX_IN_FLIGHT:
            raise BadRequest(f"invalid in_flight: a list of at most {MAX_IN_FLIGHT}", "in_flight")
        held = []
        for job in jobs:
            if not isinstance(job, dict) or set(job) - _JOB_FIELDS:
                raise BadRequest(
                    "invalid in_flight: objects of queue, job_id and started_ms", "in_flight"
                )
            jid = job.get("job_id")
            if not isinstance(jid, str) or names.job_id(jid):
                raise BadRequest("invalid in_flight: a job_id is not a job id", "in_flight")
            held.append(
                {
                    "queue": _queue(job.get("queue"), "in_flight"),
                    "job_id": jid,
                    "started_ms": _int(job, "started_ms", MAX_MS),
                }
            )
        jobs = held
    out["in_flight"] = jobs
    return {k: v for k, v in out.items() if v is not None}


def stored(info: dict[str, Any]) -> bytes:
    return json.dumps(info, separators=(",", ":")).encode()


def listed(worker_id: str, expires_ms: int, blob: bytes) -> dict[str, Any]:
    """One worker as ``GET /api/{ns}/_workers`` lists it."""
    return {"worker_id": worker_id, "expires_ms": expires_ms, **json.loads(blob)}
