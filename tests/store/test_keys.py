"""The key a backend gets: the client's, scoped to its principal; recorded as sent, used again as sent."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta

import pytest
from alembic import command
from hypothesis import given
from hypothesis import strategies as st

from store import ApprovedDispatch, ConfirmationAnswer, OutcomeRecord, ReadRecord, Store
from store.commands import DecideApproval, Redispatch, StartReconciliation
from store.keys import principal_tag, scoped_key
from tests.store import tamper
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, outcome

SOON = NOW + timedelta(minutes=1)
SCOPED = re.compile(r"(?P<key>.+)~(?P<tag>[0-9a-f]{20})")


def test_a_backend_gets_the_clients_key_then_a_tilde_and_twenty_hex_digits() -> None:
    sent = scoped_key("acme", "agent-1", "refund-1001")

    assert SCOPED.fullmatch(sent) is not None
    assert SCOPED.fullmatch(sent)["key"] == "refund-1001"  # an operator finds the call by its key
    # Pinned: a tag that changed between releases would lose every call dispatched before.
    assert sent == "refund-1001~93340dfa123712c6a845"
    assert scoped_key("acme", "demo-agent", "refund-1001") == "refund-1001~55b06a6c5fee43dda192"


def test_the_longest_client_key_is_sent_in_276_printable_characters() -> None:
    longest = "k" * 255  # what the MCP edge lets a client's key be

    sent = scoped_key("acme", "alice", longest)

    assert len(sent) == 276 and sent.isascii() and sent.isprintable()


def test_another_process_computes_the_same_key() -> None:
    program = "from store.keys import scoped_key; print(scoped_key('t\\u00e9nant', 'sub\\x00ject', 'k'))"

    other = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)

    assert other.stdout.strip() == scoped_key("ténant", "sub\0ject", "k")


def test_each_tenant_and_each_subject_gets_a_key_of_its_own() -> None:
    keys = {
        scoped_key(tenant, subject, "same-key")
        for tenant in ("acme", "globex")
        for subject in ("alice", "bob")
    }

    assert len(keys) == 4
    assert scoped_key("acme", "alice", "same-key") == scoped_key("acme", "alice", "same-key")


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("a\0b", "c"), ("a", "b\0c")),
        (("ab", "c"), ("a", "bc")),
        (("", "x"), ("x", "")),
    ],
)
def test_principals_whose_names_run_together_the_same_get_different_tags(
    one: tuple[str, str], other: tuple[str, str]
) -> None:
    assert principal_tag(*one) != principal_tag(*other)


@given(st.tuples(st.text(), st.text()), st.tuples(st.text(), st.text()))
def test_any_two_principals_get_different_tags(one: tuple[str, str], other: tuple[str, str]) -> None:
    # Lone surrogates included: a subject is whatever string a token's claim held.
    assert (principal_tag(*one) == principal_tag(*other)) == (one == other)


def dispatching_key(store: Store, tool_call_id: str) -> str:
    """The key the call's last dispatch recorded it sent."""
    dispatches = [e for e in store.events(tool_call_id=tool_call_id) if e.type == "tool_call.dispatching"]
    return dispatches[-1].payload["idempotency_key"]


def requested_key(store: Store, tool_call_id: str) -> str:
    return store.events(tool_call_id=tool_call_id)[0].payload["idempotency_key"]


def test_every_kind_of_dispatch_records_the_key_scoped_and_the_call_keeps_the_clients(store: Store) -> None:
    allowed = call_request(tool_call_id="tc-allowed", idempotency_key="k-allowed")
    store.admit(allowed)
    approved = call_request(
        tool_call_id="tc-approved", idempotency_key="k-approved", decision=REQUIRE_APPROVAL
    )
    store.admit(approved)
    assert approved.approval_id is not None
    store.decide_approval(DecideApproval(approved.approval_id, approve=True, decided_by="bob", now=SOON))
    store.dispatch_approved(ApprovedDispatch("tc-approved", now=SOON))
    confirmed = call_request(
        tool_call_id="tc-confirmed",
        idempotency_key="k-confirmed",
        confirmation_id="cf-1",
        confirmation_expires_at=NOW + timedelta(minutes=10),
    )
    store.admit(confirmed)
    store.answer_confirmation(
        ConfirmationAnswer("tc-confirmed", "cf-1", "action-a", "accept", answered_by="alice", now=SOON)
    )
    read = call_request(tool_call_id="tc-read", idempotency_key="k-read", effect_class="read")
    store.record_read(ReadRecord(read, OutcomeRecord("completed"), observed_at=NOW))

    for tool_call_id, key in [
        ("tc-allowed", "k-allowed"),
        ("tc-approved", "k-approved"),
        ("tc-confirmed", "k-confirmed"),
        ("tc-read", "k-read"),
    ]:
        call = store.get_call(tool_call_id)
        assert call is not None
        sent = scoped_key("acme", "alice", key)
        assert (dispatching_key(store, tool_call_id), requested_key(store, tool_call_id)) == (sent, key)
        assert (call.idempotency_key, call.key_scoped, call.sent_key) == (key, True, sent)
        held = store.find_call_by_key("acme", "alice", key)  # the ledger holds the client's key
        assert held is not None and held.tool_call_id == tool_call_id
    assert store.verify().ok


