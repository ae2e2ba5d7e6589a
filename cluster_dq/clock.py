"""The one wall clock of the service: integer milliseconds since the epoch."""

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
