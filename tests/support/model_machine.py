"""The model-based test's machine (tests/engine/test_model.py), without its rules: its
service on a real Redis with a fake clock and a faulty transport, how a request is run and its
outcomes weighed against the model (``each``, ``settle``), time and faults as rules, and the
observation after every step (``engine_agrees``). The rules are mixins of it
(tests/support/model_publish.py, model_publish_keyed.py, model_delivery.py, model_control.py),
composed in tests/support/model_rules.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import EngineConfig, GroupChanges
from cluster_dq.errors import (
    BadRequest,
    Conflict,
    IdempotencyMismatch,
    NotFound,
    PoolUnavailable,
    QueueFull,
    WrongState,
)
from cluster_dq.keys import QueueKeys, ShardKeys, shard_of
from cluster_dq.models import JobState, id_to_member
from cluster_dq.pools import RedisPool
from cluster_dq.service import Service
from cluster_dq.settings import load
from cluster_dq.testing.invariants import check_queue, queue_keys
from tests.support import flush
from tests.support.model_harness import (
    GROUPS,
    IDEM_MS,
    NS,
    QUEUES,
    REMEMBER_MS,
    START_MS,
    STATS,
    TOLERATE,
    FakeClock,
    Fault,
    Transport,
    matches,
    note,
    patch_clock,
    summary,
    summary_line,
    summary_m,
    view,
)
from tests.support.model_keyed import kept_entry
from tests.support.model_ref import (
    DEAD,
    DELAYED,
    PRIO_SHIFT,
    READY,
    RESERVED,
    GConf,
    Key,
    Mismatch,
    MJob,
    Model,
)


def next_turn(raw: bytes, n: int) -> tuple[int, int]:
    """A rate's next turn as GCONF keeps it (``a:<g>``: ``ms`` then r/n to 12 places, lib/
    groups.lua read_turn) as ``(ms, r)``, r in 0..n-1; what it wrote must read back exactly."""
    whole, dot, frac = raw.decode().partition(".")
    if not dot:
        return int(whole), 0
    r = round(float("0." + frac) * n)
    if not 0 < r < n or f"{r / n:.12f}"[1:] != dot + frac:
        raise Mismatch(f"a next turn {raw!r} that is no whole number of 1/{n} ms")
    return int(whole), r


class ModelMachine(RuleBasedStateMachine):
    deployment: Any = None  # set by the test function (a conftest deployment)

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.sync = self.deployment.sync_client()
        flush(self.sync)
        ps = self.deployment.pool_settings()
        env = {"CLUSTER_DQ_POOL__DEFAULT__ADDR": ps.Addr}
        if ps.Cluster:
            env["CLUSTER_DQ_POOL__DEFAULT__CLUSTER"] = "true"
        self.settings = load(None, env)
        self.pool = RedisPool.create(
            self.settings.Pool["default"],
            EngineConfig(remember_acked_ms=REMEMBER_MS, idempotency_ms=IDEM_MS),
        )
        self.clock = FakeClock(START_MS)
        self.saved = patch_clock(self.clock, self.pool)
        self.run(self.pool.start(run_pump=False))
        self.svc = Service(self.settings, {"default": self.pool})
        self.route = self.svc.route("default")
        self.net = Transport(self.pool, self.clock)
        self.model = Model(REMEMBER_MS)
        self.deliveries = 0
        self.leases: list[tuple[str, str, str]] = []  # every delivery: (queue, job id, lease)
        self.pending = False
        self.held_open = False  # a request's repeat is held (its signal not sent yet)
        STATS["examples"] += 1
        if STATS["examples"] % 200 == 0:  # a long run shows its figures as it goes
            print(summary_line(), flush=True)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            if not self.pending:  # a failed step keeps its own error
                self.clean_up()
        finally:
            for mod, name, value in self.saved:
                setattr(mod, name, value)
            self.run(self.pool.close())
            self.loop.close()
            self.sync.close()

    def clean_up(self) -> None:
        """Nothing left behind: every job acked or the queue destroyed, then no key remains
        but the expiring memory of acked ids."""
        self.net.armed = None
        for (q, g), c in self.model.gconf.items():
            if c != GConf():  # (a destroy keeps GCONF)
                off = GroupChanges(paused=False, clear_concurrency=True, clear_rate=True)
                self.run(self.svc.configure_group(self.route, NS, q, g, off))
        for q in QUEUES:
            if q in self.model.paused or q in self.model.max_size or q in self.model.backoff:
                conf = ["paused", "max_size", "backoff", "backoff_ms", "backoff_cap_ms"]
                conf.append("backoff_jitter")  # (a destroy keeps CONF)
                self.run(self.svc.configure(self.route, NS, q, [(f, "") for f in conf]))
            keys = [k[1] for k in self.model.jobs if k[0] == q and self.model.jobs[k] is not None]
            if keys and q == "a":
                self.run(self.svc.ack(self.route, NS, q, keys))
            else:
                self.run(self.svc.destroy(self.route, NS, q))
            left = queue_keys(self.sync, NS, q)
            if q == "a":  # (acked: KEYED's windows and answers stay until their time)
                qk = QueueKeys(NS, q)
                kept = [k for k in left if k.decode() in (qk.keyed, qk.keyed_due)]
                assert all(self.sync.pexpiretime(k) > 0 for k in kept), f"{kept} never expire"
                left = [k for k in left if k not in kept]
            assert not left, f"queue {q} left keys behind: {left}"

    # -- requests, each checked against the model -------------------------------------------

    def request(self, name: str, coro: Any) -> tuple[Any, BaseException | None]:
        """Runs one service call; returns (answer, error) and counts it."""
        self.net.start_request()
        STATS[f"op {name}"] += 1
        return self.outcome(coro)

    def outcome(self, aw: Any) -> tuple[Any, BaseException | None]:
        """Runs a service call (or the task running one) to its end: (answer, error)."""
        self.pending = True
        try:
            return self.run(aw), None
        except (
            PoolUnavailable,
            NotFound,
            BadRequest,
            Conflict,
            WrongState,
            QueueFull,
            IdempotencyMismatch,
        ) as e:
            return None, e

    def fired(self) -> Any:
        return self.net.fired

    def stamps(self, t0: int, main: tuple[str, ...] = ()) -> list[int]:
        """When the request's script ran, as its ARGV says: the request's start, or, when
        that step (or one before it, ``main`` naming them) was refused and repeated after the
        clock moved, the repeat's time (a repeated step is stamped afresh, and so is every
        stamped step of the operation after it)."""
        f = self.fired()
        if f is not None and f.kind in Fault.REFUSALS and f.ms and any(n in f.step for n in main):
            return [self.clock.now, t0] if "stale-stamp" in TOLERATE else [self.clock.now]
        return [t0]

    def no_503_when_retried(self, name: str, err: BaseException | None) -> None:
        if isinstance(err, PoolUnavailable):
            raise Mismatch(
                f"{name} is retried by the policy, yet one fault ({self.fired()}) answered 503: {err}"
            )

    def settle(self, worlds: list[Model], errors: list[BaseException]) -> None:
        """Keeps the outcomes that the engine's answer allows: the first as the model, the
        others as alternatives the next observation chooses among."""
        if not worlds:
            raise errors[0]
        first = worlds[0]
        for other in worlds[1:]:
            for key in set(first.jobs) | set(other.jobs):
                first.allow(key, other.jobs.get(key))
                for alt in other.alts.get(key, []):
                    first.allow(key, alt)
            for key, t in other.acked.items():
                first.acked.setdefault(key, t)
            first.hidden_alts += [other.hidden(), *other.hidden_alts]
            first.hidden_unknown = first.hidden_unknown or other.hidden_unknown
        self.model = first

    def each(self, candidates: list[Any], apply: Any, unknown: bool = False) -> None:
        """``apply`` to a copy of the model for each candidate (the times a step may have run
        at); ``unknown``: the outcome is unknown (a 503 that may have been applied), so the
        model before the step stays allowed too."""
        worlds, errors = [], []
        for c in candidates:
            m = self.model.copy()
            before = m.copy() if unknown else None
            try:
                apply(m, c)
            except Mismatch as e:
                errors.append(e)
                continue
            if before is not None:
                m.allow_world(before)
            worlds.append(m)
        self.settle(worlds, errors)

    def pick(self, i: int, q: str | None = None) -> Key:
        """A known job (reserved ones more often: where holders matter), or an unknown id."""
        keys = sorted(k for k in self.model.jobs if q is None or k[0] == q)
        held = [k for k in keys if (j := self.model.jobs[k]) is not None and j.state == RESERVED]
        if held and i % 3:
            return held[i % len(held)]
        keys.append((q or QUEUES[i % 2], "nosuchjob"))
        return keys[i % len(keys)]

    def pick_lease(self, i: int, q: str | None = None) -> tuple[str, str, str] | None:
        """A delivery's (queue, job, lease): mostly one that still holds its job, else a stale one."""
        log = [d for d in self.leases if q is None or d[0] == q]
        if not log:
            return None
        live = [d for d in log if (j := self.model.jobs.get(d[:2])) is not None and j.lease == d[2]]
        if live and i % 4:
            return live[i % len(live)]
        return log[i % len(log)]

    @rule(ms=st.sampled_from([1, 29, 30, 31, 499, 1_000, 4_000, 6_000, 20_000, 61_000]))
    def advance(self, ms: int) -> None:
        self.clock.now += ms
        note(f"clock +{ms} -> {self.clock.now}")

    @rule(
        kind=st.sampled_from(Fault.KINDS),
        at=st.sampled_from([0, 0, 0, 1, 2]),
        ms=st.sampled_from([0, 0, 10, 600, 25_000]),
    )
    def fault(self, kind: str, at: int, ms: int) -> None:
        if self.net.armed is None:  # one armed at a time (see the note above dead_sweep)
            self.net.armed = Fault(kind, at, ms)

    # -- observation ----------------------------------------------------------------------------

    @invariant()
    def engine_agrees(self) -> None:
        if self.net.fired is not None:
            note(f"fired: {self.net.fired}")
        armed, self.net.armed = self.net.armed, None  # observations are not faulted
        try:
            self.observe()
        finally:
            self.net.armed = armed

    def observe(self) -> None:
        m = self.model
        seen, keyed = self.read_queues()
        keys = sorted(set(m.jobs) | set(m.alts))

        at_once = asyncio.Semaphore(32)  # well within the pool's connections

        async def peek(q: str, job_id: str) -> Any:
            async with at_once:
                try:
                    return await self.svc.peek_job(self.route, NS, q, job_id)
                except NotFound:
                    return None

        async def peek_all() -> list[Any]:  # at once: reads, and no fault is armed
            looks = [self.svc.sizes(self.route, NS, q) for q in QUEUES]
            looks += [
                self.pool.engine.run(ops.describe_groups(NS, q, GROUPS), idempotent=True)
                for q in QUEUES
            ]
            return await asyncio.gather(*looks, *(peek(q, job_id) for q, job_id in keys))

        found_all = self.run(peek_all())
        n = len(QUEUES)
        sizes, described = dict(zip(QUEUES, found_all[:n])), dict(zip(QUEUES, found_all[n : 2 * n]))
        for key, job in zip(keys, found_all[2 * n :], strict=True):
            q, job_id = key
            STATS["checks"] += 1
            records, leases, held_back, ready = seen[q][:4]
            options = [m.jobs.get(key)] + m.alts.get(key, [])
            member = id_to_member(job_id)
            held = member in held_back
            tag = ready.get(member)  # its READY score below the priority (a grouped job's tag)
            if job is not None and job.state is JobState.READY and held != (job.due_ms is None):
                raise Mismatch(f"{job_id}: held back {held}, yet peek_job's score is {job.due_ms}")
            holder = leases.get(member)
            found: MJob | None | str = next(
                (
                    o
                    for o in options
                    if matches(o, job, member not in records, held, tag)
                    and (o is None or o.lease is None or holder is None or o.lease == holder.hex())
                ),
                "none",
            )
            if isinstance(found, str):
                raise Mismatch(
                    f"job {q}/{job_id}: engine {summary(job, held, tag)}; model allows "
                    f"{[summary_m(o) for o in options]} (clock {self.clock.now})"
                )
            if found is None:
                m.jobs.pop(key, None)
            else:
                if found.state == RESERVED and found.lease is None and holder is not None:
                    found.lease = (
                        holder.hex()
                    )  # a reservation whose answer was lost: held by nobody
                if found.loose:  # an unknown outcome: its tag and holding as found
                    STATS["loose outcome read"] += 1
                    found.loose, found.held = False, held
                    if tag is not None:
                        found.due = tag
                    elif found.state == RESERVED and job.due_ms is not None:
                        found.deadline = job.due_ms
                m.jobs[key] = found
        m.alts.clear()
        self.check_hidden(seen)
        self.check_keyed(keyed)
        self.check_signalled()
        self.pending = False
        for q in QUEUES:
            s = sizes[q]
            mine = Counter(j.state for j in m.of(q))
            want = (mine[DELAYED], mine[READY], mine[RESERVED], mine[DEAD])
            if (s.delayed, s.ready, s.reserved, s.dead) != want:
                raise Mismatch(f"sizes of {q}: engine {s}, model {want}")
            try:
                shape = check_queue(self.sync, NS, q)
            except AssertionError as e:
                if "keeps its meta hash" not in str(e) or "republish-tidy" not in TOLERATE:
                    raise
                STATS["tolerated republish-tidy"] += 1
                self.sync.delete(QueueKeys(NS, q).meta)  # what tidy() would have done
                shape = check_queue(self.sync, NS, q)
            wheel = sum(1 for j in m.of(q, DELAYED) if j.wheel is not None)
            if (shape["wheel"], shape["delayed"]) != (wheel, mine[DELAYED] - wheel):
                raise Mismatch(f"{q}: engine wheel/near delayed {shape}, model wheel {wheel}")
            for j in m.of(q, RESERVED):
                if j.tries < 0:
                    raise Mismatch(f"{j.job_id}: tries exceeded")
            for g in described[q]:
                if view(g) != m.group_view(q, g.name):
                    raise Mismatch(
                        f"group {q}/{g.name}: engine {g}, model {m.group_view(q, g.name)}"
                    )
            STATS["checks"] += 4

    def check_signalled(self) -> None:
        """What the shards were told (lua/signal.lua), unless a fault may have lost a signal
        (``Transport.unsignalled``; the reconcile sweep repairs that): a queue holding jobs is
        registered in its shard, and the pump's schedule looks at it no later than its next
        event (META.next)."""
        if self.net.unsignalled or self.held_open:
            STATS["signals not checked (a fault; a repeat held)"] += 1
            return
        cfg = self.pool.engine.config
        for q in QUEUES:
            qk = QueueKeys(NS, q)
            sk = ShardKeys(shard_of(qk.qualified, cfg.shards))
            nxt = self.sync.hget(qk.meta, "next")
            at = self.sync.zscore(sk.schedule, qk.qualified)
            if self.model.of(q) and not self.sync.sismember(sk.queues, qk.qualified):
                raise Mismatch(f"queue {q} holds jobs, yet its shard does not list it")
            if nxt is not None and (at is None or at > int(nxt)):
                raise Mismatch(
                    f"queue {q}: the pump looks at it at {at}, after its next event {int(nxt)}"
                )
            STATS["checks"] += 1

    def read_queues(self) -> dict[str, tuple[Any, ...]]:
        """What the observation reads of each queue beside peek_job, in one round trip: records,
        leases, the members HELD holds back, READY's scores below the priority (grouped jobs'
        tags, which peek_job does not give), and what the scripts keep beside the jobs (GROUPS,
        GCONF, GWAKE); and apart, each queue's KEYED, KEYED_DUE and their expiry times."""
        p = self.sync.pipeline(transaction=False)
        for q in QUEUES:
            qk = QueueKeys(NS, q)
            p.hgetall(qk.jobs)
            p.hgetall(qk.leases)
            p.zrange(qk.held, 0, -1)
            p.zrange(qk.ready, 0, -1, withscores=True)
            p.hgetall(qk.groups)
            p.hgetall(qk.group_conf)
            p.zrange(qk.group_wake, 0, -1, withscores=True)
            p.hgetall(qk.keyed)
            p.zrange(qk.keyed_due, 0, -1, withscores=True)
            p.pexpiretime(qk.keyed)
            p.pexpiretime(qk.keyed_due)
        got = p.execute()
        out, keyed = {}, {}
        for i, q in enumerate(QUEUES):
            records, leases, held, ready, groups_, gconf, wakes = got[11 * i : 11 * i + 7]
            held_ids = {h.split(b"\0", 1)[1] for h in held}
            tags = {m: int(sc) % PRIO_SHIFT for m, sc in ready}
            out[q] = (records, leases, held_ids, tags, groups_, gconf, wakes)
            keyed[q] = tuple(got[11 * i + 7 : 11 * i + 11])
        return out, keyed

    def check_hidden(self, seen: dict[str, tuple[Any, ...]]) -> None:
        """Groups' settings exactly as the model has them; the groups' last tags, the rates'
        next allowed deliveries and their wake-ups as one of the outcomes it allows (taken from
        the engine when it cannot know them: after a consume whose reply was lost)."""
        m = self.model
        tags: dict[tuple[str, str], Any] = {}
        tat: dict[tuple[str, str], tuple[int, int]] = {}
        turns: dict[tuple[str, str], bytes] = {}
        wake: dict[tuple[str, str], int] = {}
        conf: dict[tuple[str, str], GConf] = {}
        for q, (_, _, _, _, groups_, gconf, wakes) in seen.items():
            for f, x in groups_.items():
                kind, _, g = f.decode().partition(":")
                if kind == "t":  # `<tag>` (period 0) or `<tag> <period>`
                    tag, _, period = x.decode().partition(" ")
                    tags[(q, g)] = (int(tag), int(period or 0))
                elif kind == "e":
                    tags[(q, "")] = int(x)
            for f, x in gconf.items():
                kind, _, g = f.decode().partition(":")
                c = conf.setdefault((q, g), GConf())
                if kind == "a":
                    turns[(q, g)] = x
                elif kind == "p":
                    c.paused = x == b"1"
                elif kind == "c":
                    c.concurrency = int(x)
                else:
                    jobs, per = x.split()
                    c.rate = (int(jobs), int(per))
            for g, at in wakes:
                wake[(q, g.decode())] = int(at)
        for key, x in turns.items():
            rate = conf[key].rate
            if rate is None:
                raise Mismatch(f"group {key}: a next turn {x!r} kept without a rate")
            tat[key] = next_turn(x, rate[0])
        mine = {k: c for k, c in m.gconf.items() if c != GConf()}
        if {k: c for k, c in conf.items() if c != GConf()} != mine:
            raise Mismatch(f"group settings: engine {conf}, model {mine}")
        found = (
            tuple(sorted(tags.items())),
            tuple(sorted(tat.items())),
            tuple(sorted(wake.items())),
        )
        if m.hidden_unknown:
            STATS["hidden state read after an unknown outcome"] += 1
        elif found != m.hidden() and found not in m.hidden_alts:
            raise Mismatch(
                f"last tags, rate times, wake-ups: engine {found}, model {m.hidden()} "
                f"(or {m.hidden_alts})"
            )
        m.set_hidden(found)
        m.hidden_alts, m.hidden_unknown = [], False

    def check_keyed(self, seen: dict[str, tuple[Any, ...]]) -> None:
        """Each queue's KEYED exactly as the model has it: every throttle window (its end and
        job) and every Idempotency-Key's answer (its end, fingerprint, dedup outcome, codes and
        jobs), those past their time until a keyed publish trims them; KEYED_DUE the same fields
        at the same times; both keys expiring at the last one's time."""
        for q, (entries, due, expiry, due_expiry) in seen.items():
            # a debounce's replacement, `r:<its made-up job 1>`: by time and job, as a multiset
            # (the model knows the call, not that id)
            every = {f: kept_entry(f, v) for f, v in entries.items()}
            found = {f.decode(): k for f, k in every.items() if not f.startswith(b"r:")}
            found_r = sorted((k.until, k.ids) for f, k in every.items() if f.startswith(b"r:"))
            all_mine = {f: k for (q2, f), k in self.model.keyed.items() if q2 == q}
            mine = {f: k for f, k in all_mine.items() if not f.startswith("r:")}
            mine_r = sorted((k.until, k.ids) for f, k in all_mine.items() if f.startswith("r:"))
            if found != mine or found_r != mine_r:
                raise Mismatch(f"KEYED of {q}: engine {every}, model {all_mine}")
            if {f for f in every if f.startswith(b"r:")} != {
                f for f, _ in due if f.startswith(b"r:")
            }:
                raise Mismatch(
                    f"KEYED and KEYED_DUE of {q} name other replacements: {every}, {due}"
                )
            due_named = {f.decode(): int(t) for f, t in due if not f.startswith(b"r:")}
            due_r = sorted(int(t) for f, t in due if f.startswith(b"r:"))
            if due_named != {f: k.until for f, k in mine.items()} or due_r != [
                u for u, _ in mine_r
            ]:
                raise Mismatch(f"KEYED_DUE of {q}: engine {due}, model {all_mine}")
            last = max((k.until for k in all_mine.values()), default=-2)  # (-2: no such key)
            if (expiry, due_expiry) != (last, last):
                raise Mismatch(f"KEYED of {q} expires at {expiry} / {due_expiry}, model {last}")
            STATS["checks"] += 1
