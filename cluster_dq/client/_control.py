"""The data port's control verbs as pure functions (arguments -> ``Call``): dead letters,
queue settings and listing, recurring jobs. The hot verbs are in ``_verbs``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster_dq import names as rules
from cluster_dq.client._core import (
    JSON,
    Call,
    Reply,
    Safety,
    absent,
    expect,
    integer,
    json_body,
    millis,
    millis_down,
    millis_up,
    ms_to_s,
    opt,
    query,
    segment,
)
from cluster_dq.client._verbs import no_content, queue_path
from cluster_dq.client.models import (
    Backoff,
    DeadJob,
    DeadPage,
    QueueInfo,
    QueuePage,
    QueueSettings,
    Schedule,
    ScheduleJob,
    SchedulePage,
    Sweep,
)

ONCE = Safety.ONCE

# -- dead letters -----------------------------------------------------------------------------


def _dead_job(o: Mapping[str, Any]) -> DeadJob:
    return DeadJob(
        id=o["job_id"],
        reason=o["reason"],
        died_at=ms_to_s(o.get("died_at")),
        deliveries=int(o.get("deliveries", 0)),
        last_error=o.get("last_error"),
        size=int(o.get("size", 0)),
        published_at=ms_to_s(o.get("published_at")),
        attributes=o.get("attributes"),
    )


def dead_jobs(
    ns: str, queue: str, *, cursor: str | None = None, limit: int = 100
) -> Call[DeadPage]:
    def decode(r: Reply) -> DeadPage:
        o = expect(r, 200)
        return DeadPage([_dead_job(j) for j in o["jobs"]], o["cursor"], o["cursor"] is not None)

    params = query(cursor=cursor, limit=integer(limit, "limit"))
    return Call("GET", f"{queue_path(ns, queue)}/deadletter/jobs", decode, params)


def _sweep(
    what: str,
    ns: str,
    queue: str,
    reason: str | None,
    since: float | None,
    until: float | None,
    limit: int | None,
    cursor: str | None,
) -> Call[Sweep]:
    def decode(r: Reply) -> Sweep:
        o = expect(r, 200)
        return Sweep(int(o["count"]), bool(o["more"]), o["cursor"])

    params = query(
        reason=reason,
        cursor=cursor,
        limit=opt(integer, limit, "limit"),
        # the filter is on whole milliseconds: `from` rounds up, `to` down, none is widened
        **{"from": opt(millis_up, since, "since"), "to": opt(millis_down, until, "until")},
    )
    # A repeat of a step already applied acts on the next jobs of the walk: not repeated.
    return Call("POST", f"{queue_path(ns, queue)}/deadletter/{what}", decode, params, safety=ONCE)


def redrive(
    ns: str,
    queue: str,
    *,
    reason: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[Sweep]:
    return _sweep("redrive", ns, queue, reason, since, until, limit, cursor)


def purge(
    ns: str,
    queue: str,
    *,
    reason: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[Sweep]:
    return _sweep("purge", ns, queue, reason, since, until, limit, cursor)


def dead_size(ns: str, queue: str) -> Call[int]:
    return Call(
        "GET", f"{queue_path(ns, queue)}/deadletter/size", lambda r: int(expect(r, 200)["size"])
    )


def dead_peek(ns: str, queue: str) -> Call[tuple[int, str | None]]:
    """lmstfy's dead-letter peek: the size and the id of the oldest dead job (None: empty)."""

    def decode(r: Reply) -> tuple[int, str | None]:
        o = expect(r, 200)
        return int(o["deadletter_size"]), o["deadletter_head"] or None

    return Call("GET", f"{queue_path(ns, queue)}/deadletter", decode)


def respawn(ns: str, queue: str, *, limit: int = 1, ttl: float | None = None) -> Call[int]:
    params = query(limit=integer(limit, "limit"), ttl_ms=opt(millis, ttl, "ttl"))
    decode = lambda r: int(expect(r, 200)["count"])  # noqa: E731
    return Call("PUT", f"{queue_path(ns, queue)}/deadletter", decode, params, safety=ONCE)


