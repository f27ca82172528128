"""The sign-in's HTML pages (login, consent, problems): never cached, never framed."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

HERE = Path(__file__).parent


class Pages:
    def __init__(self) -> None:
        self._templates = Jinja2Templates(directory=str(HERE / "templates"))

    def render(
        self,
        request: Request,
        name: str,
        status_code: int = 200,
        *,
        redirect_uri: str | None = None,
        **context: Any,
    ) -> Response:
        """A page whose forms post here only (and, for the consent, lead on to the client's redirect)."""
        context["redirect_uri"] = redirect_uri
        response = self._templates.TemplateResponse(request, name, context, status_code=status_code)
        form_action = "'self'"
        if redirect_uri is not None:
            # Browsers hold a form's redirect to the form-action rule too: the consent's leads there.
            parts = urlsplit(redirect_uri)
            form_action += f" {parts.scheme}://{parts.netloc}"
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            f"default-src 'self'; frame-ancestors 'none'; form-action {form_action}"
        )
        return response

    def problem(self, request: Request, message: str, status_code: int = 400) -> Response:
        return self.render(request, "problem.html", status_code=status_code, message=message)

    def expired(self, request: Request) -> Response:
        return self.problem(
            request,
            "This sign-in has expired or was not started in this browser. Start again from your client.",
        )
