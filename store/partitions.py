"""Partitions of the log: which chain an event is sealed on, so replicas need not queue on one head.

Each partition has its own head row (`log_head`), its own `pseq` from 1 and its own hash chain. The
default is one partition, "", exactly the log as it was before partitions. `Partitioning("tenant")`
gives each tenant a partition (`t:<tenant>`) and, with `buckets` N > 1, N of them
(`t:<tenant>/<k>`), an event going to the bucket of its run (or, with no run, of its call). Events of
no tenant (security notes, OAuth clients) stay in "".

Every event of one call or one run lands in one partition, so each is appended, under that
partition's head lock, in the order its projections need. A store's engine carries its scheme
(`configure`), read by every `Append` on a connection of it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Literal
from weakref import WeakKeyDictionary

from sqlalchemy import Engine

from store import events as ev

UNPARTITIONED = ""
"""The partition of a log with one, and of events of no tenant in a partitioned one."""


@dataclass(frozen=True, slots=True)
class Partitioning:
    by: Literal["none", "tenant"] = "none"
    buckets: int = 1
    """Partitions per tenant, by a hash of the run (or call) id; only with `by="tenant"`."""

    def __post_init__(self) -> None:
        if self.buckets < 1:
            raise ValueError("a tenant has at least one partition (buckets >= 1)")
        if self.by == "none" and self.buckets != 1:
            raise ValueError("buckets partition a tenant's log: set by to tenant")

    @property
    def single(self) -> bool:
        return self.by == "none"

    def partition_of(self, event: ev.Envelope) -> str:
        """The partition `event` is sealed on."""
        return self.partition_for(event.tenant, event.run_id, event.tool_call_id)

    def partition_for(self, tenant: str | None, run_id: str | None, tool_call_id: str | None) -> str:
        """The partition of the events of a call or run with these ids."""
        if self.by == "none" or not tenant:
            return UNPARTITIONED
        name = f"t:{tenant}"
        if self.buckets == 1:
            return name
        key = run_id or tool_call_id or ""
        return f"{name}/{zlib.crc32(key.encode('utf-8')) % self.buckets}"

    def tenant_partitions(self, tenant: str) -> tuple[str, ...]:
        """Every partition a tenant's events may go to, in the order their heads are taken."""
        if self.by == "none" or not tenant:
            return (UNPARTITIONED,)
        name = f"t:{tenant}"
        if self.buckets == 1:
            return (name,)
        return tuple(sorted(f"{name}/{k}" for k in range(self.buckets)))


SINGLE = Partitioning()

_SCHEMES: WeakKeyDictionary[Engine, Partitioning] = WeakKeyDictionary()


def configure(engine: Engine, scheme: Partitioning) -> None:
    """Make every append on `engine` seal events on the partitions `scheme` chooses."""
    _SCHEMES[engine] = scheme


def scheme_of(engine: Engine) -> Partitioning:
    return _SCHEMES.get(engine, SINGLE)