def dead_delete(ns: str, queue: str, *, limit: int = 1) -> Call[None]:
    params = query(limit=integer(limit, "limit"))
    return Call("DELETE", f"{queue_path(ns, queue)}/deadletter", no_content, params, safety=ONCE)


# -- queue control ----------------------------------------------------------------------------


def _settings(r: Reply) -> QueueSettings:
    o = expect(r, 200)
    backoff = None
    if o.get("backoff"):
        backoff = Backoff(
            o["backoff"],
            o["backoff_ms"] / 1000,
            (o.get("backoff_cap_ms") or 0) / 1000,
            float(o.get("backoff_jitter") or 0.0),
        )
    return QueueSettings(
        namespace=o["namespace"],
        queue=o["queue"],
        paused=bool(o["paused"]),
        ttr=ms_to_s(o.get("ttr_ms")),
        tries=o.get("tries"),
        max_size=o.get("max_size"),
        backoff=backoff,
    )


def settings(ns: str, queue: str) -> Call[QueueSettings]:
    return Call("GET", f"{queue_path(ns, queue)}/settings", _settings)


SETTINGS = ("paused", "ttr", "tries", "max_size", "backoff")


def update_settings(ns: str, queue: str, **changes: Any) -> Call[QueueSettings]:
    """``changes``: any of paused, ttr (seconds), tries, max_size, backoff (a ``Backoff``);
    None removes a setting."""
    unknown = sorted(set(changes) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}: one of {', '.join(SETTINGS)}")
    body: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "ttr":
            body["ttr_ms"] = None if value is None else int(millis(value, "ttr"))
        elif name == "backoff":
            if value is not None and not isinstance(value, Backoff):
                raise ValueError(f"backoff must be a Backoff or None, not {value!r}")
            body["backoff"] = None if value is None else value.kind
            if value is not None:
                body["backoff_ms"] = int(millis(value.base, "backoff base"))
                body["backoff_cap_ms"] = int(millis(value.cap, "backoff cap"))
                body["backoff_jitter"] = value.jitter
        else:
            body[name] = value
    if not body:
        raise ValueError(f"no change given: one of {', '.join(SETTINGS)}")
    return Call("PATCH", f"{queue_path(ns, queue)}/settings", _settings, [], JSON, json_body(body))


def pause(ns: str, queue: str, paused: bool = True, create: bool = False) -> Call[QueueSettings]:
    """A queue that does not exist is a 404 (``NotFound``) unless ``create``."""
    path = f"{queue_path(ns, queue)}/{'pause' if paused else 'resume'}"
    return Call("POST", path, _settings, params=[("create", "1")] if create else [])


def queues(ns: str, *, cursor: str | None = None, limit: int = 100) -> Call[QueuePage]:
    def decode(r: Reply) -> QueuePage:
        o = expect(r, 200)
        found = [
            QueueInfo(
                name=q["queue"],
                ready=q["ready"],
                delayed=q["delayed"],
                reserved=q["reserved"],
                dead=q["dead"],
                paused=q["paused"],
                oldest_due_at=ms_to_s(q.get("oldest_due_ms")),
                lateness=ms_to_s(q.get("lateness_ms")),
            )
            for q in o["queues"]
        ]
        return QueuePage(found, o["cursor"] or None)

    params = query(cursor=cursor, limit=integer(limit, "limit"))
    return Call("GET", f"/api/{segment(ns, 'namespace', rules.namespace)}", decode, params)


# -- recurring jobs ---------------------------------------------------------------------------


