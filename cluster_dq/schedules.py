"""Recurring jobs: a schedule's definition, its occurrence rule and its firing state. No I/O.

A schedule belongs to a queue and publishes one job per occurrence, under the deterministic
id ``occurrence_id(name, ms)``. Occurrences are a cron expression in an IANA time zone
(croniter decides them, daylight-saving changes included) or every ``every_ms`` from an
anchor. The firing state (``State``) is one string that the scripts compare and set whole
(``schedule_cas.lua``): the claim of an occurrence is that compare-and-set, so each
occurrence is claimed once (lua/README.md, docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter  # type: ignore[import-untyped]

from cluster_dq import names, userjson
from cluster_dq.errors import BadRequest, BodyTooLarge
from cluster_dq.models import (
    CLIENT_ID_MAX_LEN,
    MAX_BODY,
    MAX_PRIORITY,
    MAX_SECONDS,
    MAX_TRIES,
    JobSpec,
    validate_spec,
)

_RANDOM_FIELD = re.compile(r"[rR](?:\(|/|\Z)")  # croniter's random field: R, R(a-b), R/n
MIN_EVERY_MS = 1_000
MAX_EVERY_MS = MAX_SECONDS * 1000
DEFAULT_CATCH_UP_MS = 3_600_000  # 1 h
MAX_CATCH_UP_MS = 7 * 86_400_000  # 7 days
MAX_SCHEDULES_PER_QUEUE = 1_000
MAX_SCHEDULE_PAGE = 100  # schedules listed per page
MAX_CRON_LEN = 256
MAX_TZ_LEN = 64
MAX_START_MS = 2**47  # every_ms's anchor
FIRE_BATCH = 64  # occurrences published per firing step (one publish call: MAX_BULK)
SKIP_BATCH = 256  # occurrences older than the catch-up window counted per firing step
# How long a claimed occurrence is left to its claimer before another firer publishes it.
CLAIM_LEASE_MS = 5_000
# An occurrence published at most this late is on time, whatever ``catch_up_ms`` (even 0): a
# firer never wakes at its very millisecond (its timer, a leader's poll, other schedules
# fired first in the same step).
ON_TIME_MS = 2_000
NEVER = 2**48 - 1  # the "next occurrence" of a cron expression that matches no later date


@dataclass(frozen=True, slots=True)
class Template:
    """The job each occurrence publishes: a publish's parameters, with its limits."""

    body: str = ""
    delay_ms: int = 0
    ttl_ms: int = 86_400_000
    tries: int = 1
    priority: int = 0
    group: str | None = None  # the group of each job it publishes (none: no group)

    def as_json(self) -> dict[str, Any]:
        """As stored and answered: ``group`` only when it has one."""
        out = asdict(self)
        if self.group is None:
            del out["group"]
        return out

    def spec(self, job_id: str, due_ms: int) -> JobSpec:
        return JobSpec(
            self.body.encode(),
            delay_ms=self.delay_ms,
            ttl_ms=self.ttl_ms,
            tries=self.tries,
            priority=self.priority,
            job_id=job_id,
            due_ms=due_ms,
            group=self.group,
        )


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule's definition (what a PUT sets). Exactly one of ``cron`` and ``every_ms``."""

    name: str
    job: Template
    cron: str | None = None
    tz: str = "UTC"
    every_ms: int | None = None
    start_ms: int = 0  # every_ms: occurrences are start_ms + k * every_ms
    catch_up_ms: int = DEFAULT_CATCH_UP_MS

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "job": self.job.as_json()}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Schedule:
        data = json.loads(raw)
        data["job"] = Template(**data["job"])
        return cls(**data)

    def occurrences(self, after_ms: int) -> Iterator[int]:
        """Every occurrence strictly after ``after_ms``, in order (ms since the epoch)."""
        if self.every_ms is not None:
            k = max((after_ms - self.start_ms) // self.every_ms + 1, 0)
            while True:
                yield self.start_ms + k * self.every_ms
                k += 1
        zone = ZoneInfo(self.tz)
        start = datetime.fromtimestamp(after_ms / 1000, tz=timezone.utc).astimezone(zone)
        it = croniter(self.cron, start)
        while True:
            try:
                t = int(round(it.get_next(float) * 1000))
            except CroniterError:  # no later date matches (within croniter's search)
                return
            if t >= NEVER:
                return
            if t > after_ms:
                yield t

    def next_after(self, after_ms: int) -> int:
        """The first occurrence after ``after_ms``; ``NEVER`` when there is none."""
        return next(self.occurrences(after_ms), NEVER)


_SHORTENED = re.compile(r".{24}-[0-9a-f]{16}")  # a long name as ``occurrence_id`` shortens it


def occurrence_id(name: str, at_ms: int) -> str:
    """The job id of occurrence ``at_ms``: ``s-<name>-<ms>``, or with a long name
    ``s-<name's first 24 chars>-<8 bytes of its sha1>-<ms>`` (at most 64 chars). It starts
    with ``s-``, so it is a client id (``models.is_client_id_valid``), never a server id. A
    name shaped as a shortened one (24 characters, ``-``, 16 hex digits) is shortened too:
    its own ids would be those of the long name it looks like shortened."""
    out = f"s-{name}-{at_ms}"
    if len(out) <= CLIENT_ID_MAX_LEN and not _SHORTENED.fullmatch(name):
        return out
    digest = hashlib.sha1(name.encode()).hexdigest()[:16]
    return f"s-{name[:24]}-{digest}-{at_ms}"


@dataclass(frozen=True, slots=True)
class State:
    """A schedule's firing state, compared and set whole. ``next_ms``: the first occurrence
    not claimed yet; ``flying``: occurrences claimed at ``claim_ms`` and not yet confirmed
    published; ``gen``: a new value per PUT, so a firer of the old definition cannot
    compare-and-set the new state."""

    gen: str
    next_ms: int
    paused: bool = False
    claim_ms: int = 0
    flying: tuple[int, ...] = ()
    fired: int = 0
    missed: int = 0

    def encode(self) -> str:
        fly = ",".join(map(str, self.flying))
        return (
            f"{self.gen};{self.next_ms};{int(self.paused)};{self.claim_ms};{fly};"
            f"{self.fired};{self.missed}"
        )

    @classmethod
    def decode(cls, raw: str | bytes) -> State:
        text = raw.decode() if isinstance(raw, bytes) else raw
        gen, nxt, paused, claim, fly, fired, missed = text.split(";")
        return cls(
            gen,
            int(nxt),
            paused == "1",
            int(claim),
            tuple(int(x) for x in fly.split(",")) if fly else (),
            int(fired),
            int(missed),
        )

    @classmethod
    def fresh(cls, schedule: Schedule, now_ms: int, paused: bool) -> State:
        return cls(os.urandom(6).hex(), schedule.next_after(now_ms), paused)

    def with_(self, **changes: Any) -> State:
        return replace(self, **changes)

    def due_at(self) -> int | None:
        """When a firer must look at the schedule next (None: paused)."""
        if self.paused:
            return None
        if self.flying:
            return self.claim_ms + CLAIM_LEASE_MS
        return self.next_ms


@dataclass(frozen=True, slots=True)
class Plan:
    """What one firing step does: publish ``fire`` (claimed in ``claimed``), or only move
    the state on (``claimed`` with nothing to fire: occurrences skipped as missed)."""

    claimed: State
    fire: tuple[int, ...]


def plan(schedule: Schedule, state: State, now_ms: int, remember_acked_ms: int) -> Plan | None:
    """The occurrence rule. None: nothing to do now.

    - occurrences at or before ``now_ms`` are due; those older than ``catch_up_ms`` (and
      than ``ON_TIME_MS``) are skipped and counted as missed (at most ``SKIP_BATCH`` per step);
    - at most ``FIRE_BATCH`` due occurrences are claimed per step;
    - occurrences claimed by a firer that did not confirm them within ``CLAIM_LEASE_MS`` are
      claimed again and published again under the same ids (a publish of an id that exists,
      or was acked within ``remember_acked_ms``, is a duplicate and writes nothing); past
      that memory (less a margin) they are counted as missed instead, since a job made of
      them and acked since could no longer be told from a new one."""
    if state.paused:
        return None
    if state.flying:
        age = now_ms - state.claim_ms
        if age < CLAIM_LEASE_MS:
            return None
        if age < remember_acked_ms - CLAIM_LEASE_MS:
            return Plan(state.with_(claim_ms=now_ms), state.flying)
        lost = state.with_(flying=(), claim_ms=0, missed=state.missed + len(state.flying))
        return Plan(lost, ())
    if state.next_ms > now_ms:
        return None
    window_start = now_ms - max(schedule.catch_up_ms, ON_TIME_MS)
    skipped, fire = 0, list[int]()
    nxt = state.next_ms
    occ = schedule.occurrences(nxt)  # those after nxt
    while nxt <= now_ms:
        if nxt < window_start:
            if skipped >= SKIP_BATCH:
                break
            skipped += 1
        else:
            if len(fire) >= FIRE_BATCH:
                break
            fire.append(nxt)
        nxt = next(occ, NEVER)
    claimed = state.with_(
        next_ms=nxt,
        missed=state.missed + skipped,
        flying=tuple(fire),
        claim_ms=now_ms if fire else 0,
    )
    return Plan(claimed, tuple(fire))


# -- the PUT body -----------------------------------------------------------------------------


def _int(
    data: Mapping[str, Any], key: str, default: int, low: int, high: int, where: str = ""
) -> int:
    """``data[key]``, an integer in low..high; ``where``: the key's prefix in the body
    (``job.``), which the refusal names."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"invalid {where}{key}: an integer in {low}..{high}", where + key)
    return int(value)


def check_name(name: str) -> str:
    problem = names.schedule(name)
    if problem:
        raise BadRequest(problem, "name")
    return name


_KEYS = {"cron", "tz", "every_ms", "start_ms", "catch_up_ms", "paused", "job"}
_JOB_KEYS = {"body", "delay_ms", "ttl_ms", "tries", "priority", "group"}


def _group(job: dict[str, Any]) -> str | None:
    g = job.get("group")
    if g is None:
        return None
    if not isinstance(g, str):
        raise BadRequest("job.group must be a string", "job.group")
    if why := names.group(g):
        raise BadRequest(f"job.group: {why}", "job.group")
    return g


def parse(
    name: str,
    raw: bytes,
    default_ttl_ms: int,
    default_tries: int,
    now_ms: int,
    max_body: int = MAX_BODY,
) -> tuple[Schedule, bool]:
    """A PUT body -> (definition, paused). Refuses anything wrong with a ``BadRequest``
    naming the field, before anything is written."""
    check_name(name)
    data = userjson.parse(raw, "body", "the body must be a JSON object", by_field=True)
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object", "body")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]}", unknown[0])
    job = data.get("job", {})
    if not isinstance(job, dict):
        raise BadRequest("job must be an object", "job")
    unknown = sorted(set(job) - _JOB_KEYS)
    if unknown:
        raise BadRequest(f"unknown field job.{unknown[0]}", f"job.{unknown[0]}")
    body = job.get("body", "")
    if not isinstance(body, str):
        raise BadRequest("job.body must be a string", "job.body")
    try:
        size = len(body.encode())
    except UnicodeEncodeError:  # JSON allows a lone surrogate ("\\ud800"); UTF-8 does not
        raise BadRequest("job.body must be UTF-8 text (no lone surrogate)", "job.body") from None
    if size > max_body:
        raise BodyTooLarge("job.body too large", "job.body")
    template = Template(
        body,
        _int(job, "delay_ms", 0, 0, MAX_SECONDS * 1000, "job."),
        _int(job, "ttl_ms", default_ttl_ms, 0, MAX_SECONDS * 1000, "job."),
        _int(job, "tries", default_tries, 0, MAX_TRIES, "job."),
        _int(job, "priority", 0, 0, MAX_PRIORITY, "job."),
        _group(job),
    )
    try:
        validate_spec(template.spec("s-check", now_ms + template.delay_ms))
    except BadRequest as e:  # (a job's rule, as a publish words it): named in the body
        where = f"job.{e.parameter}" if e.parameter else "job"
        raise BadRequest(f"{where}: {e}", where) from None
    paused = data.get("paused", False)
    if not isinstance(paused, bool):
        raise BadRequest("paused must be true or false", "paused")
    catch_up = _int(data, "catch_up_ms", DEFAULT_CATCH_UP_MS, 0, MAX_CATCH_UP_MS)
    has_cron, has_every = "cron" in data, "every_ms" in data
    if has_cron == has_every:
        raise BadRequest("give exactly one of cron and every_ms", "cron")
    if has_every:
        for key in ("tz",):
            if key in data:
                raise BadRequest(f"{key} goes with cron, not every_ms", key)
        every = _int(data, "every_ms", 0, MIN_EVERY_MS, MAX_EVERY_MS)
        start = _int(data, "start_ms", 0, 0, MAX_START_MS)
        return Schedule(
            name, template, every_ms=every, start_ms=start, catch_up_ms=catch_up
        ), paused
    if "start_ms" in data:
        raise BadRequest("start_ms goes with every_ms, not cron", "start_ms")
    cron, tz = data["cron"], data.get("tz", "UTC")
    if not isinstance(cron, str) or len(cron) > MAX_CRON_LEN or len(cron.split()) != 5:
        if not (isinstance(cron, str) and cron.startswith("@") and len(cron) <= MAX_CRON_LEN):
            raise BadRequest("invalid cron: five fields, or an @alias", "cron")
    if not isinstance(tz, str) or not tz or len(tz) > MAX_TZ_LEN:
        raise BadRequest("invalid tz: an IANA time zone name", "tz")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise BadRequest(f"invalid tz: unknown time zone {tz!r}", "tz") from None
    if not croniter.is_valid(cron):
        raise BadRequest(f"invalid cron expression {cron!r}", "cron")
    if any(_RANDOM_FIELD.match(f) for f in cron.split()):
        # croniter draws a random value for `R` at every evaluation: no two firing steps (nor
        # two instances) would agree on the next occurrence
        raise BadRequest(f"invalid cron: {cron!r} has a random (R) field", "cron")
    schedule = Schedule(name, template, cron=cron, tz=tz, catch_up_ms=catch_up)
    if schedule.next_after(now_ms) == NEVER:  # no date matches it (30 February)
        raise BadRequest(f"invalid cron: {cron!r} never fires", "cron")
    return schedule, paused


def describe(ns: str, q: str, schedule: Schedule, state: State) -> dict[str, Any]:
    """A schedule as the API answers it."""
    out: dict[str, Any] = {"namespace": ns, "queue": q, "name": schedule.name}
    if schedule.cron is not None:
        out.update(cron=schedule.cron, tz=schedule.tz)
    else:
        out.update(every_ms=schedule.every_ms, start_ms=schedule.start_ms)
    out.update(
        job=schedule.job.as_json(),
        catch_up_ms=schedule.catch_up_ms,
        paused=state.paused,
        next_at_ms=None
        if state.paused or (not state.flying and state.next_ms == NEVER)
        else (state.flying or (state.next_ms,))[0],
        fired=state.fired,
        missed=state.missed,
    )
    return out
