"""Code run in racing processes by tests/gateway/test_secret_files.py (importable, so they find it)."""

from __future__ import annotations

from typing import Any

from gateway.auth.dev_issuer import DevIssuer
from gateway.calls.actions import Redactor


def salted(path: str, start: Any) -> str:
    """The digest a process salting with the file at `path` gives, once `start` is set."""
    start.wait(10)
    return Redactor.from_file(path).digest("4111 1111 1111 1111")


def kid(path: str, start: Any) -> str:
    """The key id of the dev issuer a process loads or creates at `path`, once `start` is set."""
    start.wait(10)
    return str(DevIssuer.load_or_create(path, "http://127.0.0.1/dev-issuer").jwks()["keys"][0]["kid"])
