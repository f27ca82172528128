"""A log with every path a call can take, written through the store's own writes: what verify must pass."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select

from store import ApprovedDenial, ApprovedDispatch, ConfirmationAnswer, Store
from store.commands import (
    DecideApproval,
    EscalateReconciliation,
    ExpireApproval,
    RecordContradiction,
    RecordInconclusive,
    Redispatch,
    ResolveManually,
    ResolveReconciliation,
    RestorePrincipal,
    RevokePrincipal,
    StartReconciliation,
)
from store.model import Charge
from store.schema import PROJECTION_TABLES
from tests.store.builders import DENY, NOW, REQUIRE_APPROVAL, call_request, outcome, refusal_request

M = 1_000_000
SOON = NOW + timedelta(minutes=1)
LATER = NOW + timedelta(minutes=2)
LATEST = NOW + timedelta(hours=3)


def record_every_path(store: Store) -> None:
    """Calls allowed, denied, refused, conflicting, approved and run, rejected, expired, refused after
    approval, confirmed, declined, unknown and reconciled (lookup, retry, escalation, a person),
    contradicted; budgets charged and exceeded; a principal revoked, refused, and restored; a derived key
    taken over past its window."""
    # Allowed and completed; charged to a budget of two calls; the third is refused, over it.
    day = NOW.replace(hour=0, minute=0, second=0, microsecond=0)
    budget = (Charge("daily", "counter-a", 1 * M, 2 * M, day, day + timedelta(days=1), "principal"),)
    store.admit(call_request(tool_call_id="ok", idempotency_key="k-ok", charges=budget))
    store.record_outcome(outcome("ok", "completed", result={"ok": 1}, now=NOW))
    store.admit(call_request(tool_call_id="ok-2", idempotency_key="k-ok-2", charges=budget))
    store.record_outcome(outcome("ok-2", "failed", error="declined", now=NOW))
    store.admit(call_request(tool_call_id="over-budget", idempotency_key="k-over", charges=budget))
    # Denied by policy; refused at the edge in a run of its own; a conflicting action under a held key.
    store.admit(call_request(tool_call_id="denied", idempotency_key="k-denied", decision=DENY))
    store.refuse(refusal_request(tool_call_id="refused", run_id="run-2", run_origin="client"))
    store.admit(call_request(tool_call_id="conflict", idempotency_key="k-ok", action_hash="other"))
    # Approvals: granted and run, rejected, expired, and granted but refused at execution.
    for name in ("granted", "rejected", "expired", "reauth-denied"):
        store.admit(call_request(tool_call_id=name, idempotency_key=f"k-{name}", decision=REQUIRE_APPROVAL))
    decide = {"granted": True, "rejected": False, "reauth-denied": True}
    for name, approve in decide.items():
        approval_id = _approval_of(store, name)
        store.decide_approval(DecideApproval(approval_id, approve=approve, decided_by="carol", now=SOON))
    store.dispatch_approved(ApprovedDispatch("granted", now=SOON, policy_version="8"))
    store.record_outcome(outcome("granted", "completed", now=SOON))
    store.expire_approval(ExpireApproval(_approval_of(store, "expired"), now=LATEST))
    store.deny_approved(ApprovedDenial("reauth-denied", reason="amount_over_limit", now=SOON))
    # Confirmations: accepted and run, declined.
    for name in ("confirmed", "declined"):
        store.admit(
            call_request(
                tool_call_id=name,
                idempotency_key=f"k-{name}",
                confirmation_id=f"cf-{name}",
                confirmation_expires_at=LATER,
            )
        )
    for name, action in (("confirmed", "accept"), ("declined", "decline")):
        answer = ConfirmationAnswer(name, f"cf-{name}", "action-a", action, answered_by="alice", now=SOON)
        store.answer_confirmation(answer)
    store.record_outcome(outcome("confirmed", "completed", token=1, now=SOON))
    _reconciliations(store)
    # Standing: revoked, refused while revoked, restored.
    store.revoke_principal(RevokePrincipal("acme", "mallory", revoked_by="root", now=SOON))
    store.admit(call_request(tool_call_id="by-revoked", idempotency_key="k-rev", subject="mallory"))
    store.restore_principal(RestorePrincipal("acme", "mallory", restored_by="root", now=LATER))
    # A derived key: failed, then taken over by the same call again (the failure left no effect).
    store.admit(call_request(tool_call_id="derived-1", idempotency_key="k-derived", key_source="derived"))
    store.record_outcome(outcome("derived-1", "failed", error="no", now=NOW))
    store.admit(
        call_request(tool_call_id="derived-2", idempotency_key="k-derived", key_source="derived", now=LATER)
    )


def _reconciliations(store: Store) -> None:
    def unknown(name: str) -> int:
        store.admit(call_request(tool_call_id=name, idempotency_key=f"k-{name}"))
        return store.record_outcome(outcome(name, "unknown", error="timeout", now=NOW)).lease_token

    def started(name: str, token: int) -> int:
        cmd = StartReconciliation(
            name, expected_token=token, method="lookup", owner="rec", lease_s=30, now=SOON
        )
        return store.start_reconciliation(cmd).lease_token

    token = started("looked-up", unknown("looked-up"))
    store.record_inconclusive(RecordInconclusive("looked-up", token, {"found": None}, SOON, SOON))
    token = started("looked-up", token)
    store.resolve_reconciliation(
        ResolveReconciliation("looked-up", token, "confirmed_success", {"found": "r1"}, SOON)
    )
    token = started("retried", unknown("retried"))
    retried = store.redispatch(Redispatch("retried", token, owner="rec", lease_s=30, now=SOON))
    store.record_outcome(outcome("retried", "completed", token=retried.lease_token, now=SOON))
    unknown("by-hand")
    token = started("escalated", unknown("escalated"))
    store.escalate_reconciliation(
        EscalateReconciliation("escalated", token, "inconclusive_after_retries", SOON)
    )
    store.resolve_manually(
        ResolveManually("escalated", succeeded=True, evidence="receipt", by="dan", now=LATER)
    )
    store.resolve_manually(
        ResolveManually("by-hand", succeeded=False, evidence="bank says no", by="dan", now=SOON)
    )
    # A settled call contradicted by a late lookup, then settled again by a person.
    store.record_contradiction(
        RecordContradiction("ok", "lookup", "confirmed_failure", {"found": None}, "gone", now=LATER)
    )
    store.resolve_manually(ResolveManually("ok", succeeded=True, evidence="statement", by="dan", now=LATER))


def _approval_of(store: Store, tool_call_id: str) -> str:
    call = store.get_call(tool_call_id)
    assert call is not None and call.approval_id is not None
    return call.approval_id


def projections(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Every projection table's rows, in key order: what a rebuild must give back."""
    with store.engine.begin() as conn:
        return {
            table.name: [
                dict(row._mapping) for row in conn.execute(select(table).order_by(*table.primary_key.columns))
            ]
            for table in PROJECTION_TABLES
        }
