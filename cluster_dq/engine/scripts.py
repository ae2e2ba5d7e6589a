"""Loads the Lua scripts from ``lua/`` (shipped in the wheel as ``cluster_dq/lua``) and inlines
``--@include`` libs."""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

_INCLUDE = re.compile(r"^--@include (\S+)$", re.MULTILINE)


def lua_dir() -> Path:
    """The scripts: ``cluster_dq/lua`` in an installed wheel (pyproject.toml maps ``lua/``
    onto that package), else ``lua/`` at the top of the checkout this package is in."""
    shipped = Path(str(resources.files("cluster_dq") / "lua"))
    if shipped.is_dir():
        return shipped
    return Path(__file__).resolve().parents[2] / "lua"


@dataclass(frozen=True, slots=True)
class LuaScript:
    name: str
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


def _expand(text: str, base: Path) -> str:
    return _INCLUDE.sub(lambda m: (base / f"{m.group(1)}.lua").read_text(), text)


@functools.cache
def load_all() -> dict[str, LuaScript]:
    base = lua_dir()
    out = {}
    for path in sorted(base.glob("*.lua")):
        out[path.stem] = LuaScript(path.stem, _expand(path.read_text(), base))
    return out
