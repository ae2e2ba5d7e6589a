"""JSON from users, read strictly: RFC 8259 values with finite numbers, one rule for every
body and parameter the service parses as JSON (progress, results, batch acks, bulk publishes,
schedules, queue settings, limits, reasons and errors).

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON) and reads a number
beyond a float's range (``1e999``) as infinity. Stored, such a value is written back as
``Infinity``, which no JSON reader accepts, the service's own answers included: refused here,
it is a 400 naming the parameter, and nothing is written. So is an integer beyond a double's
range (``1`` and 400 zeros: Python keeps it exactly, a reader on doubles gets infinity), and
an object that names a key twice. A string holding a lone surrogate (``"\\ud800"``: no
Unicode text, and not UTF-8 once written out) is refused by each reader that keeps a text
(``check_text`` for a bulk publish's elements; the others name their field). No I/O.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from cluster_dq.errors import BadRequest


class NotFinite(ValueError):
    """A number JSON cannot carry: NaN, Infinity, or one beyond a float's range. ``field``:
    the key of the innermost object holding it (None: not in an object)."""

    def __init__(self, text: str, field: str | None = None) -> None:
        super().__init__(f"{text[:32]} is not a finite number")
        self.field = field


class DuplicateKey(ValueError):
    """An object that names one key twice: which value counts would be a guess (RFC 8259 says
    the names SHOULD be unique; Python keeps the last)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key[:64]} is given twice")
        self.field = key


class NotText(ValueError):
    """A string holding a lone surrogate (an escape ``\\ud800`` with no pair): not Unicode
    text, which no UTF-8 writer can write."""

    def __init__(self) -> None:
        super().__init__("a lone surrogate (\\ud800 to \\udfff unpaired) is not text")


# an escape of a surrogate: only then is a parsed value checked for a lone one
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_B = re.compile(rb"\\u[dD][89a-fA-F]")


def check_text(raw: bytes | str, value: Any) -> None:
    """``NotText`` when ``value``, parsed from ``raw``, holds a lone surrogate."""
    escaped = _SURROGATE_B.search(raw) if isinstance(raw, bytes) else _SURROGATE.search(raw)
    if escaped:
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise NotText() from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return out


def _constant(name: str) -> Any:
    raise NotFinite(name)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotFinite(text)
    return value


def _finite_int(text: str) -> bool:
    """Whether an integer's text is within a double's range (309 digits and more may not be)."""
    return len(text) < 309 or math.isfinite(float(text))


# 309 digits in a row: only then can an integer be beyond a double's range (looked for in the
# raw text, in C, so that a read pays no call per integer but then)
_LONG_DIGITS = re.compile(r"[0-9]{309}")
_LONG_DIGITS_B = re.compile(rb"[0-9]{309}")


def _int(text: str) -> int:
    if not _finite_int(text):
        raise NotFinite(text)
    return int(text)


_INTS = json.JSONDecoder(parse_int=_int)


def check_ints(raw: str) -> None:
    """``NotFinite`` when the JSON text ``raw`` holds an integer beyond a double's range: read
    again with a check of each integer, but only when it has 309 digits in a row somewhere (in
    a string too, which is no such integer)."""
    if _LONG_DIGITS.search(raw):
        _INTS.decode(raw)


# One decoder (the C scanner takes the hooks): ``raw_decode`` for the bulk publish's elements,
# whose text is given to ``check_ints`` and ``check_text``.
DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_float, object_pairs_hook=_unique)
_MARK = object()  # where a number JSON cannot carry was, while ``loads`` finds its field


def loads(data: bytes | str) -> Any:
    """``data`` as JSON, strictly. Raises ``NotFinite`` for a non-finite number,
    ``DuplicateKey`` for an object naming a key twice, another ``ValueError`` for anything
    else that is not JSON (UTF-8 included, and integers of more than Python's 4,300 digits),
    ``RecursionError`` for nesting deeper than Python goes."""
    found: list[str] = []

    def bad(text: str) -> Any:
        found.append(text)
        return _MARK

    def number(text: str) -> Any:
        value = float(text)
        return value if math.isfinite(value) else bad(text)

    def integer(text: str) -> Any:
        return int(text) if _finite_int(text) else bad(text)

    long = _LONG_DIGITS_B.search(data) if isinstance(data, bytes) else _LONG_DIGITS.search(data)
    value = json.loads(
        data,
        parse_constant=bad,
        parse_float=number,
        parse_int=integer if long else None,
        object_pairs_hook=_unique,
    )
    if found:
        raise NotFinite(found[0], _field_of(value))
    return value


def _field_of(value: Any) -> str | None:
    """The key of the innermost object that holds a ``_MARK``, at any depth."""
    stack: list[tuple[Any, str | None]] = [(value, None)]
    while stack:
        v, key = stack.pop()
        if v is _MARK:
            return key
        if isinstance(v, dict):
            stack.extend((x, k) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, key) for x in v)
    return None


def parse(data: bytes | str, what: str, message: str, by_field: bool = False) -> Any:
    """``data`` as JSON, else a ``BadRequest``: ``message`` naming ``what`` when it is not
    JSON; for a number JSON cannot carry, why, naming ``what`` or (``by_field``: a body of
    named fields) the field that holds it."""
    try:
        return loads(data)
    except NotFinite as e:
        name = e.field if by_field and e.field else what
        raise BadRequest(f"invalid {name}: {e}", name) from None
    except DuplicateKey as e:
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
