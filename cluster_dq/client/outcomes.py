"""What happens to a job after its handler: the exceptions a handler raises to say so
(``Retry``, ``Snooze``, ``Bury``), the four outcomes, and ``decide``, the one rule that maps a
handler's return or exception onto an outcome (used by ``Worker`` and by ``testing.run_job``).

    return value            -> Acked(result)      ack, the value as its result (None: none)
    raise Retry(delay)      -> Released           release; the delivery counts (a try spent)
    raise Snooze(delay)     -> Snoozed            release with keep_try: no try spent
    raise Bury(reason)      -> Buried             to the dead letter with the reason
    raise one of bury_on    -> Buried             reason: "<Type>: <message>"
    raise any other         -> Released           error: "<Type>: <message>", no delay (the
                                                  job's retry backoff applies server-side);
                                                  any BaseException too (GeneratorExit, a
                                                  class of the handler's own)

The caller handles three exceptions before this rule: a ``CancelledError`` from cancelling
the handler's task (the shutdown gives its job back; one the handler raised itself is
released as any other), and ``SystemExit`` / ``KeyboardInterrupt`` (the job is given back
unspent and the worker stops).
"""

from __future__ import annotations

from cluster_dq.client._core import json_text
from dataclasses import dataclass
from typing import Any

MAX_TEXT = 1024  # bytes of UTF-8: the service's limit for an error text or a bury reason
MAX_DELAY = 2**32 - 1  # seconds: the service's largest delay (a 400 above)
MAX_RESULT = 4096  # bytes of compact JSON: the service's limit for an ack's result


def _seconds(delay: float) -> float:
    """A delay as the service takes it; a bad one is the handler's error (a ValueError)."""
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= MAX_DELAY:
        raise ValueError(f"delay must be a number of seconds >= 0, not {delay!r}")
    return float(delay)


class Retry(Exception):
    """Give the job back to be tried again, after ``delay`` seconds (None: at once, or after
    the job's retry backoff); the delivery counts, so the last try goes to the dead letter.
    ``error``: kept as the job's last error."""

    def __init__(self, delay: float | None = None, error: str | None = None) -> None:
        super().__init__(error or "retry")
        self.delay, self.error = None if delay is None else _seconds(delay), error


class Snooze(Exception):
    """Give the job back for ``delay`` seconds without spending a try (not now, later: a
    rate limit, a dependency not ready yet). ``error``: kept as the job's last error."""

    def __init__(self, delay: float, error: str | None = None) -> None:
        super().__init__(error or f"snooze {delay} s")
        self.delay, self.error = _seconds(delay), error


class Bury(Exception):
    """Send the job to the dead letter now: it can never succeed. ``reason`` is kept."""

    def __init__(self, reason: str = "buried") -> None:
        super().__init__(reason)
        self.reason = reason


def seconds_text(limit: float) -> str:
    """A time limit as the messages say it: "30", "0.5", "1234567"."""
    return f"{limit:.3f}".rstrip("0").rstrip(".")


class TimeLimitExceeded(Exception):
    """A handler ran past its job's time limit: an async one was cancelled, a sync one is
    left to finish in its thread (a thread cannot be stopped), its result ignored. The job is
    released with this as its error, spending a try, and its slot is free at once."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"the handler ran past the job's time limit of {seconds_text(limit)} s")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Acked:
    result: Any = None


@dataclass(frozen=True, slots=True)
class Released:
    delay: float | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Snoozed:
    delay: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Buried:
    reason: str


Outcome = Acked | Released | Snoozed | Buried


def _text(value: object) -> str:
    """``value`` as a string, even one whose ``__str__`` raises (a careless exception):
    whatever it raises, ``KeyboardInterrupt`` or ``GeneratorExit`` included, is the value's
    fault, not a signal to this worker, and must not leave the job unsettled."""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except BaseException:  # noqa: BLE001  # see above
        return f"<unprintable {type(value).__name__}>"


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, on a character boundary (anything
    else a careless handler gave as a text: as ``str`` shows it)."""
    text = _text(text)
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return text.encode("utf-8", "replace").decode()
    return raw[:limit].decode("utf-8", "ignore")


def describe(exc: BaseException) -> str:
    """An exception as an error text: its type and message, within the service's limit."""
    message = _text(exc)
    return clip(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


def decide(
    returned: Any = None,
    exc: BaseException | None = None,
    bury_on: tuple[type[BaseException], ...] = (),
) -> Outcome:
    """The outcome of a handler that returned ``returned`` or raised ``exc`` (any
    exception; the cancellation of its task and interpreter exits are the caller's business,
    see above). A return value that is not JSON, or over the service's 4,096 bytes, is the
    handler's error, and so is one whose encoding raises (a ``dict`` whose ``items()`` fails):
    ``decide`` never raises, so no job is left held for want of an outcome."""
    if exc is None:
        if returned is None:
            return Acked()
        try:
            size = len(json_text(returned))  # as the service measures it
        except Exception as e:  # TypeError, ValueError, RecursionError (too deep), its own
            return Released(error=clip(f"result is not JSON: {describe(e)}"))
        if size > MAX_RESULT:
            return Released(error=f"result too large: {size} bytes of JSON (max {MAX_RESULT})")
        return Acked(returned)
    try:  # the delay checked again: a subclass may have set its own after the base's check
        if isinstance(exc, Snooze):
            return Snoozed(_seconds(exc.delay), None if exc.error is None else clip(exc.error))
        if isinstance(exc, Retry):
            delay = None if exc.delay is None else _seconds(exc.delay)
            return Released(delay, None if exc.error is None else clip(exc.error))
        if isinstance(exc, Bury):
            return Buried(clip(exc.reason))
    except Exception:  # a subclass that skipped its base's __init__, or set a bad delay, or
        return Released(error=describe(exc))  # whose attributes raise: the handler's error
    if bury_on and isinstance(exc, bury_on):
        return Buried(describe(exc))
    return Released(error=describe(exc))
