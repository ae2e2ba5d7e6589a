"""The operator commands of a queue's groups (``groups``, ``group``): list them, look at one,
pause, resume or change its limits, through ``cluster_dq.client``; ``cli.py`` parses their
arguments. Errors as ``ops.py``'s: one line on stderr, exit status 1 or 2."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from typing import TYPE_CHECKING, Any

from cluster_dq import ops
from cluster_dq.client import GroupInfo
from cluster_dq.terminal import cell, shown

if TYPE_CHECKING:
    from rich.table import Table

PAGE = 1_000  # groups per listing call: the most the service answers


def run(args: argparse.Namespace) -> int:
    """Runs ``groups`` or ``group``; the exit status (``ops.run``'s rules)."""
    return ops.run(args, {"groups": groups, "group": group})


def groups(args: argparse.Namespace) -> int:
    """Every group of the queue that holds jobs, by name."""
    with ops.client_for(args) as client:
        found = sorted(client.iter_groups(args.queue, limit=PAGE), key=lambda g: g.name)
    where = f"{client.namespace}/{args.queue}"
    if args.json:
        ops.print_json([dataclasses.asdict(g) for g in found])
    elif found:
        _print(group_table(f"{where}: {len(found):,} group(s) holding jobs", found))
    else:
        print(f"{shown(where)}: no group holds jobs")
    return 0


def group(args: argparse.Namespace) -> int:
    """One group; with a change (``--pause``, ``--concurrency``, ``--no-rate``...), the group
    after it, all changes made at once."""
    changes = _changes(args)
    with ops.client_for(args) as client:
        if changes:
            info = client.update_group(args.queue, args.name, **changes)
        else:
            info = client.group(args.queue, args.name)
    if args.json:
        ops.print_json(dataclasses.asdict(info))
    else:
        _print(group_table(f"{client.namespace}/{args.queue}", [info]))
    return 0


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.paused is not None:
        out["paused"] = args.paused
    if args.no_concurrency or args.concurrency is not None:
        out["concurrency"] = None if args.no_concurrency else args.concurrency
    if args.no_rate or args.rate is not None:
        out["rate"] = None if args.no_rate else args.rate
    return out


_STORED_RATE = re.compile(r"([0-9]+)/([0-9]+)ms")


def rate_text(rate: str | None) -> str:
    """A rate as the service answers it (``"600/60000ms"``), in the largest whole unit
    (``"600/1m"``); ``-`` for none."""
    m = _STORED_RATE.fullmatch(rate or "")
    if m is None:
        return rate or "-"
    jobs, ms = m[1], int(m[2])
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms and ms % size == 0:
            return f"{jobs}/{ms // size}{unit}"
    return f"{jobs}/{ms}ms"


def group_table(title: str, found: list[GroupInfo]) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(
        title=cell(title),
        title_justify="left",
        box=box.SIMPLE,
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("group", overflow="fold")
    for name in ("size", "reserved", "held", "paused", "concurrency", "rate"):
        table.add_column(name, justify="right", no_wrap=True)
    for g in found:
        table.add_row(
            cell(g.name),
            f"{g.size:,}",
            f"{g.reserved:,}",
            f"{g.held:,}",
            "yes" if g.paused else "no",
            "-" if g.concurrency is None else f"{g.concurrency:,}",
            cell(rate_text(g.rate)),
        )
    return table


def _print(table: Table) -> None:
    from rich.console import Console

    Console(width=None if sys.stdout.isatty() else 160).print(table)
