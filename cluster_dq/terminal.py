"""Text as the CLI prints it. What a job, a worker or a token carries (bodies, errors,
attributes, progress, host names, descriptions) was written by whoever called the API, and it
reaches the operator's terminal: an escape sequence there could clear the screen, colour or
fake a line, or write the clipboard (OSC 52). Every command prints such text through here, so
it arrives as the characters it is made of, never as a terminal's or rich's instructions."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.text import Text


def _escape(c: str) -> str:
    """One character a terminal would not print as itself, as its escape (``\\x1b``)."""
    return c.encode("unicode_escape").decode("ascii")


def shown(text: object) -> str:
    """``text`` (its ``str``) as a terminal may print it: every character that is not
    printable (controls, line breaks, a lone surrogate, format characters such as a text
    direction override) written as its escape (``\\x1b``, ``\\n``); ``-`` for None."""
    if text is None:
        return "-"
    return "".join(c if c.isprintable() else _escape(c) for c in str(text))


def cell(text: object) -> Text:
    """``shown(text)`` for a rich table: a ``Text``, so no ``[red]`` markup nor ``:emoji:``
    code in it is read as one."""
    from rich.text import Text

    return Text(shown(text))


def _json_escape(c: str) -> str:
    """One character as JSON writes it escaped (a surrogate pair past U+FFFF)."""
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_line(doc: Any) -> str:
    """``doc`` as one line of JSON, the same value a parser reads, with every character that
    is not printable escaped: ``json.dumps`` escapes only those below U+0020, and leaves C1
    controls (``\\x9b``, an 8-bit CSI), text direction overrides and lone surrogates raw."""
    text = json.dumps(doc, ensure_ascii=False)
    return "".join(c if c.isprintable() else _json_escape(c) for c in text)
