"""What ``/metrics`` answers on the admin port, rendered off the worker's event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from cluster_dq import metrics
from cluster_dq.metrics import SizeBoard


class Exposition:
    """What ``/metrics`` answers, rendered off the event loop: reading every worker's files
    and formatting the text runs in a thread, so the worker's other requests (the data port
    is served by the same loop) go on meanwhile. Scrapes that arrive while a render runs
    share it, and a render is reused for ``REUSE`` times as long as it took after it ended
    (a 20 ms render: 80 ms), so scrapes back to back or in parallel keep rendering to at most
    a fifth of the worker's time, never a thread each; never longer than ``REUSE_MAX_S``, so
    however slow a render, a scrape is at most that much older than the last one rendered."""

    REUSE = 4.0
    REUSE_MAX_S = 5.0

    def __init__(self, board: SizeBoard, clock: Callable[[], float] = time.monotonic) -> None:
        self.board = board
        self.clock = clock
        self._running: asyncio.Future[tuple[bytes, str]] | None = None
        self._last: tuple[bytes, str] | None = None
        self._fresh_until = 0.0

    async def render(self) -> tuple[bytes, str]:
        if self._last is not None and self.clock() < self._fresh_until:
            return self._last
        running = self._running
        if running is None:
            running = self._running = asyncio.ensure_future(self._render())
        # Shielded: a scraper that goes away does not cancel the render the others wait for.
        return await asyncio.shield(running)

    async def _render(self) -> tuple[bytes, str]:
        started = self.clock()
        try:
            self._last = await asyncio.to_thread(metrics.render, self.board)
        finally:
            self._running = None
        ended = self.clock()
        self._fresh_until = ended + min(self.REUSE * (ended - started), self.REUSE_MAX_S)
        return self._last
