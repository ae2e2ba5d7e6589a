"""A queue's groups: their sizes and settings (pause, concurrency limit, rate limit), read and
changed at run time (lua/lib/groups.lua is where groups act: fair turns, holding back, rate
slots). Steps and reply decoding only, no I/O, as the other operations (steps.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cluster_dq import names
from cluster_dq.engine.steps import Cmd, EngineConfig, Op, fixed_keys, keep_listed, lua, signal
from cluster_dq.errors import BadRequest
from cluster_dq.keys import QueueKeys

UNHOLD_PER_CALL = 1_000  # held-back jobs one group_configure call brings back
# Settings of a queue's groups (a setting: a pause, a limit, a rate and its next turn, one field
# each): at most this many, so at least 10,000 groups with every setting
MAX_GROUP_SETTINGS = 40_000
MAX_GROUP_PAGE = 1_000  # groups per listing page
SCANS_PER_PAGE = 16  # HSCANs one listing page may take to hold its groups
MAX_CONCURRENCY = 1_000_000
MAX_RATE_JOBS = 1_000_000
MAX_RATE_PER_MS = 86_400_000  # a rate's window: at most a day
_RATE = re.compile(r"\A([0-9]{1,7})/([0-9]{1,8})(ms|s|m|h)?\Z")
_CURSOR = re.compile(r"[0-9]{1,20}")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, None: 1_000}


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``jobs`` deliveries in any ``per_ms``: turns ``per_ms / jobs`` apart."""

    jobs: int
    per_ms: int

    def text(self) -> str:
        return f"{self.jobs}/{self.per_ms}ms"

    @classmethod
    def parse(cls, raw: str) -> Rate:
        """``<jobs>/<window>``, the window in ms, s (the default), m or h: ``10/1s``, ``100/m``
        would be ``100/1m``."""
        m = _RATE.fullmatch(raw)  # (as the OpenAPI pattern: no spaces)
        if m is None:
            raise BadRequest("rate must be <jobs>/<window>, as 10/1s, 600/1m or 5/250ms", "rate")
        jobs, per_ms = int(m.group(1)), int(m.group(2)) * _UNIT_MS[m.group(3)]
        if not 0 < jobs <= MAX_RATE_JOBS:
            raise BadRequest(f"a rate's jobs must be 1 to {MAX_RATE_JOBS}", "rate")
        if not 0 < per_ms <= MAX_RATE_PER_MS:
            raise BadRequest("a rate's window must be 1 ms to 24 h", "rate")
        return cls(jobs, per_ms)

    @classmethod
    def stored(cls, raw: bytes | str) -> Rate:
        text = raw.decode() if isinstance(raw, bytes) else raw
        jobs, per = text.split(" ")
        return cls(int(jobs), int(per))


@dataclass(frozen=True, slots=True)
class Group:
    """One group of a queue as the API shows it."""

    name: str
    size: int  # its jobs, in every state
    reserved: int  # being worked on
    held: int  # ready, held back by its pause or concurrency limit
    paused: bool
    concurrency: int | None  # at most this many reserved at once
    rate: Rate | None


@dataclass(frozen=True, slots=True)
class GroupChanges:
    """What a PATCH of a group's settings asks (None: left as it is; ``clear_*``: removed)."""

    paused: bool | None = None
    concurrency: int | None = None
    clear_concurrency: bool = False
    rate: Rate | None = None
    clear_rate: bool = False

    def fields(self) -> list[str]:
        out: list[str] = []
        if self.paused is not None:
            out += ["p", "1" if self.paused else ""]
        if self.clear_concurrency:
            out += ["c", ""]
        elif self.concurrency is not None:
            out += ["c", str(self.concurrency)]
        if self.clear_rate:
            out += ["q", ""]
        elif self.rate is not None:
            out += ["q", f"{self.rate.jobs} {self.rate.per_ms}"]
        return out


def check_group(group: str) -> str:
    if why := names.group(group):
        raise BadRequest(why, "group")
    return group


def describe(ns: str, q: str, groups: Sequence[str]) -> Op[list[Group]]:
    """The groups named, in that order (a group with no job and no setting: all zero)."""
    if not groups:
        return []
    raw = yield lua("group_info", {"queue": fixed_keys(QueueKeys(ns, q))}, groups=list(groups))
    out = []
    for i, g in enumerate(groups):
        size, reserved, held, paused, conc, rate = raw[6 * i : 6 * i + 6]
        out.append(
            Group(
                g,
                int(size),
                int(reserved),
                int(held),
                paused == b"1",
                int(conc) if conc else None,
                Rate.stored(rate) if rate else None,
            )
        )
    return out


