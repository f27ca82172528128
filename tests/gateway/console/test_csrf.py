"""The console's CSRF rules, as pure functions: the token a session's forms carry, and where a POST may
come from."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from gateway.console.csrf import csrf_token, from_origin, origin_of, token_ok
from gateway.console.routes import Console

CONSOLE = "http://127.0.0.1:8080"
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


def test_the_token_does_not_show_the_session_id_it_comes_from() -> None:
    session = "Xq3vQm8yZ0hN4kT1wR7uP2sL9dF6gJ5bC8eA0iO3tYw"  # secrets.token_urlsafe(32)
    token = csrf_token(session)
    assert token != session and not any(session[i : i + 8] in token for i in range(len(session) - 7))


@pytest.mark.parametrize(
    ("origin", "fetch_site"),
    [
        (CONSOLE, "same-origin"),
        (CONSOLE, None),
        (None, "same-origin"),
        (None, "none"),  # started by the user (typed, a bookmark): no page caused it
        (None, None),  # not a browser
    ],
)
def test_a_post_from_the_consoles_origin_or_from_no_browser_is_let_through(
    origin: str | None, fetch_site: str | None
) -> None:
    assert from_origin(origin, fetch_site, CONSOLE)


@pytest.mark.parametrize(
    ("origin", "fetch_site"),
    [
        ("http://127.0.0.1:18901", None),  # another port of the same host
        ("http://127.0.0.1:18901", "same-site"),
        ("https://127.0.0.1:8080", None),  # another scheme
        ("http://evil.example", "cross-site"),
        ("null", None),  # a sandboxed frame, or a POST redirected from elsewhere
        (None, "same-site"),  # a sibling port or subdomain, in a browser that sent no Origin
        (None, "cross-site"),
        (CONSOLE, "same-site"),  # the two headers disagree: the stricter one wins
    ],
)
def test_a_post_from_any_other_origin_is_refused(origin: str | None, fetch_site: str | None) -> None:
    assert not from_origin(origin, fetch_site, CONSOLE)


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://Writ.Example.com/", "https://writ.example.com"),
        ("https://writ.example.com:443/base", "https://writ.example.com"),
        ("http://127.0.0.1:8080/console/inbox?x=1", "http://127.0.0.1:8080"),
        ("http://[::1]:8080", "http://[::1]:8080"),
        ("https://writ.example.com:8443", "https://writ.example.com:8443"),
    ],
)
def test_a_url_has_the_origin_a_browser_would_write(url: str, origin: str) -> None:
    assert origin_of(url) == origin


def console(public_url: str | None) -> Console:
    unused: Any = None  # the origin check touches no store, sessions, decisions or verifier
    return Console(
        store=unused,
        sessions=unused,
        decisions=unused,
        verify=unused,
        clock=lambda: datetime.now(UTC),
        public_url=public_url,
    )


def post(host: str, origin: str) -> Request:
    """A POST as it reaches Writ, over plain http (as behind a proxy that ends TLS), from `origin`."""
    headers = [(b"host", host.encode()), (b"origin", origin.encode())]
    scope = {
        "type": "http",
        "method": "POST",
        "scheme": "http",
        "path": "/console/logout",
        "headers": headers,
    }
    return Request(scope)


def test_behind_a_public_url_only_its_origin_is_the_consoles() -> None:
    # Behind a proxy the request's own origin is plain http: a page on http://writ.example.com (on a
    # network that can rewrite plain http) is not the console.
    behind = console("https://writ.example.com")
    assert behind.from_console(post("writ.example.com", "https://writ.example.com"))
    assert not behind.from_console(post("writ.example.com", "http://writ.example.com"))


def test_with_a_public_url_the_host_the_browser_asked_for_is_the_consoles_too() -> None:
    # compose's public URL is http://localhost:8080, and the console is also opened at 127.0.0.1:8080:
    # refused, its login said "Log in from this page, not from another site" on its own page.
    compose = console("http://localhost:8080")
    assert compose.from_console(post("127.0.0.1:8080", "http://127.0.0.1:8080"))
    assert compose.from_console(post("127.0.0.1:8080", "http://localhost:8080"))
    assert not compose.from_console(post("127.0.0.1:8080", "http://127.0.0.1:18901"))
    assert not compose.from_console(post("127.0.0.1:8080", "https://127.0.0.1:8080"))


def test_without_a_public_url_the_origin_the_browser_asked_for_is_the_consoles() -> None:
    local = console(None)
    assert local.from_console(post("localhost:8080", "http://localhost:8080"))
    assert local.from_console(post("127.0.0.1:8080", "http://127.0.0.1:8080"))
    assert not local.from_console(post("127.0.0.1:8080", "http://127.0.0.1:18901"))
