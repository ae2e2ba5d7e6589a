"""Queue-wide operations: its settings, destroy, respawn and delete its dead jobs, and the
overview of a namespace's queues. Steps only, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING


from cluster_dq.engine import replies
from cluster_dq.engine.replies import Sizes as Sizes  # re-exported: the service and metrics use it
from cluster_dq.keys import QueueKeys, ShardKeys, shard_of
from cluster_dq.queueconf import QueueSettings

from cluster_dq.engine.steps import (
    Call,
    Cmd,
    EngineConfig,
    Op,
    fixed_keys,
    keep_listed,
    lua,
    signal,
)

from cluster_dq.engine.lookups import ready_due

if TYPE_CHECKING:
    pass


def destroy(cfg: EngineConfig, ns: str, q: str) -> Op[int]:
    """Deletes a queue in every state, in bounded steps. Returns the number of jobs deleted."""
    qk = QueueKeys(ns, q)
    deleted = 0
    while True:
        names = yield Cmd(("ZRANGE", qk.wheel, 0, 63))
        bnames = [n.decode() for n in names]
        final = "1" if len(bnames) < 64 else "0"
        keys = {
            "queue": fixed_keys(qk),
            "results": qk.results,
            "results_due": qk.results_due,
            "keyed": qk.keyed,
            "keyed_due": qk.keyed_due,
            "buckets": [qk.bucket(b) for b in bnames],
        }
        reply = replies.decode_destroy((yield lua("destroy", keys, final=final, names=bnames)))
        deleted += reply.deleted
        if reply.gone:
            break
    sk = ShardKeys(shard_of(qk.qualified, cfg.shards))
    yield (
        Cmd(("SREM", sk.queues, qk.qualified)),
        Cmd(("ZREM", sk.schedule, qk.qualified)),
        Cmd(("HDEL", sk.pending, qk.qualified)),
    )
    return deleted


def respawn(cfg: EngineConfig, ns: str, q: str, limit: int, ttl_ms: int, now: int) -> Op[int]:
    qk = QueueKeys(ns, q)
    done = 0
    while done < limit:
        step = min(limit - done, 500)
        call = lua(
            "respawn",
            {"queue": fixed_keys(qk)},
            stamped=True,
            now=now,
            limit=step,
            ttl=ttl_ms,
            notify=qk.notify,
        )
        reply = replies.decode_respawn((yield call))
        n = reply.respawned
        if reply.lowered:
            yield signal(qk, cfg, now + ttl_ms if ttl_ms else None)
        done += n
        if n < step:
            break
    return done


def delete_dead(ns: str, q: str, limit: int) -> Op[int]:
    qk = QueueKeys(ns, q)
    done = 0
    while done < limit:
        step = min(limit - done, 500)
        n = replies.decode_count((yield lua("delete_dead", {"queue": fixed_keys(qk)}, limit=step)))
        done += n
        if n < step:
            break
    return done


def queue_settings(ns: str, q: str) -> Op[QueueSettings]:
    """The queue's own settings (its CONF hash)."""
    return QueueSettings.from_hash((yield Cmd(("HGETALL", QueueKeys(ns, q).conf))))


def queue_known(ns: str, q: str) -> Op[bool]:
    """Whether the queue exists here: a job in any state (JOBS, or META counting wheel jobs),
    settings of its own (CONF) or a schedule. A name nothing was written to is unknown."""
    qk = QueueKeys(ns, q)
    return bool((yield Cmd(("EXISTS", qk.jobs, qk.meta, qk.conf, qk.schedules))))


def configure(
    cfg: EngineConfig, ns: str, q: str, changes: Sequence[tuple[str, str]]
) -> Op[QueueSettings]:
    """Changes the queue's own settings (``queueconf.parse_changes``: field, value; '' removes
    it) atomically; resuming a queue wakes its long-polls. Returns the settings after it. A
    queue with settings is listed (``keep_listed``)."""
    qk = QueueKeys(ns, q)
    fields = [x for pair in changes for x in pair]
    raw = yield lua("configure", {"queue": fixed_keys(qk)}, notify=qk.notify, fields=fields)
    yield from keep_listed(qk, cfg)
    return QueueSettings.from_hash(dict(zip(raw[0::2], raw[1::2])))


@dataclass(frozen=True, slots=True)
class QueueOverview:
    """One queue as the namespace listing shows it."""

    name: str
    sizes: Sizes
    paused: bool
    oldest_due_ms: int | None  # the due time of the job at the head of READY


def queues_of_namespace(shards: int, ns: str) -> Op[list[str]]:
    """The names of the namespace's queues in the shard registries, those holding jobs and
    those with settings (every shard in one pipeline), sorted."""
    sks = [ShardKeys(s) for s in range(shards)]
    got = yield tuple(Cmd(("SMEMBERS", key)) for sk in sks for key in (sk.queues, sk.configured))
    prefix = ns + "/"
    return sorted(
        {m.decode()[len(prefix) :] for ms in got for m in ms if m.decode().startswith(prefix)}
    )


def overview(cfg: EngineConfig, ns: str, queues: Sequence[str]) -> Op[list[QueueOverview]]:
    """Sizes, paused flag and READY's head of each queue: one pipeline of read-only steps."""
    steps: list[Call] = []
    for q in queues:
        qk = QueueKeys(ns, q)
        steps += [
            lua("sizes", {"queue": fixed_keys(qk)}, open_lead=cfg.open_lead_ms),
            Cmd(("HGET", qk.conf, "paused")),
            Cmd(("ZRANGE", qk.ready, 0, 0, "WITHSCORES")),
        ]
    got = (yield tuple(steps)) if steps else []
    found: list[tuple[bytes, float] | None] = []
    for i in range(len(queues)):
        head = got[3 * i + 2]
        pair = (head[0] if isinstance(head[0], (tuple, list)) else head[:2]) if head else None
        found.append((bytes(pair[0]), float(pair[1])) if pair else None)
    # the heads' records: a grouped job's score is its place in the fair order, not its due time
    wanted = [(q, h) for q, h in zip(queues, found) if h is not None]
    records = (
        (yield tuple(Cmd(("HGET", QueueKeys(ns, q).jobs, h[0])) for q, h in wanted))
        if wanted
        else ()
    )
    by_queue = {q: rec for (q, _), rec in zip(wanted, records)}
    out = []
    for i, q in enumerate(queues):
        sizes_, paused = got[3 * i : 3 * i + 2]
        h, rec = found[i], by_queue.get(q)
        oldest = ready_due(h[0], rec, h[1]) if h is not None and rec is not None else None
        out.append(QueueOverview(q, replies.decode_sizes(sizes_), paused in (b"1", "1"), oldest))
    return out
