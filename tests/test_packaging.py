"""The Lua scripts ship inside the wheel: every file under lua/ is matched by package-data."""

from __future__ import annotations

import tomllib
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
