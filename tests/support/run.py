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
from tests.support.fixtures import SHARED

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


def against_redis(n: int) -> settings:
    """The settings of a property test run against a real Redis: ``examples(n)`` examples, no
    deadline (a step waits on the server), and the fixtures it takes (a server, an engine)
    shared by its examples, each of which keeps to its own keys."""
    return settings(
        max_examples=examples(n),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


def by_tier(default: int, long: int) -> int:
    """A fixed-duration system run's length or rate (a drill, a history, the load profile): its
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

# Guarantees that live in a surface folder, beside the routes they go through: each runs on the
# topologies listed here by default, whatever its folder's (the races and exactly-once rules
# of per-job control, a full queue never overshot, schedules firing once across leaders and
# pools, a SIGKILLed worker's job acked once, leases and placement while pools migrate).
_BOTH = ("standalone", "cluster")
GUARANTEES: dict[str, tuple[str, ...]] = {
    **{
        f"tests/http/test_control.py::{name}": _BOTH
        for name in (
            "test_a_walk_lists_in_cursor_order_every_job_dead_throughout_exactly_once",
            "test_bury_races_ack_exactly_one_wins",
            "test_bury_with_lease_races_a_leased_ack_never_both_never_neither",
            "test_kick_races_respawn_the_job_is_ready_exactly_once",
            "test_reschedule_races_promotion_and_consume_delivered_exactly_once",
            "test_redrive_while_jobs_die_loses_and_duplicates_nothing",
        )
    },
    **{
        f"tests/http/test_schedules.py::{name}": _BOTH
        for name in (
            "test_every_occurrence_is_published_once_with_competing_firers_and_a_leader_change",
            "test_a_gap_inside_the_window_fires_every_missed_occurrence_once_beyond_it_only_the_window",
            "test_real_pumps_fire_once_across_a_killed_leader",
            "test_a_schedule_moved_to_a_new_pool_publishes_each_occurrence_once",
        )
    },
    "tests/http/test_queue_control.py::test_concurrent_publishes_never_take_a_queue_beyond_its_max_size": _BOTH,
    "tests/http/test_review_findings.py::test_leases_work_while_a_pool_migrates": _BOTH,
    "tests/http/test_review_findings.py::test_consume_with_ttr_zero_gives_no_second_holder": _BOTH,
    "tests/client/test_worker.py::test_a_worker_killed_mid_job_its_job_comes_back_after_the_ttr_and_is_acked_once": _BOTH,
    # placement and migration between pools: the old pool is a standalone server, the new one
    # the topology under test (standalone: two databases of one server), on all three
    **{
        f"tests/http/test_routing.py::{name}": ALL
        for name in (
            "test_migration_drains_the_old_pool_while_publishing_to_the_new",
            "test_a_ring_spreads_queues_and_drains_moved_ones_after_a_pool_is_added",
            "test_publish_and_consume_beside_the_engine",
            "test_a_queues_settings_follow_it_to_the_pool_it_moves_to",
            "test_a_queues_schedules_move_with_it_and_fire_once_per_occurrence",
        )
    },
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
    # the pipeline writes through the engine's operations, which the engine suite runs on every
    # topology: by default it runs on a Cluster (its CLI on standalone), on standalone here
    "tests/system/test_pipeline.py::test_schedule_validates_publishes_and_reruns_idempotently[standalone]",
    "tests/system/test_pipeline.py::test_schedule_and_export_follow_a_ring[standalone]",
    # the pipeline's command line, each run a Spark of its own (~40 s of a loaded core): the
    # same functions run in-process by default
    "tests/system/test_pipeline.py::test_cli_schedule_and_export_print_counts",
    "tests/system/test_pipeline.py::test_cli_schedule_signals_the_shard_of_the_configured_shard_count",
    # every verb's 503 while Redis is down is test_outages' (in-process); this is its CLI
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[outage_answers.py]",
    # the peer benchmark installs BullMQ from the npm registry: no network in the default run
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_peers.py]",
    # the benchmarks that load both cores (locust, wrk, the CPU and engine measurements), each
    # slowing every test beside it: they print figures, they check no guarantee
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_locust.py]",
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_cpu.py]",
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_http.py]",
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_engine.py]",
    "tests/system/test_bench_commands.py::test_command_runs_small_and_prints_figures[bench_scale.py]",
)


# Tests of the quick tier's folders it leaves to the default run (marked ``slow``; the quick
# tier deselects them): each takes seconds to provoke a fault or wait out a timeout that the
# edit-and-test loop can do without, and each is in every default run.
SLOW: tuple[str, ...] = (
    # schemathesis over both documents and the raw-HTTP fuzz run: minutes of generated requests
    "tests/http/test_openapi.py::test_data_port_conforms_to_its_document",
    "tests/http/test_openapi.py::test_data_port_follows_its_links",
    "tests/http/test_openapi.py::test_admin_port_conforms_to_its_document",
    "tests/http/test_fuzz.py::test_http_surface",
    # Redis killed or stopped under a service: each request rides out its 5 s retry budget
    "tests/http/test_http.py::test_redis_lost_mid_flight_gives_503_on_every_route",
    "tests/http/test_http.py::test_redis_down_gives_503_not_500",
    "tests/http/test_edges.py::test_503_shows_no_redis_address_or_exception",
    "tests/engine/test_service.py::test_a_503_says_what_may_have_happened",
    "tests/engine/test_executors.py::test_a_durable_write_waits_for_replicas_in_both",
    # worker restarts, crash loops, capped series and waiters: processes started and waited for
    "tests/http/test_runtime.py::test_per_queue_metric_series_are_capped",
    "tests/http/test_runtime.py::test_a_dead_worker_is_restarted_and_a_crash_loop_exits_non_zero",
    "tests/http/test_runtime.py::test_long_polls_beyond_max_waiters_get_429_at_once_and_reserve_nothing",
    # migrations between pools, end to end: seconds of draining
    "tests/http/test_routing.py::test_migration_drains_the_old_pool_while_publishing_to_the_new",
    "tests/http/test_routing.py::test_a_ring_spreads_queues_and_drains_moved_ones_after_a_pool_is_added",
    "tests/http/test_routing.py::test_a_queues_settings_follow_it_to_the_pool_it_moves_to",
    "tests/http/test_routing.py::test_a_queues_schedules_move_with_it_and_fire_once_per_occurrence",
)


def folder(nodeid: str) -> str:
    """``tests/http/test_http.py::t`` -> ``http``."""
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 else ""


def order_folders(items: list[pytest.Item]) -> None:
    """Orders the tests: the files the longest first (``FILE_SECONDS``); within a file,
    those that use the shared service first, by topology (it stops before any other test,
    and starts again for the next that uses it). A stable sort, so that the groups pytest
    made by fixture parameters stay (called last, by ``tests/conftest.py``)."""

    def place(item: pytest.Item) -> tuple[float, int, int]:
        file = -FILE_SECONDS.get(item.nodeid.split("::")[0], UNMEASURED_S)
        names = set(getattr(item, "fixturenames", ()))
        shared = [SHARED[name] for name in SHARED if name in names]
        if not shared:
            return file, 1, 0
        callspec = getattr(item, "callspec", None)
        on = shared[0] or (callspec.params.get("deployment") if callspec is not None else None)
        return file, 0, ALL.index(on) if on in ALL else 0

    items.sort(key=place)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``long`` the tests of a topology their folder leaves to the long run (but the
    ``GUARANTEES``), and those of ``LONG``; marks ``slow`` those of ``SLOW``. An entry of
    these lists that names no test of a collected file is an error: the lists must not go
    stale when a test is renamed."""
    narrowed = os.environ.get("DQ_TOPOLOGIES", ",".join(ALL)).split(",")
    for item in items:
        callspec = getattr(item, "callspec", None)
        on = callspec.params.get("deployment") if callspec is not None else None
        if on is None:
            continue
        base = item.nodeid.split("[")[0]
        default = GUARANTEES.get(base) or DEFAULT_TOPOLOGIES.get(folder(item.nodeid), ALL)
        # a run narrowed to topologies none of which is the default keeps what it asked for
        if on not in default and set(default) & set(narrowed):
            item.add_marker(pytest.mark.long)
    for item in items:
        if item.nodeid.split("[")[0] in SLOW:
            item.add_marker(pytest.mark.slow)
    ids = {item.nodeid: item for item in items}
    files = {item.nodeid.split("::")[0] for item in items}
    bases = {item.nodeid.split("[")[0] for item in items}
    for nodeid in (*GUARANTEES, *SLOW):
        if nodeid not in bases and nodeid.split("::")[0] in files and _whole_files(config):
            raise pytest.UsageError(f"tests/support/run.py names no such test: {nodeid}")
    topologies = narrowed
    for nodeid in LONG:
        named = ids.get(nodeid)
        if named is not None:
            named.add_marker(pytest.mark.long)
        elif nodeid.split("::")[0] in files and _whole_files(config):
            topology = nodeid.rsplit("[", 1)[-1].rstrip("]").split("-")[0]
            if topology in ALL and topology not in topologies:
                continue  # narrowed away by DQ_TOPOLOGIES
            raise pytest.UsageError(f"tests/support/run.py LONG names no test: {nodeid}")


# The order the workers are handed files in (``--dist loadfile``: a file's tests run on one
# worker, so its module fixtures, a Spark session or a fuzz target, start once): the folders
# of long runs first, so that no worker starts a two-minute file when the others are done.
# Each file's seconds in the last measured default run (``python -m tests.support.slowest
# --files``): a worker takes whole files, the longest first, so that none starts a long file
# when the others are done (a file never measured counts as ``UNMEASURED_S``).
FILE_SECONDS: dict[str, float] = json.loads(
    (Path(__file__).parent / "file_seconds.json").read_text()
)
UNMEASURED_S = 10.0


def _whole_files(config: pytest.Config) -> bool:
    """Whether whole test files were asked for: no single tests, no ``-k``."""
    return not config.getoption("keyword") and not any("::" in a for a in config.args)


# -- ports: each parallel worker (pytest-xdist) takes its own share of every range -------------

_worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
if _worker:
    _count = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    # modulo: a worker that replaces a crashed one gets the next id (gw2 of 2)
    os.environ[PORT_SLICE] = f"{int(_worker.removeprefix('gw')) % _count}/{_count}"

# -- durations: every run writes each test's time (setup + call + teardown) --------------------

DURATIONS = ROOT / ".test-durations.json"
_durations: dict[str, float] = {}
_started = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if hasattr(report, "context"):
        return  # a subtest's (schemathesis: one per operation): counted in its test's time
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
