"""The operator commands of ``cluster-dq`` (stats, jobs, dlq, pause, resume): each talks to a
running service through ``cluster_dq.client``; ``cli.py`` parses their arguments.

A client error becomes one line on stderr and exit status 1; a missing setting or bad
argument exit status 2; never a traceback."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from cluster_dq.client import AdminClient, Client, DeadJob, DQError, Job, TransportError
from cluster_dq.progress import Progress
from cluster_dq.stats import Sample, StatsRow, rows_of, sample, stats_doc, stats_table
from cluster_dq.terminal import json_line, shown

PAGE = 1_000  # dead-letter listing page
SWEEP = 500  # jobs moved or deleted per redrive / purge call


class UsageError(Exception):
    """A missing setting or an argument the parser could not check: exit status 2."""


Command = Callable[[argparse.Namespace], int]


def run(args: argparse.Namespace, commands: dict[str, Command] | None = None) -> int:
    """Runs one operator command (of ``commands``, else this module's); the exit status."""
    command: Command = (commands or COMMANDS)[args.cmd]
    try:
        return command(args)
    except (UsageError, ValueError) as e:  # ValueError: an argument the client refused
        # (a name the client refused is a DQError too: its message, not a status never sent)
        return _fail(e.message if isinstance(e, DQError) else str(e), 2)
    except TransportError as e:
        where = getattr(e, "where", None) or args.url or os.environ.get("CLUSTER_DQ_URL")
        return _fail(f"cannot reach {where}: {e.message}", 1)
    except DQError as e:
        return _fail(f"{e.message} (HTTP {e.status})", 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cluster-dq jobs dead q | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _fail(message: str, status: int) -> int:
    print(f"cluster-dq: {shown(message)}", file=sys.stderr)  # (a service's message echoes input)
    return status


def client_for(args: argparse.Namespace) -> Client:
    try:
        return Client(args.url, args.token, args.namespace, timeout=args.timeout)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _admin(args: argparse.Namespace) -> AdminClient | None:
    """The admin client, or None when no admin URL is given (stats shows no rates then)."""
    if not (args.admin_url or os.environ.get("CLUSTER_DQ_ADMIN_URL")):
        return None
    auth = None
    if args.admin_auth:
        user, sep, password = args.admin_auth.partition(":")
        if not sep:
            raise UsageError("--admin-auth: give user:password")
        auth = (user, password)
    try:
        return AdminClient(args.admin_url, auth, timeout=args.timeout)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _sample(admin: AdminClient | None) -> Sample | None:
    """The admin port's counters now (None without an admin URL)."""
    if admin is None:
        return None
    try:
        return sample(admin)
    except TransportError as e:
        e.where = admin.url  # type: ignore[attr-defined]  # the message names the admin port
        raise


def print_json(doc: Any) -> None:
    print(json_line(doc), flush=True)


# -- stats ----------------------------------------------------------------------------------


def stats(args: argparse.Namespace) -> int:
    interval = args.watch if args.watch is not None else args.interval
    with client_for(args) as client:
        admin = _admin(args)
        try:
            previous: Sample | None = _sample(admin)
            if args.watch is None:
                if previous is not None:
                    time.sleep(interval)
                _show_stats(args, client, admin, previous)
                return 0
            _watch(args, client, admin, previous, interval)
            return 0
        finally:
            if admin is not None:
                admin.close()


def _show_stats(
    args: argparse.Namespace, client: Client, admin: AdminClient | None, previous: Sample | None
) -> Sample | None:
    current = _sample(admin)
    rows = rows_of(client.namespace, list(client.iter_queues()), previous, current)
    if args.json:
        print_json(stats_doc(client.namespace, rows, previous, current))
    else:
        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else 160).print(
            stats_table(client.namespace, rows, previous, current)
        )
    return current


def _watch(
    args: argparse.Namespace,
    client: Client,
    admin: AdminClient | None,
    previous: Sample | None,
    interval: float,
) -> None:
    if args.json or not sys.stdout.isatty():  # one document (or table) per refresh
        while True:
            time.sleep(interval)
            previous = _show_stats(args, client, admin, previous)
    from rich.live import Live

    with Live(auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            current = _sample(admin)
            rows: list[StatsRow] = rows_of(
                client.namespace, list(client.iter_queues()), previous, current
            )
            live.update(stats_table(client.namespace, rows, previous, current), refresh=True)
            previous = current


# -- jobs -----------------------------------------------------------------------------------


def job_doc(job: Job) -> dict[str, Any]:
    doc = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
    doc.update(_body(job.body))
    return doc


def _body(body: bytes) -> dict[str, str]:
    try:
        return {"body": body.decode(), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode(), "body_encoding": "base64"}


def _show_job(args: argparse.Namespace, job: Job | None, missing: str) -> int:
    if job is None:
        return _fail(missing, 1)
    doc = job_doc(job)
    if args.json:
        print_json(doc)
        return 0
    for key, value in doc.items():
        if value is None or key == "body_encoding":
            continue
        if key in ("died_at", "next_attempt_at"):
            value = _when(value)
        elif key == "body" and doc["body_encoding"] == "base64":
            key = "body (base64)"
        print(f"{key:>16}: {shown(value)}")
    return 0


def jobs_peek(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        return _show_job(args, client.peek(args.queue), f"queue {args.queue}: no ready job")


def jobs_get(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        return _show_job(args, client.get_job(args.queue, args.id), f"job {args.id}: not found")


@dataclasses.dataclass(frozen=True)
class DeadFilter:
    """The filters of the dead-letter commands (times: epoch seconds, both included)."""

    reason: str | None = None
    since: float | None = None
    until: float | None = None

    def match(self, job: DeadJob) -> bool:
        died = job.died_at
        return (
            (self.reason is None or job.reason == self.reason)
            and (self.since is None or (died is not None and died >= self.since))
            and (self.until is None or (died is not None and died <= self.until))
        )


def walk_dead(client: Client, queue: str, wanted: DeadFilter) -> Iterator[DeadJob]:
    """The queue's dead jobs that match, oldest death first, following the listing's cursor."""
    cursor: str | None = None
    while True:
        page = client.dead_jobs(queue, cursor=cursor, limit=PAGE)
        yield from (j for j in page.jobs if wanted.match(j))
        if not page.more or page.cursor is None:
            return
        cursor = page.cursor


def dead_doc(job: DeadJob) -> dict[str, Any]:
    return {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}


def jobs_dead(args: argparse.Namespace) -> int:
    wanted = DeadFilter(args.reason)
    with client_for(args) as client:
        found = []
        for job in walk_dead(client, args.queue, wanted):
            found.append(job)
            if args.limit is not None and len(found) >= args.limit:
                break
    if args.json:
        print_json([dead_doc(j) for j in found])
        return 0
    for j in found:
        error = f"  {shown(j.last_error)}" if j.last_error else ""
        print(
            f"{shown(j.id)}  {shown(j.reason):<15}  {_when(j.died_at)}  "
            f"deliveries={j.deliveries}{error}"
        )
    print(f"{len(found):,} dead job(s)", file=sys.stderr)
    return 0


# -- dlq --------------------------------------------------------------------------------------


def dlq(args: argparse.Namespace) -> int:
    redrive = args.action == "redrive"
    verb, done = ("redrive", "redriven") if redrive else ("delete", "deleted")
    wanted = DeadFilter(args.reason, args.since, args.until)
    if args.since is not None and args.until is not None and args.since > args.until:
        raise UsageError("--since is after --until: no dead job can match")
    with client_for(args) as client:
        where = shown(f"{client.namespace}/{args.queue}")
        if args.dry_run:
            n = 0
            for _ in walk_dead(client, args.queue, wanted):
                n += 1
                if args.limit is not None and n >= args.limit:
                    break
            _report(args, done, where, n, dry_run=True)
            return 0
        dead = client.dead_size(args.queue)
        if not args.yes:
            _confirm(f"{verb} the dead jobs of {where}{_filters(wanted)} ({dead:,} dead)?")
        sweep = client.redrive if redrive else client.purge
        count, cursor = 0, None
        bar = Progress(f"{verb} {where}", dead, unit="jobs") if sys.stderr.isatty() else None
        try:
            while args.limit is None or count < args.limit:
                step = SWEEP if args.limit is None else min(SWEEP, args.limit - count)
                result = sweep(
                    args.queue,
                    reason=wanted.reason,
                    since=wanted.since,
                    until=wanted.until,
                    limit=step,
                    cursor=cursor,
                )
                count += result.count
                if bar is not None:
                    bar.update(count)
                if not result.more or result.cursor is None:
                    break
                cursor = result.cursor
        finally:
            if bar is not None:
                bar.close()
    _report(args, done, where, count, dry_run=False)
    return 0


def _report(args: argparse.Namespace, verb: str, where: str, n: int, *, dry_run: bool) -> None:
    if args.json:
        print_json({"queue": where, "action": args.action, "dry_run": dry_run, "count": n})
    elif dry_run:
        print(f"{n:,} dead job(s) of {where} would be {verb} (dry run)")
    else:
        print(f"{n:,} dead job(s) of {where} {verb}")


def _filters(f: DeadFilter) -> str:
    parts = [f"reason {f.reason}"] if f.reason else []
    if f.since is not None:
        parts.append(f"dead since {_when(f.since)}")
    if f.until is not None:
        parts.append(f"dead until {_when(f.until)}")
    return f" ({', '.join(parts)})" if parts else ""


def _confirm(question: str) -> None:
    if not sys.stdin.isatty():
        raise UsageError("stdin is not a terminal, so nothing can be confirmed: pass --yes")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise UsageError("not confirmed; nothing changed")


# -- pause, resume ----------------------------------------------------------------------------


def pause(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        if args.cmd == "pause":
            settings = client.pause(args.queue, create=args.create)
        else:
            settings = client.resume(args.queue)
    state = "paused" if settings.paused else "running"
    if args.json:
        print_json({"queue": f"{client.namespace}/{args.queue}", "paused": settings.paused})
    else:
        print(f"{shown(client.namespace)}/{shown(args.queue)}: {state}")
    return 0


# -- who is running what ----------------------------------------------------------------------


def workers(args: argparse.Namespace) -> int:
    """The namespace's workers: one line each (id, host, pid, queues, held jobs, last seen),
    then the jobs each holds, with how long it has held them."""
    with client_for(args) as client:
        page = client.workers()
    found, now = page.workers, time.time()
    if page.truncated:
        print("cluster-dq: more workers are announced than one listing answers", file=sys.stderr)
    if args.json:
        print_json([dataclasses.asdict(w) for w in found])
        return 0
    for w in found:
        queues = shown(",".join(w.queues) or None)
        print(
            f"{shown(w.worker_id)}  {shown(w.host or None)}  pid {shown(w.pid)}  {queues}  "
            f"{len(w.in_flight)}/{shown(w.concurrency)} held  "
            f"seen {max(now - w.last_seen, 0):.0f} s ago"
        )
        for j in w.in_flight:
            held = "" if j.started_at is None else f"  for {max(now - j.started_at, 0):.1f} s"
            print(f"    {shown(j.queue)}/{shown(j.job_id)}{held}")
    if not found:
        print(f"{shown(client.namespace)}: no worker announced")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "workers": workers,
    "stats": stats,
    "pause": pause,
    "resume": pause,
    "dlq": dlq,
}


def jobs(args: argparse.Namespace) -> int:
    return {"peek": jobs_peek, "get": jobs_get, "dead": jobs_dead}[args.action](args)


COMMANDS["jobs"] = jobs


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")
