"""The CLI's one clock, built at its entry: every command that records or decides reads now here.

Like a replica's, it keeps time by the database server's clock on PostgreSQL (`gateway.clock`): a
command measures the offset once, when it opens the store (`gateway.cli.stores.opened_store`).
"""

from __future__ import annotations

from gateway.clock import SharedClock, system_clock

CLOCK = SharedClock(system_clock)
