"""deploy/local/redis: starts a topology, is idempotent, reports status, stops it clean."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import redis

from tests.support import ROOT


def run(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CLUSTER_DQ_LOCAL_DIR": str(state)}
    return subprocess.run(
        [str(ROOT / "deploy/local/redis"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_up_is_idempotent_and_down_cleans_up(tmp_path: Path) -> None:
    first = run("up", "standalone", state=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "export CLUSTER_DQ_POOL__DEFAULT__ADDR=127.0.0.1:17379" in first.stdout
    state = json.loads((tmp_path / "standalone.json").read_text())
    (member,) = state["members"]
    try:
        with redis.Redis(port=member["port"]) as r:
            assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
            assert r.config_get("bind") == {"bind": "127.0.0.1"}
        again = run("up", "standalone", state=tmp_path)
        assert again.returncode == 0 and again.stdout == first.stdout
        assert json.loads((tmp_path / "standalone.json").read_text()) == state  # same process
        assert run("status", "standalone", state=tmp_path).returncode == 0
    finally:
        assert "stopped" in run("down", "standalone", state=tmp_path).stdout
    assert run("status", "standalone", state=tmp_path).returncode == 1
    assert not Path(member["dir"]).exists()
    assert run("up", "nonsense", state=tmp_path).returncode == 2