def test_a_call_not_yet_dispatched_is_not_scoped(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", decision=REQUIRE_APPROVAL))

    call = store.get_call("tc-1")

    assert call is not None and (call.key_scoped, call.sent_key) == (False, "key-1")


def resent(store: Store, tool_call_id: str) -> str:
    """Take the unknown call's reconciliation lease and re-send it; the key the re-send recorded."""
    call = store.get_call(tool_call_id)
    assert call is not None
    leased = store.start_reconciliation(
        StartReconciliation(
            tool_call_id, expected_token=call.lease_token, method="resend", owner="rec", lease_s=30, now=SOON
        )
    )
    again = store.redispatch(
        Redispatch(tool_call_id, token=leased.lease_token, owner="rec", lease_s=30, now=SOON)
    )
    assert again.attempts == 2
    return dispatching_key(store, tool_call_id)


def test_a_call_dispatched_under_its_plain_key_before_the_upgrade_is_re_sent_under_it(store: Store) -> None:
    for tool_call_id, key in [("tc-old", "k-old"), ("tc-new", "k-new")]:
        store.admit(call_request(tool_call_id=tool_call_id, idempotency_key=key))
        store.record_outcome(outcome(tool_call_id, "unknown", error="response_timeout", now=NOW))
    tamper.as_dispatched_before_keys_were_scoped(store, "tc-old")
    old = store.get_call("tc-old")
    assert old is not None and (old.key_scoped, old.sent_key) == (False, "k-old")
    assert store.verify().ok  # the replay of the plain dispatch projects the row the migration left

    assert resent(store, "tc-old") == "k-old"  # the backend knows the request by the key it got
    assert resent(store, "tc-new") == scoped_key("acme", "alice", "k-new")

    assert (store.get_call("tc-old").key_scoped, store.get_call("tc-new").key_scoped) == (False, True)
    assert store.verify().ok  # a log mixing both, and its replay, agree


def test_the_migration_finds_again_the_calls_sent_scoped_after_a_downgrade(own_store: Store) -> None:
    store = own_store  # the downgrade changes the schema: never the suite's shared one
    for tool_call_id, key in [("tc-old", "k-old"), ("tc-new", "k-new")]:
        store.admit(call_request(tool_call_id=tool_call_id, idempotency_key=key))
        store.record_outcome(outcome(tool_call_id, "unknown", error="response_timeout", now=NOW))
    tamper.as_dispatched_before_keys_were_scoped(store, "tc-old")
    store.admit(
        call_request(tool_call_id="tc-waiting", idempotency_key="k-waiting", decision=REQUIRE_APPROVAL)
    )
    config = store._alembic_config()

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0024_rechecks_by_time")
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    scoped = {c: store.get_call(c).key_scoped for c in ("tc-old", "tc-new", "tc-waiting")}  # type: ignore[union-attr]
    assert scoped == {"tc-old": False, "tc-new": True, "tc-waiting": False}
    assert store.verify().ok


def test_a_call_taking_over_a_key_its_backend_got_plain_is_sent_under_the_plain_key(store: Store) -> None:
    # A call sent plain before the upgrade, settled failed (wrongly: the backend had made the refund),
    # then re-run under the same key (`writ calls retry` of a capability whose backend deduplicates),
    # outright, after an approval or a confirmation: each went out scoped, a key the deduplicating
    # backend had never seen, and it made the refund again (trial 6, finding K3).
    from store.model import RetryLink

    def failed_plain(tool_call_id: str, key: str) -> None:
        store.admit(call_request(tool_call_id=tool_call_id, idempotency_key=key))
        store.record_outcome(outcome(tool_call_id, "failed", error="backend said no", now=NOW))
        tamper.as_dispatched_before_keys_were_scoped(store, tool_call_id)

    def retry_of(of: str, key: str, tool_call_id: str, **kwargs: object) -> None:
        link = RetryLink(of, 1, "carol", "card fixed", break_glass=False, same_key=True)
        store.admit(
            call_request(tool_call_id=tool_call_id, idempotency_key=key, retry=link, now=SOON, **kwargs)
        )

    failed_plain("tc-old-1", "k-1")
    retry_of("tc-old-1", "k-1", "tc-allowed")
    failed_plain("tc-old-2", "k-2")
    retry_of("tc-old-2", "k-2", "tc-approved", decision=REQUIRE_APPROVAL)
    approval = store.get_call("tc-approved").approval_id  # type: ignore[union-attr]
    assert approval is not None
    store.decide_approval(DecideApproval(approval, approve=True, decided_by="bob", now=SOON))
    store.dispatch_approved(ApprovedDispatch("tc-approved", now=SOON))
    failed_plain("tc-old-3", "k-3")
    retry_of(
        "tc-old-3",
        "k-3",
        "tc-confirmed",
        confirmation_id="cf-1",
        confirmation_expires_at=SOON + timedelta(minutes=10),
    )
    store.answer_confirmation(
        ConfirmationAnswer("tc-confirmed", "cf-1", "action-a", "accept", answered_by="alice", now=SOON)
    )
    # The same, taking over a key its backend got scoped: scoped, as every call since the upgrade.
    store.admit(call_request(tool_call_id="tc-new", idempotency_key="k-4"))
    store.record_outcome(outcome("tc-new", "failed", error="backend said no", now=NOW))
    retry_of("tc-new", "k-4", "tc-new-retry")

    for tool_call_id, key in [("tc-allowed", "k-1"), ("tc-approved", "k-2"), ("tc-confirmed", "k-3")]:
        assert dispatching_key(store, tool_call_id) == key
        call = store.get_call(tool_call_id)
        assert call is not None and (call.key_scoped, call.sent_key) == (False, key)
    assert dispatching_key(store, "tc-new-retry") == scoped_key("acme", "alice", "k-4")
    assert store.verify().ok
