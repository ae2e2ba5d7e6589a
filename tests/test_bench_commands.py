"""Every benchmark and drill command, run as the docs run it: ``python loadtest/X.py ...`` from
the checkout's root with the venv's python, as a subprocess, at a tiny size. It must exit 0 and
print figures. Nothing is timed or asserted about the figures themselves."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_command(args: list[str], timeout: float = 120) -> str:
    """Runs ``python <args>`` from the root as a user would (the script's folder first on
    sys.path); PYTHONPATH names the checkout so that it is this checkout's package that runs."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_bench_pipeline_runs() -> None:
    out = run_command(["loadtest/bench_pipeline.py", "--jobs", "2000"])
    assert re.search(r"jobs/s", out), out


@pytest.mark.parametrize(
    "module", sorted(p.stem for p in (ROOT / "loadtest").glob("*.py") if p.stem != "__init__")
)
def test_no_loadtest_module_shadows_another(module: str) -> None:
    """``python loadtest/X.py`` puts loadtest/ first on sys.path: a module there named like a
    standard or installed one replaces it for every import (loadtest/profile.py broke pyspark,
    which imports cProfile, which imports profile)."""
    assert module not in sys.stdlib_module_names
    assert importlib.util.find_spec(module) is None, importlib.util.find_spec(module)
