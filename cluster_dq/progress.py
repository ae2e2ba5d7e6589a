"""Progress of long operator commands on stderr: a rich bar when stderr is a terminal, plain
lines (at most one per ``every`` seconds, and a last one) when it is not, so logs of a
non-interactive run stay readable. ``spark_progress`` feeds one from Spark's status tracker."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any


class Progress:
    """``update(completed, total)`` as work goes on, ``close()`` at the end (a context
    manager). ``total`` None: unknown (the bar spins, the lines give the count alone)."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "",
        stream: IO[str] | None = None,
        every: float = 5.0,
        bar: bool | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.completed = 0
        self.unit = unit
        self.stream = stream or sys.stderr
        self.every = every
        self._printed_at = time.monotonic()
        self._closed = False
        use_bar = bar if bar is not None else _isatty(self.stream)
        self._rich: Any = None
        if use_bar:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(unit),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
                redirect_stdout=False,  # stdout is the command's output, maybe a pipe
            )
            self._rich.start()
            self._task = self._rich.add_task(label, total=total)

    def update(self, completed: int, total: int | None = None) -> None:
        self.completed = completed
        if total is not None:
            self.total = total
        if self._rich is not None:
            self._rich.update(self._task, completed=completed, total=self.total)
        elif time.monotonic() - self._printed_at >= self.every:
            self._line()

    def advance(self, n: int) -> None:
        self.update(self.completed + n)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._rich is not None:
            self._rich.stop()
        else:
            self._line()

    def _line(self) -> None:
        self._printed_at = time.monotonic()
        of = f"/{self.total:,}" if self.total is not None else ""
        unit = f" {self.unit}" if self.unit else ""
        print(f"{self.label}: {self.completed:,}{of}{unit}", file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class StageTally:
    """Tasks done and planned over every Spark stage seen, from status-tracker snapshots: a
    stage that left the tracker's active list counts as done."""

    def __init__(self) -> None:
        self.stages: dict[int, tuple[int, int]] = {}

    def observe(self, active: dict[int, tuple[int, int]]) -> tuple[int, int]:
        for sid, (done, total) in list(self.stages.items()):
            if sid not in active:
                self.stages[sid] = (total, total)
        self.stages.update(active)
        return sum(d for d, _ in self.stages.values()), sum(t for _, t in self.stages.values())


@contextlib.contextmanager
def spark_progress(spark: Any, label: str, poll: float = 0.5) -> Iterator[Progress]:
    """A ``Progress`` of the Spark tasks run inside the block (counted over all its stages),
    polled from ``SparkContext.statusTracker()`` by a thread of its own."""
    tracker = spark.sparkContext.statusTracker()
    tally = StageTally()
    progress = Progress(label, None, unit="tasks")
    stop = threading.Event()

    def poll_once() -> None:
        active = {}
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                active[sid] = (info.numCompletedTasks, info.numTasks)
        if active or tally.stages:
            done, total = tally.observe(active)
            progress.update(done, total)

    def run() -> None:
        while not stop.wait(poll):
            with contextlib.suppress(Exception):  # a tracker call racing the session's stop
                poll_once()

    thread = threading.Thread(target=run, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(Exception):
            poll_once()
        progress.close()