def list_groups(ns: str, q: str, cursor: int, count: int) -> Op[tuple[int, list[Group]]]:
    """One page of the groups that hold jobs (HSCAN of GROUPS: a group that comes or goes
    meanwhile may be seen or not); the next cursor, 0 when done. A page holds at least
    ``count`` groups but the last, seldom more than twice that: GROUPS holds two or three
    fields a group, so each HSCAN asks for twice what the page lacks, and a page scans on (at
    most ``SCANS_PER_PAGE`` times) until it has them; a small hash comes whole in one. A group
    with settings but no job is shown by ``describe``, not listed."""
    qk = QueueKeys(ns, q)
    found: set[str] = set()
    for _ in range(SCANS_PER_PAGE):
        want = 2 * max(count - len(found), 1)  # (what the page still lacks)
        nxt, fields = yield Cmd(("HSCAN", qk.groups, cursor, "MATCH", "n:*", "COUNT", want))
        found |= {(f.decode() if isinstance(f, bytes) else f)[2:] for f in fields}
        cursor = int(nxt)
        if cursor == 0 or len(found) >= count:
            break
    return cursor, (yield from describe(ns, q, sorted(found)))


def configure_group(
    cfg: EngineConfig, ns: str, q: str, group: str, changes: GroupChanges, now: int
) -> Op[Group]:
    """Changes a group's settings; what it held back and may now go comes back to READY (a
    bounded number per call, the calls repeated until none is left; under a rate, one per turn,
    the next turns the pump's). Returns the group. A queue with settings is listed
    (``keep_listed``)."""
    qk = QueueKeys(ns, q)
    fields, owed = changes.fields(), 0
    while True:
        _back, left, lowered, refused = yield lua(
            "group_configure",
            {"queue": fixed_keys(qk)},
            stamped=True,
            now=now,
            group=group,
            limit=UNHOLD_PER_CALL,
            owed=owed,
            max_fields=MAX_GROUP_SETTINGS,
            fields=fields,
        )
        if int(refused):
            raise BadRequest(
                f"too many groups with settings in queue {ns}/{q} (at most {MAX_GROUP_SETTINGS} "
                "settings: remove some first); nothing was changed",
                "group",
            )
        if int(lowered):
            yield signal(qk, cfg, int(lowered))
        fields, owed = [], int(left)
        if owed <= 0:
            break
    yield from keep_listed(qk, cfg)
    (out,) = yield from describe(ns, q, [group])
    return out


GROUP_FIELDS = ("paused", "concurrency", "rate")


def cursor_of(raw: object) -> int:
    """A listing's cursor, as a page gave it (absent or empty: the first page): ASCII digits
    (``str.isdigit`` takes "²") of a number below 2^64 (Redis refuses the rest)."""
    if raw is None or raw == "":
        return 0
    if not isinstance(raw, str) or not _CURSOR.fullmatch(raw) or int(raw) >= 2**64:
        raise BadRequest("invalid cursor: the one a page gave, or empty", "cursor")
    return int(raw)


def parse_changes(body: object) -> GroupChanges:
    """A PATCH of a group's settings (a JSON object: ``paused`` true/false, ``concurrency`` an
    integer or null, ``rate`` ``"<jobs>/<window>"`` or null); refuses anything unknown or out of
    range, naming it, before anything is written."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", "body")
    unknown = sorted(set(body) - set(GROUP_FIELDS))
    if unknown:
        known = ", ".join(GROUP_FIELDS)
        raise BadRequest(f"unknown group setting {unknown[0]!r}; known: {known}", unknown[0])
    paused = body.get("paused")
    if "paused" in body and not isinstance(paused, bool):
        raise BadRequest("invalid paused: true or false", "paused")
    conc = body.get("concurrency")
    if conc is not None and (
        isinstance(conc, bool) or not isinstance(conc, int) or not 1 <= conc <= MAX_CONCURRENCY
    ):
        raise BadRequest(
            f"invalid concurrency: an integer 1..{MAX_CONCURRENCY}, or null", "concurrency"
        )
    rate = body.get("rate")
    if rate is not None and not isinstance(rate, str):
        raise BadRequest("invalid rate: a string such as 10/1s, or null", "rate")
    return GroupChanges(
        paused=paused,
        concurrency=conc,
        clear_concurrency="concurrency" in body and conc is None,
        rate=Rate.parse(rate) if rate is not None else None,
        clear_rate="rate" in body and rate is None,
    )
