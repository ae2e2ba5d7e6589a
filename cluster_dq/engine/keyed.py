"""Publishing under a dedup key or an Idempotency-Key (lua/publish_keyed.lua): one step looks
the keys up, then publishes, replaces the key's waiting job (debounce) or answers what the keys
hold, and records them with the outcome. Such jobs never rest in a wheel bucket (a dedup key's
job is found in the jobs hash). Steps only, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cluster_dq.engine import replies
from cluster_dq.engine.publish import Published, packed_job, place_jobs, signal_event
from cluster_dq.engine.replies import ReplyCode
from cluster_dq.engine.steps import EngineConfig, Op, fixed_keys, lua, signal
from cluster_dq.errors import IdempotencyMismatch, QueueFull, WrongState
from cluster_dq.keys import QueueKeys
from cluster_dq.models import Dedup, Idempotency, JobSpec, id_to_text, validate_keys

# publish_keyed.lua's modes (ARGV dedup_mode), in the order of names.DEDUP_MODES
MODES = {"simple": 1, "throttle": 2, "debounce": 3}
# A keyed job's second byte (publish's "what to do with the bucket", unused without a bucket):
# 1 when the caller made its id up for this call alone, so that the script may tell this
# call's own repeat by it (lua/publish_keyed.lua: `r:<id>`); 0 for a client's id
MADE_UP = 1


@dataclass(frozen=True, slots=True)
class KeyedPublished:
    published: list[Published]
    dedup: str | None  # "new", "existing", "replaced"; None: no dedup key
    replayed: bool  # the answer kept under the Idempotency-Key (nothing written now)


@dataclass(frozen=True, slots=True)
class KeyedRequest:
    """One request's jobs and its keys (``publish_keyed_many`` does several in one call)."""

    specs: Sequence[JobSpec]
    dedup: Dedup | None
    idem: Idempotency | None


def publish_keyed(
    cfg: EngineConfig,
    ns: str,
    q: str,
    specs: Sequence[JobSpec],
    now: int,
    dedup: Dedup | None,
    idem: Idempotency | None,
) -> Op[KeyedPublished]:
    """Publishes ``specs`` (all or none, as a bulk: ``QueueFull``) unless a key answers.
    Safe to repeat: the ids are fixed before the first attempt, so a repeat finds its own job
    under the dedup key or its own answer under the Idempotency-Key, told as new (not
    replayed) when the service made the ids; a client's job_id gets any request's answer."""
    (one,) = yield from publish_keyed_many(cfg, ns, q, [KeyedRequest(specs, dedup, idem)], now)
    if isinstance(one, Exception):
        raise one
    return one


def publish_keyed_many(
    cfg: EngineConfig, ns: str, q: str, requests: Sequence[KeyedRequest], now: int
) -> Op[list[KeyedPublished | Exception]]:
    """Several requests of one queue in one script call (group commit), each done in turn as if
    alone; each one's outcome, or its own error (``IdempotencyMismatch``, ``QueueFull``,
    ``WrongState``), which wrote nothing for it. As safe to repeat as ``publish_keyed``."""
    for r in requests:  # (the service checks them first; the engine's other callers may not)
        validate_keys(r.specs, r.dedup, r.idem)
    qk = QueueKeys(ns, q)
    placed = [place_jobs(cfg, qk, _holding(r), now, wheel_ok=False) for r in requests]
    args: list[Any] = []
    for r, jobs in zip(requests, placed, strict=True):
        dedup, idem = r.dedup, r.idem
        args += [
            dedup.key if dedup else "",
            MODES[dedup.mode] if dedup else 0,
            now + dedup.ttl_ms if dedup else 0,
            idem.key if idem else "",
            idem.fingerprint if idem else b"",
            now + cfg.idempotency_ms,
            len(jobs.members),
            *(
                packed_job(m, d, rec, 0, MADE_UP if made else 0)
                for (m, d, rec, _, _, _), made in zip(jobs.placed, jobs.made_up, strict=True)
            ),
        ]
    keys = {"queue": fixed_keys(qk), "keyed": qk.keyed, "keyed_due": qk.keyed_due}
    call = lua(
        "publish_keyed",
        keys,
        stamped=True,
        now=now,
        notify=qk.notify,
        remember_acked=cfg.remember_acked_ms,
        requests=args,
    )
    raw = yield call
    out: list[KeyedPublished | Exception] = []
    lowered, events = False, []
    for r, jobs, one in zip(requests, placed, raw, strict=True):
        reply = replies.decode_keyed(one)
        # its queue came into being, or its next event moved earlier; or this may be the repeat
        # of a call whose reply was lost, whose signal was never sent (the script says so)
        if reply.lowered:
            lowered = True
            event = signal_event(jobs.event, reply.again_at)
            if event is not None:
                events.append(event)
        try:
            out.append(_answered(ns, q, r, jobs.members, jobs.made_up, reply))
        except (IdempotencyMismatch, QueueFull, WrongState) as e:
            out.append(e)
    if lowered:
        yield signal(qk, cfg, min(events, default=None))
    return out


