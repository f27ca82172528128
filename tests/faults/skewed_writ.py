"""`writ ARGS` on a host whose wall clock is off by $WRIT_TEST_CLOCK_SKEW_S seconds (its NTP broken).

Run as a script: the shift is made before `gateway` reads the clock, so every reading of the wall clock
Writ makes for business time is off, as on such a host. Monotonic timers are left alone, as NTP does.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import gateway.clock

_wall = gateway.clock.system_clock
_skew = timedelta(seconds=float(os.environ["WRIT_TEST_CLOCK_SKEW_S"]))
gateway.clock.system_clock = lambda: _wall() + _skew

from gateway.cli.main import main  # noqa: E402  (after the shift: it imports the clock by name)

if __name__ == "__main__":
    main(sys.argv[1:])
