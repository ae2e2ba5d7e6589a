"""Retry backoff: how long a job waits before its next attempt after a failed one. The rule
runs in Lua (``retry_wait`` in lua/lib/retry.lua); this is its mirror, for the job's record
section, the queue settings and the tests. No I/O."""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass

from cluster_dq.errors import BadRequest

KINDS = {"none": 0, "fixed": 1, "exponential": 2}
KIND_NAMES = {v: k for k, v in KINDS.items()}
MAX_BACKOFF_MS = 2**32 - 1  # a u32 in the record
MAX_DOUBLINGS = 40  # 2^40 times any base is past any cap: no overflow, same in Lua
SECTION = struct.Struct(">BIIH")  # kind, base ms, cap ms (0 = none), jitter in thousandths
GOLDEN = 0.6180339887498949
_DIGITS = re.compile(r"[0-9]{1,20}")
_DECIMAL = re.compile(r"(?:[0-9]{1,20}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][-+]?[0-9]{1,3})?")


@dataclass(frozen=True, slots=True)
class Backoff:
    """``kind`` 0 none (a job's way to opt out of its queue's), 1 fixed, 2 exponential;
    ``jitter_pm``: the share (thousandths) of a wait that a random draw may take off."""

    kind: int
    base_ms: int = 0
    cap_ms: int = 0
    jitter_pm: int = 0

    def pack(self) -> bytes:
        return SECTION.pack(self.kind, self.base_ms, self.cap_ms, self.jitter_pm)

    @classmethod
    def unpack_from(cls, data: bytes, offset: int) -> Backoff:
        return cls(*SECTION.unpack_from(data, offset))

    def wait_ms(self, deliveries: int, r: float) -> int:
        return wait_ms(self.kind, self.base_ms, self.cap_ms, self.jitter_pm, deliveries, r)

    @classmethod
    def parse(cls, kind: str, base: str | None, cap: str | None, jitter: str | None) -> Backoff:
        """From text (query parameters, CONF): refuses a bad value naming it."""
        if kind not in KINDS:
            raise BadRequest("invalid backoff: none, fixed or exponential", "backoff")
        k = KINDS[kind]
        b = _ms(base, "backoff_ms", 0 if k == 0 else 1)
        c = _ms(cap, "backoff_cap_ms", 0)
        if k and b == 0:
            raise BadRequest("backoff_ms is required with a backoff", "backoff_ms")
        # a decimal of ASCII digits (an exponent allowed: Python's repr of 0.00001); float()
        # alone takes a sign, spaces and any script's digits, which no other number here does
        decimal = jitter is None or _DECIMAL.fullmatch(jitter) is not None
        j = float(jitter) if jitter is not None and decimal else 0.0
        if not decimal or not 0 <= j <= 1:
            raise BadRequest("invalid backoff_jitter: a number 0..1", "backoff_jitter")
        if k == 0:  # no backoff has no base, cap nor jitter: a value for one is a mistake
            for name, v in (("backoff_ms", b), ("backoff_cap_ms", c), ("backoff_jitter", j)):
                if v:
                    raise BadRequest(f"{name} needs backoff fixed or exponential", name)
        return cls(k, b, c, round(j * 1000))

    def as_json(self) -> dict[str, object]:
        return {
            "backoff": KIND_NAMES[self.kind],
            "backoff_ms": self.base_ms,
            "backoff_cap_ms": self.cap_ms,
            "backoff_jitter": self.jitter_pm / 1000,
        }


def _ms(text: str | None, name: str, low: int) -> int:
    if text is None:
        return 0
    # ASCII digits, length-bounded: str.isdigit() accepts "²", which int() refuses (a 500),
    # and int() refuses over 4,300 digits.
    if not _DIGITS.fullmatch(text) or not low <= int(text) <= MAX_BACKOFF_MS:
        raise BadRequest(f"invalid {name}: an integer {low}..{MAX_BACKOFF_MS}", name)
    return int(text)


def wait_ms(kind: int, base: int, cap: int, jitter_pm: int, deliveries: int, r: float) -> int:
    """``fixed``: base; ``exponential``: min(cap, base * 2^(deliveries - 1)) (cap 0: none);
    then a jitter draw ``r`` in [0, 1) takes off up to ``jitter`` of it. The same float
    operations, in the same order, as lua/lib/retry.lua, so both give the same millisecond."""
    if kind == 0 or base <= 0:
        return 0
    d = float(base)
    if kind == 2:
        d = base * 2.0 ** min(max(deliveries - 1, 0), MAX_DOUBLINGS)
        if cap > 0 and d > cap:
            d = float(cap)
    return int(d - math.floor(d * (jitter_pm / 1000) * r))


def draw(seed: float, k: int) -> float:
    """The jitter draw of the ``k``-th job a script call retries (0-based), from its seed."""
    return (seed + k * GOLDEN) % 1.0
