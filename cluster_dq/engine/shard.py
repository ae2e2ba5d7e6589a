"""Steps of the pump and of a queue's shard: the tick that moves what came due, the shard's
schedule (claim, reschedule, reconcile), its leader lease and the sizes of its queues. Steps
only, no I/O (pump.py runs them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING


from cluster_dq.engine import replies
from cluster_dq.engine.replies import Sizes as Sizes  # re-exported: the service and metrics use it
from cluster_dq.keys import BUCKET_WIDTH_MS, QueueKeys, ShardKeys, parse_qualified, shard_of

from cluster_dq.engine.steps import Cmd, EngineConfig, Op, fixed_keys, lua, signal

if TYPE_CHECKING:
    pass


def tick(cfg: EngineConfig, ns: str, q: str, now: int) -> Op[Sizes]:
    """One pump step for a queue: open wheel buckets that start soon (unless consumers lag
    behind), promote due jobs, expire reservations and ttls. Returns sizes and next event.

    The look for buckets to open goes in the same round trip as the promote and expiry
    scripts: most steps find none (a job due within the open lead never enters the wheel),
    and then the step is that one round trip. When buckets open, the scripts run once more
    after them, for the jobs the buckets brought."""
    qk = QueueKeys(ns, q)
    fixed = fixed_keys(qk)
    horizon = now + cfg.open_lead_ms
    probe = (
        Cmd(("ZCARD", qk.ready)),
        Cmd(("ZCOUNT", qk.delayed, "-inf", horizon + BUCKET_WIDTH_MS)),
        Cmd(
            ("ZRANGE", qk.wheel, "-inf", horizon, "BYSCORE", "LIMIT", 0, cfg.open_buckets_per_call)
        ),
    )
    queue = {"queue": fixed}
    steps = (
        lua("promote_due", queue, stamped=True, now=now, limit=cfg.promote_limit, notify=qk.notify),
        lua(
            "expire_reserved",
            queue,
            stamped=True,
            now=now,
            limit=cfg.promote_limit,
            notify=qk.notify,
            seed=repr(cfg.draw()),
        ),
        lua("expire_ttl", queue, stamped=True, now=now, limit=cfg.promote_limit),
        lua("next_event", queue, open_lead=cfg.open_lead_ms),
    )
    first = yield (*probe, *steps)
    (ready, near, names), replies_ = first[:3], [first[3:]]
    held_back = opened = False
    for _ in range(cfg.open_calls_per_tick):
        if not names:
            break
        if int(ready) + int(near) >= cfg.open_backlog:
            held_back = True
            break
        bnames = [n.decode() for n in names]
        keys = {"queue": fixed, "buckets": [qk.bucket(b) for b in bnames]}
        yield lua("open_buckets", keys, stamped=True, now=now, names=bnames)
        opened = True
        ready, near, names = yield probe
    if opened:
        replies_.append((yield steps))
    moved = retried = dead = expired_ = 0
    for reply in replies_:
        promoted = replies.decode_moved(reply[0])
        expired = replies.decode_expire_reserved(reply[1])
        moved += promoted.moved
        retried += expired.retried
        dead += expired.dead
        expired_ += promoted.expired + expired.expired + replies.decode_count(reply[2])
    if cfg.moves:
        cfg.moves.moved(ns, q, moved, retried, dead, expired_)
    result = replies.decode_sizes(replies_[-1][-1])
    if held_back and result.next_event_ms is not None:
        # Consumers lag: look again soon instead of spinning on an overdue bucket.
        result = Sizes(
            result.delayed,
            result.ready,
            result.reserved,
            result.dead,
            max(result.next_event_ms, now + 50),
        )
    return result


def claim(shard: int, now: int, limit: int, lease_ms: int, epoch: int) -> Op[list[str]]:
    """Claims the shard's due queues (re-checked at ``now + lease_ms`` should the pump die).
    Raises ``Fenced`` when ``epoch`` is not the shard's current leadership."""
    sk = ShardKeys(shard)
    keys = {"schedule": sk.schedule, "pending": sk.pending, "epoch": sk.epoch}
    call = lua("claim", keys, now=now, limit=limit, lease_end=now + lease_ms, epoch=epoch)
    return replies.decode_claim((yield call), epoch)


