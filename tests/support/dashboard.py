"""Reading and driving the dashboard as a browser would: its CSRF cookie, form posts, the
flash and error messages and the sizes a page shows; and the data API calls its suites use."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx

NS = "shop"


def csrf(ui: httpx.Client) -> str:
    token = ui.cookies.get("dq_csrf")
    assert token
    return token


def post(ui: httpx.Client, path: str, **form: Any) -> httpx.Response:
    return ui.post(path, data={"csrf": csrf(ui), **form})


def flash(r: httpx.Response) -> str:
    found = re.search(r'id="flash"[^>]*>(.*?)</div>', r.text, re.S)
    return html.unescape(found.group(1)) if found else ""


def error_message(r: httpx.Response) -> str:
    found = re.search(r'id="error-message">(.*?)</p>', r.text, re.S)
    return html.unescape(found.group(1)) if found else ""


def shown_sizes(page: str, key: str) -> dict[str, int]:
    """The sizes a page shows for the queue ``ns/q`` (its element with data-queue)."""
    start = page.index(f'data-queue="{key}"')
    block = page[start : page.index('data-size="dead"', start) + 200]
    return {
        state: int(n) for state, n in re.findall(r'data-size="(\w+)">(?:<a[^>]*>)?\s*(\d+)', block)
    }


def publish(api: httpx.Client, q: str, body: bytes = b"x", **query: Any) -> str:
    r = api.put(f"/api/{NS}/{q}", params=query, content=body)
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


def consume(api: httpx.Client, q: str, ttr: int = 60) -> dict[str, Any]:
    r = api.get(f"/api/{NS}/{q}", params={"ttr": ttr})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def state_of(api: httpx.Client, q: str, jid: str) -> str | None:
    r = api.get(f"/api/{NS}/{q}/job/{jid}")
    return None if r.status_code == 404 else str(r.json()["state"])


def sizes(api: httpx.Client, q: str) -> dict[str, int]:
    got = api.get(f"/api/{NS}/{q}/size").json()
    return {k: got[k] for k in ("size", "delayed", "reserved", "dead")}


def audit_rows(ui: httpx.Client) -> list[dict[str, str]]:
    page = ui.get("/audit").text
    rows = []
    for row in re.findall(r"<tr data-action=.*?</tr>", page, re.S):
        cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        rows.append({"user": cells[1], "action": cells[2], "target": cells[3], "outcome": cells[4]})
    return rows
