"""The key a retry runs under when its backend does not deduplicate: new, derived from the original's,
never stacked, never longer than a key may be."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.calls.retries import MAX_KEY, retry_key


def test_a_retrys_key_is_the_originals_with_the_retry_number() -> None:
    assert retry_key("refund-1001", 1) == "refund-1001:retry-1"


def test_a_retry_of_a_retry_replaces_the_number_instead_of_stacking_it() -> None:
    assert retry_key(retry_key("refund-1001", 1), 2) == "refund-1001:retry-2"


def test_a_clients_key_that_looks_like_a_retrys_is_still_changed() -> None:
    assert retry_key("refund:retry-1", 1) == "refund:retry-1:retry-1"


@given(
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=255),
    st.integers(min_value=1, max_value=10_000),
)
def test_a_retrys_key_fits_and_differs_from_the_original(key: str, number: int) -> None:
    new = retry_key(key, number)

    assert len(new) <= MAX_KEY and new != key and new.endswith(f":retry-{number}")
    assert retry_key(key + ":retry-1", 1) != key + ":retry-1"
