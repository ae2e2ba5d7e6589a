"""Every data-port verb as a pure function: its arguments -> a ``Call`` (the request and the
decoder of its reply). The sync and async clients send these and nothing else."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from cluster_dq import names as rules
from cluster_dq import tracing
from cluster_dq.client._core import (
    JSON,
    Call,
    Reply,
    Safety,
    absent,
    as_bytes,
    check,
    expect,
    integer,
    json_body,
    millis,
    ms_to_s,
    opt,
    query,
    segment,
)
from cluster_dq.client.models import Backoff, Job, Publication, Sizes

T = TypeVar("T")
ONCE = Safety.ONCE
ATTR_KEY = re.compile(r"[-_A-Za-z0-9]{1,32}")
# what an HTTP header carries as it is: printable ASCII, no space at either end (a field's
# value does not include them: the service would keep the value without them, h11 refuses it)
ATTR_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?)?")


def traced(call: Call[T], span: tracing.Span) -> Call[T]:
    """``call`` carrying ``span``'s context in its headers (``traceparent``), so the service's
    span is its child; ``call`` itself when no span is made."""
    if span is tracing.OFF:
        return call
    return dataclasses.replace(call, headers=span.headers(dict(call.headers)))


def queue_path(ns: str, queue: str) -> str:
    return (
        f"/api/{segment(ns, 'namespace', rules.namespace)}/{segment(queue, 'queue', rules.queue)}"
    )


def _job(ns: str, queue: str, job_id: str) -> str:
    return f"{queue_path(ns, queue)}/job/{segment(job_id, 'job_id', rules.job_id)}"


def job_of(o: Mapping[str, Any]) -> Job:
    """The service's job object -> ``Job``."""
    return Job(
        namespace=o["namespace"],
        queue=o["queue"],
        id=o["job_id"],
        body=base64.b64decode(o["data"]) if "data" in o else b"",
        ttl=float(o.get("ttl", 0)),
        elapsed_ms=int(o.get("elapsed_ms", 0)),
        remain_tries=int(o.get("remain_tries", 0)),
        attributes=o.get("attributes"),
        state=o.get("state"),
        deliveries=int(o.get("deliveries", 0)),
        lease=o.get("lease"),
        progress=o.get("progress"),
        last_error=o.get("last_error"),
        next_attempt_at=ms_to_s(o.get("next_attempt_at")),
        reason=o.get("reason"),
        died_at=ms_to_s(o.get("died_at")),
        result=o.get("result"),
        dedup_key=o.get("dedup_key"),
        group=o.get("group"),
    )


def _job_reply(reply: Reply) -> Job:
    return job_of(expect(reply, 200))


def _job_or_none(reply: Reply) -> Job | None:
    return None if absent(reply) else job_of(expect(reply, 200))


def no_content(reply: Reply) -> None:
    check(reply, 200, 201, 204)


def backoff_params(b: Backoff | None) -> list[tuple[str, str]]:
    if b is None:
        return []
    if b.kind == "none":
        return [("backoff", "none")]
    return query(
        backoff=b.kind,
        backoff_ms=millis(b.base, "backoff base"),
        backoff_cap_ms=millis(b.cap, "backoff cap") if b.cap else None,
        backoff_jitter=repr(float(b.jitter)) if b.jitter else None,
    )


def group_param(group: str | None) -> list[tuple[str, str]]:
    """A job's group: a name the service accepts (``names.group``), else ``InvalidName``."""
    return [] if group is None else [("group", segment(group, "group", rules.group))]


def _job_params(
    delay: float, ttl: float | None, tries: int | None, priority: int | None = None
) -> list[tuple[str, str]]:
    return query(
        delay_ms=millis(delay, "delay"),
        ttl_ms=opt(millis, ttl, "ttl"),
        tries=opt(integer, tries, "tries"),
        priority=opt(integer, priority, "priority"),
    )


# -- the hot verbs ----------------------------------------------------------------------------


def publish(
    ns: str,
    queue: str,
    body: bytes | str,
    *,
    delay: float = 0.0,
    ttl: float | None = None,
    tries: int | None = None,
    job_id: str | None = None,
    attributes: Mapping[str, str] | None = None,
    backoff: Backoff | None = None,
    priority: int | None = None,
    dedup_key: str | None = None,
    dedup_mode: str | None = None,
    dedup_ttl: float | None = None,
    idempotency_key: str | None = None,
    group: str | None = None,
) -> Call[str]:
    call = publish_outcome(
        ns,
        queue,
        body,
        delay=delay,
        ttl=ttl,
        tries=tries,
        job_id=job_id,
        attributes=attributes,
        backoff=backoff,
        priority=priority,
        dedup_key=dedup_key,
        dedup_mode=dedup_mode,
        dedup_ttl=dedup_ttl,
        idempotency_key=idempotency_key,
        group=group,
    )
    return Call(
        call.method, call.path, _job_id_of, call.params, call.headers, call.content, call.safety
    )


