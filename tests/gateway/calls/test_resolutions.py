"""A person settling an unknown call: who may, what the evidence must be, and the refusal codes.

The store is a fake (tests/fakes.py); the store suite holds what a manual resolution records.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from gateway.calls.resolutions import ResolutionInput, resolve_call
from gateway.errors import Refused
from store.model import CallView
from tests.fakes import FakeResolutions

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
UNKNOWN = CallView(
    tool_call_id="tc-1",
    run_id="run-1",
    tenant="acme",
    subject="alice",
    tool_name="refund_order",
    capability_id="refund-order",
    capability_version="1",
    action_hash="h",
    idempotency_key="k",
    key_source="client",
    status="result_unknown",
    verification_status="inconclusive",
    decision_effect="allow",
    reason=None,
    policy_version="p1",
    arguments={},
    summary="",
    external_request_id="x",
    approval_id=None,
    result=None,
    error=None,
    created_at=NOW,
    updated_at=NOW,
)
CAROL = frozenset({"approver"})


def resolution(**changes: object) -> ResolutionInput:
    base = ResolutionInput("tc-1", False, "no refund at the bank", "carol", CAROL, "acme")
    return dataclasses.replace(base, **changes)


async def refusal(store: FakeResolutions, inp: ResolutionInput) -> tuple[str, int]:
    with pytest.raises(Refused) as refused:
        await resolve_call(store, inp, NOW)
    return refused.value.code, refused.value.http_status


async def test_a_resolution_records_who_the_verdict_and_the_trimmed_evidence_in_the_tenant() -> None:
    store = FakeResolutions([UNKNOWN])

    call = await resolve_call(store, resolution(evidence="  no refund at the bank \n"), NOW)

    assert (call.status, call.resolved_by) == ("failed", "carol")
    [cmd] = store.resolved
    assert (cmd.evidence, cmd.by, cmd.tenant, cmd.now, cmd.break_glass) == (
        "no refund at the bank",
        "carol",
        "acme",
        NOW,
        False,
    )


async def test_resolving_needs_the_approver_or_admin_role() -> None:
    store = FakeResolutions([UNKNOWN])

    assert await refusal(store, resolution(roles=frozenset({"agent"}))) == ("insufficient_role", 403)
    assert (await resolve_call(store, resolution(roles=frozenset({"admin"})), NOW)).status == "failed"


async def test_empty_or_unstorable_evidence_is_refused_before_the_store() -> None:
    store = FakeResolutions([UNKNOWN])

    assert await refusal(store, resolution(evidence="   ")) == ("invalid_request", 400)
    assert await refusal(store, resolution(evidence="\x00")) == ("invalid_request", 400)
    assert await refusal(store, resolution(resolved_by="c" * 10_000)) == ("invalid_request", 400)
    assert store.resolved == []


async def test_another_tenants_call_is_not_found() -> None:
    store = FakeResolutions([UNKNOWN])

    assert await refusal(store, resolution(tenant="globex")) == ("not_found", 404)
    assert await refusal(store, resolution(tool_call_id="tc-none")) == ("not_found", 404)


async def test_the_principal_who_made_the_call_may_not_settle_it_even_holding_the_role() -> None:
    # alice also holds approver: a `failed` she recorded would free her refund's key to be sent again.
    store = FakeResolutions([UNKNOWN])

    assert await refusal(store, resolution(resolved_by="alice")) == ("self_resolution_forbidden", 403)
    assert await refusal(store, resolution(resolved_by="alice", succeeded=True)) == (
        "self_resolution_forbidden",
        403,
    )
    assert store.resolved == []
    assert (await resolve_call(store, resolution(resolved_by="carol"), NOW)).resolved_by == "carol"


async def test_a_call_no_longer_unknown_is_refused_as_not_unresolved() -> None:
    store = FakeResolutions(
        [dataclasses.replace(UNKNOWN, status="completed", verification_status="confirmed_success")]
    )

    assert await refusal(store, resolution(succeeded=True)) == ("not_unresolved", 409)
