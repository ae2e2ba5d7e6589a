"""Where a run's time went: ``python -m tests.support.slowest [FILE] [N]`` reads the durations
the last run wrote (``.test-durations.json``) and prints, as Markdown for docs/testing.md, the
run's shape, each folder's total and the N (20) slowest tests (setup + call + teardown).
``--files`` prints each file's seconds instead, for ``tests/support/file_seconds.json`` (the
order in which the workers take the files)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from tests.support.run import DURATIONS, folder


def report(record: dict[str, object], n: int = 20) -> str:
    tests: dict[str, float] = record["tests"]  # type: ignore[assignment]
    total = sum(tests.values())
    by_folder: dict[str, float] = defaultdict(float)
    for nodeid, s in tests.items():
        by_folder[folder(nodeid) or "(top)"] += s
    lines = [
        f"Tier `{record['tier']}`, topologies {record['topologies']}, {record['workers']} workers:"
        f" {len(tests)} tests, {record['wall_s']:.0f} s of wall time,"
        f" {total:.0f} s of test time.",
        "",
        "| folder | tests' time (s) |",
        "|---|---:|",
        *(f"| {name} | {s:.0f} |" for name, s in sorted(by_folder.items(), key=lambda kv: -kv[1])),
        "",
        f"| the {n} slowest | s |",
        "|---|---:|",
        *(f"| `{nodeid}` | {s:.1f} |" for nodeid, s in list(tests.items())[:n]),
    ]
    return "\n".join(lines)


def file_seconds(record: dict[str, object]) -> dict[str, int]:
    """Each file's seconds, the longest first: ``tests/support/file_seconds.json``, the
    order in which the workers take the files."""
    tests: dict[str, float] = record["tests"]  # type: ignore[assignment]
    by_file: dict[str, float] = defaultdict(float)
    for nodeid, s in tests.items():
        by_file[nodeid.split("::")[0]] += s
    return {f: round(s) for f, s in sorted(by_file.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> None:
    """``[FILE] [N]``: the report; ``--files [FILE]``: each file's seconds, as JSON."""
    if argv[:1] == ["--files"]:
        path = Path(argv[1]) if len(argv) > 1 else DURATIONS
        print(json.dumps(file_seconds(json.loads(path.read_text())), indent=1))
        return
    path = Path(argv[0]) if argv else DURATIONS
    n = int(argv[1]) if len(argv) > 1 else 20
    print(report(json.loads(path.read_text()), n))


if __name__ == "__main__":
    main(sys.argv[1:])
