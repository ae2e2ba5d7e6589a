"""What a consume that reserved fewer jobs than asked says of its queues (``ops.consume``'s
``seen``, consume.lua's ``report``): a long-poll's watcher sets its timer from it instead of
asking sizes.lua, so it must be exactly what sizes.lua would answer right after the call, for
every state the queue can be in (delayed near and far in the wheel, ready, reserved with ttrs
running out, paused), and never a later next event than the queue's (for a queue a multi-queue
probe passed, the META.next it read)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from cluster_dq.engine import commands as ops
from cluster_dq.engine.commands import EngineConfig
from cluster_dq.engine.sync import SyncEngine
from cluster_dq.keys import QueueKeys
from cluster_dq.models import JobSpec
from tests.support import flush
from tests.support.run import against_redis

NS = "looks"
QUEUES = ("a", "b")
H = 3_600_000

action = st.one_of(
    st.tuples(
        st.just("publish"),
        st.sampled_from(QUEUES),
        st.sampled_from([0, 0, 40, 300, 2_000, 3 * H]),  # ready, near, wheel (3 h)
    ),
    st.tuples(
        st.just("consume"),
        st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2, unique=True),
        st.integers(1, 3),  # count
        st.sampled_from([50, 500, 5_000]),  # ttr
    ),
    st.tuples(st.just("ack"), st.sampled_from(QUEUES)),
    st.tuples(st.just("pause"), st.sampled_from(QUEUES), st.booleans()),
    st.tuples(st.just("wait"), st.sampled_from([10, 100, 1_000, 3 * H])),
)


@pytest.fixture
def sync_engine(sync_redis: redis.Redis) -> SyncEngine:
    return SyncEngine(sync_redis, EngineConfig())


@against_redis(60)
@given(actions=st.lists(action, min_size=1, max_size=25))
def test_what_a_look_reports_is_what_sizes_answers_right_after(
    sync_engine: SyncEngine, sync_redis: redis.Redis, actions: list[Any]
) -> None:
    flush(sync_redis)
    e, cfg = sync_engine, sync_engine.config
    t = 10**12  # a fake clock: every step takes its time from here
    held: dict[str, list[Any]] = {q: [] for q in QUEUES}
    reports = 0
    for a in actions:
        if a[0] == "publish":
            e.run(ops.publish(cfg, NS, a[1], [JobSpec(b"x", delay_ms=a[2], tries=2)], t))
        elif a[0] == "ack":
            if held[a[1]]:
                job = held[a[1]].pop(0)
                e.run(ops.ack(NS, a[1], [job.job_id], t))
        elif a[0] == "pause":
            e.run(ops.configure(e.config, NS, a[1], [("paused", "1" if a[2] else "")]))
        elif a[0] == "wait":
            t += a[1]
        else:
            _, queues, count, ttr = a
            seen: dict[str, tuple[int, int | None]] = {}

            def told(q: str, ready: int, nxt: int | None) -> None:
                seen[q] = (ready, nxt)  # noqa: B023 (used within this iteration)

            marked = {}  # what a multi-queue probe reads: is it passed over, with META.next
            for q in queues:
                qk = QueueKeys(NS, q)
                mark = sync_redis.hget(qk.meta, "next")
                due = mark is not None and int(mark) <= t  # type: ignore[arg-type]
                if len(queues) > 1 and not sync_redis.exists(qk.ready) and not due:
                    marked[q] = None if mark is None else int(mark)  # type: ignore[arg-type]
            got = e.run(ops.consume(cfg, NS, queues, ttr, count, t, told))
            for job in got:
                held[job.queue].append(job)
            if len(got) < count:
                assert set(seen) == set(queues), (queues, seen)  # each said what it holds
            for q, (ready, nxt) in seen.items():
                reports += 1
                sizes = e.run(ops.sizes(cfg, NS, q))
                assert ready == sizes.ready, (q, ready, sizes)
                if q in marked:  # passed over: the META.next it read, no later than the event
                    assert nxt == marked[q], (q, nxt, marked)
                    if nxt is None:
                        assert sizes.next_event_ms is None, (q, sizes)
                    else:
                        assert sizes.next_event_ms is not None, (q, sizes)
                        assert nxt <= sizes.next_event_ms, (q, nxt, sizes)
                else:  # visited: the script's own, exact
                    assert nxt == sizes.next_event_ms, (q, nxt, sizes)
    flush(sync_redis)
