"""What ``cluster-dq stats`` shows: queue sizes from the queue listing, and rates per queue
(published, consumed, acked per second) from two samples of the admin port's ``/metrics``
counters. Pure functions over the samples; ``ops.py`` does the calls and the refreshing."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from cluster_dq.names import OTHER_QUEUE
from cluster_dq.terminal import cell

if TYPE_CHECKING:
    from rich.table import Table

    from cluster_dq.client import AdminClient, QueueInfo

# The service's counters (cluster_dq/metrics.py) behind each rate.
COUNTERS = {
    "cluster_dq_jobs_published": "published",
    "cluster_dq_jobs_delivered": "consumed",
    "cluster_dq_jobs_acked": "acked",
}
RATES = tuple(COUNTERS.values())
HEADERS = ("pub/s", "cons/s", "ack/s")  # short: the table fits 80 columns


@dataclass(frozen=True)
class Sample:
    """Counter values per (kind, namespace, queue) at ``at`` (monotonic seconds)."""

    at: float
    counts: dict[tuple[str, str, str], float]


def parse_counters(text: str) -> dict[tuple[str, str, str], float]:
    """The three counters of every queue in a Prometheus text exposition."""
    counts: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        kind = COUNTERS.get(family.name.removesuffix("_total"))
        if kind is None:
            continue
        for s in family.samples:
            if not s.name.endswith("_total"):
                continue  # _created
            key = (kind, s.labels.get("namespace", ""), s.labels.get("queue", ""))
            counts[key] = counts.get(key, 0.0) + s.value
    return counts


def sample(admin: AdminClient) -> Sample:
    return Sample(time.monotonic(), parse_counters(admin.metrics_text()))


@dataclass(frozen=True)
class StatsRow:
    queue: str
    ready: int
    delayed: int
    reserved: int
    dead: int
    paused: bool
    lateness: float | None  # seconds since the ready head was due
    # per second, by kind; None without two samples, or when the service counts the queue
    # under "_other" (past its MetricsMaxQueues series)
    rates: dict[str, float] | None


def rate(kind: str, ns: str, q: str, before: Sample, after: Sample) -> float:
    """Per second between the samples; a counter that went down (an instance restarted)
    counts from zero."""
    elapsed = after.at - before.at
    now = after.counts.get((kind, ns, q), 0.0)
    then = before.counts.get((kind, ns, q), 0.0)
    delta = now - then if now >= then else now
    return delta / elapsed if elapsed > 0 else 0.0


def rows_of(
    ns: str, queues: Iterable[QueueInfo], before: Sample | None, after: Sample | None
) -> list[StatsRow]:
    rows = []
    capped = after is not None and any((k, ns, OTHER_QUEUE) in after.counts for k in RATES)
    for info in queues:
        rates = None
        if before is not None and after is not None:
            rates = {k: rate(k, ns, info.name, before, after) for k in RATES}
            if capped and not any((k, ns, info.name) in after.counts for k in RATES):
                rates = None  # counted under _other, past the series cap: its own not known
        rows.append(
            StatsRow(
                info.name,
                info.ready,
                info.delayed,
                info.reserved,
                info.dead,
                info.paused,
                info.lateness,
                rates,
            )
        )
    return rows


def partial(ns: str, before: Sample | None, after: Sample | None) -> bool:
    """Whether the namespace's ``_other`` series moved between the samples: each worker
    process caps its own series, so a queue's own rates may then miss what another process
    counted under ``_other`` (lower bounds)."""
    if before is None or after is None:
        return False
    return any(rate(k, ns, OTHER_QUEUE, before, after) > 0 for k in RATES)


def stats_doc(
    ns: str, rows: list[StatsRow], before: Sample | None, after: Sample | None
) -> dict[str, Any]:
    """The --json document of one refresh."""
    window = after.at - before.at if before is not None and after is not None else None
    return {
        "namespace": ns,
        "at": time.time(),
        "rate_window": window,
        "rates_partial": partial(ns, before, after),
        "queues": [
            {
                "queue": r.queue,
                "ready": r.ready,
                "delayed": r.delayed,
                "reserved": r.reserved,
                "dead": r.dead,
                "paused": r.paused,
                "lateness": r.lateness,
                **{f"{k}_per_s": (r.rates[k] if r.rates is not None else None) for k in RATES},
            }
            for r in rows
        ],
    }


def stats_table(
    ns: str, rows: list[StatsRow], before: Sample | None, after: Sample | None
) -> Table:
    """The refreshing table: a paused queue is marked after its name; fits 80 columns."""
    from rich import box
    from rich.table import Table

    window = f"rates over {after.at - before.at:.1f} s" if before and after else "no rates"
    if partial(ns, before, after):
        window += "; some counted under _other: rates are at least these"
    table = Table(
        title=cell(f"namespace {ns} ({window})"),
        title_justify="left",
        box=box.SIMPLE,
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("queue", overflow="fold")
    for name in ("ready", "delayed", "reserved", "dead", "lateness", *HEADERS):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        rates = [f"{r.rates[k]:.1f}" if r.rates is not None else "-" for k in RATES]
        table.add_row(
            cell(f"{r.queue} (paused)" if r.paused else r.queue),
            f"{r.ready:,}",
            f"{r.delayed:,}",
            f"{r.reserved:,}",
            f"{r.dead:,}",
            f"{r.lateness:.1f}s" if r.lateness is not None else "-",
            *rates,
        )
    return table
