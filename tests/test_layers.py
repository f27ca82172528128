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


@pytest.mark.parametrize("package", sorted(OURS))
def test_a_package_imports_only_what_lies_below_it(package: str) -> None:
    violations = []
    for path in modules(package):
        for name in imports_of(path):
            top = name.split(".")[0]
            if top in OURS and not any(name == a or name.startswith(a + ".") for a in ALLOWED[package]):
                violations.append(f"{path.relative_to(ROOT)} imports {name}")
            if top in FORBIDDEN_FOREIGN.get(package, set()):
                violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert violations == []


def test_the_layer_check_sees_a_violation_when_there_is_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from gateway.app import build_app\nimport store.model\n")
    assert imports_of(bad) == {"gateway.app", "store.model"}