def _holding(r: KeyedRequest) -> Sequence[JobSpec]:
    """The request's jobs, its first carrying the simple or debounce dedup key it would hold
    (in its record: lua/lib/jobs.lua drop lets the key go with it), and a debounce's its due
    time."""
    if r.dedup is None or r.dedup.mode == "throttle" or not r.specs:
        return r.specs
    debounced = r.dedup.mode == "debounce"  # (its record carries its due time)
    return [replace(r.specs[0], dedup_key=r.dedup.key, debounced=debounced), *r.specs[1:]]


def _answered(
    ns: str,
    q: str,
    r: KeyedRequest,
    members: Sequence[bytes],
    made_up: Sequence[bool],
    reply: replies.KeyedReply,
) -> KeyedPublished:
    if reply.status is ReplyCode.MISMATCH:
        raise IdempotencyMismatch(r.idem.key if r.idem else "")
    if reply.status is ReplyCode.FULL:
        raise QueueFull(ns, q)
    if reply.status is ReplyCode.FORBIDDEN:
        state = replies.job_state(reply.dedup) if reply.dedup is not None else None
        raise WrongState(
            id_to_text(reply.members[0]),
            state,
            "debounce",
            f"the job waiting (delayed or ready): a {state} job is not replaced",
        )
    return _outcome(members, made_up, reply, r.dedup is not None)


def _outcome(
    members: Sequence[bytes], made_up: Sequence[bool], reply: replies.KeyedReply, keyed: bool
) -> KeyedPublished:
    # This very call's own repeat (the engine's, after a lost reply) when the answer names the
    # ids it made up before its first attempt, or the answer kept under its Idempotency-Key was
    # kept by a call that asked for them: no other call has them. A client's job_id names no
    # call: the answer is the one any request with that id gets (duplicate, existing,
    # replaced, replayed).
    own_repeat = all(made_up) and reply.same_ids
    mine = all(made_up) and reply.members == tuple(members)
    existing = reply.dedup is ReplyCode.EXISTING
    published = [
        Published(
            id_to_text(m),
            not made and (c is ReplyCode.DUPLICATE or (existing and m == asked)),
            replies.job_state(c),
        )
        for m, c, made, asked in zip(reply.members, reply.codes, made_up, members)
    ]
    dedup: str | None = None
    if keyed:
        if reply.dedup is ReplyCode.REPLACED:
            dedup = "new" if mine else "replaced"
        elif existing and not mine:
            dedup = "existing"
        elif reply.codes and reply.codes[0] is ReplyCode.DUPLICATE and published[0].duplicate:
            dedup = "existing"  # a client job_id held already, not under this key
        else:
            dedup = "new"
    return KeyedPublished(published, dedup, reply.replayed and not mine and not own_repeat)
