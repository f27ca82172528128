"""The web console at /console: an approval inbox showing the exact effect, decisions, call timelines.

Server-rendered with Jinja2. Login is a bearer token pasted into a form, verified by the same verifier
as /mcp and kept in an HttpOnly, SameSite=Strict cookie. Every POST, the login's too, must come from
the console's own origin (`Origin`, `Sec-Fetch-Site`), and every form carries its session's CSRF token
(derived from the session, `gateway.console.csrf`).
"""

from gateway.console.routes import console_routes

__all__ = ["console_routes"]
