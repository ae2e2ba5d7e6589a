"""The data of the dashboard's own panels: the delay timeline (with drill-down and a bucket's
reschedule), dead letters grouped by error fingerprint (with a group's redrive); the topology view
reads ``Service.topology`` (the lateness and redelivery charts are ``charts.py``). Every read and
every change goes through the service (``cluster_dq/service/``); nothing here talks to Redis.
The pages themselves are in ``panel_views.py``."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cluster_dq.dashboard import times
from cluster_dq.engine.insight import DelayedJob
from cluster_dq.errors import BadRequest, NotFound, WrongState
from cluster_dq.pools import RedisPool
from cluster_dq.routing import PoolRoute
from cluster_dq.service import Service

Route = PoolRoute[RedisPool]
# Called once per job changed by a bulk action: (action, target, detail); the dashboard's audit.
Audit = Callable[[str, str, str], Awaitable[None] | None]

SECOND, MINUTE, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000
WIDTHS = (
    SECOND,
    5 * SECOND,
    10 * SECOND,
    30 * SECOND,
    MINUTE,
    5 * MINUTE,
    10 * MINUTE,
    30 * MINUTE,
    HOUR,
    3 * HOUR,
    6 * HOUR,
    12 * HOUR,
    DAY,
    7 * DAY,
    30 * DAY,
    365 * DAY,
)
MAX_BINS = 60
BUCKET_JOBS = 200  # jobs a bucket's drill-down shows, and a bucket's reschedule moves
DEAD_WALK = 5_000  # dead jobs one grouping or one group redrive looks at
DEAD_PAGE = 1_000
REDRIVE_MAX = 100  # jobs one group redrive kicks


async def _audit(audit: Audit | None, action: str, target: str, detail: str) -> None:
    if audit is None:
        return
    got = audit(action, target, detail)
    if got is not None:
        await got


# -- delay timeline ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bin:
    start_ms: int
    end_ms: int
    count: int


@dataclass(frozen=True, slots=True)
class Timeline:
    now_ms: int
    width_ms: int
    bins: list[Bin]
    outside: int  # delayed jobs in no bin (none expected; a job moved during the look)
    unread: int  # jobs of wheel buckets past the look's bound, in no bin

    @property
    def total(self) -> int:
        return sum(b.count for b in self.bins) + self.outside + self.unread

    @property
    def peak(self) -> int:
        return max((b.count for b in self.bins), default=0)


def choose_width(span_ms: int) -> int:
    """The narrowest bin width that covers ``span_ms`` in at most ``MAX_BINS`` bins."""
    for w in WIDTHS:
        if span_ms < w * MAX_BINS:
            return w
    return WIDTHS[-1]


async def timeline(service: Service, route: Route, ns: str, q: str, now_ms: int) -> Timeline:
    """The queue's delayed jobs by due time, in bins whose width suits the range (seconds to
    days), from the precise ``delayed`` zset and the far-future wheel buckets."""
    span = await service.delayed_span(route, ns, q)
    if span is None:
        return Timeline(now_ms, SECOND, [], 0, 0)
    first = min(span.first_ms, now_ms)
    width = choose_width(span.last_ms - first + 1)
    # bins start on a multiple of their width: the first one may begin up to a width early
    while (span.last_ms - first // width * width) // width + 1 > MAX_BINS and width < WIDTHS[-1]:
        width = WIDTHS[WIDTHS.index(width) + 1]
    start = first // width * width
    n = min(MAX_BINS, (span.last_ms - start) // width + 1)
    edges = [start + i * width for i in range(n + 1)]
    got = await service.delayed_counts(route, ns, q, edges)
    bins = [Bin(edges[i], edges[i + 1], c) for i, c in enumerate(got.counts)]
    return Timeline(now_ms, width, bins, got.outside, got.unread)


async def bucket_jobs(
    service: Service, route: Route, ns: str, q: str, start: int, end: int
) -> list[DelayedJob]:
    """The delayed jobs due in ``[start, end)``, soonest first, at most ``BUCKET_JOBS``."""
    check_range(start, end)
    return await service.delayed_between(route, ns, q, start, end, BUCKET_JOBS)


def check_range(start: int, end: int) -> None:
    if not 0 <= start < end or end - start > 400 * DAY:
        raise BadRequest("invalid bucket: 0 <= start < end, at most 400 days wide", "start")


@dataclass(slots=True)
class Outcome:
    """What a bulk action did: jobs changed, and those left alone with why."""

    changed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    examined: int = 0


async def reschedule_bucket(
    service: Service,
    route: Route,
    ns: str,
    q: str,
    start: int,
    end: int,
    *,
    shift_ms: int | None = None,
    to_ms: int | None = None,
    audit: Audit | None = None,
) -> Outcome:
    """Gives the bucket's jobs (at most ``BUCKET_JOBS``) a new due time: each one's own plus
    ``shift_ms``, or ``to_ms`` for all, never before the pool's now (a due time in the past
    would put the job ahead of those already waiting and count its delivery as that late:
    ``to_ms=0`` is "ready now"); each through the service's per-job reschedule, so a job that
    left the delayed state meanwhile is refused by its state and skipped."""
    if (shift_ms is None) == (to_ms is None):
        raise BadRequest("give exactly one of shift and to", "shift")
    out = Outcome()
    for job in await bucket_jobs(service, route, ns, q, start, end):
        out.examined += 1
        due = job.due_ms + shift_ms if shift_ms is not None else to_ms
        assert due is not None
        set_to: list[int] = []
        try:
            moved = await service.reschedule(route, ns, q, job.job_id, _not_before_now(due, set_to))
        except (NotFound, WrongState, BadRequest) as e:
            out.skipped.append((job.job_id, str(e)))
            continue
        out.changed.append(job.job_id)
        await _audit(
            audit,
            "reschedule",
            f"{ns}/{q}/{job.job_id}",
            f"from the timeline: due {times.shown(job.due_ms)} -> {times.shown(set_to[-1])} "
            f"({moved.state})",
        )
    return out


def _not_before_now(at: int, chosen: list[int]) -> Callable[[int], int]:
    """The due time for the service's reschedule: ``at``, or the pool's now when that is
    later (kept in ``chosen`` for the audit)."""

    def due(now: int) -> int:
        chosen.append(max(at, now))
        return chosen[-1]

    return due


# -- dead letters by fingerprint -------------------------------------------------------------

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_HEX = re.compile(r"\b0[xX][0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")


def fingerprint(error: str) -> str:
    """An error text with what varies from one job to the next normalised away: quoted values,
    UUIDs, hex strings, then numbers; so "order 42 failed" and "order 7 failed" group."""
    text = _QUOTED.sub("<str>", error)
    text = _UUID.sub("<uuid>", text)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACES.sub(" ", text).strip()[:300]


def group_id(reason: str, print_: str) -> str:
    return hashlib.sha1(f"{reason}\0{print_}".encode()).hexdigest()[:12]


@dataclass(slots=True)
class DeadGroup:
    reason: str
    fingerprint: str
    count: int
    first_died_ms: int
    last_died_ms: int
    sample_error: str
    sample_ids: list[str]

    @property
    def id(self) -> str:
        return group_id(self.reason, self.fingerprint)


@dataclass(frozen=True, slots=True)
class DeadGroups:
    groups: list[DeadGroup]  # most jobs first
    examined: int
    complete: bool  # the walk reached the end of the dead letter


async def _walk_dead(
    service: Service, route: Route, ns: str, q: str, most: int
) -> tuple[list[tuple[str, str, int, str]], bool]:
    """(job id, reason, died ms, last error) of up to ``most`` dead jobs, oldest death first,
    and whether that was all of them."""
    out: list[tuple[str, str, int, str]] = []
    cursor: str | None = None
    while len(out) < most:
        page, cursor = await service.dead_jobs(
            route, ns, q, cursor, min(DEAD_PAGE, most - len(out))
        )
        out += [(d.job_id, d.reason, d.died_ms, d.last_error or "") for d in page]
        if cursor is None:
            return out, True
    return out, False


async def dead_groups(
    service: Service, route: Route, ns: str, q: str, most: int = DEAD_WALK
) -> DeadGroups:
    """The dead letter grouped by reason and error fingerprint, with counts, first and last
    death, a sample error and a few ids; a bounded walk of ``most`` jobs."""
    walked, complete = await _walk_dead(service, route, ns, q, most)
    groups: dict[tuple[str, str], DeadGroup] = {}
    for job_id, reason, died, error in walked:
        key = (reason, fingerprint(error))
        g = groups.get(key)
        if g is None:
            groups[key] = DeadGroup(reason, key[1], 1, died, died, error, [job_id])
            continue
        g.count += 1
        g.first_died_ms, g.last_died_ms = min(g.first_died_ms, died), max(g.last_died_ms, died)
        if len(g.sample_ids) < 5:
            g.sample_ids.append(job_id)
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.reason, g.fingerprint))
    return DeadGroups(ordered, len(walked), complete)


async def redrive_group(
    service: Service,
    route: Route,
    ns: str,
    q: str,
    gid: str,
    *,
    tries: int,
    ttl_ms: int,
    limit: int = REDRIVE_MAX,
    audit: Audit | None = None,
) -> Outcome:
    """Kicks the dead jobs of group ``gid`` back to ready (at most ``limit``; a bounded walk of
    the dead letter), each through the service's kick, so one that left the dead letter
    meanwhile is refused by its state and skipped."""
    if not re.fullmatch(r"[0-9a-f]{12}", gid):
        raise BadRequest("invalid group", "group")
    walked, _ = await _walk_dead(service, route, ns, q, DEAD_WALK)
    out = Outcome(examined=len(walked))
    for job_id, reason, _, error in walked:
        if len(out.changed) >= limit:
            break
        if group_id(reason, fingerprint(error)) != gid:
            continue
        try:
            await service.kick(route, ns, q, job_id, 0, tries, ttl_ms)
        except (NotFound, WrongState) as e:
            out.skipped.append((job_id, str(e)))
            continue
        out.changed.append(job_id)
        await _audit(audit, "kick", f"{ns}/{q}/{job_id}", f"redrive of group {gid} ({reason})")
    return out
