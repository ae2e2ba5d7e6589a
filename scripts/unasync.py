"""Writes the blocking clients from the asyncio ones, as httpcore's ``scripts/unasync.py`` does:
every module of ``cluster_dq/client/_async/`` becomes the module of the same name in
``cluster_dq/client/_sync/`` with ``async`` and ``await`` taken out and the async names swapped
for their blocking twins, then sorted and formatted by ruff. The two cannot drift apart: no
verb, argument, default or docstring is written twice.

    python scripts/unasync.py            # write cluster_dq/client/_sync/
    python scripts/unasync.py --check    # exit 1, naming the files, if one is not up to date
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "cluster_dq" / "client" / "_async"
TARGET = ROOT / "cluster_dq" / "client" / "_sync"

# In order: a longer name before one it contains.
SUBSTITUTIONS = [
    ("async def ", "def "),
    ("await ", ""),
    ("cluster_dq.client._async", "cluster_dq.client._sync"),
    ("AsyncRetrying", "Retrying"),
    ("AsyncIterator", "Iterator"),
    ("AsyncBaseTransport", "BaseTransport"),
    ("AsyncAdminClient", "AdminClient"),
    ("AsyncSender", "Sender"),
    ("async_sender", "sync_sender"),
    ("AsyncClient", "Client"),
    ("aclose", "close"),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
    ("the asyncio client", "the blocking client"),
]


def header(source: Path) -> str:
    origin = source.relative_to(ROOT).as_posix()
    return f"# Generated from {origin} by scripts/unasync.py:\n# edit that file, then run the script.\n"


def modules(folder: Path) -> list[Path]:
    """A folder's modules, but its ``__init__.py`` (each package says what it is itself)."""
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


def unasync(source: Path) -> str:
    text = source.read_text(encoding="utf-8")
    for old, new in SUBSTITUTIONS:
        text = text.replace(old, new)
    ruff = Path(sys.executable).parent / "ruff"  # the project's own (the test extra pins it)
    if not ruff.exists():
        raise SystemExit(f"unasync: {ruff} not found: install the test extra (.venv)")
    target = TARGET / source.name
    for step in (["check", "--select", "I", "--fix", "--quiet"], ["format", "--quiet"]):
        text = subprocess.run(
            [str(ruff), *step, "--stdin-filename", str(target), "-"],
            input=text,
            capture_output=True,
            text=True,
            encoding="utf-8",
            check=True,
        ).stdout
    return header(source) + text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = ap.parse_args(argv)
    stale = []
    wanted = {s.name: unasync(s) for s in modules(SOURCE)}
    present = {p.name for p in modules(TARGET)}
    for name, text in wanted.items():
        target = TARGET / name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            stale.append(target)
            if not args.check:
                target.write_text(text, encoding="utf-8")
    for name in sorted(present - set(wanted)):  # a module whose async twin is gone
        stale.append(TARGET / name)
        if not args.check:
            (TARGET / name).unlink()
    for path in stale:
        verb = "is not up to date" if args.check else "written"
        print(f"{path.relative_to(ROOT)} {verb}", file=sys.stderr)
    if args.check and stale:
        print("run: python scripts/unasync.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
