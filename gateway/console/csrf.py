"""Cross-site request forgery, refused twice on every console POST: the request must come from the
console's own origin, and a form must carry the CSRF token of the session it is posted in.

Cookies ignore ports and a sibling subdomain may set them for the parent, so a page on another port of
the console's host (or a sibling host) can plant any cookie the console reads. A token that a cookie
merely repeats (double submit) is then the attacker's to choose; a token derived from the session is
not: it takes the session's id (the random value the `writ_session` cookie holds,
`gateway.console.sessions`), which such a page can plant but its script never read (HttpOnly). A
session id the attacker planted is one of the attacker's own sessions: a form posted in it acts as
the attacker, not as the approver whose browser sent it. (A server on another port that the approver's
browser visits under /console does receive the cookie; it then holds the session itself and needs no
forged form. That is why the cookie holds a session id, which opens the console only and ends at
logout, and not the bearer token, which would work on /mcp and /api until it expired.)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Collection
from urllib.parse import urlsplit

_PURPOSE = b"writ console csrf v1"
_DEFAULT_PORTS = {"http": 80, "https": 443}

BROWSER_SAME_ORIGIN = frozenset({"same-origin", "none"})
"""The `Sec-Fetch-Site` values of a request no other page caused: one the console's own page sent,
or one the user started themselves (a typed URL, a bookmark); `same-site` is another port or a sibling
host, which is exactly the page that can plant cookies."""


def csrf_token(session: str) -> str:
    """The CSRF token of the session whose id (the `writ_session` cookie) is `session`."""
    # An HMAC keyed by the session's own id, not by a server key: every replica behind a load balancer
    # and every restart derives the same token with nothing to share or configure, and it is as secret
    # as a server key would make it (whoever has the session id needs no forged form: they can post
    # in the session themselves). The token shows nothing of the session id it comes from, which the
    # store keeps only as a digest; no bearer token enters it.
    digest = hmac.digest(session.encode(), _PURPOSE, hashlib.sha256)
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def token_ok(session: str | None, given: object) -> bool:
    """Whether `given` is the CSRF token of the session whose id is `session` (compared in constant
    time)."""
    if not session or not isinstance(given, str):
        return False
    return hmac.compare_digest(csrf_token(session).encode(), given.encode())


def from_origin(origin: str | None, fetch_site: str | None, expected: Collection[str]) -> bool:
    """Whether a POST with these `Origin` and `Sec-Fetch-Site` headers came from one of the origins
    `expected` (`scheme://host[:port]`), or from no browser at all."""
    if fetch_site is not None and fetch_site not in BROWSER_SAME_ORIGIN:
        return False
    if origin is not None:
        # "null" (a sandboxed frame, a POST redirected from elsewhere) is no origin of ours either.
        return origin in expected
    # Neither header: not a browser (browsers send Origin with every POST, and Sec-Fetch-Site since
    # 2020-2023), or one too old to send them. Nothing here can be told apart from a script of the
    # session's owner, which needs no forgery; a form still needs its session's token, which another
    # page cannot read.
    return True


def origin_of(url: str) -> str:
    """The origin of `url` as a browser writes it in `Origin`: lower case, no default port, no path."""
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    port = parts.port
    return f"{scheme}://{host}" if port in (None, _DEFAULT_PORTS.get(scheme)) else f"{scheme}://{host}:{port}"
