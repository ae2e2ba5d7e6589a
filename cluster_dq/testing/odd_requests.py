"""Requests no client of the API would send: random methods on random paths of both ports (route
templates filled with random names, and paths no route has). The security suite and
``loadtest/bench_scrape.py`` send them to show that nothing a request carries becomes a metric
label."""

from __future__ import annotations

import random
import string

# What llhttp (httptools, the workers' parser) accepts as a method; CONNECT takes host:port.
METHODS = (
    "DELETE GET HEAD POST PUT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND PROPPATCH SEARCH "
    "UNLOCK BIND REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY SUBSCRIBE "
    "UNSUBSCRIBE PATCH PURGE MKCALENDAR LINK UNLINK SOURCE QUERY"
).split()
# Paths of both ports' route templates ({} gets a random name), and paths no route has.
TEMPLATES = (
    "/api/{}",
    "/api/{}/{}",
    "/api/{}/{}/job/{}",
    "/api/{}/{}/job/{}/touch",
    "/api/{}/{}/size",
    "/api/{}/{}/peek",
    "/api/{}/{}/deadletter",
    "/api/{}/{}/schedules/{}",
    "/api/{}/{}/settings",
    "/token/{}",
    "/token/{}/{}",
    "/token/{}/{}/limit",
    "/metrics",
    "/info",
    "/ui/",
    "/ui/{}",
    "/ui/ns/{}/{}",
    "/{}",
    "/{}/{}/{}",
)
MARK = "zq"  # every random name starts with it: a label value holding it came from a request


def name(rng: random.Random) -> str:
    return MARK + "".join(rng.choices(string.ascii_lowercase + string.digits, k=rng.randint(3, 10)))


def odd_request(rng: random.Random) -> tuple[str, str]:
    """(method, path) of one odd request."""
    template = rng.choice(TEMPLATES)
    return rng.choice(METHODS), template.format(*(name(rng) for _ in range(template.count("{}"))))
