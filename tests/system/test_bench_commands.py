"""Every benchmark and drill command, run as the docs run it: ``python loadtest/X.py ...`` from
the checkout's root with the venv's python, as a subprocess, at a tiny size. Each must exit 0
and print its figures; nothing about the figures is asserted (tests assert behaviour, the
benchmarks print figures).

This is about the commands themselves (arguments, imports with loadtest/ first on sys.path,
start-up and clean-up of their own Redis and services, the report): the behaviour of each drill
and history scenario is tested in-process, short, by tests/system/test_drills.py and
tests/system/test_history.py. So one drill runs here, ``service-leader`` (a Cluster, two instances,
one SIGKILLed), and one history scenario, ``standalone``; every other drill and scenario name
the docs give is checked against the command's choices instead. About 145 s in all on 2 cores
shared with other work (load average 7), a third of it bench_pipeline.py's Spark run.

The docs are checked too: every ``loadtest/`` file they name exists, and every command they
show has a smoke run here.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_dq.testing import default_sigint

from tests.support import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# script: (arguments after it, a figure its report must print)
COMMANDS: dict[str, tuple[list[str], str]] = {
    "bench_cpu.py": (
        ["--rounds", "1", "--seconds", "1", "--connections", "4"],
        r"publish +[\d,]+ +\d+ +[\d.]+[\s\S]*ack +[\d,]+ +\d+[\s\S]*bulk +[\d,]+ +\d+",
    ),
    "bench_peers.py": (  # installs BullMQ with npm (the registry must be reachable)
        ["--rounds", "1", "--seconds", "1", "--warmup", "0.2", "--jobs", "500"]
        + ["--only", "memory"],
        r"memory: .* cluster_dq +[\d.]+ B/job[\s\S]*BullMQ +[\d.]+ B/job",
    ),
    "bench_cluster_refresh.py": (
        ["--seconds", "0.5", "--failing", "2"],
        r"one master killed, 2 tasks asking it +\d+ reads of 6 keys: p50 +[\d.]+ ms",
    ),
    "bench_engine.py": (
        ["--jobs", "2000", "--ops", "500", "--late", "200", "--late-seconds", "1"]
        + ["--expired", "500"],
        r"memory +2,000 delayed jobs over .* B/job[\s\S]*burst +drained 2,000 jobs",
    ),
    "bench_groups.py": (
        ["--seconds", "2", "--warmup", "0.5", "--drain", "1", "--heavy-rate", "100"]
        + ["--scenarios", "ABCDE", "--rounds", "1", "--cost-jobs", "100", "--memory-jobs", "640"]
        + ["--script-calls", "10"],
        r"memory: Redis used_memory[\s\S]*1,000 groups of 8 bytes +[-\d.]+ +[-\d.]+[\s\S]*"
        r"ack +dedup +[\d.]+ +[-+]\d+ %[\s\S]*"
        r"publish +dedup +[\d.]+ +[-+]\d+ % +[\d.]+ +[\d.]+ +[-+][\d.]+[\s\S]*"
        r"publish +debounce +[\d.]+ +[-+]\d+ % +[\d.]+ +[\d.]+ +[-+][\d.]+"
        r"[\s\S]*B light \+ heavy, grouped +[\d,]+ +[\d.]+ +[\d.]+"
        r"[\s\S]*D light no group \+ heavy grouped +[\d,]+ +[\d.]+"
        r"[\s\S]*E's light p99 ÷ A's [\d.]+ \(the heavy group held to 6 of 8 consumers\)",
    ),
    "bench_http.py": (
        ["--seconds", "0.5", "--workers", "1", "--wrk"],
        r"end to end: bulk 64 \+ consume 100 \+ batch ack +[\d,]+ jobs/s",
    ),
    "bench_junk.py": (
        ["--requests", "300", "--bodies", "1", "--conns", "4"],
        r"after 300 junk-token requests: VmRSS +[\d.]+ MB",
    ),
    "bench_locust.py": (  # 5 s: on a loaded machine the client's user spent 2 s starting
        ["--seconds", "5", "--rate", "20"],
        r"locustfile.py:[\s\S]*locust CPU: [\d.]+ s for [1-9][\d,]* requests[\s\S]*"
        r"locust_client.py:[\s\S]*locust CPU: [\d.]+ s for [1-9][\d,]* requests",
    ),
    "bench_metrics.py": (["--updates", "2000"], r"one HTTP publish: [\d.]+ us"),
    "bench_scrape.py": (
        ["--odd", "50", "--scrapes", "3", "--gap", "0.1", "--data", "10"],
        r"after them: +\d+ series[\s\S]*scrape \(3\): +p50 +[\d.]+ ms[\s\S]*scraping: +p50",
    ),
    "outage_answers.py": (["--only", "size"], r"size +503 +[\d.]+ s .*nothing was written"),
    "bench_pipeline.py": (
        ["--jobs", "2000"],
        r"spark local\[2\]: published 2,000[\s\S]*CPU per job: redis-server [\d.]+ us, jvm [\d.]+ us, "
        r"python workers [\d.]+ us[\s\S]*single process: 2,000 jobs in .* jobs/s",
    ),
    "bench_slow_clients.py": (
        ["--connections", "10", "--seconds", "2", "--idle", "0.5", "--header-timeout", "1"],
        r"10 slow connections +VmRSS +[\d.]+ MB[\s\S]*closed \d+ of \d+ silent connections",
    ),
    "bench_sweep.py": (["--queues", "300"], r"sweep, 30 signals lost: [\d.]+ s, 30 queue"),
    "bench_client.py": (
        ["--rounds", "1", "--seconds", "0.3", "--concurrency", "1,4"],
        r"in flight +cluster_dq +httpx +aiohttp[\s\S]* 4 +\d+ +\d+ +\d+ +[\d.]+",
    ),
    "bench_worker.py": (
        ["--jobs", "2000", "--batch", "10", "--middleware", "2"],
        r"worker \(concurrency \d+, 3 consume\(s\) of 10 .*, 2 middleware\): 2000 acked in .* jobs/s",
    ),
    "drill.py": (
        ["service-leader", "--rate", "50", "--seconds", "2", "--backlog", "200", "--queues", "2"]
        + ["--ack-behind", "2", "--partial-coverage"],
        r"acks up to 2 batches behind, cluster-require-full-coverage no[\s\S]*"
        r"published \(2xx\): [\d,]+[\s\S]*acknowledged jobs never delivered: 0",
    ),
    "history.py": (
        ["standalone", "--seconds", "3", "--rate", "20"],
        r"figures: +publish_ok \d+",
    ),
    "load_profile.py": (
        ["--jobs", "1000", "--seconds", "3", "--rate", "50"],
        r"all API requests: \d+ in .* req/s, failures 0",
    ),
    "bench_scale.py": (
        ["--jobs", "500", "--seconds", "3", "--rate", "60"]
        + ["--instance-counts", "1,2", "--master-counts", "1,3", "--queues", "4"]
        + ["--idle-seconds", "1"],
        r"over more instances[\s\S]* now +2 +[\d,]+ +0 [\s\S]*on a Cluster of more masters"
        r"[\s\S]*now +3 +[\d,]+ +0 ",
    ),
}


def run_command(args: list[str], timeout: float = 180) -> str:
    """Runs ``python <args>`` from the root as a user would (the script's folder first on
    sys.path); PYTHONPATH names the checkout so that it is this checkout's package that runs
    (as ServiceProcess does). A run past ``timeout`` is interrupted (its clean-up stops its
    Redis servers, which live in sessions of their own), then killed."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,  # the SIGINT below works however the suite was started
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{args} still running after {timeout:.0f} s:\n{out}\n{err}")
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{out}\n{err}"
    return out


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_command_runs_small_and_prints_figures(script: str) -> None:
    args, figure = COMMANDS[script]
    out = run_command([f"loadtest/{script}", *args])
    print(out)  # the figures, for the CI log
    assert re.search(figure, out), out


