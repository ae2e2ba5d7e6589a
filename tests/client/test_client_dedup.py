"""The Python client's dedup keys and Idempotency-Key against a real service, both shells: what
``publish_outcome`` answers, what is refused before sending, and a lost reply repeated only
when the Idempotency-Key makes it safe."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cluster_dq.client import IdempotencyMismatch, Publication, Sizes, WrongState
from cluster_dq.client import _verbs as v
from cluster_dq.client._core import Safety
from cluster_dq.testing.service_process import ServiceProcess
from tests.support.clients import FAULTY_KINDS, LoseReplies, close, faulty


async def test_publish_outcome_says_what_the_dedup_key_did(dq: Any) -> None:
    first = await dq.publish_outcome("q", b"a", dedup_key="order-1")
    assert first == Publication(first.job_id, "new")
    assert await dq.publish("q", b"b", dedup_key="order-1") == first.job_id
    again = await dq.publish_outcome("q", b"b", dedup_key="order-1")
    assert again == Publication(first.job_id, "existing")
    t = await dq.publish_outcome("q", b"t", dedup_key="t", dedup_mode="throttle", dedup_ttl=60)
    assert t.dedup == "new"
    d1 = await dq.publish_outcome("q", b"d1", dedup_key="d", dedup_mode="debounce", delay=60)
    d2 = await dq.publish_outcome("q", b"d2", dedup_key="d", dedup_mode="debounce", delay=60)
    assert d2 == Publication(d1.job_id, "replaced")
    plain = await dq.publish_outcome("q", b"p")
    assert plain.dedup is None and not plain.replayed
    assert await dq.size("q") == Sizes(3, 1, 0, 0)  # order-1, t and p ready; d delayed
    looked = await dq.get_job("q", d1.job_id)
    assert looked is not None and (looked.dedup_key, looked.body) == ("d", b"d2")
    assert (await dq.get_job("q", plain.job_id)).dedup_key is None


async def test_a_debounce_of_a_reserved_job_is_a_wrong_state(dq: Any) -> None:
    first = await dq.publish("q", b"a", dedup_key="d", dedup_mode="debounce")
    job = await dq.consume("q", ttr=30)
    assert job.id == first
    with pytest.raises(WrongState) as e:
        await dq.publish("q", b"b", dedup_key="d", dedup_mode="debounce")
    assert e.value.state == "reserved"


async def test_an_idempotency_key_gets_the_first_answer(dq: Any) -> None:
    first = await dq.publish_outcome("q", b"a", idempotency_key="pay-7")
    again = await dq.publish_outcome("q", b"a", idempotency_key="pay-7")
    assert again == Publication(first.job_id, replayed=True)
    ids = await dq.publish_many("q", [b"1", b"2"], idempotency_key="bulk-7")
    assert await dq.publish_many("q", [b"1", b"2"], idempotency_key="bulk-7") == ids
    assert (await dq.size("q")).ready == 3
    with pytest.raises(IdempotencyMismatch):
        await dq.publish("q", b"other", idempotency_key="pay-7")
    assert (await dq.size("q")).ready == 3


@pytest.mark.parametrize(
    "kw",
    [
        {"dedup_key": "a b"},
        {"dedup_key": "k", "dedup_mode": "often"},
        {"dedup_key": "k", "dedup_mode": "throttle"},
        {"dedup_key": "k", "dedup_ttl": 5},
        {"dedup_key": "k", "dedup_mode": "throttle", "dedup_ttl": 0},
        {"dedup_key": "k", "dedup_mode": "throttle", "dedup_ttl": 0.0004},  # under 1 ms
        {"dedup_key": "k", "dedup_mode": "throttle", "dedup_ttl": 0.0009},
        {"dedup_key": "k", "dedup_mode": "throttle", "dedup_ttl": 30 * 86400 + 1},  # over 30 days
        {"dedup_mode": "simple"},
        {"idempotency_key": ""},
        {"idempotency_key": "x" * 256},
    ],
)
def test_bad_keys_are_refused_before_sending(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        v.publish("ns", "q", b"x", **kw)


def test_an_idempotency_key_makes_a_publish_safe_to_repeat() -> None:
    assert v.publish("ns", "q", b"x").safety is Safety.ONCE
    assert v.publish("ns", "q", b"x", dedup_key="k").safety is Safety.ONCE
    assert v.publish("ns", "q", b"x", idempotency_key="i").safety is Safety.IDEMPOTENT
    assert v.publish_many("ns", "q", [b"1"]).safety is Safety.ONCE
    assert v.publish_many("ns", "q", [b"1"], idempotency_key="i").safety is Safety.IDEMPOTENT


def test_a_job_id_under_a_debounce_key_is_not_repeated_without_an_idempotency_key() -> None:
    """A debounce with a job_id that holds its key replaces that job again, so a repeat after
    a lost reply could put its body back over a newer debounce's: once-only, unless an
    Idempotency-Key makes the repeat the first answer. Failed before (repeated)."""
    debounce = {"dedup_key": "k", "dedup_mode": "debounce", "job_id": "j"}
    assert v.publish("ns", "q", b"x", job_id="j").safety is Safety.IDEMPOTENT
    assert v.publish("ns", "q", b"x", job_id="j", dedup_key="k").safety is Safety.IDEMPOTENT
    assert v.publish("ns", "q", b"x", **debounce).safety is Safety.ONCE
    assert v.publish("ns", "q", b"x", idempotency_key="i", **debounce).safety is Safety.IDEMPOTENT


def _publishes(r: httpx.Request) -> bool:
    return r.method == "PUT"


@pytest.mark.parametrize("kind", FAULTY_KINDS)
async def test_a_lost_reply_with_an_idempotency_key_is_repeated_and_publishes_once(
    kind: str, served: ServiceProcess, token: str
) -> None:
    faults = LoseReplies(_publishes)
    c = await faulty(kind, served, token, faults)
    got = await c.publish_outcome("q", b"x", idempotency_key="lost-1")
    assert len(faults.seen) == 2 and faults.lose == 0  # the repeat got the first answer
    assert got.replayed
    assert (await c.size("q")).ready == 1 and (await c.peek("q")).id == got.job_id
    faults.lose = 1
    ids = await c.publish_many("q", [b"1", b"2"], idempotency_key="lost-2")
    assert sum(map(_publishes, faults.seen)) == 4 and (await c.size("q")).ready == 3
    assert all([await c.get_job("q", i) for i in ids])
    await close(c)
