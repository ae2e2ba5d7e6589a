"""The reference model's keyed publishes (tests/support/model_ref.py), as lua/publish_keyed.lua
makes them: a mixin of ``Model``, whose fields it reads and writes.

A publish under a dedup key or an Idempotency-Key is one script call. It first trims the
queue's KEYED entries whose time has come (``trim``); then, with an Idempotency-Key whose
answer is kept (until after now), answers that answer (``replayed``), or refuses another
request's fingerprint (MISMATCH), writing nothing. Else the dedup key's holder is found
(``holder``): a simple or debounce key's job while it exists, carries the key and is not dead
(``Model.dedup`` names it; ``MJob.dedup_key`` is the key its record carries), else a throttle
window's job while the window lasts, whatever became of that job. A debounce replaces a waiting
holder (delayed or ready) and is refused (FORBIDDEN) by a reserved or dead one, unless that job
is job 1's client id; any other holder is the answer (EXISTING, with the holder's state, or none
when the window's job is gone). A repeat of a call (its reply lost) answers what its first run
did, whatever holds the key now, writing nothing: REPLACED (kept `r:`), or EXISTING, the job it
made (the holder, present or acked lately); so does a request whose job 1's client id names
another job than the holder, present or acked lately (a duplicate of it); with no holder the jobs are published, all or none
(FULL under the queue's max_size), and a simple or debounce key names the first job, a throttle
key opens a window on it. An Idempotency-Key keeps the answer of a call that wrote (OK) until
its time; a refusal (FULL, FORBIDDEN, MISMATCH) keeps nothing.

``told`` is the answer a client gets for a call, as docs/api.md says it: a job id the service
made up is never a duplicate; a client's job id is a duplicate when it was present or acked
lately, or when it is the key's holder; ``dedup`` is new, existing or replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster_dq.backoff import Backoff
from cluster_dq.engine.replies import JOB_STATES, ReplyCode
from cluster_dq.models import id_to_text
from tests.support.model_job import DEAD, DELAYED, READY, RESERVED, Key, Mismatch, MJob

THROTTLE = "throttle"
STATE_CODES = {
    READY: ReplyCode.READY,
    DELAYED: ReplyCode.DELAYED,
    RESERVED: ReplyCode.RESERVED,
    DEAD: ReplyCode.DEAD,
}


@dataclass(frozen=True)
class Kept:
    """An entry of KEYED (`t:<dedup key>` a throttle window, `i:<idempotency key>` an answer):
    kept until ``until``; a window's job, or an answer's jobs with its codes and fingerprint."""

    until: int
    ids: tuple[str, ...]
    fingerprint: bytes = b""
    dedup: ReplyCode | None = None
    codes: tuple[ReplyCode, ...] = ()


@dataclass(frozen=True)
class KeyedJob:
    """One job of a keyed request: a client's id, or none (the engine makes one up: ``answered``
    is the id its answer gives, which the model takes for a job it places anew), and what its
    record says."""

    client_id: str | None
    answered: str | None
    delay: int
    ttl: int  # from the request's time; 0: none
    tries: int
    priority: int = 0
    group: str | None = None
    backoff: Backoff | None = None


@dataclass(frozen=True)
class Reply:
    """One call's reply (publish_keyed.lua's, as replies.decode_keyed reads it); ``how``: how
    the keys were found, for the run's figures."""

    status: ReplyCode
    replayed: bool = False
    dedup: ReplyCode | None = None
    codes: tuple[ReplyCode, ...] = ()
    ids: tuple[str, ...] = ()
    how: str = ""