def documented_commands() -> list[tuple[str, str]]:
    """(script, first word after it) of every ``python loadtest/X.py ...`` the docs show."""
    found: set[tuple[str, str]] = set()
    for doc in DOCS:
        for m in re.finditer(r"python loadtest/(\w+\.py)(?:[ \t]+([a-z][\w-]*))?", doc.read_text()):
            found.add((m[1], m[2] or ""))
    return sorted(found)


def documented_files() -> list[str]:
    return sorted(
        {name for doc in DOCS for name in re.findall(r"loadtest/[\w./-]*\w", doc.read_text())}
    )


@pytest.mark.parametrize("name", documented_files())
def test_documented_loadtest_file_exists(name: str) -> None:
    assert (ROOT / name).exists(), f"the docs name {name}, which is not in the checkout"


@pytest.mark.parametrize("script,word", documented_commands())
def test_documented_command_has_a_smoke_run(script: str, word: str) -> None:
    """A command the docs show is run above; a drill or history scenario they name is one the
    command accepts (its runs are tests/system/test_drills.py's and tests/system/test_history.py's)."""
    assert script in COMMANDS, f"loadtest/{script} is documented but has no smoke run here"
    if script in ("drill.py", "history.py"):
        module = importlib.import_module(f"loadtest.{script.removesuffix('.py')}")
        assert word in (*module.SCENARIOS, "all"), (script, word, module.SCENARIOS)


@pytest.mark.parametrize(
    "module", sorted(p.stem for p in (ROOT / "loadtest").glob("*.py") if p.stem != "__init__")
)
def test_no_loadtest_module_shadows_another(module: str) -> None:
    """``python loadtest/X.py`` puts loadtest/ first on sys.path: a module there named like a
    standard or installed one replaces it for every import (loadtest/profile.py broke pyspark,
    which imports cProfile, which imports profile)."""
    assert module not in sys.stdlib_module_names
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "loadtest"]
    found = importlib.machinery.PathFinder.find_spec(module, elsewhere)
    assert found is None, f"loadtest/{module}.py hides {found.origin if found else ''}"
