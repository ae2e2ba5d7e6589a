"""The history checker (loadtest/history_check.py) on hand-made histories: a clean history
passes, and each anomaly is found (and only it). Pure: no Redis, no service."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from loadtest.history_check import KINDS, Final, History, Report, check


class Script:
    """Builds a history by hand: one call per operation, with its invoke and completion times."""

    def __init__(self) -> None:
        self.h = History()

    def op(
        self,
        f: str,
        t0: float,
        t1: float,
        type: str = "ok",
        process: int = 0,
        result: dict[str, Any] | None = None,
        **args: Any,
    ) -> None:
        op = self.h.invoke(process, f, t0, **args)
        if type != "none":
            self.h.complete(op, type, t1, **(result or {}))

    def publish(
        self, key: str, t0: float, t1: float, type: str = "ok", delay_ms: int = 0, tries: int = 1
    ) -> None:
        self.op(
            "publish",
            t0,
            t1,
            type,
            key=key,
            queue="q",
            delay_ms=delay_ms,
            tries=tries,
            result={"job_id": "id-" + key} if type == "ok" else {},
        )

    def consume(
        self,
        key: str,
        t0: float,
        t1: float,
        remain: int,
        deliveries: int,
        ttr_ms: int = 1000,
        lease: str | None = None,
        process: int = 1,
    ) -> None:
        job = {
            "key": key,
            "job_id": "id-" + key,
            "remain_tries": remain,
            "deliveries": deliveries,
            "lease": lease,
        }
        self.op(
            "consume", t0, t1, process=process, queues=["q"], ttr_ms=ttr_ms, result={"jobs": [job]}
        )

    def act(
        self,
        f: str,
        key: str,
        t0: float,
        t1: float,
        type: str = "ok",
        job_id: str | None = None,
        **args: Any,
    ) -> None:
        self.op(f, t0, t1, type, key=key, job_id=job_id or "id-" + key, **args)

    def check(
        self, states: dict[str, str | None] | None = None, dead: int = 0, **leftovers: Any
    ) -> Report:
        return check(self.h, Final(states or {}, {"q": dead}, leftovers))


def only(report: Report, kind: str | None, n: int = 1) -> None:
    found = {k: c for k, c in report.counts.items() if c}
    assert found == ({kind: n} if kind else {}), (found, report.examples)


def clean() -> Script:
    """Two jobs: one acked at once, one dropped (ttr ran out), delivered again and acked."""
    s = Script()
    s.publish("a", 0.0, 0.1, delay_ms=500, tries=2)
    s.publish("b", 0.0, 0.1, tries=3)
    s.consume("b", 0.1, 0.2, remain=2, deliveries=1, ttr_ms=1000)
    s.consume("a", 0.6, 0.7, remain=1, deliveries=1)
    s.act("ack", "a", 0.7, 0.8)
    s.consume("b", 1.0, 1.25, remain=1, deliveries=2)  # 1.25 > 0.1 + 1 s ttr
    s.act("ack", "b", 1.3, 1.4)
    return s


def test_a_clean_history_passes() -> None:
    r = clean().check()
    only(r, None)
    assert (
        r.stats["publish_ok"] == 2
        and r.stats["deliveries"] == 3
        and r.stats["redelivered_jobs"] == 1
    )


def test_unexpected_delivery() -> None:
    s = clean()
    s.consume("ghost", 2.0, 2.1, remain=0, deliveries=1)
    only(s.check(), "unexpected")
    s = clean()  # a publish that certainly failed (4xx) is not a publish
    s.publish("c", 2.0, 2.1, type="fail")
    s.consume("c", 2.2, 2.3, remain=0, deliveries=1)
    only(s.check(), "unexpected")


def test_double_publish() -> None:
    s = clean()
    s.publish("c", 2.0, 2.1)
    s.consume("c", 2.2, 2.3, remain=0, deliveries=1)
    s.op(
        "consume",
        2.2,
        2.3,
        process=2,
        queues=["q"],
        ttr_ms=1000,
        result={"jobs": [{"key": "c", "job_id": "other", "remain_tries": 0, "deliveries": 1}]},
    )
    s.act("ack", "c", 2.4, 2.5)
    only(s.check(), "double_publish")


def test_an_indeterminate_publish_may_be_delivered_or_not() -> None:
    s = clean()
    s.publish("c", 2.0, 2.1, type="info")
    s.publish("d", 2.0, 2.1, type="info")
    s.publish("e", 2.0, 0, type="none")  # never completed: the client gave up
    s.consume("c", 2.2, 2.3, remain=0, deliveries=1)
    s.act("ack", "c", 2.3, 2.4)
    only(s.check(), None)


def test_lost_acknowledged_publish() -> None:
    s = clean()
    s.publish("c", 2.0, 2.1)
    r = s.check()
    only(r, "lost")
    assert r.stats["never_delivered"] == 1
    s = clean()  # delivered, dropped with tries left, then gone without an ack
    s.publish("c", 2.0, 2.1, tries=2)
    s.consume("c", 2.2, 2.3, remain=1, deliveries=1)
    only(s.check(), "lost")


def test_duplicated_after_ack() -> None:
    s = clean()
    s.consume("a", 0.9, 1.0, remain=0, deliveries=2)  # asked for after the ack of 0.8 succeeded
    only(s.check(), "duplicated")
    s = clean()  # a consume sent while the ack was under way is at-least-once, not a duplicate
    s.consume("a", 0.75, 0.9, remain=0, deliveries=2)
    assert s.check().counts["duplicated"] == 0


def test_early_from_the_publish_and_from_a_release() -> None:
    s = clean()
    s.publish("c", 2.0, 2.1, delay_ms=1000)
    s.consume("c", 2.2, 2.95, remain=0, deliveries=1)  # the reply came before 2.0 + 1 s
    s.act("ack", "c", 3.0, 3.1)
    only(s.check(), "early")
    # Due at 3.0 at the earliest only if published at its invoke: a reply at 3.05 is not early
    # even though it is before publish ack (2.1) + delay.
    s = clean()
    s.publish("c", 2.0, 2.1, delay_ms=1000)
    s.consume("c", 2.2, 3.05, remain=0, deliveries=1)
    s.act("ack", "c", 3.1, 3.2)
    only(s.check(), None)
    s = clean()  # released with a 2 s delay, delivered again 1 s later
    s.publish("c", 2.0, 2.1, tries=2)
    s.consume("c", 2.2, 2.3, remain=1, deliveries=1)
    s.act("release", "c", 2.4, 2.5, delay_ms=2000, result={"state": "delayed"})
    s.consume("c", 2.6, 3.5, remain=0, deliveries=2)
    s.act("ack", "c", 3.6, 3.7)
    only(s.check(), "early_release")


def test_held_twice_within_the_ttr() -> None:
    s = clean()
    s.publish("c", 2.0, 2.1, tries=3)
    s.consume("c", 2.2, 2.3, remain=2, deliveries=1, ttr_ms=2000)
    s.consume("c", 3.0, 3.2, remain=1, deliveries=2, process=2)  # 3.2 < 2.2 + 2 s
    s.act("ack", "c", 3.3, 3.4)
    only(s.check(), "held_twice")
    s = clean()  # the same, but a release was under way in between: not a second holder
    s.publish("c", 2.0, 2.1, tries=3)
    s.consume("c", 2.2, 2.3, remain=2, deliveries=1, ttr_ms=2000)
    s.act("release", "c", 2.4, 2.6, type="info", delay_ms=0)
    s.consume("c", 2.5, 3.2, remain=1, deliveries=2, process=2)
    s.act("ack", "c", 3.3, 3.4)
    only(s.check(), None)
    s = clean()  # a touch with a shorter ttr moved the end of the first hold earlier: fine
    s.publish("c", 2.0, 2.1, tries=3)
    s.consume("c", 2.2, 2.3, remain=2, deliveries=1, ttr_ms=2000)
    s.act("touch", "c", 2.4, 2.5, ttr_ms=300)
    s.consume("c", 2.6, 3.2, remain=1, deliveries=2, process=2)  # 3.2 > 2.4 + 0.3
    s.act("ack", "c", 3.3, 3.4)
    only(s.check(), None)
    s.act("touch", "c", 2.45, 2.5, ttr_ms=300)  # ... but not when it held the job still
    s.h.events = [e for e in s.h.events if not (e.f == "consume" and e.process == 2)]
    s.consume("c", 2.6, 2.65, remain=1, deliveries=2, process=2)  # 2.65 < 2.4 + 0.3
    only(s.check(), "held_twice")
    s = clean()  # the same delivery count twice (a lost write): held twice if they overlap
    s.publish("c", 2.0, 2.1, tries=3)
    s.consume("c", 2.2, 2.3, remain=2, deliveries=1, ttr_ms=2000)
    s.consume("c", 2.5, 2.6, remain=2, deliveries=1, process=2)
    s.act("ack", "c", 3.3, 3.4)
    only(s.check(), "held_twice")


def test_over_tries_and_remain_tries() -> None:
    s = clean()
    s.publish("c", 2.0, 2.1, tries=1)
    s.consume("c", 2.2, 2.3, remain=0, deliveries=1, ttr_ms=100)
    s.consume("c", 2.5, 2.6, remain=0, deliveries=2)  # a second delivery of a 1-try job
    s.act("ack", "c", 2.7, 2.8)
    r = s.check()
    assert r.counts["over_tries"] == 2 and r.counts["remain_tries"] == 1, r.counts
    s = clean()
    s.publish("c", 2.0, 2.1, tries=3)
    s.consume("c", 2.2, 2.3, remain=1, deliveries=1)  # should say 2
    s.act("ack", "c", 2.4, 2.5)
    only(s.check(), "remain_tries")


def dropped_last_try() -> Script:
    s = clean()
    s.publish("c", 2.0, 2.1, tries=2)
    s.consume("c", 2.2, 2.3, remain=1, deliveries=1, ttr_ms=100)
    s.consume("c", 2.5, 2.6, remain=0, deliveries=2, ttr_ms=100)  # dropped: dead after its ttr
    return s


def test_dead_letters_exact() -> None:
    only(dropped_last_try().check({"c": "dead"}, dead=1), None)
    only(dropped_last_try().check({"c": None}, dead=0), "lost")
    only(dropped_last_try().check({"c": "ready"}, dead=0), "dead_letter")
    only(dropped_last_try().check({"c": "dead"}, dead=2), "dead_letter")  # the size disagrees
    s = clean()  # tries left at its last delivery, yet dead
    s.publish("c", 2.0, 2.1, tries=2)
    s.consume("c", 2.2, 2.3, remain=1, deliveries=1, ttr_ms=100)
    only(s.check({"c": "dead"}, dead=1), "dead_letter")
    # ... unless a consume whose reply was lost may have taken it again
    s.op("consume", 2.5, 2.9, "info", queues=["q"], ttr_ms=100)
    only(s.check({"c": "dead"}, dead=1), None)
    s = clean()  # a release on the last try sends it to the dead letter
    s.publish("c", 2.0, 2.1, tries=1)
    s.consume("c", 2.2, 2.3, remain=0, deliveries=1)
    s.act("release", "c", 2.4, 2.5, delay_ms=0, result={"state": "dead"})
    only(s.check({"c": "dead"}, dead=1), None)


def test_left_behind() -> None:
    s = clean()
    s.publish("c", 2.0, 2.1, tries=2)
    s.consume("c", 2.2, 2.3, remain=1, deliveries=1)
    only(s.check({"c": "ready"}), "left_behind")
    only(clean().check(sizes={"q": {"size": 1}}), "left_behind")


def test_stale_lease() -> None:
    def late_ack(type: str) -> Script:
        s = clean()
        s.publish("c", 2.0, 2.1, tries=2)
        s.consume("c", 2.2, 2.3, remain=1, deliveries=1, ttr_ms=100, lease="L1")
        s.consume("c", 2.5, 2.6, remain=0, deliveries=2, lease="L2", process=2)
        s.act(
            "ack", "c", 2.7, 2.8, type, lease="L1", result={"status": 409} if type == "fail" else {}
        )
        s.act("ack", "c", 2.9, 3.0, lease="L2")
        return s

    r = late_ack("fail").check()
    only(r, None)  # refused: right
    assert r.stats["lease_conflicts"] == 1
    r = late_ack("ok").check()
    assert r.counts["stale_lease"] == 1, r.counts
    s = late_ack("ok")  # the holder's ack came first: the late one acks a gone job, no conflict
    s.h.events = [e for e in s.h.events if e.value.get("lease") != "L2" or e.f != "ack"]
    s.act("ack", "c", 2.65, 2.68, lease="L2")
    only(s.check(), None)

    def expired(touch_ttr_ms: int | None) -> Report:  # nobody else took it, but its ttr ran out
        s = clean()
        s.publish("c", 2.0, 2.1, tries=2)
        s.consume("c", 2.2, 2.3, remain=1, deliveries=1, ttr_ms=500, lease="L1")
        if touch_ttr_ms:
            s.act("touch", "c", 2.4, 2.5, lease="L1", ttr_ms=touch_ttr_ms)
        s.act("ack", "c", 2.9, 3.0, lease="L1")  # 2.9 > 2.3 + 0.5
        return s.check()

    only(expired(None), "stale_lease")
    only(expired(1000), None)  # the touch moved the deadline to 3.5 at the latest


def test_every_kind_has_a_test() -> None:
    names = {n for n in globals() if n.startswith("test_")}
    for kind in KINDS:
        assert any(kind.split("_")[0] in n for n in names), kind


# -- groups and dedup keys ---------------------------------------------------------------------


def put(
    s: Script,
    key: str,
    t0: float,
    t1: float,
    group: str | None = None,
    type: str = "ok",
    job_id: str | None = None,
    **args: Any,
) -> None:
    """A publish into queue q with a group, a dedup key (``dedup=``) or both; ``job_id``: the
    answer (a dedup key's holder: ``result dedup`` then says which)."""
    result = {"job_id": job_id or "id-" + key, "dedup": args.pop("answer", "new")}
    s.op(
        "publish",
        t0,
        t1,
        type,
        key=key,
        queue="q",
        delay_ms=0,
        tries=args.pop("tries", 1),
        group=group,
        result=result if type == "ok" else {},
        **args,
    )


def take(
    s: Script, key: str, t0: float, t1: float, ack: bool = True, job_id: str | None = None
) -> None:
    """One delivery of ``key`` (its only try), acked at once."""
    job = {"key": key, "job_id": job_id or "id-" + key, "remain_tries": 0, "deliveries": 1}
    s.op("consume", t0, t1, process=1, queues=["q"], ttr_ms=1000, result={"jobs": [job]})
    if ack:
        s.act("ack", key, t1, t1 + 0.01, job_id=job_id)


def turns(heavy_first: int, lights: int = 1, heavy_late: int = 0) -> Script:
    """A light group's ``lights`` jobs published at 1.0 (ready by 1.05) behind ``heavy_first``
    jobs of heavy published at 0.5, then heavy jobs published after them (``heavy_late``, from
    1.1); heavy's jobs delivered first, in the order published, then light's."""
    s = Script()
    for i in range(heavy_first):
        put(s, f"h{i}", 0.5, 0.55, "heavy")
    for i in range(lights):
        put(s, f"l{i}", 1.0, 1.05, "light")
    for i in range(heavy_late):
        put(s, f"H{i}", 1.1 + i / 100, 1.11 + i / 100, "heavy")
    t = 1.2
    for key in [f"h{i}" for i in range(heavy_first)] + [f"H{i}" for i in range(heavy_late)]:
        take(s, key, t, t + 0.01)
        t += 0.02
    for i in range(lights):
        take(s, f"l{i}", t, t + 0.01)
        t += 0.02
    return s


def test_a_group_waiting_its_turns_is_not_starved() -> None:
    # heavy's backlog published before the light job goes first, however long: not counted
    r = turns(heavy_first=20, heavy_late=2).check()
    only(r, None)
    assert r.stats["grouped_publishes"] == 23
    # the light group's own backlog of 4: its last waits 4 rounds, one heavy job each, and 2
    only(turns(heavy_first=0, lights=5, heavy_late=6).check(), None)


def test_starved_a_light_group_passed_by_a_heavy_ones_later_jobs() -> None:
    r = turns(heavy_first=0, heavy_late=3).check()  # 3 heavy jobs published after it went first
    only(r, "starved")
    assert r.examples["starved"][0]["passed_by"] == "heavy", r.examples
    assert r.examples["starved"][0]["bound"] == 2, r.examples
    # 5 light jobs at once (in an unknown order): each may wait 4 rounds, 7 heavy ones pass all
    only(turns(heavy_first=0, lights=5, heavy_late=7).check(), "starved", 5)
    # a group that was paused or limited waits by design: not checked
    s = turns(heavy_first=0, heavy_late=3)
    s.op("configure_group", 0.0, 0.1, queue="q", group="light")
    only(s.check(), None)
    # in a queue with ungrouped jobs, a due time can put READY's head (V) below the tags
    s = turns(heavy_first=0, heavy_late=3)
    s.publish("u", 1.3, 1.31)
    take(s, "u", 1.4, 1.41)
    only(s.check(), None)
    # a configured group's held jobs come back just behind READY's head, by design: a group
    # a configure_group touched does not count as passing either
    s = turns(heavy_first=0, heavy_late=3)
    s.op("configure_group", 0.0, 0.1, queue="q", group="heavy", settings={"concurrency": 2})
    only(s.check(), None)
    # a consume whose reply was lost before it was ready may have taken a light job, which
    # then came back (unseen) before it: one turn more
    s = turns(heavy_first=0, heavy_late=3)
    s.op("consume", 1.0, 1.02, "info", queues=["q"], ttr_ms=1000, count=1)
    only(s.check(), None)


def earlier_turns(tries: int, lease: bool, first_ack: str | None = None) -> Report:
    """turns(heavy_late=3) after three earlier light jobs, each delivered once (with a lease or
    without) and acked at once; ``first_ack``: the outcome of another ack of the first one,
    sent before its ack came back."""
    s = Script()
    for i in range(3):
        key, job_lease = f"e{i}", f"L{i}" if lease else None
        s.op(
            "publish",
            0.1,
            0.15,
            key=key,
            queue="q",
            delay_ms=0,
            tries=tries,
            group="light",
            result={"job_id": "id-" + key},
        )
        job = {
            "key": key,
            "job_id": "id-" + key,
            "remain_tries": tries - 1,
            "deliveries": 1,
            "lease": job_lease,
        }
        s.op("consume", 0.2, 0.25, process=1, queues=["q"], ttr_ms=1000, result={"jobs": [job]})
        if first_ack and i == 0:
            s.act("ack", key, 0.28, 0.4, first_ack)
        s.act("ack", key, 0.3, 0.35, lease=job_lease)
    late = turns(heavy_first=0, heavy_late=3)
    s.h.events += [replace(e, op=e.op + 100) for e in late.h.events]
    return s.check()


def test_starved_counts_only_the_turns_a_group_may_still_take() -> None:
    # each earlier delivery may have brought its job back (dropped): 3 turns more, not starved
    only(earlier_turns(tries=2, lease=False), None)
    # acked with their lease, they certainly did not: the light job waited behind 3 later jobs
    r = earlier_turns(tries=2, lease=True)
    only(r, "starved")
    assert r.examples["starved"][0]["bound"] == 2, r.examples
    # ... as on their last try (a release or the ttr ends the job there)
    only(earlier_turns(tries=1, lease=False), "starved")
    # a lease acks a job already gone too: another ack may have come first (and the ttr had
    # brought the job back before it): that delivery's turn counts again
    only(earlier_turns(tries=2, lease=True, first_ack="info"), None)


def test_a_clean_history_of_dedup_keys_passes() -> None:
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k")
    put(s, "b", 0.2, 0.3, dedup="k", job_id="id-a", answer="existing")  # a holds the key
    take(s, "a", 0.4, 0.5)  # acked at 0.5
    put(s, "c", 0.6, 0.7, dedup="k")  # a new job: a was gone
    take(s, "c", 0.8, 0.9)
    r = s.check()
    only(r, None)
    assert r.stats["dedup_publishes"] == 3
    # a key's job dead at the end, its id the answer of two publishes: one dead job
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k")
    put(s, "b", 0.2, 0.3, dedup="k", job_id="id-a", answer="existing")
    take(s, "a", 0.4, 0.5, ack=False)  # its only try: dead after its ttr
    only(s.check({"a": "dead", "b": "dead"}, dead=1), None)


def test_dedup_twice_two_jobs_under_one_key_at_once() -> None:
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k")
    put(s, "c", 0.2, 0.3, dedup="k")  # a new job while a lives
    take(s, "a", 0.4, 0.5)
    take(s, "c", 0.6, 0.7)
    only(s.check(), "dedup_twice")
    # ... also when only its delivery shows it (its publish's reply was lost)
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k")
    put(s, "c", 0.2, 0.3, dedup="k", type="info")
    take(s, "c", 0.35, 0.38)
    take(s, "a", 0.4, 0.5)
    only(s.check(), "dedup_twice")
    # not when the first may have ended: an ack under way, its last try taken, or another mode
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k")
    s.act("ack", "a", 0.15, 0.4, type="info")
    put(s, "c", 0.2, 0.3, dedup="k")
    take(s, "c", 0.6, 0.7)
    r = s.check()
    assert r.counts["dedup_twice"] == 0, r.examples
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k")
    take(s, "a", 0.15, 0.18, ack=False)  # its only try: it may be dead from 0.15 on
    put(s, "c", 0.2, 0.3, dedup="k")
    take(s, "c", 0.6, 0.7)
    assert s.check({"a": "dead"}, dead=1).counts["dedup_twice"] == 0
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k", dedup_mode="throttle")
    put(s, "c", 0.2, 0.3, dedup="k", dedup_mode="throttle")
    take(s, "a", 0.4, 0.5)
    take(s, "c", 0.6, 0.7)
    only(s.check(), None)


def test_a_debounced_job_is_checked_once_by_id() -> None:
    # b replaced a's body (answered replaced): delivered as b, acked
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k", dedup_mode="debounce")
    put(s, "b", 0.2, 0.3, dedup="k", dedup_mode="debounce", job_id="id-a", answer="replaced")
    take(s, "b", 0.4, 0.5, job_id="id-a")
    only(s.check(), None)
    # ... its reply lost: the replacement is seen only in the delivery, and a is not lost
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k", dedup_mode="debounce")
    put(s, "b", 0.2, 0.3, type="info", dedup="k", dedup_mode="debounce")
    take(s, "b", 0.4, 0.5, job_id="id-a")
    only(s.check(), None)
    # ... nor wrongly dead, and counted once in the dead letter
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k", dedup_mode="debounce")
    put(s, "b", 0.2, 0.3, type="info", dedup="k", dedup_mode="debounce")
    take(s, "b", 0.4, 0.5, ack=False, job_id="id-a")  # its only try: dead after its ttr
    only(s.check({"a": "dead", "b": "dead"}, dead=1), None)
    # a job a 2xx replaced, never acked and gone at the end: lost, once
    s = Script()
    put(s, "a", 0.0, 0.1, dedup="k", dedup_mode="debounce")
    put(s, "b", 0.2, 0.3, dedup="k", dedup_mode="debounce", job_id="id-a", answer="replaced")
    r = s.check()
    only(r, "lost")
    assert r.examples["lost"][0]["job_id"] == "id-a", r.examples


# -- a group's settings: pause, concurrency limit, rate ----------------------------------------


def configure(s: Script, t0: float, t1: float, type: str = "ok", **settings: Any) -> None:
    s.op("configure_group", t0, t1, type, queue="q", group="g", settings=settings)


def test_while_paused_a_delivery_inside_a_certain_pause() -> None:
    def paused(t0: float, t1: float, *changes: tuple[float, float, str, dict[str, Any]]) -> Report:
        s = Script()
        put(s, "a", 0.0, 0.01, "g")
        configure(s, 0.1, 0.2, paused=True)
        for c0, c1, type, settings in changes:
            configure(s, c0, c1, type, **settings)
        take(s, "a", t0, t1)
        return s.check()

    r = paused(0.3, 0.4)
    only(r, "while_paused")
    assert r.stats["pause_windows"] == 1, r.stats
    only(paused(0.15, 0.4), None)  # its consume may have run before the pause
    only(paused(0.6, 0.7, (0.5, 0.55, "ok", {"paused": False})), None)  # resumed before
    only(paused(0.6, 0.7, (0.5, 0.55, "info", {"paused": False})), None)  # may have been
    # a refused resume, a pause again or another field's change: still paused
    only(paused(0.6, 0.7, (0.5, 0.55, "fail", {"paused": False})), "while_paused")
    only(paused(0.6, 0.7, (0.5, 0.55, "ok", {"paused": True})), "while_paused")
    only(paused(0.6, 0.7, (0.5, 0.55, "ok", {"concurrency": 3})), "while_paused")

    def resumed_first(type: str, answered: float, t0: float) -> Report:
        """A resume invoked before the pause (at 0.02) and answered at ``answered``."""
        s = Script()
        put(s, "a", 0.0, 0.01, "g")
        configure(s, 0.02, answered, type, paused=False)
        configure(s, 0.1, 0.2, paused=True)
        take(s, "a", t0, t0 + 0.04)
        return s.check()

    # a resume whose outcome is unknown may land however late (the service may still be
    # running it when the client gives up): no pause is certain after it
    only(resumed_first("info", 0.05, 5.0), None)
    # a resume that succeeded, answered after the pause: the pause is certain from its answer
    only(resumed_first("ok", 0.25, 0.22), None)
    only(resumed_first("ok", 0.25, 0.26), "while_paused")


def test_over_concurrency_more_held_at_once_than_the_limit() -> None:
    def two(second: tuple[float, float], ack_first: float, ttr_ms: int = 1000, limit: int = 1):
        s = Script()
        put(s, "a", 0.0, 0.01, "g")
        put(s, "b", 0.0, 0.01, "g")
        configure(s, 0.05, 0.1, concurrency=limit)
        s.consume("a", 0.2, 0.3, remain=0, deliveries=1, ttr_ms=ttr_ms)
        s.consume("b", *second, remain=0, deliveries=1)
        s.act("ack", "a", ack_first, ack_first + 0.01)
        s.act("ack", "b", 0.9, 0.91)
        return s.check({"a": None, "b": None})

    r = two((0.35, 0.4), ack_first=0.5)  # both held from 0.4 to 0.5
    only(r, "over_concurrency")
    assert r.examples["over_concurrency"][0]["held"] == ["a", "b"], r.examples
    assert r.stats["limit_windows"] == 1 and r.stats["limited_deliveries"] == 2, r.stats
    only(two((0.35, 0.4), ack_first=0.5, limit=2), None)
    only(two((0.35, 0.4), ack_first=0.38), None)  # a's ack under way before b's reply
    only(two((0.35, 0.4), ack_first=0.5, ttr_ms=100), None)  # a's ttr may end at 0.3
    only(two((0.02, 0.4), ack_first=0.5), None)  # b's consume may have run before the limit
    # a touch sets the hold's end anew, sooner too: a's may end at 0.32 + 0.1
    s = Script()
    put(s, "a", 0.0, 0.01, "g")
    put(s, "b", 0.0, 0.01, "g")
    configure(s, 0.05, 0.1, concurrency=1)
    s.consume("a", 0.2, 0.3, remain=0, deliveries=1, ttr_ms=10_000)
    s.act("touch", "a", 0.32, 0.33, type="info", ttr_ms=100)
    s.consume("b", 0.45, 0.5, remain=0, deliveries=1)
    s.act("ack", "b", 0.9, 0.91)
    only(s.check({"a": "dead"}, dead=1), None)
    # a lift of unknown outcome: no limit certain after it, however late
    s = Script()
    put(s, "a", 0.0, 0.01, "g")
    put(s, "b", 0.0, 0.01, "g")
    configure(s, 0.01, 0.02, "info", concurrency=None)
    configure(s, 0.05, 0.1, concurrency=1)
    s.consume("a", 0.2, 0.3, remain=0, deliveries=1)
    s.consume("b", 0.35, 0.4, remain=0, deliveries=1)
    s.act("ack", "a", 0.5, 0.51)
    s.act("ack", "b", 0.5, 0.51)
    only(s.check(), None)
    # ... also one consume of two jobs
    s = Script()
    put(s, "a", 0.0, 0.01, "g")
    put(s, "b", 0.0, 0.01, "g")
    configure(s, 0.05, 0.1, concurrency=1)
    jobs = [{"key": k, "job_id": "id-" + k, "remain_tries": 0, "deliveries": 1} for k in ("a", "b")]
    s.op("consume", 0.2, 0.3, process=1, queues=["q"], ttr_ms=1000, result={"jobs": jobs})
    s.act("ack", "a", 0.4, 0.41)
    s.act("ack", "b", 0.4, 0.41)
    only(s.check(), "over_concurrency")


def test_over_rate_two_deliveries_closer_than_the_rate_lets_them() -> None:
    def two(second: tuple[float, float], *changes: tuple[float, float, str, dict[str, Any]]):
        s = Script()
        put(s, "a", 0.0, 0.01, "g")
        put(s, "b", 0.0, 0.01, "g")
        configure(s, 0.05, 0.1, rate="10/1s")  # 100 ms apart
        for c0, c1, type, settings in changes:
            configure(s, c0, c1, type, **settings)
        take(s, "a", 0.2, 0.21)
        take(s, "b", *second)
        return s.check()

    r = two((0.25, 0.26))  # 60 ms apart at most
    only(r, "over_rate")
    assert r.stats["rate_windows"] == 1, r.stats
    only(two((0.25, 0.33)), None)  # may have been 130 ms apart
    only(two((0.25, 0.26), (0.22, 0.23, "ok", {"rate": "10/1s"})), None)  # a rate starts afresh
    only(two((0.25, 0.26), (0.22, 0.23, "info", {"rate": None})), None)  # may have been lifted
    only(two((0.25, 0.26), (0.22, 0.23, "ok", {"paused": False})), "over_rate")


def test_an_act_of_unknown_outcome_may_land_however_late() -> None:
    """A release (or touch) without a lease whose reply was lost may land after the job's next
    delivery and end that hold instead: neither ``over_concurrency`` nor ``held_twice``."""
    for f, extra in (("release", {"delay_ms": 0}), ("touch", {"ttr_ms": 50})):
        s = Script()
        put(s, "a", 0.0, 0.01, "g", tries=3)
        put(s, "b", 0.0, 0.01, "g")
        configure(s, 0.05, 0.1, concurrency=1)
        s.consume("a", 0.2, 0.3, remain=2, deliveries=1, ttr_ms=100)
        s.act(f, "a", 0.32, 0.33, type="info", **extra)  # no lease; lands at 0.5, say
        s.consume("a", 0.40, 0.45, remain=1, deliveries=2, ttr_ms=10_000)
        s.consume("b", 0.55, 0.60, remain=0, deliveries=1, ttr_ms=10_000)
        s.act("ack", "b", 0.9, 0.91)
        s.consume("a", 0.95, 1.0, remain=0, deliveries=3, ttr_ms=10_000)
        s.act("ack", "a", 1.0, 1.01)
        only(s.check(), None)
