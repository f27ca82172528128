"""How long `writ audit verify` takes per million events: generate a log, then time the store's verify.

    python -m bench.verify_speed --events 100000 --store sqlite:///tmp/v.db
    python -m bench.verify_speed --events 100000 --store postgresql://postgres@127.0.0.1:5432/test

The log is written through the store's own append path (`store.log.Append`: each event sealed onto the
chain and projected as it is added), a thousand events a transaction, so it is the log and projections
a gateway would leave, without the gateway: a mix of calls allowed and completed, approved and run,
denied, and unknown then reconciled. The database must be empty or absent; it is migrated first.
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from store import Store
from store import events as ev
from store.log import Append

_START = datetime(2026, 11, 1, tzinfo=UTC)
_CALLS_PER_RUN = 50
_BATCH = 1000


@dataclass(frozen=True)
class Timing:
    events: int
    seconds: float
    max_rss_mb: float
    ok: bool

    @property
    def seconds_per_million(self) -> float:
        return self.seconds / self.events * 1_000_000


def _call_events(n: int, at: datetime) -> list[ev.Envelope]:
    """The events of call `n`: one of four lifecycles, by `n % 4`."""
    ts = ev.format_ts(at)
    call_id, run_id = f"tc-{n}", f"run-{n // _CALLS_PER_RUN}"
    base: dict[str, Any] = {
        "occurred_at": ts,
        "producer": "bench",
        "run_id": run_id,
        "tool_call_id": call_id,
        "capability_id": "refund-order",
        "capability_version": "2",
        "policy_version": "7",
        "correlation_id": f"corr-{n}",
        "tenant": "acme",
    }
    kind = ("allow", "approval", "deny", "unknown")[n % 4]
    effect = {"allow": "allow", "approval": "require_approval", "deny": "deny", "unknown": "allow"}[kind]
    found: list[ev.Envelope] = []
    if n % _CALLS_PER_RUN == 0:
        started = ev.RunStarted(tenant="acme", subject="alice")
        found.append(ev.RunStartedEvent(**{**base, "tool_call_id": None}, payload=started))
    requested = ev.ToolCallRequested(
        tool_name="refund_order",
        subject="alice",
        arguments={"order_id": str(1000 + n), "amount": 50 + n % 500, "currency": "EUR", "reason": "bench"},
        action_hash=f"sha256:{n:064x}",
        idempotency_key=f"key-{n}",
        key_source="client",
        claims_key=True,
        principal={"subject": "alice", "tenant": "acme", "roles": ["agent"]},
        decision={"effect": effect, "reason": "bench", "policy_version": "7"},
        effect_class="write",
        summary=f"refund {50 + n % 500} EUR to order {1000 + n}",
        external_request_id=f"req-{n}",
        dedupe_window_s=600,
    )
    found.append(ev.ToolCallRequestedEvent(**base, payload=requested))
    if kind == "deny":
        found.append(ev.ToolCallDeniedEvent(**base, payload=ev.ToolCallDenied(reason="amount_over_limit")))
        return found
    if kind == "approval":
        approval_id = f"ap-{n}"
        required = ev.ApprovalRequired(
            approval_id=approval_id,
            approver_role="approver",
            expires_at=ev.format_ts(at + timedelta(hours=1)),
            requester_may_approve=False,
            action_hash=requested.action_hash,
            requester="alice",
        )
        with_approval = {**base, "approval_id": approval_id}
        found.append(ev.ApprovalRequiredEvent(**with_approval, payload=required))
        granted = ev.ApprovalDecided(decided_by="carol", decided_by_roles=["approver"])
        found.append(ev.ApprovalGrantedEvent(**with_approval, payload=granted))
        base = with_approval
    lease_expires_at = ev.format_ts(at + timedelta(minutes=1))
    dispatching = ev.ToolCallDispatching(
        attempt=1,
        idempotency_key=f"key-{n}",
        external_request_id=f"req-{n}",
        lease_owner="bench",
        fencing_token=1,
        lease_expires_at=lease_expires_at,
    )
    found.append(ev.ToolCallDispatchingEvent(**base, payload=dispatching))
    if kind != "unknown":
        result = {"structuredContent": {"refund_id": f"r-{n}", "status": "refunded"}, "isError": False}
        found.append(ev.ToolCallCompletedEvent(**base, payload=ev.ToolCallCompleted(result=result)))
        return found
    found.append(ev.ToolCallResultUnknownEvent(**base, payload=ev.ToolCallResultUnknown(error="timeout")))
    lookup = ev.ReconciliationStarted(
        method="lookup", lease_owner="bench", fencing_token=2, lease_expires_at=lease_expires_at
    )
    found.append(ev.ReconciliationStartedEvent(**base, payload=lookup))
    resolved = ev.ReconciliationResolved(verdict="confirmed_success", evidence={"found": f"r-{n}"})
    found.append(ev.ReconciliationResolvedEvent(**base, payload=resolved))
    return found


def generate(store: Store, events: int) -> int:
    """Append calls until at least `events` events are in the log; returns how many there are."""
    written, n = 0, 0
    while written < events:
        with store.engine.begin() as conn:
            log = Append(conn)
            batch = 0
            while batch < _BATCH and written + batch < events:
                for event in _call_events(n, _START + timedelta(seconds=n)):
                    log.add(event)  # type: ignore[arg-type]  # each is one member of the Event union
                    batch += 1
                n += 1
            log.flush()
        written += batch
    return written


def measure(url: str, events: int) -> Timing:
    """Migrate the store at `url`, write a log of about `events` events, and time one verify of it."""
    with Store.open(url, durable=False) as store:
        store.migrate()
        count = generate(store, events)
        began = time.perf_counter()
        report = store.verify()
        seconds = time.perf_counter() - began
    max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Timing(count, seconds, max_rss_mb, report.ok)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--store", required=True, help="sqlite:///path or postgresql://... (empty)")
    args = parser.parse_args()
    timing = measure(args.store, args.events)
    print(
        f"{timing.events} events verified in {timing.seconds:.1f} s "
        f"({timing.seconds_per_million / 60:.1f} min per million events), ok={timing.ok}, "
        f"max RSS {timing.max_rss_mb:.0f} MB"
    )


if __name__ == "__main__":
    main()
