"""A reply lost after Redis ran the call: the fault the engine's repeat of a write is for."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.steps import Eval


@contextmanager
def first_reply_lost(
    engine: AsyncEngine, script: str, meanwhile: Callable[[], Awaitable[Any]] | None = None
) -> Iterator[list[int]]:
    """Within the block, the first call of ``script`` runs on Redis and its reply is lost (a
    connection error), after ``meanwhile`` (another client's move in between) if given; the
    list it yields holds one entry once that happened."""
    real_step = engine._step
    lost: list[int] = []

    async def lose(step: Any) -> Any:
        reply = await real_step(step)
        if isinstance(step, Eval) and step.script == script and not lost:
            lost.append(1)
            if meanwhile is not None:
                await meanwhile()
            raise RedisConnectionError("reply lost")
        return reply

    engine._step = lose  # type: ignore[method-assign]
    try:
        yield lost
    finally:
        engine._step = real_step  # type: ignore[method-assign]
