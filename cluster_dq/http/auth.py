"""HTTP basic auth against ``[Accounts]``: the one check the admin API and the dashboard share."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Mapping

from starlette.requests import Request

from cluster_dq.errors import Unauthorized

ANONYMOUS = "anonymous"  # who acted when no accounts are configured


def basic_auth(accounts: Mapping[str, str], request: Request) -> str:
    """The user the request authenticates as (``ANONYMOUS`` when no accounts are
    configured); ``Unauthorized`` when accounts are configured and it does not."""
    if not accounts:
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    scheme, _, blob = header.partition(" ")
    try:
        user, _, password = base64.b64decode(blob).decode().partition(":")
    except ValueError:  # binascii.Error, UnicodeDecodeError, a non-ASCII blob: all bad input
        user, password = "", ""
    expected = accounts.get(user)
    # Compared as bytes: compare_digest refuses str with non-ASCII characters (a 500).
    if (
        scheme.lower() != "basic"
        or expected is None
        or not hmac.compare_digest(expected.encode(), password.encode())
    ):
        raise Unauthorized("unauthorized")
    return user
