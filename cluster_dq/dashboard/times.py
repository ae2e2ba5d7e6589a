"""How the dashboard shows and reads a moment: one convention, UTC, labelled, everywhere.

Every page (and the audit log) shows a time as ``2026-01-31 08:00:00.123 UTC`` in a
``<time datetime="2026-01-31T08:00:00.123Z" data-ms="…">`` element, rendered by the server:
no script turns it into the browser's zone. The forms that take a time (a dead-letter redrive
or purge) take exactly that text, an ISO-8601 date and time (UTC unless it names its offset,
``Z`` included), or ms since the epoch, so a time copied from a page names the same moment.
"""

from __future__ import annotations

from datetime import datetime, timezone

_LABEL = " UTC"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _at(ms: int) -> datetime | None:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):  # beyond year 9999 (or before year 1)
        return None


def shown(ms: int) -> str:
    """``2026-01-31 08:00:00.123 UTC``; a time no calendar holds: its ms, labelled."""
    at = _at(ms)
    if at is None:
        return f"{ms} ms since the epoch"
    return at.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}" + _LABEL


def clock(ms: int) -> str:
    """``08:05 UTC``: a chart's tick, the hour and minute of a moment, labelled as every time."""
    at = _at(ms)
    return "" if at is None else at.strftime("%H:%M") + _LABEL


def iso(ms: int) -> str:
    """``2026-01-31T08:00:00.123Z`` (the ``datetime`` of a ``<time>``), '' if none."""
    at = _at(ms)
    if at is None:
        return ""
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def moment(raw: str) -> datetime | None:
    """A date and time as the pages show it (``… UTC``) or in ISO-8601 (UTC unless it names
    its offset), or None when it is neither."""
    text = raw.strip()
    if text.upper().endswith(_LABEL.strip()):
        text = text[: -len(_LABEL.strip())].rstrip()
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def parse(raw: str, upper: bool = False) -> int | None:
    """``moment`` as ms since the epoch, rounded inward for a range's bound (up; down when
    ``upper``), or None."""
    when = moment(raw)
    if when is None:
        return None
    delta = when - _EPOCH  # exact, in whole microseconds (a float's timestamp is not)
    us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return us // 1000 if upper else -(-us // 1000)