class KeyedRules:
    """lua/publish_keyed.lua on ``Model``'s fields (declared here for the reader), with its
    ``duplicate``, ``full``, ``place``, ``gone`` and ``let_one_go``."""

    jobs: dict[Key, MJob | None]
    dedup: dict[tuple[str, str], str]
    keyed: dict[tuple[str, str], Kept]
    max_size: dict[str, int]
    remember_acked_ms: int

    # -- KEYED ---------------------------------------------------------------------------------

    def trim(self, q: str, now: int) -> list[str]:
        """The entries whose time has come go (the call's first step); their fields."""
        old = [f for (q2, f), k in self.keyed.items() if q2 == q and k.until <= now]
        for f in old:
            del self.keyed[(q, f)]
        return old

    def kept(self, q: str, field: str, now: int) -> Kept | None:
        k = self.keyed.get((q, field))
        return k if k is not None and k.until > now else None

    def forget_keyed(self, q: str) -> None:
        """A destroy: every window and answer of the queue goes."""
        for key in [k for k in self.keyed if k[0] == q]:
            del self.keyed[key]

    def holder(self, q: str, key: str, now: int) -> tuple[str | None, str]:
        """The job holding ``key`` and how: 'job' (a simple or debounce key's, alive),
        'window' (a throttle window's), or None ('free')."""
        held = self.dedup.get((q, key))
        j = self.jobs.get((q, held)) if held is not None else None
        if held is not None and j is not None and j.dedup_key == key and j.state != DEAD:
            return held, "job"
        w = self.kept(q, "t:" + key, now)
        if w is not None:
            return w.ids[0], "window"
        return None, "free"

    def state_code(self, q: str, job_id: str) -> ReplyCode | None:
        j = self.jobs.get((q, job_id))
        return None if j is None else STATE_CODES[j.state]

    # -- the call ------------------------------------------------------------------------------

    def publish_keyed(
        self,
        q: str,
        now: int,
        base: int,
        jobs: list[KeyedJob],
        dedup: tuple[str, str, int] | None,
        idem: tuple[str, bytes, int] | None,
        own: tuple[str, ...] | None = None,
        call: int = 0,
    ) -> Reply:
        """One call of publish_keyed.lua at ``now`` (``base``: the request's time, from which
        due times, ttls and the windows count): ``dedup`` (key, mode, window's end),
        ``idem`` (key, fingerprint, the answer's end); ``own``: the ids an earlier run of this
        very call placed (the engine's repeat after a lost reply sends the same ids); ``call``:
        the request (its runs share it: a debounce's replacement is kept under its job 1's id,
        which the model does not know). Applies what it writes; its reply."""
        self.trim(q, now)
        if idem is not None:
            got = self.kept(q, "i:" + idem[0], now)
            if got is not None:
                if got.fingerprint != idem[1]:
                    return Reply(ReplyCode.MISMATCH, how="mismatch")
                return Reply(ReplyCode.OK, True, got.dedup, got.codes, got.ids, "replay")
        reply = self.keyed_dedup(q, now, base, jobs, dedup, own, call)
        if idem is not None and reply.status is ReplyCode.OK:
            self.keyed[(q, "i:" + idem[0])] = Kept(
                idem[2], reply.ids, idem[1], reply.dedup, reply.codes
            )
        return reply

    def keyed_dedup(
        self,
        q: str,
        now: int,
        base: int,
        jobs: list[KeyedJob],
        dedup: tuple[str, str, int] | None,
        own: tuple[str, ...] | None,
        call: int,
    ) -> Reply:
        # the call's ids: a client's, or those it made up (an earlier run's, else unknown yet:
        # never present, taken from the engine's answer once placed)
        ids = [j.client_id or (own[i] if own else f"?{i}") for i, j in enumerate(jobs)]
        held, how = (None, "") if dedup is None else self.holder(q, dedup[0], now)
        mode = dedup[1] if dedup is not None else ""
        if dedup is not None:
            how = f"{mode}: held by a {how}" if held is not None else f"{mode}: free"
        # this call's repeat, its job 1 made (an id made up for it): that job as it is now,
        # whatever holds the key since, nothing written; so is a request whose client id names
        # another job than the holder, present or acked lately: a duplicate of that job
        first = jobs[0].client_id if jobs and jobs[0].client_id is not None else None
        mine_id = own[0] if own is not None and first is None else first
        mine = (
            held is not None
            and mine_id is not None
            and (
                (first is None and held == mine_id)
                or (held != mine_id and self.duplicate(q, mine_id, now))
            )
        )
        if mine and held != mine_id:
            why = "since this call made its job" if first is None else "job 1's id a duplicate"
            how = f"{mode}: held by another {why}"
        st = self.state_code(q, held) if held is not None else None
        if held is not None and st is not None:
            how += f" ({st.name.lower()})"
        waiting = st in (ReplyCode.READY, ReplyCode.DELAYED)
        prior = self.kept(q, f"r:#{call}", now) if mode == "debounce" and jobs else None
        if prior is not None:  # this call's repeat after its first attempt replaced a job
            code = self.state_code(q, prior.ids[0]) or ReplyCode.NOT_FOUND
            return Reply(ReplyCode.OK, False, ReplyCode.REPLACED, (code,), prior.ids, how)
        if mine:
            assert mine_id is not None
            code = self.state_code(q, mine_id) or ReplyCode.NOT_FOUND
            return Reply(ReplyCode.OK, False, ReplyCode.EXISTING, (code,), (mine_id,), how)
        if st is not None and mode == "debounce" and not waiting and held != ids[0]:
            return Reply(ReplyCode.FORBIDDEN, dedup=st, codes=(st,), ids=(held or "",), how=how)
        if held is not None and st is not None and mode == "debounce" and waiting:
            reply = self.replace(q, now, base, held, jobs[0], dedup, how)
            # kept for the call's repeat when its job 1's id is made up for it (it names the
            # entry in the engine: `r:<id>`): the repeat answers it, writing nothing
            if jobs[0].client_id is None and self.remember_acked_ms > 0:
                self.keyed[(q, f"r:#{call}")] = Kept(now + self.remember_acked_ms, (held,))
            return reply
        if held is not None:
            code = st if st is not None else ReplyCode.NOT_FOUND
            return Reply(ReplyCode.OK, False, ReplyCode.EXISTING, (code,), (held,), how)
        new = sum(1 for i in ids if not self.duplicate(q, i, now))
        if self.full(q, new):
            return Reply(ReplyCode.FULL, how=how)
        codes: list[ReplyCode] = []
        for i, j in enumerate(jobs):
            if self.duplicate(q, ids[i], now):
                codes.append(ReplyCode.DUPLICATE)
                continue
            if ids[i].startswith("?"):
                if j.answered is None:
                    raise Mismatch(f"job {i} of a keyed publish is new, yet the engine refused")
                ids[i] = j.answered
            key = dedup[0] if dedup is not None and i == 0 and mode != THROTTLE else None
            state = self.place(
                q,
                ids[i],
                j.client_id is not None,
                base,
                now,
                j.delay,
                j.ttl,
                j.tries,
                j.priority,
                j.backoff,
                False,  # (never in the wheel)
                j.group,
                dedup_key=key,
                debounced=key is not None and mode == "debounce",
            )
            codes.append(ReplyCode.READY if state == READY else ReplyCode.DELAYED)
        if dedup is not None and codes[0] is not ReplyCode.DUPLICATE:
            if mode == THROTTLE:
                self.keyed[(q, "t:" + dedup[0])] = Kept(dedup[2], (ids[0],))
                # a dead job's simple or debounce key, taken over: dropped (revived, that job
                # does not hold it again)
                self.dedup.pop((q, dedup[0]), None)
            else:
                self.dedup[(q, dedup[0])] = ids[0]
        return Reply(ReplyCode.OK, False, None, tuple(codes), tuple(ids), how)

    def replace(
        self,
        q: str,
        now: int,
        base: int,
        held: str,
        job: KeyedJob,
        dedup: tuple[str, str, int],
        how: str,
    ) -> Reply:
        """debounce: the waiting holder's record replaced by the request's (body, ttl, tries,
        due time; its id kept, its last error gone: it starts afresh), out of READY or DELAYED
        and back."""
        old = self.jobs[(q, held)]
        assert old is not None
        self.gone(old)  # (its group counted out, then the new record's counted in)
        if old.state == READY and not old.held:
            self.let_one_go(q, old.group, now)  # (unready: it hands its turn on)
        state = self.place(
            q,
            held,
            old.client_id,
            base,
            now,
            job.delay,
            job.ttl,
            job.tries,
            job.priority,
            job.backoff,
            False,
            job.group,
            dedup_key=dedup[0],  # (the request's record carries its key)
            debounced=True,  # (and its due time)
        )
        self.dedup[(q, dedup[0])] = held  # (a window's job replaced holds the key now)
        code = ReplyCode.READY if state == READY else ReplyCode.DELAYED
        return Reply(ReplyCode.OK, False, ReplyCode.REPLACED, (code,), (held,), how)