def reschedule(
    shard: int, qualified: str, next_ms: int | None, epoch: int, empty: bool = False
) -> Op[int | None]:
    """After a pump step: the next wake-up, folding in signals received since the claim. A
    queue the step found ``empty`` (no job in any state) leaves the shard's registry, unless a
    signal came meanwhile. Raises ``Fenced`` when ``epoch`` is not the shard's current leadership."""
    sk = ShardKeys(shard)
    keys = {"schedule": sk.schedule, "pending": sk.pending, "epoch": sk.epoch, "queues": sk.queues}
    call = lua(
        "reschedule",
        keys,
        queue=qualified,
        next=-1 if next_ms is None else next_ms,
        epoch=epoch,
        empty="1" if empty else "0",
    )
    return replies.decode_reschedule((yield call), epoch)


def next_schedule(shard: int) -> Op[int | None]:
    sk = ShardKeys(shard)
    head = yield Cmd(("ZRANGE", sk.schedule, 0, 0, "WITHSCORES"))
    return int(head[0][1]) if head else None


# A queue scheduled this much after its own next event is late beyond a pump step in
# progress (a claim pushes the queue one lease, 3 s, ahead while the pump works on it).
RECONCILE_GRACE_MS = 5_000


def reconcile(cfg: EngineConfig, queues: Sequence[QueueKeys], now: int) -> Op[list[str]]:
    """The repair of a lost shard signal (a publisher killed between its queue's script and
    the signal): of ``queues``, those with a next event (META.next) that their shard's schedule
    lacks, or holds much later, are signalled now. Returns their ``ns/q``. Read-only for the
    others; a signal is idempotent (ZADD LT), so a race with a publisher or the pump at worst
    costs the pump one extra step."""
    nexts = yield tuple(Cmd(("HGET", qk.meta, "next")) for qk in queues)
    have = [(qk, int(n)) for qk, n in zip(queues, nexts, strict=True) if n is not None]
    if not have:
        return []
    scores = yield tuple(
        Cmd(("ZSCORE", ShardKeys(shard_of(qk.qualified, cfg.shards)).schedule, qk.qualified))
        for qk, _ in have
    )
    lost = [
        (qk, n)
        for (qk, n), s in zip(have, scores, strict=True)
        if s is None or float(s) > max(n, now) + RECONCILE_GRACE_MS
    ]
    if lost:
        yield tuple(signal(qk, cfg, n) for qk, n in lost)
    return [qk.qualified for qk, _ in lost]


def queues_of_shard(shard: int) -> Op[list[str]]:
    members = yield Cmd(("SMEMBERS", ShardKeys(shard).queues))
    return sorted(m.decode() for m in members)


def sizes_of(cfg: EngineConfig, qualified: Sequence[str], chunk: int = 100) -> Op[dict[str, Sizes]]:
    """Sizes of many queues (``ns/q`` names), in pipelines of ``chunk`` read-only scripts."""
    out: dict[str, Sizes] = {}
    for i in range(0, len(qualified), chunk):
        names = qualified[i : i + chunk]
        got = yield tuple(
            lua(
                "sizes",
                {"queue": fixed_keys(QueueKeys(*parse_qualified(n)))},
                open_lead=cfg.open_lead_ms,
            )
            for n in names
        )
        out.update((n, replies.decode_sizes(r)) for n, r in zip(names, got, strict=True))
    return out


def lead(shard: int, token: str, lease_ms: int, give_up: bool = False) -> Op[int]:
    """Acquires or renews the shard's leadership: its fencing epoch (> 0); when another holds
    it, minus the ms that lease has left; 0 when given up."""
    sk = ShardKeys(shard)
    call = lua(
        "leader",
        {"leader": sk.lock, "epoch": sk.epoch},
        token=token,
        lease=lease_ms,
        release="1" if give_up else "0",
    )
    return replies.decode_leader((yield call))
