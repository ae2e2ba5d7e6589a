"""The wheel ships every module and every Lua script (package-data under lua/)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tests.support import ROOT


def test_every_lua_file_is_package_data() -> None:
    """``lua/`` stays at the top of the checkout (no symlink into the package): pyproject maps
    it onto the package ``cluster_dq.lua``, and every file in it matches a package-data pattern."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"]["cluster_dq.lua"] == "lua"
    assert not (ROOT / "cluster_dq" / "lua").exists()
    files = {p for p in (ROOT / "lua").rglob("*") if p.is_file()}
    shipped = set()
    for package, patterns in config["package-data"].items():
        assert package in config["packages"]
        base = ROOT / "lua" / package.removeprefix("cluster_dq.lua").lstrip(".").replace(".", "/")
        shipped |= {p.resolve() for pat in patterns for p in base.glob(pat)}
    assert files
    missing = sorted(str(f.relative_to(ROOT)) for f in files if f.resolve() not in shipped)
    assert not missing, f"not shipped in the wheel: {missing}"


def test_the_wheel_holds_every_module_and_script(tmp_path: Path) -> None:
    """Built for real: every module of every subpackage and every Lua file is in the wheel."""
    src = tmp_path / "src"  # a clean copy: setuptools would reuse a stale build/ in the tree
    for name in ("lua", "cluster_dq"):
        shutil.copytree(
            ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("cluster_dq-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {str(p.relative_to(ROOT)) for p in (ROOT / "cluster_dq").rglob("*.py")}
    wanted |= {
        "cluster_dq/" + str(p.relative_to(ROOT)) for p in (ROOT / "lua").rglob("*") if p.is_file()
    }
    ui = ROOT / "cluster_dq" / "dashboard"  # the dashboard's templates and static files
    wanted |= {
        str(p.relative_to(ROOT)) for d in ("templates", "static") for p in (ui / d).iterdir()
    }
    assert not sorted(wanted - shipped), f"not in the wheel: {sorted(wanted - shipped)}"
    # Installed (no checkout around it): the engine finds every script inside the package.
    target = tmp_path / "installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "from cluster_dq.engine.scripts import load_all, lua_dir; "
        "print(lua_dir()); print(' '.join(sorted(load_all())))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert out[0] == str(target / "cluster_dq" / "lua")
    assert out[1].split() == sorted(p.stem for p in (ROOT / "lua").glob("*.lua"))
