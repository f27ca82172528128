"""`capabilities` imports nothing of Writ's other packages (DESIGN §2: imports point down)."""

from __future__ import annotations

import ast
from pathlib import Path

import capabilities

FORBIDDEN = ("gateway", "policy", "store")


def test_no_module_of_capabilities_imports_gateway_policy_or_store() -> None:
    offenders = []
    for path in Path(capabilities.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]

    assert offenders == []
