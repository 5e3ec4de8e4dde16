"""The one clock of the contract: every ``*_ts`` field is epoch milliseconds."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall clock, epoch milliseconds (the unit of every ``*_ts`` field).

    Example:
        >>> now_ms() > 1_700_000_000_000
        True
    """
    return time.time_ns() // 1_000_000
