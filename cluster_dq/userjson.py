"""JSON from users, read strictly: RFC 8259 values with finite numbers, one rule for every
body and parameter the service parses as JSON (progress, results, batch acks, bulk publishes,
schedules, queue settings, limits, reasons and errors).

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON) and reads a number
beyond a float's range (``1e999``) as infinity. Stored, such a value is written back as
``Infinity``, which no JSON reader accepts, the service's own answers included: refused here,
it is a 400 naming the parameter, and nothing is written. No I/O.
"""

from __future__ import annotations

import json
import math
from typing import Any

from cluster_dq.errors import BadRequest


class NotFinite(ValueError):
    """A number JSON cannot carry: NaN, Infinity, or one beyond a float's range."""


def _constant(name: str) -> Any:
    raise NotFinite(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotFinite(f"{text[:32]} is beyond the range of a number (a float's)")
    return value


# One decoder (the C scanner takes the hooks): ``raw_decode`` for the bulk publish's elements.
DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_float)


def loads(data: bytes | str) -> Any:
    """``data`` as JSON, strictly. Raises ``NotFinite`` for a non-finite number, another
    ``ValueError`` for anything else that is not JSON (UTF-8 included, and integers of more
    than Python's 4,300 digits), ``RecursionError`` for nesting deeper than Python goes."""
    return json.loads(data, parse_constant=_constant, parse_float=_float)


def parse(data: bytes | str, what: str, message: str) -> Any:
    """``data`` as JSON, else a ``BadRequest`` naming ``what``: ``message`` when it is not
    JSON, and why when it holds a number JSON cannot carry."""
    try:
        return loads(data)
    except NotFinite as e:
        raise BadRequest(f"invalid {what}: {e}", what) from None
    except (ValueError, RecursionError):  # bad JSON or UTF-8, deep nesting, huge integers
        raise BadRequest(message, what) from None


def stored(raw: bytes) -> Any:
    """A JSON value the service stored (a progress, a result), for an answer. One stored
    before the strict rule may hold ``Infinity`` or ``NaN``, which no answer can carry: it is
    given as its text, a JSON string, rather than failing the request."""
    try:
        return loads(raw)
    except (ValueError, RecursionError):
        return raw.decode(errors="replace")
