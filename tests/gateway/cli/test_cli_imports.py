"""The CLI's commands that serve nothing load no server stack: its imports are most of their start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.gateway.cli.test_cli_calls import escalated_store

SERVER_STACK = ("mcp.server", "starlette", "uvicorn", "opentelemetry.sdk", "alembic")

# Runs one command in a fresh interpreter and prints which of the server stack's packages it loaded.
PROBE = """
import json, sys
from gateway.cli.main import app
try:
    app(sys.argv[1:], prog_name="writ")
except SystemExit:
    pass
loaded = sorted({n for n in sys.modules for p in PREFIXES if n == p or n.startswith(p + ".")})
print(json.dumps(loaded), file=sys.stderr)
"""


def loaded_by(*args: str) -> tuple[str, list[str]]:
    """What `writ *args` printed, and the server stack's modules it loaded."""
    probe = f"PREFIXES = {SERVER_STACK!r}\n{PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120, check=True
    )
    loaded: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return done.stdout, loaded


def test_writ_help_loads_no_server_stack_and_no_migrations() -> None:
    out, loaded = loaded_by("--help")
    assert "calls" in out and loaded == []


def test_writ_calls_show_loads_no_server_stack(tmp_path: Path) -> None:
    out, loaded = loaded_by("calls", "show", "tc-done", "-c", str(escalated_store(tmp_path)))
    # Alembic tells whether the store's schema is the newest, which every store command checks first.
    assert "tc-done" in out and [m for m in loaded if not m.startswith("alembic")] == []


def test_writ_oauth_clients_list_loads_no_server_stack(tmp_path: Path) -> None:
    out, loaded = loaded_by("oauth", "clients", "list", "-c", str(escalated_store(tmp_path)))
    assert (
        "no clients have signed anyone in" in out and [m for m in loaded if not m.startswith("alembic")] == []
    )
