"""The one reading of the wall clock for business time (decisions, expiries, records).

Only the composition roots (the app factory, the CLI's entry) take `system_clock` and hand it in; every
other module is given a `Clock`, so a test can run it at any instant. Monotonic timers for timeouts
read their own clock.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]
"""Now, as an aware UTC datetime."""


def system_clock() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)