def schedule_of(o: Mapping[str, Any]) -> Schedule:
    job = o.get("job") or {}
    return Schedule(
        namespace=o["namespace"],
        queue=o["queue"],
        name=o["name"],
        cron=o.get("cron"),
        tz=o.get("tz"),
        every=ms_to_s(o.get("every_ms")),
        start_at=ms_to_s(o.get("start_ms")),
        catch_up=o["catch_up_ms"] / 1000,
        paused=bool(o["paused"]),
        next_at=ms_to_s(o.get("next_at_ms")),
        fired=int(o["fired"]),
        missed=int(o["missed"]),
        job=ScheduleJob(
            body=job.get("body", ""),
            delay=job.get("delay_ms", 0) / 1000,
            ttl=ms_to_s(job.get("ttl_ms")),
            tries=job.get("tries"),
            priority=job.get("priority", 0),
            group=job.get("group"),
        ),
    )


def _schedule_path(ns: str, queue: str, name: str) -> str:
    return f"{queue_path(ns, queue)}/schedules/{segment(name, 'schedule name', rules.schedule)}"


def _schedule(r: Reply) -> Schedule:
    return schedule_of(expect(r, 200, 201))


def put_schedule(
    ns: str,
    queue: str,
    name: str,
    *,
    cron: str | None = None,
    tz: str | None = None,
    every: float | None = None,
    start_at: float | None = None,
    catch_up: float | None = None,
    paused: bool = False,
    body: str = "",
    delay: float | None = None,
    ttl: float | None = None,
    tries: int | None = None,
    priority: int | None = None,
    group: str | None = None,
) -> Call[Schedule]:
    """Create or replace: exactly one of ``cron`` (with ``tz``) and ``every`` (seconds);
    ``group``: the group of each occurrence's job."""
    if (cron is None) == (every is None):
        raise ValueError("give exactly one of cron and every")
    job: dict[str, Any] = {"body": body}
    for key, value in (("delay_ms", delay), ("ttl_ms", ttl)):
        if value is not None:
            job[key] = int(millis(value, key[:-3]))
    job.update({k: v for k, v in (("tries", tries), ("priority", priority)) if v is not None})
    if group is not None:
        job["group"] = segment(group, "group", rules.group)
    out: dict[str, Any] = {"paused": paused, "job": job}
    if cron is not None:
        out["cron"] = cron
        if tz is not None:
            out["tz"] = tz
    elif every is not None:
        out["every_ms"] = int(millis(every, "every"))
        if start_at is not None:
            out["start_ms"] = int(millis(start_at, "start_at"))
    if catch_up is not None:
        out["catch_up_ms"] = int(millis(catch_up, "catch_up"))
    # Idempotent: the same definition PUT again changes nothing.
    path = _schedule_path(ns, queue, name)
    return Call("PUT", path, _schedule, [], JSON, json_body(out))


def get_schedule(ns: str, queue: str, name: str) -> Call[Schedule | None]:
    def decode(r: Reply) -> Schedule | None:
        return None if absent(r) else schedule_of(expect(r, 200))

    return Call("GET", _schedule_path(ns, queue, name), decode)


def list_schedules(
    ns: str, queue: str, *, cursor: str | None = None, limit: int = 100
) -> Call[SchedulePage]:
    def decode(r: Reply) -> SchedulePage:
        o = expect(r, 200)
        nxt = o["cursor"]
        return SchedulePage([schedule_of(s) for s in o["schedules"]], None if nxt == "0" else nxt)

    params = query(cursor=cursor, limit=integer(limit, "limit"))
    return Call("GET", f"{queue_path(ns, queue)}/schedules", decode, params)


def delete_schedule(ns: str, queue: str, name: str) -> Call[None]:
    return Call("DELETE", _schedule_path(ns, queue, name), no_content)


def pause_schedule(ns: str, queue: str, name: str, paused: bool = True) -> Call[Schedule]:
    what = "pause" if paused else "resume"
    return Call("POST", f"{_schedule_path(ns, queue, name)}/{what}", _schedule)
