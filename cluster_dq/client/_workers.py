"""Who is running what, as pure functions (arguments -> ``Call``): a worker announces itself
and what it holds, retires, and a namespace's workers are listed (the data port's
``/api/{ns}/_workers``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster_dq import names as rules
from cluster_dq.client._core import JSON, Call, Reply, expect, json_body, millis, ms_to_s, query
from cluster_dq.client._core import segment
from cluster_dq.client._verbs import no_content
from cluster_dq.client.models import HeldJob, WorkerInfo, WorkerPage


def _path(ns: str, worker_id: str | None = None) -> str:
    path = f"/api/{segment(ns, 'namespace', rules.namespace)}/_workers"
    if worker_id is None:
        return path
    return f"{path}/{segment(worker_id, 'worker_id', rules.job_id)}"


def announce(ns: str, worker_id: str, info: Mapping[str, Any], *, ttl: float) -> Call[float]:
    """``info``: the announcement's fields (host, pid, version, started_ms, queues,
    concurrency, in_flight); answers when it runs out (epoch seconds)."""

    def decode(r: Reply) -> float:
        return float(expect(r, 200)["expires_ms"]) / 1000

    params = query(ttl_ms=millis(ttl, "ttl"))
    return Call("PUT", _path(ns, worker_id), decode, params, JSON, json_body(dict(info)))


def _worker(o: Mapping[str, Any]) -> WorkerInfo:
    held = tuple(
        HeldJob(j["queue"], j["job_id"], ms_to_s(j.get("started_ms")))
        for j in o.get("in_flight", ())
    )
    return WorkerInfo(
        o["worker_id"],
        o["last_seen_ms"] / 1000,
        o["expires_ms"] / 1000,
        o.get("host"),
        o.get("pid"),
        o.get("version"),
        ms_to_s(o.get("started_ms")),
        tuple(o.get("queues", ())),
        o.get("concurrency"),
        held,
    )


def workers(ns: str) -> Call[WorkerPage]:
    def decode(r: Reply) -> WorkerPage:
        o = expect(r, 200)
        return WorkerPage([_worker(w) for w in o["workers"]], bool(o.get("truncated")))

    return Call("GET", _path(ns), decode)


def retire(ns: str, worker_id: str) -> Call[None]:
    return Call("DELETE", _path(ns, worker_id), no_content)
