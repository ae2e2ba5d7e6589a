"""The Python client's groups against a real service, both shells: ``group=`` on every publish
and ``Job.group`` on what comes back, the listing walked page by page, a group's settings
changed (given, removed with None, left alone when not given), paused and resumed, a bad name
refused before sending; and the operator commands ``cluster-dq groups`` / ``group``."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cluster_dq.cli import main
from cluster_dq.client import BadRequest, Client, GroupInfo, GroupPage, InvalidName
from cluster_dq.client import _verbs as v
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH
from tests.support.clients import NS, LoseReplies, Sync, close, faulty


async def drain(dq: Any, name: str, *args: Any, **kwargs: Any) -> list[Any]:
    """Everything an iter_* verb yields, from either client."""
    if isinstance(dq, Sync):
        return list(await getattr(dq, name)(*args, **kwargs))
    return [x async for x in getattr(dq, name)(*args, **kwargs)]


def info(name: str, size: int = 0, **kw: Any) -> GroupInfo:
    fields: dict[str, Any] = dict(reserved=0, held=0, paused=False, concurrency=None, rate=None)
    return GroupInfo(NS, "q", name, size, **{**fields, **kw})


async def test_every_publish_carries_the_group_and_the_job_shows_it(dq: Any) -> None:
    one = await dq.publish("q", b"1", group="tenant-1")
    out = await dq.publish_outcome("q", b"2", group="tenant-2", tries=2)
    many = await dq.publish_many("q", [b'"3"', b'"4"'], group="tenant-3")
    plain = await dq.publish("q", b"5")
    assert (await dq.get_job("q", one)).group == "tenant-1"
    assert (await dq.get_job("q", out.job_id)).group == "tenant-2"
    assert [(await dq.get_job("q", i)).group for i in many] == ["tenant-3"] * 2
    assert (await dq.get_job("q", plain)).group is None
    assert (await dq.peek("q")).group in ("tenant-1", "tenant-2", "tenant-3", None)
    got = await dq.consume_many("q", 10, ttr=30)
    assert sorted((j.group or "") for j in got) == [
        "",
        *["tenant-1", "tenant-2"],
        *["tenant-3"] * 2,
    ]
    second = next(j for j in got if j.group == "tenant-2")
    await dq.release("q", second.id, lease=second.lease, delay=0, error="later")
    back = await dq.consume("q", ttr=30)
    assert (back.id, back.group, back.deliveries) == (second.id, "tenant-2", 2)  # kept
    first = next(j for j in got if j.group == "tenant-1")
    moved = await dq.republish("q", first.id, b"again", lease=first.lease, group="tenant-9")
    assert (await dq.get_job("q", moved)).group == "tenant-9"
    again = await dq.consume("q", ttr=30)
    assert (again.id, again.group, again.body) == (moved, "tenant-9", b"again")
    bare = await dq.republish("q", again.id, b"bare", lease=again.lease)
    assert (await dq.get_job("q", bare)).group is None  # a republish names its own group


async def test_the_listing_walks_every_group_page_by_page(dq: Any) -> None:
    names = {f"g{i:03d}" for i in range(260)}
    for name in sorted(names):
        await dq.publish("q", b"x", group=name)
    await dq.publish("q", b"y", group="g000")
    first = await dq.groups("q", limit=100)
    assert isinstance(first, GroupPage) and first.cursor is not None
    assert 0 < len(first.groups) < len(names)
    seen: dict[str, GroupInfo] = {g.name: g for g in first.groups}
    cursor, sizes = first.cursor, [len(first.groups)]
    while cursor is not None:
        page = await dq.groups("q", cursor=cursor, limit=100)
        seen.update((g.name, g) for g in page.groups)
        cursor = page.cursor
        sizes.append(len(page.groups))
    assert len(sizes) >= 2 and min(sizes[:-1]) >= 100 and set(seen) == names, sizes
    walked = await drain(dq, "iter_groups", "q", limit=100)
    assert sorted(g.name for g in walked) == sorted(names)  # each once
    assert {g.name: g for g in walked}["g000"] == info("g000", 2)
    assert seen["g259"] == info("g259", 1)
    assert await dq.groups("empty") == GroupPage([], None)
    assert await drain(dq, "iter_groups", "empty") == []


async def test_a_groups_settings_change_only_as_given(dq: Any) -> None:
    assert await dq.group("q", "t1") == info("t1")  # nothing written to it: all zero
    set_ = await dq.update_group("q", "t1", concurrency=1, rate="10/1s")
    assert set_ == info("t1", concurrency=1, rate="10/1000ms")
    for body in (b"a", b"b"):
        await dq.publish("q", body, group="t1")
    await dq.publish("q", b"c", group="t2")
    got = await dq.consume_many("q", 10, ttr=30)
    assert sorted(j.group for j in got) == ["t1", "t2"]  # t1: one at a time
    assert await dq.group("q", "t1") == info(
        "t1", 2, reserved=1, held=1, concurrency=1, rate="10/1000ms"
    )
    paused = await dq.update_group("q", "t1", paused=True)
    assert (paused.paused, paused.concurrency, paused.rate) == (True, 1, "10/1000ms")
    no_rate = await dq.update_group("q", "t1", rate=None)
    assert (no_rate.paused, no_rate.concurrency, no_rate.rate) == (True, 1, None)
    cleared = await dq.update_group("q", "t1", concurrency=None, paused=False)
    assert cleared == info("t1", 2, reserved=1, held=0)  # the held job is ready again
    nxt = await dq.consume("q", ttr=30)
    assert (nxt.group, nxt.body) == ("t1", b"b")
    for bad in ({"concurrency": 0}, {"rate": "fast"}, {"rate": "1/25h"}):
        with pytest.raises(BadRequest):
            await dq.update_group("q", "t1", **bad)
    assert await dq.group("q", "t1") == info("t1", 2, reserved=2)  # nothing changed


async def test_pause_and_resume_a_group_while_the_others_go_on(dq: Any) -> None:
    await dq.publish("q", b"held", group="slow")
    assert await dq.pause_group("q", "slow") == info("slow", 1, paused=True)
    await dq.publish("q", b"free", group="fast")
    assert [j.body for j in await dq.consume_many("q", 10, ttr=30)] == [b"free"]
    assert await dq.consume("q") is None
    held = info("slow", 1, held=1, paused=True)  # (set aside once a consume passed it)
    assert await dq.group("q", "slow") == held
    assert await dq.pause_group("q", "slow") == held  # idempotent
    assert await dq.resume_group("q", "slow") == info("slow", 1)
    job = await dq.consume("q", ttr=30)
    assert (job.body, job.group) == (b"held", "slow")


@pytest.mark.parametrize(
    ("call", "refusal"),
    [
        (lambda c: c.publish("q", b"x", group="a b"), InvalidName),
        (lambda c: c.publish_outcome("q", b"x", group=""), ValueError),  # (no name at all)
        (lambda c: c.publish_many("q", [b"1"], group="x" * 65), InvalidName),
        (lambda c: c.republish("q", "j1", b"x", group="ü"), InvalidName),
        (lambda c: c.group("q", "a/b"), InvalidName),
        (lambda c: c.update_group("q", "..", paused=True), InvalidName),
        (lambda c: c.pause_group("q", "a b"), InvalidName),
        (lambda c: c.resume_group("q", ""), ValueError),
    ],
)
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_bad_group_name_is_refused_before_sending(
    kind: str, call: Any, refusal: type[Exception], served: ServiceProcess, token: str
) -> None:
    faults = LoseReplies(lambda r: False, lose=0)  # the real transport, counting requests
    c = await faulty(kind, served, token, faults)
    with pytest.raises(refusal, match="group"):  # InvalidName: a BadRequest and a ValueError
        await call(c)
    assert faults.seen == []
    await close(c)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"paused": None},
        {"paused": 1},
        {"concurrency": True},
        {"concurrency": 1.5},
        {"rate": 10},
    ],
)
def test_a_change_the_client_can_check_is_refused_before_sending(kw: dict[str, Any]) -> None:
    from cluster_dq.client import _groups as g

    with pytest.raises(ValueError):
        g.update_group("ns", "q", "g", **kw)


def test_a_group_is_sent_as_the_services_query_parameter() -> None:
    assert ("group", "t-1") in v.publish("ns", "q", b"x", group="t-1").params
    assert not any(k == "group" for k, _ in v.publish("ns", "q", b"x").params)
    assert ("group", "t_2") in v.publish_many("ns", "q", [b"1"], group="t_2").params


# -- the operator commands ------------------------------------------------------------------


@pytest.fixture
def client(service: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """A client of a fresh namespace, whose URL and token are in the CLUSTER_DQ_* variables
    the commands read."""
    base, admin = service
    ns = f"grp{uuid.uuid4().hex[:10]}"
    r = httpx.post(f"{admin}/token/{ns}", params={"description": "cli"}, auth=ADMIN_AUTH)
    for k, val in (("URL", base), ("TOKEN", r.json()["token"]), ("NAMESPACE", ns)):
        monkeypatch.setenv(f"CLUSTER_DQ_{k}", val)
    with Client() as c:
        yield c


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def rows(out: str) -> dict[str, list[str]]:
    """The table's rows by group: its cells, split on spaces."""
    lines = [line.split() for line in out.splitlines()]
    return {cells[0]: cells[1:] for cells in lines if len(cells) == 7 and cells[0] != "group"}


