"""The web console at /console: an approval inbox showing the exact effect, decisions, call timelines.

Server-rendered with Jinja2. Login is a bearer token pasted into a form, verified by the same verifier
as /mcp; it opens a session in the store (`gateway.console.sessions`), whose random id, never the
token, is kept in an HttpOnly, SameSite=Strict cookie, and which logging out ends. Every POST, the
login's too, must come from the console's own origin (`Origin`, `Sec-Fetch-Site`), and every form
carries its session's CSRF token (derived from the session id, `gateway.console.csrf`).
"""

from gateway.console.routes import console_routes

__all__ = ["console_routes"]