def told(reply: Reply, jobs: list[KeyedJob], keyed: bool) -> tuple[Any, ...]:
    """The answer a client gets for ``reply`` (docs/api.md): an error's name (and the job a
    debounce found, with its state), or each job's (id, duplicate, state), the dedup outcome
    (``keyed``: the request had a dedup key) and whether it is a replay."""
    if reply.status is ReplyCode.FULL:
        return ("QueueFull",)
    if reply.status is ReplyCode.MISMATCH:
        return ("IdempotencyMismatch",)
    if reply.status is ReplyCode.FORBIDDEN:
        return ("WrongState", reply.ids[0], JOB_STATES.get(reply.codes[0]))
    existing = reply.dedup is ReplyCode.EXISTING
    published = tuple(
        (
            i,
            j.client_id is not None
            and (c is ReplyCode.DUPLICATE or (existing and i == j.client_id)),
            JOB_STATES.get(c),
        )
        for i, c, j in zip(reply.ids, reply.codes, jobs)
    )
    dedup = None
    if keyed:
        if reply.dedup is ReplyCode.REPLACED:
            dedup = "replaced"
        elif existing or (reply.codes[0] is ReplyCode.DUPLICATE and published[0][1]):
            dedup = "existing"
        else:
            dedup = "new"
    return published, dedup, reply.replayed


