"""Short runs of the black-box history test (loadtest/history.py): random consumers that ack,
drop, touch, release and ack late, through two real service instances, jobs of groups (one
heavy, three light, one paused and limited at run time) and under dedup keys (simple,
debounce, throttle), while an instance and the pump leader are SIGKILLed (and restarted), or
a Redis master is SIGKILLed (Sentinel, Cluster; durable publish on and off). The recorded
history is checked (loadtest/history_check.py, unit-tested in test_history_check.py) for what
the engine guarantees there.

Long runs are a command: ``python loadtest/history.py all --seconds 300``.
"""

from __future__ import annotations

import pytest

from cluster_dq.localredis import Server
from loadtest.history import Report, Run, history_run, print_report
from loadtest.history_mix import tally
from tests.support.run import by_tier

SECONDS = by_tier(6, 60)  # of load (long run: a minute); with the restarts, the drain and
# the lookups a short run takes ~15-20 s
AT_LEAST = 150  # publishes answered 2xx: the load goes on past SECONDS until there are as many

# Across a Redis failover: a consume, a touch, a release and the pump's moves are not durable
# writes (publish and ack are), so a failover may roll a reservation back, or the end of one:
# a second holder within the ttr, one delivery more than tries, a dead letter that is ready
# again, a release's delay (early_release), an earlier lease holding again after a later
# delivery (stale_lease: a touch that shortened its hold, or a release, and the delivery after
# it, both rolled back), a group's turns (starved), a dedup key's job shown by a consume or an
# `existing` answer only (which write nothing durable: dedup_twice), a group's reservations,
# settings and rate's turns (while_paused, over_concurrency, over_rate). Those are printed, not
# asserted, there. Everything else is guaranteed.
ALWAYS = ("unexpected", "double_publish", "early", "remain_tries", "left_behind")
DURABLE = (*ALWAYS, "lost", "duplicated")  # publish and ack are WAITed


def sound(report: Report, run: Run, kinds: tuple[str, ...]) -> None:
    print_report(run.scenario, run.durable, SECONDS, report, run)  # the figures, for the CI log
    found = {k: report.counts[k] for k in kinds if report.counts[k]}
    assert not found, (found, {k: report.examples[k] for k in found}, run.events)
    assert report.stats["publish_ok"] >= AT_LEAST, report.stats
    # Not a vacuous run: jobs came back after a dropped ttr or a release, and died.
    assert report.stats["redelivered_jobs"] > 0 and report.stats["dead_at_end"] > 0, report.stats
    # ... and groups and dedup keys were used: grouped jobs delivered and judged, a dedup
    # key's job found by another publish, the metered group's settings changed.
    done = tally(run.h)
    assert done["grouped_deliveries"] and report.stats["turns_judged"], (done, report.stats)
    assert done["existing"] and done["group_changes"], done
    assert len([e for e in run.events if "SIGKILL" in e]) == 2, run.events
    assert not [k for k in run.statuses if k.endswith(" 500")], run.statuses
    # A 503 carrying a bare ResponseError is a Redis reply the engine did not understand.
    assert not [k for k, text in run.examples.items() if "ResponseErro" in text], run.examples


def test_history_standalone_instance_and_pump_leader_killed(redis_server: Server) -> None:
    report, run = history_run("standalone", SECONDS, deployment=redis_server, at_least=AT_LEAST)
    sound(report, run, tuple(report.counts))  # no failover: every anomaly counts
    # The metered group's settings were judged: deliveries under a limit or a rate, or
    # consumes of its queue while it was paused.
    judged = ("limited_deliveries", "pause_consumes")
    assert sum(report.stats[k] for k in judged) > 0, report.stats
    # Late acks with a lease whose delivery lapsed were sent, and refused (409), while the
    # checker found none that succeeded against another consumer's hold (stale_lease).
    assert report.stats["lease_conflicts"] > 0, report.stats


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "not-durable"])
@pytest.mark.parametrize("scenario", ["sentinel", "cluster"])
def test_history_redis_master_killed(scenario: str, durable: bool) -> None:
    report, run = history_run(scenario, SECONDS, durable=durable, at_least=AT_LEAST)
    # Without durable publish a failover may lose acknowledged publishes (and acks): reported.
    sound(report, run, DURABLE if durable else ALWAYS)
