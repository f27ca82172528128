"""The console's CSRF rules, as pure functions: the token a session's forms carry."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.console.csrf import csrf_token, token_ok

sessions = st.text(min_size=1, max_size=200)


@given(sessions, sessions)
def test_a_sessions_token_validates_for_that_session_only(session: str, other: str) -> None:
    assert token_ok(session, csrf_token(session))
    assert token_ok(other, csrf_token(session)) == (other == session)


def test_no_session_or_no_token_never_validates() -> None:
    assert not token_ok(None, csrf_token("a-session"))
    assert not token_ok("", csrf_token(""))
    assert not token_ok("a-session", None)
    assert not token_ok("a-session", "")


def test_the_token_does_not_show_the_bearer_token_it_comes_from() -> None:
    session = "eyJhbGciOiJFUzI1NiJ9.payload.signature"
    assert session not in csrf_token(session) and "payload" not in csrf_token(session)
