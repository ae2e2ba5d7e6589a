"""The operator commands of ``cluster-dq`` (stats, jobs, dlq, pause, resume) against a real
``cluster-dq serve`` on every topology: run in-process through ``main(argv)``, and as the real
console script in a subprocess. What they print is checked against what the service holds."""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster_dq.cli import main, when_arg
from cluster_dq.client import Client
from cluster_dq.keys import AdminKeys
from cluster_dq.localredis import free_port
from cluster_dq.stats import RATES, Sample, parse_counters, rate, rows_of, stats_doc
from cluster_dq.testing import default_sigint
from cluster_dq.testing.service_process import pool_env
from tests.support import Deployment
from tests.support import ADMIN_AUTH

from tests.support import ROOT

CONSOLE_SCRIPT = Path(sys.executable).parent / "cluster-dq"


@pytest.fixture
def env(service: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fresh namespace with its token, in the CLUSTER_DQ_* variables the commands read."""
    base, admin = service
    ns = f"cli{uuid.uuid4().hex[:10]}"
    token = httpx.post(
        f"{admin}/token/{ns}", params={"description": "cli"}, auth=ADMIN_AUTH
    ).json()["token"]
    values = {
        "CLUSTER_DQ_URL": base,
        "CLUSTER_DQ_TOKEN": token,
        "CLUSTER_DQ_NAMESPACE": ns,
        "CLUSTER_DQ_ADMIN_URL": admin,
        "CLUSTER_DQ_ADMIN_AUTH": ":".join(ADMIN_AUTH),
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


@pytest.fixture
def client(env: dict[str, str]) -> Iterator[Client]:
    with Client() as c:
        yield c


def wait_until(ok: Any, timeout: float) -> None:
    stop = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < stop, "timed out"
        time.sleep(0.02)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def bury(client: Client, q: str, body: str, reason: str) -> str:
    jid = client.publish(q, body, tries=3)
    job = client.consume(q, ttr=30)
    assert job is not None and job.id == jid
    client.bury(q, jid, reason=reason, lease=job.lease)
    return jid


def expire(client: Client, q: str, body: str) -> str:
    """A job whose one try runs out unacked: dead with reason ttr_expired."""
    jid = client.publish(q, body, tries=1)
    assert client.consume(q, ttr=0.1) is not None
    deadline = time.monotonic() + 10
    while client.get_job(q, jid) is None or client.get_job(q, jid).state != "dead":  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the expired reservation never reached the dead letter"
        time.sleep(0.05)
    return jid


def sizes_of(client: Client, q: str) -> dict[str, int]:
    s = client.size(q)
    return {"ready": s.ready, "delayed": s.delayed, "reserved": s.reserved, "dead": s.dead}


def test_stats_json_matches_the_service_and_rates_move_with_traffic(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    bury(client, "busy", "bad", "malformed")
    for i in range(3):
        client.publish("busy", f"job {i}")
    client.publish("later", "x", delay=600)
    client.publish("later", "y", delay=600)
    assert client.consume("busy", ttr=60) is not None
    client.pause("later")
    doc = cli_json(capsys, "stats", "--interval", "0.3")
    assert doc["namespace"] == client.namespace and doc["rate_window"] > 0
    rows = {r["queue"]: r for r in doc["queues"]}
    assert set(rows) == {"busy", "later"}
    for q, paused in (("busy", False), ("later", True)):
        assert {k: rows[q][k] for k in ("ready", "delayed", "reserved", "dead")} == sizes_of(
            client, q
        )
        assert rows[q]["paused"] is paused
        for kind in ("published", "consumed", "acked"):
            assert rows[q][f"{kind}_per_s"] >= 0
    assert rows["busy"]["lateness"] is not None and rows["busy"]["lateness"] >= 0
    assert rows["later"]["lateness"] is None  # nothing ready

    stop = threading.Event()
    cycles: list[float] = []  # when each publish, consume and ack of the traffic ended
    failed: list[BaseException] = []

    def traffic() -> None:
        try:
            with Client() as c:
                while not stop.is_set():
                    c.publish("busy", "more")
                    job = c.consume("busy", ttr=60)
                    if job is not None:
                        c.ack("busy", job.id, lease=job.lease)
                        cycles.append(time.monotonic())
        except BaseException as e:  # (a thread's failure would pass unseen)
            failed.append(e)

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        # traffic under way before the first sample, and through the second
        wait_until(lambda: cycles or failed, 30)
        began = time.monotonic()
        # counters reach /metrics within a second (each worker process flushes every second)
        doc = cli_json(capsys, "stats", "--interval", "2.5")
        ended = time.monotonic()
    finally:
        stop.set()
        worker.join()
    assert not failed, failed
    during = sum(1 for t in cycles if began <= t <= ended)
    busy = {r["queue"]: r for r in doc["queues"]}["busy"]
    rates = [busy[f"{k}_per_s"] for k in ("published", "consumed", "acked")]
    assert all(r > 0 for r in rates), (rates, during, doc["rate_window"])


def test_stats_without_the_admin_port_shows_sizes_only(
    client: Client, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLUSTER_DQ_ADMIN_URL")
    client.publish("q", "x")
    doc = cli_json(capsys, "stats")
    (row,) = doc["queues"]
    assert row["ready"] == 1 and row["published_per_s"] is None and doc["rate_window"] is None
    code, out, err = cli(capsys, "stats")
    assert code == 0 and "q" in out and "no rates" in out, (out, err)


def test_jobs_peek_get_and_a_missing_job(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    jid = client.publish("q", b"\xff\x00 binary", job_id="order-42", tries=2)
    peek = cli_json(capsys, "jobs", "peek", "q")
    assert (peek["id"], peek["state"], peek["remain_tries"]) == (jid, "ready", 2)
    assert peek["body_encoding"] == "base64" and peek["body"] == "/wAgYmluYXJ5"
    got = cli_json(capsys, "jobs", "get", "q", "order-42")
    assert got["id"] == "order-42" and got["queue"] == "q"
    code, out, _ = cli(capsys, "jobs", "get", "q", "order-42")
    fields = dict(line.strip().split(": ", 1) for line in out.splitlines())
    assert code == 0 and fields["id"] == "order-42" and fields["state"] == "ready"
    assert fields["body (base64)"] == "/wAgYmluYXJ5" and "lease" not in fields
    code, out, err = cli(capsys, "jobs", "get", "q", "no-such-job")
    assert (code, out) == (1, "") and err == "cluster-dq: job no-such-job: not found\n"
    code, out, err = cli(capsys, "jobs", "peek", "empty")
    assert code == 1 and err.count("\n") == 1


def test_jobs_dead_lists_what_died_with_reasons(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    buried = [bury(client, "q", f"b{i}", f"bad payload {i}") for i in range(2)]
    expired = expire(client, "q", "slow")
    listed = cli_json(capsys, "jobs", "dead", "q")
    assert [(j["id"], j["reason"]) for j in listed] == [
        (buried[0], "buried"),
        (buried[1], "buried"),
        (expired, "ttr_expired"),
    ]
    assert [j["last_error"] for j in listed[:2]] == ["bad payload 0", "bad payload 1"]
    assert all(j["died_at"] > 0 and j["deliveries"] == 1 for j in listed)
    only = cli_json(capsys, "jobs", "dead", "q", "--reason", "ttr_expired")
    assert [j["id"] for j in only] == [expired]
    first = cli_json(capsys, "jobs", "dead", "q", "--limit", "1")
    assert [j["id"] for j in first] == [buried[0]]
    code, out, err = cli(capsys, "jobs", "dead", "q")
    assert code == 0 and out.count("\n") == 3 and "bad payload 1" in out and "3 dead" in err


HOSTILE_BODY = "\x1b]0;PWNED\x07\x1b[31mRED body [red]x[/red] \u202e\x9b"
HOSTILE_ERROR = "\x1b[2J\x1b[31mEVIL\r\nfake line\x1b]52;c;aGVsbG8=\x07"


def test_jobs_print_what_a_publisher_wrote_without_terminal_escapes(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    """A body or an error could clear the screen, fake a line or write the clipboard: the
    commands print their characters, escaped, and JSON that reads back the same."""
    ready = client.publish("q", HOSTILE_BODY)
    dead = bury(client, "dq", HOSTILE_BODY, HOSTILE_ERROR)
    outputs = [
        cli(capsys, "jobs", "get", "q", ready),
        cli(capsys, "jobs", "peek", "q"),
        cli(capsys, "jobs", "get", "dq", dead),
        cli(capsys, "jobs", "dead", "dq"),
    ]
    for code, out, _ in outputs:
        assert code == 0 and all(line.isprintable() for line in out.split("\n")), repr(out)
        assert not any(c in out for c in "\x1b\x07\r\x9b\u202e"), repr(out)
    for _, out, _ in outputs[:3]:
        assert "\\x1b]0;PWNED\\x07\\x1b[31mRED body [red]x[/red] \\u202e\\x9b" in out, out
    assert (
        "last_error: \\x1b[2J\\x1b[31mEVIL\\r\\nfake line\\x1b]52;c;aGVsbG8=\\x07" in outputs[2][1]
    )
    assert outputs[3][1].count("\n") == 1 and "EVIL\\r\\nfake line" in outputs[3][1]
    for argv in (["jobs", "get", "dq", dead], ["jobs", "dead", "dq"]):
        code, out, _ = cli(capsys, *argv, "--json")
        assert code == 0 and not any(c in out for c in "\x1b\x07\r\x9b\u202e"), repr(out)
        doc = json.loads(out)
        got = doc if isinstance(doc, dict) else doc[0]
        assert got["last_error"] == HOSTILE_ERROR and got.get("body", HOSTILE_BODY) == HOSTILE_BODY


def test_tables_print_names_as_text_not_rich_markup() -> None:
    """Group and queue names, and rates, reach a rich table as text: no markup, no emoji."""
    from rich.console import Console

    from cluster_dq.client import GroupInfo
    from cluster_dq.ops_groups import group_table
    from cluster_dq.stats import StatsRow, stats_table

    odd = "[red]x[/red]:smile:\x1b[2J"
    group = GroupInfo("ns", "q", odd, 1, 0, 0, False, None, odd)
    row = StatsRow(odd, 1, 0, 0, 0, False, None, None)
    for table in (group_table(odd, [group]), stats_table(odd, [row], None, None)):
        console = Console(record=True, width=200, color_system=None)
        console.print(table)
        text = console.export_text()
        assert "[red]x[/red]:smile:\\x1b[2J" in text and "\x1b" not in text, text


def test_dlq_redrive_by_reason_moves_only_those_and_dry_run_changes_nothing(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    buried = {bury(client, "q", f"b{i}", "bad") for i in range(3)}
    expired = expire(client, "q", "slow")
    before = sizes_of(client, "q")
    dry = cli_json(capsys, "dlq", "redrive", "q", "--reason", "buried", "--dry-run")
    assert (dry["count"], dry["dry_run"]) == (3, True)
    code, out, _ = cli(capsys, "dlq", "redrive", "q", "--reason", "buried", "--dry-run")
    assert out == f"3 dead job(s) of {client.namespace}/q would be redriven (dry run)\n"
    assert sizes_of(client, "q") == before and before["dead"] == 4
    since = cli_json(capsys, "dlq", "delete", "q", "--since", "0", "--until", "0", "--dry-run")
    assert since["count"] == 0  # nothing died at the epoch
    done = cli_json(capsys, "dlq", "redrive", "q", "--reason", "buried", "--yes")
    assert (done["count"], done["dry_run"]) == (3, False)
    assert sizes_of(client, "q") == {**before, "ready": before["ready"] + 3, "dead": 1}
    assert [j["id"] for j in cli_json(capsys, "jobs", "dead", "q")] == [expired]
    back = {client.consume("q", ttr=30).id for _ in range(3)}  # type: ignore[union-attr]
    assert back == buried
    code, out, err = cli(capsys, "dlq", "redrive", "q", "--reason", "buried", "--yes")
    assert code == 0 and out == f"0 dead job(s) of {client.namespace}/q redriven\n"


def test_dlq_delete_asks_first_and_then_purges(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(5):
        bury(client, "q", f"b{i}", "bad")
    client.publish("q", "alive")
    before = sizes_of(client, "q")
    code, out, err = cli(capsys, "dlq", "delete", "q")  # stdin is no terminal under pytest
    assert code == 2 and "--yes" in err and err.count("\n") == 1
    assert sizes_of(client, "q") == before
    done = cli_json(capsys, "dlq", "delete", "q", "--limit", "2", "--yes")
    assert done["count"] == 2 and sizes_of(client, "q")["dead"] == 3
    done = cli_json(capsys, "dlq", "delete", "q", "-y")
    assert done["count"] == 3 and sizes_of(client, "q") == {**before, "dead": 0}
    assert client.peek("q") is not None


def test_python_dash_m_cluster_dq_is_the_command() -> None:
    """``python -m cluster_dq`` runs ``cluster-dq`` (where the venv's bin is not on the PATH)."""
    import subprocess
    import sys

    import cluster_dq

    done = subprocess.run(
        [sys.executable, "-m", "cluster_dq", "version"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, f"{cluster_dq.__version__}\n"), done.stderr


def test_dlq_with_since_after_until_names_the_flags(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    bury(client, "q", "b0", "bad")
    code, _, err = cli(capsys, "dlq", "delete", "q", "--since", "2h", "--until", "3h", "--yes")
    assert code == 2 and "--since is after --until" in err, err
    assert sizes_of(client, "q")["dead"] == 1


def test_pause_and_resume(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    client.publish("q", "x")
    code, out, _ = cli(capsys, "pause", "q")
    assert (code, out) == (0, f"{client.namespace}/q: paused\n")
    assert client.settings("q").paused and client.consume("q") is None
    assert cli_json(capsys, "pause", "q")["paused"] is True  # idempotent
    assert cli_json(capsys, "resume", "q")["paused"] is False
    assert client.consume("q", ttr=30) is not None


@pytest.fixture
def pool_configured(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The token commands' settings: the suite's Redis as the default pool, nothing else."""
    for name in [k for k in os.environ if k.startswith("CLUSTER_DQ_")]:
        monkeypatch.delenv(name)
    for name, value in pool_env(deployment.pool_settings()).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CLUSTER_DQ_LOGLEVEL", "warning")  # the suite's requests, not logged


@pytest.mark.usefixtures("pool_configured")
def test_token_create_refuses_what_the_admin_api_refuses_and_writes_nothing(
    service: tuple[str, str], sync_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, admin = service
    ns, custom = f"tok{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    cases = [  # the command's arguments; the same request to the admin API
        (["bad/ns"], "/token/bad.ns", {"description": "x"}),
        ([ns, "--pool", "nope"], f"/token/{ns}", {"description": "x", "pool": "nope"}),
        ([ns, "short"], f"/token/{ns}", {"description": "x", "token": "short"}),
        ([ns, "--description", ""], f"/token/{ns}", {"description": ""}),
        # a pool: prefix: a pool that does not exist, none at all, or not the pool asked for
        ([ns, f"nope:{custom}"], f"/token/{ns}", {"description": "x", "token": f"nope:{custom}"}),
        ([ns, f":{custom}"], f"/token/{ns}", {"description": "x", "token": f":{custom}"}),
        (
            [ns, "--pool", "nope", f"default:{custom}"],
            f"/token/{ns}",
            {"description": "x", "pool": "nope", "token": f"default:{custom}"},
        ),
    ]
    for args, path, params in cases:
        answer = httpx.post(admin + path, params=params, auth=ADMIN_AUTH)
        assert answer.status_code == 400, (args, answer.text)
        code, out, err = cli(capsys, "token", "create", *args)
        assert (code, out, err) == (2, "", f"cluster-dq: {answer.json()['error']}\n"), args
    for pool, name in (("default", "bad/ns"), ("nope", ns), ("default", ns)):
        assert not sync_redis.exists(AdminKeys.tokens(pool, name)), (pool, name)


@pytest.mark.usefixtures("pool_configured")
def test_token_options_in_any_order_and_deleting_an_unknown_token(
    service: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    ns, custom = f"tok{uuid.uuid4().hex[:10]}", f"custom-{uuid.uuid4().hex}"
    assert cli(capsys, "token", "create", ns, "--description", "x", custom) == (
        0,
        f"{custom}\n",
        "",
    )
    assert cli(capsys, "token", "list", "--pool", "default", ns) == (0, f"{custom}\tx\n", "")
    assert cli(capsys, "token", "delete", ns, "--pool", "default", custom) == (0, "", "")
    code, out, err = cli(capsys, "token", "delete", ns, custom)
    assert (code, out) == (1, "") and err.count("\n") == 1, err
    assert err.startswith(f"cluster-dq: no token {custom[:6]}") and ns in err, err
    assert cli(capsys, "token", "list", ns) == (0, "", "")


def test_the_console_script_against_the_service(client: Client, env: dict[str, str]) -> None:
    jid = client.publish("q", "hello")
    out = subprocess.run(
        [str(CONSOLE_SCRIPT), "jobs", "peek", "q", "--json"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["id"] == jid and json.loads(out.stdout)["body"] == "hello"


def test_bad_arguments_exit_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["jobs", "dead", "q", "--limit", "many"],
        ["dlq", "redrive", "q", "--since", "last tuesday"],
        ["dlq", "delete", "q", "--reason", "boredom"],
        ["stats", "--watch", "-1"],
        ["jobs", "nap", "q"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        _, err = capsys.readouterr()
        assert exit_.value.code == 2, argv
        assert "error: argument" in err or "invalid choice" in err, (argv, err)


def test_pause_of_a_queue_that_does_not_exist_exits_1_with_one_line_and_writes_nothing(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    for verb in ("pause", "resume"):
        code, out, err = cli(capsys, verb, "nosuch")
        assert code == 1 and out == "" and err.count("\n") == 1, (code, out, err)
        assert err.startswith("cluster-dq: ") and f"{client.namespace}/nosuch" in err
    assert client.queues().queues == []  # nothing was written
    assert client.settings("nosuch").paused is False
    code, out, _ = cli(capsys, "pause", "nosuch", "--create")  # before its first publish
    assert (code, out) == (0, f"{client.namespace}/nosuch: paused\n")
    client.publish("nosuch", "x")
    assert client.consume("nosuch") is None


def test_a_missing_setting_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in ("CLUSTER_DQ_URL", "CLUSTER_DQ_TOKEN", "CLUSTER_DQ_NAMESPACE"):
        monkeypatch.delenv(k, raising=False)
    code, out, err = cli(capsys, "pause", "q", "--url", "http://127.0.0.1:1", "--namespace", "n")
    assert code == 2 and out == "" and err.startswith("cluster-dq: ") and err.count("\n") == 1
    assert "token" in err.lower()


def test_an_unreachable_service_exits_1_with_one_line() -> None:
    port = free_port(19_000, 19_500)
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLUSTER_DQ_")},
        "PYTHONPATH": str(ROOT),
        "CLUSTER_DQ_URL": f"http://127.0.0.1:{port}",
        "CLUSTER_DQ_TOKEN": "t" * 26,
        "CLUSTER_DQ_NAMESPACE": "ns",
    }
    for argv in (["stats"], ["dlq", "redrive", "q", "--yes"]):
        out = subprocess.run(
            [str(CONSOLE_SCRIPT), *argv], env=environ, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 1, (argv, out.stderr)
        assert out.stderr.startswith(f"cluster-dq: cannot reach http://127.0.0.1:{port}: "), (
            out.stderr
        )
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


@pytest.fixture
def runner_ignores_sigint() -> Iterator[None]:
    """For a test that interrupts a child, the worst case always: this process with SIGINT
    ignored, as a background job of a non-interactive shell (``nohup``, ``cmd &``) starts, and
    an ignored signal stays ignored in the children it starts. (Ctrl-C waits for the test.)"""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def in_terminal(
    argv: list[str], answer: bytes = b"", interrupt_at: tuple[bytes, int] | None = None
) -> tuple[int, str]:
    """Runs the console script with stdin, stdout and stderr on a pseudo-terminal, answering
    ``answer`` to its question, and sending SIGINT once ``interrupt_at``'s text was written
    that many times; its exit status and everything it wrote."""
    master, slave = pty.openpty()
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", "COLUMNS": "80"}
    proc = subprocess.Popen(
        [str(CONSOLE_SCRIPT), *argv],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=environ,
        preexec_fn=default_sigint,
    )
    os.close(slave)
    out, asked, deadline = b"", False, time.monotonic() + 60
    try:
        while time.monotonic() < deadline and select.select([master], [], [], 60)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the process ended and closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if not asked and b"[y/N]" in out:
                os.write(master, answer)
                asked = True
            if interrupt_at and out.count(interrupt_at[0]) >= interrupt_at[1]:
                proc.send_signal(signal.SIGINT)
                interrupt_at = None
        return proc.wait(timeout=60), out.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dlq_in_a_terminal_asks_and_shows_a_progress_bar(
    client: Client, env: dict[str, str]
) -> None:
    for i in range(3):
        bury(client, "q", f"b{i}", "bad")
    code, out = in_terminal(["dlq", "delete", "q"], b"n\n")
    assert code == 2 and "[y/N]" in out and "not confirmed" in out, out
    assert client.size("q").dead == 3
    code, out = in_terminal(["dlq", "redrive", "q", "--reason", "buried"], b"y\n")
    assert code == 0, out
    assert "redrive the dead jobs of" in out and "3/3" in out, out  # the bar's count
    assert f"3 dead job(s) of {client.namespace}/q redriven" in out
    assert sizes_of(client, "q") == {"ready": 3, "delayed": 0, "reserved": 0, "dead": 0}


@pytest.mark.usefixtures("runner_ignores_sigint")
def test_stats_watch_refreshes_until_interrupted(client: Client, env: dict[str, str]) -> None:
    client.publish("q", "x")
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "stats", "--watch", "0.2", "--json"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        assert proc.stdout is not None
        docs = [json.loads(proc.stdout.readline()) for _ in range(3)]  # one document a refresh
        client.publish("q", "y")
        for _ in range(50):  # a later refresh sees the new job
            doc = json.loads(proc.stdout.readline())
            if doc["queues"][0]["ready"] == 2:
                break
        else:
            pytest.fail(f"50 refreshes and still {doc}")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert [d["queues"][0]["ready"] for d in docs] == [1, 1, 1]
    assert all(0 < d["rate_window"] < 5 for d in docs) and doc["queues"][0]["queue"] == "q"
    assert proc.returncode == 130 and "Traceback" not in err, err


@pytest.mark.usefixtures("runner_ignores_sigint")
def test_stats_watch_in_a_terminal_redraws_a_table(client: Client, env: dict[str, str]) -> None:
    client.publish("orders", "x")
    code, out = in_terminal(["stats", "--watch", "0.2"], interrupt_at=(b"ack/s", 3))
    assert code == 130 and "Traceback" not in out, out
    assert f"namespace {client.namespace} (rates over" in out and "orders" in out


def test_times_for_since_and_until() -> None:
    assert when_arg("1795466640") == 1795466640.0
    assert when_arg("2026-11-23T08:00") == when_arg("2026-11-23T09:00+01:00") == 1795420800.0
    # as the dashboard shows a time (UTC, labelled): a time copied from a page names it
    assert when_arg("2026-11-23 08:00:00.250 UTC") == 1795420800.25
    assert time.time() - 7200 - 5 < when_arg("2h") <= time.time() - 7200
    assert when_arg("90s") < when_arg("1m") + 1 and when_arg("7d") < when_arg("1d")
    for bad in ("yesterday", "2h ago", "-5m", "2026-13-01"):
        with pytest.raises(argparse.ArgumentTypeError):
            when_arg(bad)


def test_a_time_the_service_cannot_take_is_refused_by_since_and_until() -> None:
    """``--since nan``, ``inf``, ``-5`` or a date before 1970 were taken: a dry run then
    counted the jobs such a bound matched locally (``-5``: every dead job; ``nan``: none),
    while the run itself stopped at the client's check: the dry run foretold what never ran."""
    for bad in (
        "nan",
        "inf",
        "-inf",
        "1e999",
        "-5",
        "1969-12-31T23:59:59Z",
        "0001-01-01T00:00",
        "99999d",
        # past what the service takes (2^48 - 1 ms): the dry run counted 0, the run got a 400
        "99999999999999999999",
        "1e300",
        str(2**48 // 1000 + 1),
    ):
        with pytest.raises(argparse.ArgumentTypeError):
            when_arg(bad)
    assert when_arg("0") == 0.0 and when_arg("1970-01-01T00:00Z") == 0.0
    assert when_arg(str((2**48 - 1) // 1000)) == (2**48 - 1) // 1000


def test_rates_from_two_samples_of_the_counters() -> None:
    text = """# HELP cluster_dq_jobs_published Jobs published (new ids).
# TYPE cluster_dq_jobs_published counter
cluster_dq_jobs_published_total{namespace="ns",queue="q"} 10.0
cluster_dq_jobs_published_total{namespace="other",queue="q"} 99.0
# TYPE cluster_dq_jobs_acked counter
cluster_dq_jobs_acked_total{namespace="ns",queue="q"} 4.0
# TYPE cluster_dq_jobs_delivered counter
cluster_dq_jobs_delivered_total{namespace="ns",queue="q"} 6.0
"""
    before = Sample(100.0, parse_counters(text))
    assert before.counts[("published", "ns", "q")] == 10 and len(before.counts) == 4
    after = Sample(102.0, {**before.counts, ("published", "ns", "q"): 30.0})
    assert rate("published", "ns", "q", before, after) == 10.0
    assert rate("acked", "ns", "q", before, after) == 0.0
    assert rate("published", "ns", "new", before, after) == 0.0
    restarted = Sample(102.0, {("published", "ns", "q"): 4.0})  # the instance restarted
    assert rate("published", "ns", "q", before, restarted) == 2.0


def test_a_queue_counted_under_other_past_the_series_cap_has_no_rates_not_zero() -> None:
    """Past ``MetricsMaxQueues`` an instance counts a new queue under ``queue="_other"`` of its
    namespace: its own rates are not known, and stats says so rather than showing 0 (a run of
    the suite that had gone past the cap showed a queue under traffic at 0/s)."""
    from cluster_dq.client import QueueInfo

    def info(name: str) -> QueueInfo:
        return QueueInfo(name, 0, 0, 0, 0, False, None, None)

    before = Sample(100.0, {("published", "ns", "q"): 1.0, ("published", "ns", "_other"): 5.0})
    after = Sample(102.0, {("published", "ns", "q"): 3.0, ("published", "ns", "_other"): 9.0})
    rows = {r.queue: r for r in rows_of("ns", [info("q"), info("late")], before, after)}
    assert rows["q"].rates == {"published": 1.0, "consumed": 0.0, "acked": 0.0}
    assert rows["late"].rates is None  # its counts are in _other
    quiet = Sample(102.0, {("published", "ns", "q"): 3.0})  # no _other: a queue without traffic
    assert rows_of("ns", [info("late")], before, quiet)[0].rates == dict.fromkeys(RATES, 0.0)
    # each worker process caps its own series: a queue with a series of its own may have its
    # traffic counted under _other by another process, so its rates are lower bounds then
    doc = stats_doc("ns", rows_of("ns", [info("q")], before, after), before, after)
    assert doc["rates_partial"] is True
    assert (
        stats_doc("ns", rows_of("ns", [info("q")], before, quiet), before, quiet)["rates_partial"]
        is False
    )
    moved = Sample(102.0, {("published", "ns", "q"): 1.0, ("published", "ns", "_other"): 5.0})
    assert stats_doc("ns", [], before, moved)["rates_partial"] is False  # _other stood still


def test_an_unreachable_admin_port_is_named(
    client: Client, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port(19_500, 20_000)
    monkeypatch.setenv("CLUSTER_DQ_ADMIN_URL", f"http://127.0.0.1:{port}")
    code, out, err = cli(capsys, "stats")
    assert (code, out) == (1, "") and err.count("\n") == 1
    assert err.startswith(f"cluster-dq: cannot reach http://127.0.0.1:{port}: "), err


def test_workers_lists_who_is_running_what(
    env: dict[str, str], client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = cli(capsys, "workers")
    assert status == 0 and "no worker announced" in out
    held = [{"queue": "orders", "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "started_ms": 1}]
    info = {"host": "web-3", "pid": 4242, "queues": ["orders"], "concurrency": 4, "in_flight": held}
    client.announce_worker("web-3-4242-ab", info)
    status, out, _ = cli(capsys, "workers")
    assert status == 0, out
    assert "web-3-4242-ab  web-3  pid 4242  orders  1/4 held" in out
    assert "    orders/01M84CYQJ90007ZG2JKZ9W9AQM  for " in out
    (doc,) = cli_json(capsys, "workers", "--json")
    assert (doc["worker_id"], doc["pid"], doc["in_flight"][0]["job_id"]) == (
        "web-3-4242-ab",
        4242,
        "01M84CYQJ90007ZG2JKZ9W9AQM",
    )
    client.retire_worker("web-3-4242-ab")
    assert "no worker announced" in cli(capsys, "workers")[1]
