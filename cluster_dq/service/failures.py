"""The one place a Redis failure (the engine's error tree) becomes what the client is told:
``PoolUnavailable`` with advice on what may have happened, and whether repeating is safe."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from cluster_dq.engine.commands import Published
from cluster_dq.errors import NotReplicated, PoolUnavailable, RedisFailure, Refused

UNKNOWN = "the request may or may not have been applied"
# Said when nothing of the request can have reached Redis (the client's ``Unavailable`` reads
# "nothing was written" and "repeating it is safe": it repeats even a once-only call).
NOTHING_WRITTEN = (
    "nothing was written (redis refused or could not be reached); repeating it is safe"
)
NOTHING_RESERVED = (
    "nothing was written: no job was reserved for this request (redis refused or could not "
    "be reached); repeating it is safe"
)


@contextlib.contextmanager
def unavailable(
    pool: str,
    *,
    idempotent: bool = False,
    unknown: str | None = UNKNOWN,
    what: str = "",
    nothing: str = NOTHING_WRITTEN,
) -> Iterator[None]:
    """The one place a Redis failure (the engine's error tree) becomes what the client is told:
    ``PoolUnavailable``, with advice on what may have happened (``unknown``: the advice when
    the outcome is unknown; None: no advice then; ``nothing``: when nothing was written)."""
    try:
        yield
    except NotReplicated as e:
        raise PoolUnavailable(pool, str(e), not_replicated(e, idempotent)) from e
    except RedisFailure as e:
        if nothing_written(e):
            advice = nothing
        else:
            advice = "" if unknown is None else outcome(e, idempotent, unknown)
        raise PoolUnavailable(pool, f"{what}{e}", advice) from e


@contextlib.contextmanager
def written_before(written: bool, *, idempotent: bool) -> Iterator[None]:
    """A step of a request that spans pools (a migration), after an earlier pool's step that
    ``written``: its failure may not say "nothing was written", the request was applied in
    part (a repeat of a once-only one, a respawn, would do its part again)."""
    try:
        yield
    except PoolUnavailable as e:
        if not written or not nothing_written(e):
            raise
        advice = "the request was applied in part (on another pool of the queue); " + (
            "repeating it is safe" if idempotent else "look before repeating it"
        )
        raise PoolUnavailable(e.pool, e.detail, advice) from e


def nothing_written(e: BaseException | None) -> bool:
    """Whether a failure (a ``RedisFailure``, or the ``PoolUnavailable`` made of one) can have
    written nothing: the engine says so, or, where no engine did, the server refused it."""
    if isinstance(e, PoolUnavailable):
        e = e.__cause__
    if not isinstance(e, RedisFailure) or isinstance(e, NotReplicated):
        return False
    return e.nothing_written if e.nothing_written is not None else isinstance(e, Refused)


def not_replicated(e: NotReplicated, idempotent: bool) -> str:
    result = e.result[1] if isinstance(e.result, tuple) else e.result
    items = result if isinstance(result, list) else [result]
    ids = [p.job_id for p in items if isinstance(p, Published)]
    what = f"job(s) {', '.join(ids)} written" if ids else "the write was applied"
    safe = (
        "repeating the request is safe (publishing with the same job_id is idempotent)"
        if ids
        else "repeating it is safe"
        if idempotent
        else "look the job up before repeating it"
    )
    return f"{what} on the master, but {e}: it may be lost if the master fails now; {safe}"


def outcome(e: RedisFailure, idempotent: bool, unknown: str) -> str:
    """What a 503 tells the client of its request (when something may have been written)."""
    if nothing_written(e):
        return NOTHING_WRITTEN
    if idempotent:
        return "the request may have been applied; repeating it is safe"
    return unknown