def _job_id_of(r: Reply) -> str:
    return str(expect(r, 201)["job_id"])


def publish_outcome(
    ns: str,
    queue: str,
    body: bytes | str,
    *,
    delay: float = 0.0,
    ttl: float | None = None,
    tries: int | None = None,
    job_id: str | None = None,
    attributes: Mapping[str, str] | None = None,
    backoff: Backoff | None = None,
    priority: int | None = None,
    dedup_key: str | None = None,
    dedup_mode: str | None = None,
    dedup_ttl: float | None = None,
    idempotency_key: str | None = None,
    group: str | None = None,
) -> Call[Publication]:
    """``publish``, answering what happened (``Publication``): the job id, and with a dedup
    key whether the job is new, the key's existing one or that one replaced."""
    params = _job_params(delay, ttl, tries, priority) + backoff_params(backoff)
    if job_id is not None:
        segment(job_id, "job_id", rules.job_id)
        params.append(("job_id", job_id))
    params += _dedup_params(dedup_key, dedup_mode, dedup_ttl) + group_param(group)
    headers = _attribute_headers(attributes)
    _idempotency(headers, idempotency_key)
    return Call(
        "PUT",
        queue_path(ns, queue),
        _publication,
        params,
        headers,
        as_bytes(body),
        # a fixed id makes a repeat a duplicate (201, nothing new), an Idempotency-Key the
        # first answer; a server-made id does not, nor a dedup key (its job may be acked
        # between the two, and the repeat would make another); nor a fixed id under a
        # debounce key that job holds: the repeat replaces it again, maybe over a newer body
        Safety.IDEMPOTENT
        if (job_id is not None and dedup_mode != "debounce") or idempotency_key is not None
        else ONCE,
    )


def _publication(r: Reply) -> Publication:
    o = expect(r, 201)
    return Publication(
        job_id=str(o["job_id"]),
        dedup=o.get("dedup"),
        duplicate=bool(o.get("duplicate", False)),
        replayed=r.headers.get("idempotent-replayed") == "true",
    )


MAX_TTL_MS = rules.MAX_DEDUP_TTL_MS  # a throttle window, as the service takes it


def _dedup_params(key: str | None, mode: str | None, ttl: float | None) -> list[tuple[str, str]]:
    if key is None:
        if mode is not None or ttl is not None:
            raise ValueError("dedup_mode and dedup_ttl need a dedup_key")
        return []
    problem = rules.dedup_key(key)
    if problem:
        raise ValueError(problem)
    if mode is not None and mode not in rules.DEDUP_MODES:
        raise ValueError(f"dedup_mode {mode!r}: one of {', '.join(rules.DEDUP_MODES)}")
    if (mode == "throttle") != (ttl is not None):
        raise ValueError("dedup_ttl (seconds) is required with dedup_mode='throttle' only")
    window = opt(millis, ttl, "dedup_ttl")
    if ttl is not None and not (ttl * 1000 >= 1 - 1e-9 and int(window or 0) <= MAX_TTL_MS):
        raise ValueError(f"dedup_ttl must be 0.001 to {MAX_TTL_MS // 1000} seconds, not {ttl!r}")
    return query(dedup_key=key, dedup_mode=mode, dedup_ttl=window)


def _idempotency(headers: dict[str, str], key: str | None) -> None:
    if key is not None:
        problem = rules.idempotency_key(key)
        if problem:
            raise ValueError(problem)
        headers["Idempotency-Key"] = key