def engine_told(out: Any, err: BaseException | None) -> tuple[Any, ...]:
    """The engine's answer (a KeyedPublished, or its error) as ``told`` shows the model's."""
    if err is not None:
        name = type(err).__name__
        if name == "WrongState":
            return (name, getattr(err, "job_id", None), getattr(err, "state", None))
        return (name,)
    published = tuple((p.job_id, p.duplicate, p.state) for p in out.published)
    return published, out.dedup, out.replayed


def unpack_answer(raw: bytes) -> list[Any]:
    """An answer kept in KEYED (after its time and fingerprint), packed by Redis's cmsgpack:
    an array of small integers and short strings, all an answer holds."""
    pos = 0

    def take() -> Any:
        nonlocal pos
        b = raw[pos]
        pos += 1
        if b < 0x80:  # positive fixint
            return b
        if 0xA0 <= b <= 0xBF or b == 0xD9:  # fixstr, str 8
            n = b & 0x1F if b != 0xD9 else raw[pos]
            pos += b == 0xD9
            s = raw[pos : pos + n]
            pos += n
            return s
        if b == 0xCC:  # uint 8
            pos += 1
            return raw[pos - 1]
        if 0x90 <= b <= 0x9F or b == 0xDC:  # fixarray, array 16
            n = b & 0x0F if b != 0xDC else int.from_bytes(raw[pos : pos + 2], "big")
            pos += 2 if b == 0xDC else 0
            return [take() for _ in range(n)]
        raise AssertionError(f"an answer kept in KEYED holds msgpack type {b:#x}: {raw!r}")

    out = take()
    assert pos == len(raw) and isinstance(out, list), f"not one array: {raw!r}"
    return out


def kept_entry(field: bytes, value: bytes) -> Kept:
    """An entry of KEYED as the model keeps it: `t:<key>` -> (`>I6` until, the job's member),
    `i:<key>` -> (`>I6` until, fingerprint, the answer packed)."""
    until = int.from_bytes(value[:6], "big")
    if field.startswith((b"t:", b"r:")):
        return Kept(until, (id_to_text(value[6:]),))
    saved = unpack_answer(value[22:])
    status, _, dedup, _ = saved[:4]
    assert status == ReplyCode.OK, f"a refusal kept under {field!r}: {saved}"
    n = (len(saved) - 4) // 2
    return Kept(
        until,
        tuple(id_to_text(m) for m in saved[4 + n :]),
        value[6:22],
        ReplyCode(dedup) if dedup else None,
        tuple(ReplyCode(c) for c in saved[4 : 4 + n]),
    )
