"""The shape of a test run, in one place: the tiers, which topologies each folder runs on in the
default run, the Hypothesis profile each tier loads, each parallel worker's own share of the
ports, and the durations every run writes down.

Tiers (``DQ_TIER``, set by ``./deploy/dev/test`` and ``./deploy/dev/test-long``):

- ``quick``: the edit-and-test loop (``./deploy/dev/test --quick``): the engine and HTTP folders
  on Cluster but the ``SLOW`` tests, Hypothesis at its ``dev`` size.
- ``default``: what CI runs: every folder; the guarantee folders on all three topologies, the
  surface folders on Cluster; Hypothesis at ``ci`` size.
- ``long``: every test on every topology, the runs at full length, Hypothesis at ``long`` size.

A test left out of the default run is marked ``long`` (pyproject deselects ``long`` unless the
run asks for it) for one of two reasons, each written here: its folder runs on fewer topologies
by default (``DEFAULT_TOPOLOGIES``), or it is a further size of a guarantee the default run
already shows another way (``LONG``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from cluster_dq.localredis import PORT_SLICE
from tests.support import ROOT

TIER = os.environ.get("DQ_TIER", "default")
if TIER not in ("quick", "default", "long"):
    raise pytest.UsageError(f"DQ_TIER={TIER}: quick, default or long")

# -- Hypothesis: one profile per tier; a test sizes itself with ``examples(n)`` ----------------

settings.register_profile("dev", max_examples=20, deadline=None)
settings.register_profile("ci", max_examples=100, deadline=None)
settings.register_profile(
    "long", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile({"quick": "dev", "default": "ci", "long": "long"}[TIER])


def examples(n: int) -> int:
    """``n`` examples at the ``ci`` profile, scaled with the loaded one (dev: a fifth, long:
    5 times), never under 2. ``--hypothesis-profile`` picks another profile for one run."""
    return max(2, n * settings().max_examples // 100)


def seconds(default: int, long: int) -> int:
    """How long a fixed-duration system run (a drill, a history, the load profile) lasts: its
    short version checks the property in the default and quick runs, the long run goes on."""
    return long if TIER == "long" else default


# -- topologies: the guarantees everywhere, the surface on the hardest -------------------------

ALL = ("standalone", "cluster", "sentinel")
# What each folder runs on in the default run (the long run adds the rest). The guarantees
# (engine, model, leases, durable writes, failover, histories, drills) hold or fail with the
# topology, so they run on all three. The surface suites (HTTP routes and validation, the
# client, the worker, the CLI, the dashboard, the security suite) run the same scripts through
# the same code on every topology: they run on a Cluster (the hardest: a queue's keys on one
# slot of three masters, the pump per shard) and on standalone and Sentinel in the long run.
DEFAULT_TOPOLOGIES = {
    "engine": ALL,
    "guarantees": ALL,
    "system": ALL,
    "http": ("cluster",),
    "security": ("cluster",),
    "client": ("cluster",),
    "dashboard": ("cluster",),
}

# Single tests left to the long run, each a further size or topology of a guarantee the default
# run already shows with another (the reason beside each).
LONG = (
    # no failover here: the engine's guarantees under churn, as on standalone and Cluster
    "tests/guarantees/test_guarantees.py::test_many_consumers_random_delays_ttrs_and_tries[sentinel]",
    # both executors agree on Cluster and Sentinel; on standalone every durable write waits out
    # its retries to fail alike (test_a_durable_write_waits_for_replicas_in_both shows that)
    "tests/engine/test_executors.py::test_the_same_operations_give_the_same_results[standalone]",
    # the load profile through nginx runs on standalone; on Cluster in the long run
    "tests/system/test_loadtest.py::test_short_profile_through_nginx_has_no_errors[cluster]",
    # without durable publish a failover may lose acknowledged writes: only reported
    "tests/system/test_history.py::test_history_redis_master_killed[sentinel-not-durable]",
    "tests/system/test_history.py::test_history_redis_master_killed[cluster-not-durable]",
    # the CLI of functions tests/system/test_drills.py and test_history.py run in-process
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[drill.py]",
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[history.py]",
    # the load profile's short run is tests/system/test_loadtest.py's, in-process; this is its CLI
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[load_profile.py]",
    # the pipeline's own tests run Spark on every topology; this is its benchmark's CLI
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_pipeline.py]",
    # the peer benchmark installs BullMQ from the npm registry: no network in the default run
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_peers.py]",
)


# Tests of the quick tier's folders it leaves to the default run (marked ``slow``; the quick
# tier deselects them): each takes seconds to provoke a fault or wait out a timeout that the
# edit-and-test loop can do without, and each is in every default run.
SLOW: tuple[str, ...] = ()


def folder(nodeid: str) -> str:
    """``tests/http/test_http.py::t`` -> ``http``."""
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``long`` the tests of a topology their folder leaves to the long run, and those of
    ``LONG``. An entry of ``LONG`` that names no test of a collected file is an error: the list
    must not go stale when a test is renamed."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on = callspec.params.get("deployment") if callspec is not None else None
        if on is not None and on not in DEFAULT_TOPOLOGIES.get(folder(item.nodeid), ALL):
            item.add_marker(pytest.mark.long)
    for item in items:
        if item.nodeid.split("[")[0] in SLOW:
            item.add_marker(pytest.mark.slow)
    ids = {item.nodeid: item for item in items}
    files = {item.nodeid.split("::")[0] for item in items}
    topologies = os.environ.get("DQ_TOPOLOGIES", ",".join(ALL)).split(",")
    for nodeid in LONG:
        item = ids.get(nodeid)
        if item is not None:
            item.add_marker(pytest.mark.long)
        elif nodeid.split("::")[0] in files and _whole_files(config):
            topology = nodeid.rsplit("[", 1)[-1].rstrip("]").split("-")[0]
            if topology in ALL and topology not in topologies:
                continue  # narrowed away by DQ_TOPOLOGIES
            raise pytest.UsageError(f"tests/support/run.py LONG names no test: {nodeid}")


def _whole_files(config: pytest.Config) -> bool:
    """Whether whole test files were asked for: no single tests, no ``-k``."""
    return not config.getoption("keyword") and not any("::" in a for a in config.args)


# -- ports: each parallel worker (pytest-xdist) takes its own share of every range -------------

_worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
if _worker:
    os.environ[PORT_SLICE] = (
        f"{int(_worker.removeprefix('gw'))}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"
    )

# -- durations: every run writes each test's time (setup + call + teardown) --------------------

DURATIONS = ROOT / ".test-durations.json"
_durations: dict[str, float] = {}
_started = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (or a run without workers) writes ``.test-durations.json``: the tier,
    the topologies, the wall time and every test's seconds, slowest first."""
    if hasattr(session.config, "workerinput") or not _durations:
        return
    record: dict[str, Any] = {
        "tier": TIER,
        "topologies": os.environ.get("DQ_TOPOLOGIES", ",".join(ALL)),
        "workers": os.environ.get("PYTEST_XDIST_WORKER_COUNT")
        or getattr(session.config.option, "numprocesses", None)
        or 0,
        "wall_s": round(time.monotonic() - _started, 1),
        "tests": dict(sorted(_durations.items(), key=lambda kv: -kv[1])),
    }
    record["tests"] = {k: round(v, 2) for k, v in record["tests"].items()}
    Path(DURATIONS).write_text(json.dumps(record, indent=1) + "\n")
