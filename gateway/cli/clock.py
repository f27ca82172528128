"""The CLI's one clock, built at its entry: every command that records or decides reads now here."""

from __future__ import annotations

from gateway.clock import Clock, system_clock

CLOCK: Clock = system_clock
