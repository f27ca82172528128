"""Imports point down (DESIGN §2): gateway may import the rest; policy only the capability contract;
capabilities and store import none of ours; store knows nothing of MCP or HTTP."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"gateway", "capabilities", "policy", "store"}

ALLOWED = {
    "gateway": {"gateway", "capabilities", "policy", "store"},
    "policy": {"policy", "capabilities.contract"},
    "capabilities": {"capabilities"},
    "store": {"store"},
}
FORBIDDEN_FOREIGN = {"store": {"mcp", "mcp_types", "starlette", "httpx2", "httpx", "uvicorn"}}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def violations(package: str, paths: list[Path]) -> list[str]:
    """Every import in `paths` that `package` may not make."""
    found = []
    for path in paths:
        for name in imports_of(path):
            top = name.split(".")[0]
            if top in OURS and not any(name == a or name.startswith(a + ".") for a in ALLOWED[package]):
                found.append(f"{path.name} imports {name}")
            if top in FORBIDDEN_FOREIGN.get(package, set()):
                found.append(f"{path.name} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(OURS))
def test_a_package_imports_only_what_lies_below_it(package: str) -> None:
    assert violations(package, modules(package)) == []


def test_the_layer_check_reports_an_upward_or_foreign_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from gateway.app import build_app\nimport store.model\nimport starlette\n")
    assert sorted(violations("store", [bad])) == ["bad.py imports gateway.app", "bad.py imports starlette"]
    assert sorted(violations("policy", [bad])) == ["bad.py imports gateway.app", "bad.py imports store.model"]