def _attribute_headers(attributes: Mapping[str, str] | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if attributes is not None and not isinstance(attributes, Mapping):
        raise ValueError(
            f"attributes: a mapping of names to values, not {type(attributes).__name__}"
        )
    if attributes:
        headers["Enable-Job-Version"] = "YES"
        for k, val in attributes.items():
            if not isinstance(k, str) or not ATTR_KEY.fullmatch(k):
                raise ValueError(f"attribute key {k!r}: 1 to 32 characters of [-_A-Za-z0-9]")
            if not isinstance(val, str) or not ATTR_VALUE.fullmatch(val):
                raise ValueError(
                    f"attribute {k}: the value must be printable ASCII with no space at either "
                    f"end, not {val!r}"
                )
            headers[f"Job-Attr-{k}"] = val
    return headers


def publish_many(
    ns: str,
    queue: str,
    bodies: Iterable[bytes | str],
    *,
    delay: float = 0.0,
    ttl: float | None = None,
    tries: int | None = None,
    attributes: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    group: str | None = None,
) -> Call[list[str]]:
    """The bulk route: each body must be one JSON text (the service stores each element's raw
    JSON text), all published or none; ``attributes``: every job's. With an
    ``idempotency_key``, safe to repeat: a repeat gets the first answer; ``group``: every
    job's."""
    if isinstance(bodies, bytes | str):
        raise ValueError("bodies must be a list of bodies, not one body: use publish()")
    parts = []
    for i, b in enumerate(bodies):
        raw = as_bytes(b, f"bodies[{i}]")
        try:
            json.loads(raw)
        except ValueError:
            raise ValueError(
                f"bodies[{i}] is not a JSON text: publish_many sends a JSON array whose "
                "elements become the bodies; use publish() for other bodies"
            ) from None
        parts.append(raw)
    if not parts:
        raise ValueError("bodies is empty: give 1 to 64 JSON texts")
    headers = {**JSON, **_attribute_headers(attributes)}
    _idempotency(headers, idempotency_key)
    return Call(
        "PUT",
        f"{queue_path(ns, queue)}/bulk",
        lambda r: [str(i) for i in expect(r, 201)["job_ids"]],
        _job_params(delay, ttl, tries) + group_param(group),
        headers,
        b"[" + b",".join(parts) + b"]",
        Safety.IDEMPOTENT if idempotency_key is not None else ONCE,
    )


def republish(
    ns: str,
    queue: str,
    job_id: str,
    body: bytes | str,
    *,
    lease: str | None = None,
    delay: float = 0.0,
    ttl: float | None = None,
    tries: int | None = None,
    new_job_id: str | None = None,
    group: str | None = None,
) -> Call[str]:
    """lmstfy's republish: acks ``job_id`` and publishes ``body`` as a new job, atomically
    (in ``group``: none, whatever the old job's, unless given)."""
    params = _job_params(delay, ttl, tries) + query(lease=lease) + group_param(group)
    if new_job_id is not None:
        segment(new_job_id, "new_job_id", rules.job_id)
        params.append(("job_id", new_job_id))
    # Repeatable only with the new id fixed and no lease (a repeat with a lease would find it
    # no longer holding the job and answer a conflict for a republish that happened).
    safe = new_job_id is not None and lease is None
    return Call(
        "PUT",
        _job(ns, queue, job_id),
        lambda r: str(expect(r, 201)["job_id"]),
        params,
        {},
        as_bytes(body),
        Safety.IDEMPOTENT if safe else ONCE,
    )


def _consume_path(ns: str, queues: str | Sequence[str]) -> str:
    names = [queues] if isinstance(queues, str) else list(queues)
    if not names:
        raise ValueError("queues is empty: give at least one queue")
    return f"/api/{segment(ns, 'namespace', rules.namespace)}/" + ",".join(
        segment(q, "queue", rules.queue) for q in names
    )


# The longest long poll the service accepts (a longer one is its 400): the most the client
# adds to its own timeout (an unbounded one overflows the socket's timeout).
LONGEST_POLL = 3600.0


def _consume_params(ttr: float | None, timeout: float, count: int) -> list[tuple[str, str]]:
    return query(
        ttr_ms=opt(millis, ttr, "ttr"),
        timeout_ms=millis(timeout, "timeout"),
        count=integer(count, "count") if count != 1 else None,
    )


def consume(
    ns: str, queues: str | Sequence[str], *, ttr: float | None = None, timeout: float = 0.0
) -> Call[Job | None]:
    # Repeated after a lost reply: what it reserved comes back after its ttr (a try spent).
    return Call(
        "GET",
        _consume_path(ns, queues),
        _job_or_none,
        _consume_params(ttr, timeout, 1),
        wait=min(timeout, LONGEST_POLL),
    )


def consume_many(
    ns: str,
    queues: str | Sequence[str],
    count: int,
    *,
    ttr: float | None = None,
    timeout: float = 0.0,
) -> Call[list[Job]]:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 100:
        raise ValueError(f"count must be an integer 1..100, not {count!r}")

    def decode(r: Reply) -> list[Job]:
        if absent(r):
            return []
        got = expect(r, 200)
        return [job_of(o) for o in (got if isinstance(got, list) else [got])]

    params = _consume_params(ttr, timeout, count)
    if count == 1:
        params.append(("count", "1"))
    return Call("GET", _consume_path(ns, queues), decode, params, wait=min(timeout, LONGEST_POLL))


def ack(
    ns: str, queue: str, job_id: str, *, lease: str | None = None, result: Any = None
) -> Call[None]:
    params = query(
        lease=lease, result=None if result is None else json_body(result, "result").decode()
    )
    return Call("DELETE", _job(ns, queue, job_id), no_content, params)


def cancel(ns: str, queue: str, job_id: str) -> Call[str | None]:
    def decode(r: Reply) -> str | None:
        check(r, 204)
        state = r.headers.get("x-job-state")
        return None if state in (None, "none") else state

    return Call("DELETE", _job(ns, queue, job_id), decode)


def ack_many(ns: str, queue: str, jobs: Iterable[Job | tuple[str, str | None]]) -> Call[None]:
    """Acks a batch of ``queue``: a ``Job`` of another queue or namespace is refused (the
    service would ack nothing of it and answer 204)."""
    items: list[dict[str, str]] = []
    for i, j in enumerate(jobs):
        if isinstance(j, Job):
            if (j.namespace, j.queue) != (ns, queue):
                raise ValueError(
                    f"jobs[{i}] is job {j.id} of queue {j.namespace}/{j.queue}, not {ns}/{queue}"
                )
            jid, lease = j.id, j.lease
        elif isinstance(j, tuple) and len(j) == 2:
            jid, lease = j
        else:
            raise ValueError(f"jobs[{i}] must be a Job or a (job_id, lease) pair, not {j!r}")
        segment(jid, f"jobs[{i}] job_id", rules.job_id)
        if lease is not None and not isinstance(lease, str):
            raise ValueError(f"jobs[{i}] lease must be a string or None, not {lease!r}")
        items.append({"job_id": jid} if lease is None else {"job_id": jid, "lease": lease})
    if not items:
        raise ValueError("jobs is empty: nothing to ack")
    return Call("POST", f"{queue_path(ns, queue)}/ack", no_content, [], JSON, json_body(items))


def touch(
    ns: str, queue: str, job_id: str, *, lease: str | None = None, ttr: float | None = None
) -> Call[None]:
    params = query(ttr_ms=opt(millis, ttr, "ttr"), lease=lease)
    return Call("POST", f"{_job(ns, queue, job_id)}/touch", no_content, params)


def release(
    ns: str,
    queue: str,
    job_id: str,
    *,
    lease: str | None = None,
    delay: float | None = None,
    error: str | None = None,
    keep_try: bool = False,
) -> Call[str]:
    params = query(
        delay_ms=opt(millis, delay, "delay"), lease=lease, keep_try="1" if keep_try else None
    )
    content = None if error is None else json_body({"error": error})
    return Call(
        "POST",
        f"{_job(ns, queue, job_id)}/release",
        lambda r: str(expect(r, 200)["state"]),
        params,
        JSON if content else {},
        content,
        # a blind repeat could release a later delivery's reservation
        ONCE,
    )


def progress(
    ns: str, queue: str, job_id: str, value: Any, *, lease: str | None = None
) -> Call[None]:
    return Call(
        "PUT",
        f"{_job(ns, queue, job_id)}/progress",
        no_content,
        query(lease=lease),
        JSON,
        json_body(value, "progress"),
    )


def bury(
    ns: str, queue: str, job_id: str, *, reason: str | None = None, lease: str | None = None
) -> Call[Job]:
    content = None if reason is None else json_body({"reason": reason})
    return Call(
        "POST",
        f"{_job(ns, queue, job_id)}/bury",
        _job_reply,
        query(lease=lease),
        JSON if content else {},
        content,
        ONCE,
    )


def kick(
    ns: str,
    queue: str,
    job_id: str,
    *,
    delay: float | None = None,
    tries: int | None = None,
    ttl: float | None = None,
) -> Call[Job]:
    params = query(
        delay_ms=opt(millis, delay, "delay"),
        tries=opt(integer, tries, "tries"),
        ttl_ms=opt(millis, ttl, "ttl"),
    )
    path = f"{queue_path(ns, queue)}/deadletter/{segment(job_id, 'job_id', rules.job_id)}/kick"
    return Call("POST", path, _job_reply, params, safety=ONCE)


def reschedule(
    ns: str, queue: str, job_id: str, *, delay: float | None = None, at: float | None = None
) -> Call[Job]:
    if (delay is None) == (at is None):
        raise ValueError("give exactly one of delay (seconds from now) and at (epoch seconds)")
    params = query(delay_ms=opt(millis, delay, "delay"), at=opt(millis, at, "at"))
    return Call("POST", f"{_job(ns, queue, job_id)}/reschedule", _job_reply, params, safety=ONCE)


def peek(ns: str, queue: str) -> Call[Job | None]:
    return Call("GET", f"{queue_path(ns, queue)}/peek", _job_or_none)


def get_job(ns: str, queue: str, job_id: str) -> Call[Job | None]:
    return Call("GET", _job(ns, queue, job_id), _job_or_none)


def size(ns: str, queue: str) -> Call[Sizes]:
    def decode(r: Reply) -> Sizes:
        o = expect(r, 200)
        return Sizes(o["size"], o.get("delayed", 0), o.get("reserved", 0), o.get("dead", 0))

    return Call("GET", f"{queue_path(ns, queue)}/size", decode)


def destroy(ns: str, queue: str) -> Call[None]:
    return Call("DELETE", queue_path(ns, queue), no_content)
