"""Loads the Lua scripts from ``lua/`` (shipped in the wheel as ``cluster_dq/lua``) and inlines
``--@include`` libs: each lib once per script, where it is first included, after the libs it
includes itself (so every local a lib defines comes before its first use).

``lib/codes.lua`` is a table of named reply codes, but no script builds that table when it
runs (it would cost every call ~1.5 us of server time): the loader folds each ``CODE.NAME``
into its number instead, and an unknown name fails here, at load time.

A script's libs run before it on every call, and each ``local function`` they define is a
closure made anew each time (about 0.1 us of server time apiece): the loader leaves out each
top-level function of a lib that nothing in the script names (``_shaken``), which takes
1-2 us off every call.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

_INCLUDE = re.compile(r"^--@include (\S+)$", re.MULTILINE)
CODES_LIB = "lib/codes"
_CODE_TABLE = re.compile(r"^local CODE = \{\n(.*?)^\}", re.DOTALL | re.MULTILINE)
_CODE_ENTRY = re.compile(r"^\s*([A-Z_]+) = (-?\d+),", re.MULTILINE)
_CODE_REF = re.compile(r"\bCODE\.([A-Za-z_]+)\b")
# a lib's top-level function: from `local function name(` at the start of a line to the first
# `end` alone at the start of a line (the libs' style: a function's body is indented)
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)  # no string of the scripts holds `--`
_TOP_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end\n", re.MULTILINE | re.DOTALL)


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
    # EVALSHA's name for it, hashed once: every call sends it, and a source with its includes
    # is tens of kB (hashing it per call cost 2-3 % of a bulk publish's service CPU)
    sha: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


def lua_codes(base: Path) -> dict[str, int]:
    """The reply codes of ``lib/codes.lua``, by name."""
    table = _CODE_TABLE.search((base / f"{CODES_LIB}.lua").read_text())
    if table is None:
        raise ValueError(f"{base / CODES_LIB}.lua: no 'local CODE = {{' table")
    return {name: int(value) for name, value in _CODE_ENTRY.findall(table.group(1))}


def _fold(name: str, codes: dict[str, int]) -> str:
    if name not in codes:
        raise ValueError(f"CODE.{name} is not in {CODES_LIB}.lua")
    value = codes[name]
    return f"({value})" if value < 0 else str(value)  # parenthesised: never `x - -6` -> `x --6`


def _expand(text: str, base: Path, codes: dict[str, int]) -> str:
    seen: set[str] = set()

    def include(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == CODES_LIB:
            return f"-- (reply codes: folded into numbers by the loader, see {CODES_LIB}.lua)"
        if name in seen:  # a lib is inlined once per script, where it is first included
            return ""
        seen.add(name)
        return _INCLUDE.sub(include, (base / f"{name}.lua").read_text())  # its own first

    expanded = _INCLUDE.sub(include, text)
    return _shaken(_CODE_REF.sub(lambda m: _fold(m.group(1), codes), expanded))


def _shaken(source: str) -> str:
    """``source`` without the top-level functions that nothing else in it calls or names
    outside comments (a name in a string keeps one: never too few), until none is left."""
    while True:
        blocks = [(m.group(1), m.start(), m.end()) for m in _TOP_FUNCTION.finditer(source)]
        kept = source
        for name, start, end in reversed(blocks):  # from the end: earlier offsets stay right
            rest = kept[:start] + kept[end:]
            if not re.search(rf"\b{re.escape(name)}\b", _COMMENT.sub("", rest)):
                kept = rest
        if kept == source:
            return source
        source = kept


@functools.cache
def load_all() -> dict[str, LuaScript]:
    base = lua_dir()
    codes = lua_codes(base)
    out = {}
    for path in sorted(base.glob("*.lua")):
        out[path.stem] = LuaScript(path.stem, _expand(path.read_text(), base, codes))
    return out
