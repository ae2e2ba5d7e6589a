"""A queue's groups as pure functions (arguments -> ``Call``): the page of groups holding jobs,
one group, and its settings (pause, concurrency limit, rate limit) changed at run time. A
job's ``group`` on publish is ``_verbs.group_param``."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

from cluster_dq import names as rules
from cluster_dq.client._core import JSON, Call, Reply, expect, integer, json_body, query, segment
from cluster_dq.client._verbs import queue_path
from cluster_dq.client.models import GroupInfo, GroupPage


class Unset(enum.Enum):
    """A setting not given to ``update_group``: left as it is (None removes it)."""

    UNSET = "unset"


UNSET: Final = Unset.UNSET


def _path(ns: str, queue: str, name: str) -> str:
    return f"{queue_path(ns, queue)}/groups/{segment(name, 'group', rules.group)}"


def _info(ns: str, queue: str, o: Mapping[str, Any]) -> GroupInfo:
    return GroupInfo(
        namespace=ns,
        queue=queue,
        name=o["group"],
        size=int(o["size"]),
        reserved=int(o["reserved"]),
        held=int(o["held"]),
        paused=bool(o["paused"]),
        concurrency=o.get("concurrency"),
        rate=o.get("rate"),
    )


def _one(r: Reply) -> GroupInfo:
    o = expect(r, 200)
    return _info(o["namespace"], o["queue"], o)


def groups(ns: str, queue: str, *, cursor: str | None = None, limit: int = 100) -> Call[GroupPage]:
    """A page of the groups holding jobs, about ``limit`` of them (the service walks a hash:
    a page may hold more or fewer, and a group that comes or goes meanwhile may come twice)."""

    def decode(r: Reply) -> GroupPage:
        o = expect(r, 200)
        found = [_info(o["namespace"], o["queue"], g) for g in o["groups"]]
        return GroupPage(found, o["cursor"] or None)

    params = query(cursor=cursor or None, limit=integer(limit, "limit"))
    return Call("GET", f"{queue_path(ns, queue)}/groups", decode, params)


def group(ns: str, queue: str, name: str) -> Call[GroupInfo]:
    """One group; one nothing was written to is all zero, with no setting."""
    return Call("GET", _path(ns, queue, name), _one)


def update_group(
    ns: str,
    queue: str,
    name: str,
    *,
    paused: bool | Unset = UNSET,
    concurrency: int | None | Unset = UNSET,
    rate: str | None | Unset = UNSET,
) -> Call[GroupInfo]:
    """The settings given, in one change: ``concurrency`` (1..1,000,000 jobs reserved at
    once), ``rate`` (``"<jobs>/<window>"``, the window in ms, s, m or h: ``"10/1s"``); None
    removes one, and one not given is left as it is."""
    body: dict[str, Any] = {}
    if paused is not UNSET:
        if not isinstance(paused, bool):
            raise ValueError(f"paused must be True or False, not {paused!r}")
        body["paused"] = paused
    if concurrency is not UNSET:
        if concurrency is not None:
            integer(concurrency, "concurrency")
        body["concurrency"] = concurrency
    if rate is not UNSET:
        if rate is not None and not isinstance(rate, str):
            raise ValueError(f'rate must be "<jobs>/<window>" as "10/1s", or None, not {rate!r}')
        body["rate"] = rate
    if not body:
        raise ValueError("no change given: one of paused, concurrency, rate")
    return Call("PATCH", _path(ns, queue, name), _one, [], JSON, json_body(body))


def pause_group(ns: str, queue: str, name: str, paused: bool = True) -> Call[GroupInfo]:
    return Call("POST", f"{_path(ns, queue, name)}/{'pause' if paused else 'resume'}", _one)
