"""A consume whose queues live on several pools (a ring, a migration): look at each pool, then
long-poll all of them, and give back at once what a consumer that left will never get."""

from __future__ import annotations

import asyncio
import functools

from cluster_dq.engine.core import cancelling
from cluster_dq.errors import Refused
from cluster_dq.models import Job
from cluster_dq.pools import RedisPool


async def consume_across(
    groups: list[tuple[RedisPool, list[str]]], ns: str, ttr_ms: int, count: int, timeout_ms: int
) -> list[Job]:
    """A consume whose queues live on several pools (a ring, a migration): look at each pool
    at once, pools being drained first; if all are empty, long-poll all of them and take what
    the first one delivers. Jobs beyond ``count`` (two pools delivered at the same moment) are
    given back at once, without spending a try."""
    jobs: list[Job] = []
    taken: list[tuple[RedisPool, list[Job]]] = []  # what the first look reserved, by pool
    unreachable: list[Refused] = []  # pools the first look could not reach (nothing reserved)
    try:
        for pool, qs in groups:
            try:
                got = await pool.hub.consume(ns, qs, ttr_ms, count - len(jobs), 0)
            except Refused as e:  # the others may have jobs; the long poll looks again
                unreachable.append(e)
                continue
            taken.append((pool, got))
            jobs += got
            if len(jobs) >= count:
                return jobs
    except asyncio.CancelledError:  # the consumer left: give back what it will never get
        for pool, got in taken:
            _give_back_later(pool, ns, got)
        raise
    if jobs or timeout_ms <= 0:
        if not jobs and unreachable:
            raise unreachable[0]
        return jobs
    tasks = {
        asyncio.create_task(pool.hub.consume(ns, qs, ttr_ms, count, timeout_ms)): pool
        for pool, qs in groups
    }
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(not t.exception() and t.result() for t in done):
                break
    finally:
        for t in tasks:
            t.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:  # cancelled meanwhile: the tasks still end on their own
            pass
        if cancelling():  # the consumer left: what a pool delivered goes back, try unspent
            for t, pool in tasks.items():
                t.add_done_callback(functools.partial(_give_back_delivered, pool, ns))
            raise asyncio.CancelledError()
    errors: list[BaseException] = []
    by_pool: list[tuple[RedisPool, list[Job]]] = []
    for t, pool in tasks.items():
        if t.cancelled():
            continue
        if t.exception() is not None:
            errors.append(t.exception())  # type: ignore[arg-type]
        elif t.result():
            by_pool.append((pool, t.result()))
    for pool, got in by_pool:
        keep = got[: count - len(jobs)]
        jobs += keep
        await pool.hub.give_back(ns, got[len(keep) :])
    if not jobs and errors:
        raise errors[0]
    return jobs


def _give_back_delivered(pool: RedisPool, ns: str, task: asyncio.Task[list[Job]]) -> None:
    if not task.cancelled() and task.exception() is None:
        _give_back_later(pool, ns, task.result())


def _give_back_later(pool: RedisPool, ns: str, jobs: list[Job]) -> None:
    """Jobs of a consumer that is gone: back to ready in the background (the hub awaits it
    on close), without spending a try."""
    if jobs:
        pool.hub._background(pool.hub.give_back(ns, jobs))
