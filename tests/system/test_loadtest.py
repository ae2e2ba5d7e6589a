"""The load profile's short run (CI): locust through nginx to two service instances, with
resident delayed jobs in Redis. Figures are printed, not asserted (the full profile is
`python loadtest/load_profile.py`); what must hold at any rate is checked: the whole chain works,
no request fails, every resident job is still there."""

from __future__ import annotations

import pytest

from loadtest.load_profile import profile
from tests.support.run import by_tier


@pytest.mark.parametrize("cluster", [False, True], ids=["standalone", "cluster"])
def test_short_profile_through_nginx_has_no_errors(
    cluster: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    how_long, rate = by_tier(8, 120), by_tier(200, 300)  # the long run: 300 req/s for 2 min
    result = profile(jobs=20_000, rate=rate, seconds=how_long, instances=2, cluster=cluster)
    with capsys.disabled():
        print("\n" + capsys.readouterr().out)
    (step,) = result["steps"]
    assert step["failures"] == 0
    assert (
        step["requests"] > rate * how_long * 0.3
    )  # traffic really went through nginx to the service
    assert step["lateness_p99"] is not None  # jobs were delivered (and their lateness measured)
    assert result["resident_left"] == 20_000
    assert 0 < result["bytes_per_job"] < 1_000
