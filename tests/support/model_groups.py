"""The reference model's groups (tests/support/model_ref.py), as the scripts act on them
(lua/lib/groups.lua, the group parts of lib/jobs.lua, lib/promote.lua): a mixin of ``Model``,
whose fields it reads and writes.

A grouped job's READY score is its group's fair tag (``fair_tag``: ``max(V, the
group's last tag + 1)``, V the tag of READY's head, or the job's time when READY is empty); a
consume holds back (``MJob.held``) the jobs of a paused group, of one at its concurrency limit,
or of one its rate (``rate_turn``: deliveries at least P/n apart) does not let go yet, and then
registers the group's wake-up (``wake``); a job leaving RESERVED, or leaving READY without a
reservation, brings one held job of its group back (``let_one_go``), at READY's head; a wake-up
(run first by every promote) one per turn; a change of a group's settings all that it now
lets go (under a rate: one, the rest by turns). Every move runs in the order the scripts run it
(READY popped in batches, DELAYED, RESERVED, EXPIRE and the wake-ups in score then member
order), since the order in which jobs become ready is their tags' order. What the scripts keep
beside the jobs (each group's last tag, each rate's next allowed delivery, each wake-up) is
``Model.hidden``; the observation compares it with Redis after every step, and every ready
grouped job's tag with its READY score.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from cluster_dq.engine.groups import UNHOLD_PER_CALL
from tests.support.model_job import EVENTS, READY, RESERVED, GConf, GKey, Key, MJob


class GroupRules:
    """lib/groups.lua and the group parts of lib/jobs.lua and lib/promote.lua, on ``Model``'s
    fields (declared here for the reader; ``Model`` holds them)."""

    jobs: dict[Key, MJob | None]
    gconf: dict[GKey, GConf]
    tags: dict[GKey, int]
    tat: dict[GKey, float]
    wake: dict[GKey, int]
    batched: bool
    head: dict[int, int]

    def of(self, q: str, state: str | None = None) -> list[MJob]:
        raise NotImplementedError  # (Model's)

    def conf(self, q: str, g: str) -> GConf:
        return self.gconf.get((q, g)) or GConf()

    def room(self, q: str, g: str, but: MJob | None = None) -> float:
        """group_room: how many more of g's jobs may be reserved (``but``: a job on its way
        out of RESERVED, no longer counted)."""
        c = self.conf(q, g)
        if c.paused:
            return 0
        if c.concurrency is None:
            return math.inf
        busy = sum(1 for j in self.of(q, RESERVED) if j.group == g and j is not but)
        return c.concurrency - busy

    def group_view(self, q: str, g: str) -> tuple[Any, ...]:
        """A group as describe_groups shows it: size (every state), reserved, held back,
        paused, concurrency limit, rate."""
        mine = [j for j in self.of(q) if j.group == g]
        c = self.conf(q, g)
        return (
            len(mine),
            sum(1 for j in mine if j.state == RESERVED),
            sum(1 for j in mine if j.held),
            c.paused,
            c.concurrency,
            c.rate,
        )

    def head_tag(self, q: str, t: int, prio: int, fresh: bool = False) -> int:
        """V: the tag (score below the priority) of READY's first job of priority ``prio``;
        ``t`` when it has none (a publish's call: as it first read it). ``fresh`` (a job being
        tagged): READY empty begins a busy period (the queue's, kept under group ``""``)."""
        if self.batched and prio in self.head:
            return self.head[prio]
        ready = [j for j in self.of(q, READY) if not j.held and j.priority == prio]
        if not ready:
            if fresh and not any(not j.held for j in self.of(q, READY)):
                self.tags[(q, "")] = self.period(q) + 1
            return t
        v = min(ready, key=MJob.order).due
        if self.batched:
            self.head[prio] = v
        return v

    def batch(self, on: bool) -> None:
        """publish.lua's call begins (on) or ends: its groups' bookkeeping batched."""
        self.batched, self.head = on, {}

    def period(self, q: str) -> int:
        p = self.tags.get((q, ""), 0)
        assert isinstance(p, int)
        return p

    def fair_tag(self, q: str, g: str, t: int, prio: int) -> int:
        """``max(V, the group's last tag + 1)``, its last tag counting only in the busy period
        it was given in."""
        last = self.tags.get((q, g))
        v = self.head_tag(q, t, prio, fresh=True)
        period = self.period(q)
        if isinstance(last, tuple) and last[1] == period and last[0] + 1 > v:
            v = last[0] + 1
        self.tags[(q, g)] = (v, period)
        return v

    def make_ready(self, j: MJob, t: int) -> None:
        """Into READY at ``t`` (a grouped job: at its group's fair tag). ``j`` is in no state
        set meanwhile."""
        if j.group is not None:
            t = self.fair_tag(j.queue, j.group, t, j.priority)
        j.state, j.held, j.wheel, j.due = READY, False, None, t

    def held_back(self, q: str, g: str) -> list[MJob]:
        """HELD's jobs of g, in its order (the ids')."""
        return sorted((j for j in self.of(q, READY) if j.held and j.group == g), key=MJob.member)

    def unhold(self, q: str, g: str, n: float, t: int) -> int:
        """Up to ``n`` of the jobs g holds back into READY, at its head, in id order."""
        if n <= 0:
            return 0
        held = self.held_back(q, g)
        back = held if n == math.inf else held[: int(n)]
        EVENTS["group: held job brought back"] += len(back)
        # one tag apart just behind the head of their priority, that head read once per call
        base = {p: self.head_tag(q, t, p) for p in {j.priority for j in back}}
        for k, j in enumerate(back, 1):
            j.state, j.held, j.wheel, j.due = READY, False, None, base[j.priority] + k
        return len(back)

    def let_one_go(self, q: str, g: str | None, t: int, but: MJob | None = None) -> None:
        """A job of g left RESERVED, or READY unreserved: one job its concurrency limit held
        back comes back (``but``: a job on its way out of RESERVED, no longer counted)."""
        if g is not None and self.conf(q, g).concurrency is not None:
            self.unhold(q, g, min(self.room(q, g, but), 1), t)

    def unreserve(self, j: MJob, t: int, but: MJob | None = None) -> None:
        """``j`` left RESERVED (its state changed already, or ``but``)."""
        self.let_one_go(j.queue, j.group, t, but)

    def rate_turn(self, q: str, g: str, now: int) -> int:
        """0 when one of g's jobs may go at ``now`` (its turn taken), else the ms it may: turns
        ``P/n`` apart from the later of the next turn (``a:<g>``: ``ms + r/n``, kept as the
        whole numbers ``(ms, r)``) and now."""
        rate = self.conf(q, g).rate
        assert rate is not None
        n, per = rate
        ms, r = self.tat.get((q, g), (0, 0))
        if ms > now:
            return ms
        if ms < now:
            ms, r = now, 0
        self.tat[(q, g)] = (ms + (r + per) // n, (r + per) % n)
        return 0

    def wake_group(self, q: str, g: str, now: int, limit: int = 1_000) -> None:
        """lib/promote.lua wake_group: the held jobs whose turns fall within this ms go (its
        room allowing), and it stays registered, at its next turn, while it holds jobs back."""
        self.wake.pop((q, g), None)
        rate = self.conf(q, g).rate
        room = self.room(q, g) if rate is not None else 0
        if rate is None or room <= 0:
            return
        n, per = rate
        ms, r = self.tat.get((q, g), (0, 0))
        if ms < now:
            ms, r = now, 0
        turns = 0
        if ms <= now:  # every turn of this ms: before now + 1
            turns = -(-(n - r) // per)
            EVENTS["group: a rate's turn came"] += 1
        self.unhold(q, g, min(turns, room, limit), now)
        if self.held_back(q, g):
            self.wake[(q, g)] = ms + (r + turns * per) // n

    def wake_groups(self, q: str, now: int, limit: int = 1_000) -> None:
        """lib/promote.lua wake_groups: the rate wake-ups due by ``now``, in score then name
        order."""
        due = sorted((w, g.encode(), g) for (q2, g), w in self.wake.items() if q2 == q and w <= now)
        for _, _, g in due[:limit]:
            self.wake_group(q, g, now, limit)

    def group_configure(
        self, q: str, g: str, paused: bool | None, conc: int | None, rate: Any, now: int
    ) -> int:
        """group_configure.lua: the settings changed (None: left as they are; ``conc`` 0: the
        limit removed; ``rate`` Ellipsis: left, None: removed, a new or no rate starting afresh),
        then what the group held back and may now go brought back: under a rate, its first
        turn now (the others by its wake-ups), else as many as its room allows at once."""
        old = self.conf(q, g)
        c = copy.copy(old)
        if paused is not None:
            c.paused = paused
        if conc is not None:
            c.concurrency = conc or None
        if rate is not ...:
            c.rate = rate
        self.gconf[(q, g)] = c
        if (c.paused, c.concurrency, c.rate) == (old.paused, old.concurrency, old.rate):
            EVENTS["group: the same settings again"] += 1
            return 0  # nothing more: its first call let go what the change allowed
        if c.rate != old.rate:
            self.tat.pop((q, g), None)
            self.wake.pop((q, g), None)
        room = self.room(q, g)
        if self.held_back(q, g):
            EVENTS[f"group: changed while it holds jobs back, room {min(room, 9)}"] += 1
        if c.rate is not None and room > 0:
            if self.held_back(q, g):
                self.wake_group(q, g, now)
            return 0
        return self.unhold(q, g, min(room, UNHOLD_PER_CALL), now)

    def hold(self, j: MJob, turn: int) -> None:
        """consume: ``j`` held back by its group; ``turn`` > 0: by its rate until then."""
        j.state, j.held = READY, True
        if turn > 0:
            key = (j.queue, j.group or "")
            self.wake[key] = min(self.wake.get(key, turn), turn)  # (ZADD LT)
