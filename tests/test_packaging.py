"""The wheel ships every module and every Lua script (package-data under lua/)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_lua_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["cluster_dq"]
    files = {p for p in (ROOT / "lua").rglob("*") if p.is_file()}
    shipped = {p.resolve() for pat in patterns for p in (ROOT / "cluster_dq").glob(pat)}
    assert files
    missing = sorted(str(f.relative_to(ROOT)) for f in files if f.resolve() not in shipped)
    assert not missing, f"not shipped in the wheel: {missing}"
    assert (ROOT / "cluster_dq" / "lua").resolve() == (ROOT / "lua").resolve()


def test_the_wheel_holds_every_module_and_script(tmp_path: Path) -> None:
    """Built for real: every module of every subpackage and every Lua file is in the wheel."""
    src = tmp_path / "src"  # a clean copy: setuptools would reuse a stale build/ in the tree
    for name in ("lua", "cluster_dq"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(src)], check=True, capture_output=True)  # fmt: skip
    (wheel,) = tmp_path.glob("cluster_dq-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {str(p.relative_to(ROOT)) for p in (ROOT / "cluster_dq").rglob("*.py")}
    wanted |= {"cluster_dq/" + str(p.relative_to(ROOT)) for p in (ROOT / "lua").rglob("*") if p.is_file()}
    assert not sorted(wanted - shipped), f"not in the wheel: {sorted(wanted - shipped)}"
