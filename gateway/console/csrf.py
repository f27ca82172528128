"""Cross-site request forgery: every console form must carry the CSRF token of the session it is
posted in.

Cookies ignore ports and a sibling subdomain may set them for the parent, so a page on another port of
the console's host (or a sibling host) can plant any cookie the console reads. A token that a cookie
merely repeats (double submit) is then the attacker's to choose; a token derived from the session is
not: it takes the session's bearer token, which such a page can plant but never read.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

_PURPOSE = b"writ console csrf v1"


def csrf_token(session: str) -> str:
    """The CSRF token of the session whose cookie holds the bearer token `session`."""
    # An HMAC keyed by the session's own bearer token, not by a server key: every replica behind a load
    # balancer and every restart derives the same token with nothing to share or configure, and it is
    # as secret as a server key would make it (whoever has the bearer token needs no forged form: they
    # can call /api themselves). The token shows nothing of the bearer token it comes from.
    digest = hmac.digest(session.encode(), _PURPOSE, hashlib.sha256)
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def token_ok(session: str | None, given: object) -> bool:
    """Whether `given` is the CSRF token of `session` (compared in constant time)."""
    if not session or not isinstance(given, str):
        return False
    return hmac.compare_digest(csrf_token(session).encode(), given.encode())
