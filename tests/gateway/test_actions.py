"""Action hashes, derived keys and redaction: the identities that bind keys and approvals to effects."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from capabilities.contract import Capability
from gateway.actions import Redactor, action_hash, canonical_json, derived_key, new_id
from policy.model import Principal

CAP = Capability(id="refund-order", version="2", tool_name="refund_order", backend="acme", input_schema={})
ALICE = Principal(subject="alice", tenant="acme")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=5)


@given(arguments)
def test_the_action_hash_ignores_key_order(args: dict) -> None:
    reordered = dict(reversed(list(args.items())))
    assert action_hash(CAP, args, ALICE) == action_hash(CAP, reordered, ALICE)


@given(arguments, arguments)
def test_different_arguments_give_different_action_hashes(a: dict, b: dict) -> None:
    if canonical_json(a) != canonical_json(b):
        assert action_hash(CAP, a, ALICE) != action_hash(CAP, b, ALICE)


def test_the_action_hash_covers_capability_version_tenant_and_requester() -> None:
    args = {"order_id": "1001", "amount": 20}
    base = action_hash(CAP, args, ALICE)
    other_version = Capability(
        id="refund-order", version="3", tool_name="refund_order", backend="acme", input_schema={}
    )
    assert action_hash(other_version, args, ALICE) != base
    assert action_hash(CAP, args, Principal(subject="alice", tenant="other")) != base
    assert action_hash(CAP, args, Principal(subject="bob", tenant="acme")) != base


def test_derived_keys_are_stable_per_run_and_differ_across_runs() -> None:
    h = action_hash(CAP, {"a": 1}, ALICE)
    assert derived_key(ALICE, h, None) == derived_key(ALICE, h, None)
    assert derived_key(ALICE, h, "run-1") != derived_key(ALICE, h, "run-2")
    assert derived_key(ALICE, h, None).startswith("derived:")


def test_redacted_fields_are_stored_as_salted_hashes_and_the_salt_persists(tmp_path: Path) -> None:
    cap = Capability(id="pay", version="1", tool_name="pay", backend="b", input_schema={}, redact=("card",))
    redactor = Redactor.from_file(tmp_path / "salt")
    stored = redactor.redact(cap, {"card": "4111 1111 1111 1111", "amount": 5})
    assert stored["amount"] == 5
    assert "4111" not in stored["card"] and stored["card"].startswith("redacted:hmac-sha256:")
    assert (
        Redactor.from_file(tmp_path / "salt").redact(cap, {"card": "4111 1111 1111 1111"})["card"]
        == stored["card"]
    )
    assert Redactor(b"other salt").redact(cap, {"card": "4111 1111 1111 1111"})["card"] != stored["card"]


def test_new_ids_are_prefixed_and_unique() -> None:
    ids = {new_id("tc") for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("tc_") for i in ids)
