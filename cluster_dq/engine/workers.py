"""Pure operations on a namespace's worker registry (``keys.WorkerKeys``): announce, list,
retire. Plain commands on one slot; an announcement and its place in the index expire
together, and each announce drops the index's expired entries."""

from __future__ import annotations

from cluster_dq.engine.steps import Cmd, Op
from cluster_dq.keys import WorkerKeys

INDEX_TTL_MS = 3_600_000  # the index outlives its last announcement by at most this long


def announce(ns: str, worker_id: str, blob: bytes, now: int, ttl_ms: int, cap: int) -> Op[bool]:
    """Keeps ``blob`` as the worker's announcement for ``ttl_ms``; False (nothing written)
    when ``cap`` other workers are announced already."""
    wk = WorkerKeys(ns)
    _, known, count = yield (
        Cmd(("ZREMRANGEBYSCORE", wk.seen, "-inf", now)),
        Cmd(("ZSCORE", wk.seen, worker_id)),
        Cmd(("ZCARD", wk.seen)),
    )
    if known is None and int(count) >= cap:
        return False
    yield (
        Cmd(("SET", wk.entry(worker_id), blob, "PX", ttl_ms)),
        Cmd(("ZADD", wk.seen, now + ttl_ms, worker_id)),
        Cmd(("PEXPIRE", wk.seen, max(ttl_ms, INDEX_TTL_MS))),
    )
    return True


def workers(
    ns: str, now: int, limit: int, budget: int, chunk: int = 16
) -> Op[tuple[list[tuple[str, int, bytes]], bool]]:
    """The workers announced and not run out at ``now``: (id, runs out at ms, announcement),
    read ``chunk`` at a time, no more of them than ``budget`` bytes; and whether some were
    left out. (A chunk read holds at most ``chunk`` announcements beyond the budget.)"""
    wk = WorkerKeys(ns)
    ids = yield Cmd(("ZRANGEBYSCORE", wk.seen, now, "+inf", "LIMIT", 0, limit))
    texts = sorted(i.decode() if isinstance(i, bytes) else str(i) for i in ids)
    out: list[tuple[str, int, bytes]] = []
    read = 0
    for start in range(0, len(texts), chunk):
        if read >= budget:
            return out, True
        part = texts[start : start + chunk]
        scores, blobs = yield (
            Cmd(("ZMSCORE", wk.seen, *part)),
            Cmd(("MGET", *(wk.entry(i) for i in part))),
        )
        for i, score, blob in zip(part, scores, blobs):
            if score is not None and blob is not None:
                if read + len(blob) > budget:
                    return out, True
                out.append((i, int(float(score)), blob))
                read += len(blob)
    return out, False


def retire(ns: str, worker_id: str) -> Op[bool]:
    """A worker that stops: its announcement goes at once. False: there was none."""
    wk = WorkerKeys(ns)
    gone, _ = yield (Cmd(("DEL", wk.entry(worker_id))), Cmd(("ZREM", wk.seen, worker_id)))
    return bool(int(gone))