def test_cli_groups_lists_the_groups_of_a_queue(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    for g in ("a", "b", "b"):
        client.publish("q", "x", group=g)
    client.publish("q", "no group")
    client.update_group("q", "b", concurrency=5, rate="600/1m", paused=True)
    assert len(client.consume_many("q", 10, ttr=30)) == 2  # a's and the one of no group
    code, out, err = cli(capsys, "groups", "q")
    assert code == 0, err
    assert f"{client.namespace}/q: 2 group(s)" in out
    assert rows(out) == {
        "a": ["1", "1", "0", "no", "-", "-"],
        "b": ["2", "0", "2", "yes", "5", "600/1m"],
    }
    listed = cli_json(capsys, "groups", "q")
    assert listed == [dataclasses.asdict(g) for g in sorted(client.iter_groups("q"), key=str)]
    assert [g["name"] for g in listed] == ["a", "b"] and listed[1]["rate"] == "600/60000ms"
    assert cli(capsys, "groups", "empty") == (
        0,
        f"{client.namespace}/empty: no group holds jobs\n",
        "",
    )


def test_cli_group_shows_and_changes_one_group(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.publish("q", "x", group="t")
    shown = cli_json(capsys, "group", "q", "t")
    assert shown == dataclasses.asdict(client.group("q", "t"))
    assert (shown["size"], shown["paused"], shown["concurrency"]) == (1, False, None)
    code, out, _ = cli(
        capsys, "group", "q", "t", "--pause", "--concurrency", "3", "--rate", "5/250ms"
    )
    assert code == 0 and rows(out) == {"t": ["1", "0", "0", "yes", "3", "5/250ms"]}
    assert client.consume("q") is None
    code, out, _ = cli(capsys, "group", "q", "t")
    assert code == 0 and rows(out) == {"t": ["1", "0", "1", "yes", "3", "5/250ms"]}
    after = cli_json(capsys, "group", "q", "t", "--resume", "--no-rate")
    assert (after["paused"], after["concurrency"], after["rate"]) == (False, 3, None)
    after = cli_json(capsys, "group", "q", "t", "--no-concurrency")
    assert (after["paused"], after["concurrency"], after["rate"]) == (False, None, None)
    assert client.consume("q", ttr=30).group == "t"  # type: ignore[union-attr]


def test_cli_group_refusals(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["group", "q", "t", "--pause", "--resume"],
        ["group", "q", "t", "--concurrency", "0"],
        ["group", "q", "t", "--rate", "1/s", "--no-rate"],
        ["groups"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, argv
        capsys.readouterr()
    code, out, err = cli(capsys, "group", "q", "a b", "--pause")  # refused before sending
    assert (code, out, err.count("\n")) == (2, "", 1) and "group" in err
    assert "400" not in err  # nothing was sent: no status (failed before: "cluster-dq: 400: ")
    code, out, err = cli(capsys, "group", "q", "t", "--rate", "fast")  # the service's 400
    assert (code, out) == (1, "") and err.startswith("cluster-dq: ") and "rate" in err
    assert "HTTP 400" in err and err.count("\n") == 1
    assert client.group("q", "t").rate is None and client.group("q", "a_b").paused is False


async def test_a_schedule_publishes_each_occurrence_in_its_group(dq: Any) -> None:
    s = await dq.put_schedule("r", "beat", every=3600, body="tick", group="tenant-5")
    assert s.job.group == "tenant-5"
    assert (await dq.get_schedule("r", "beat")).job.group == "tenant-5"
    plain = await dq.put_schedule("r", "plain", every=3600)
    assert plain.job.group is None
    with pytest.raises(InvalidName):
        await dq.put_schedule("r", "bad", every=3600, group="a b")
