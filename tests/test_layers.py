"""Imports point down (DESIGN §2): gateway may import the rest; policy only the capability contract;
capabilities and store import none of ours; store knows nothing of MCP or HTTP. Inside gateway the
subpackages are layers too: the call domain knows no face, the faces know no composition root."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"gateway", "capabilities", "policy", "store", "demo"}

ALLOWED = {
    "demo": {"demo", "gateway", "capabilities", "policy", "store"},
    # Only gateway.cli imports the demo (to start it): checked with gateway's own layers below.
    "gateway": {"gateway", "capabilities", "policy", "store", "demo"},
    "policy": {"policy", "capabilities.contract"},
    "capabilities": {"capabilities"},
    "store": {"store"},
}
FORBIDDEN_FOREIGN = {"store": {"mcp", "mcp_types", "starlette", "httpx2", "httpx", "uvicorn"}}

# gateway's own layers, lowest first: a module may import its own layer's units and those below it,
# plus what EXTRA names. A unit is a subpackage (gateway.calls) or a top-level module (gateway.app).
GATEWAY_LAYERS = [
    {"gateway.errors", "gateway.reasons", "gateway.secret_files", "gateway.display", "gateway.clock"},
    {"gateway.calls", "gateway.audit"},
    {"gateway.config", "gateway.telemetry"},
    {"gateway.auth"},
    {"gateway.http", "gateway.mcp", "gateway.api", "gateway.console", "gateway.oauth"},
    {"gateway.app", "gateway.opening", "gateway.serve", "gateway.stdio", "gateway.startup_errors"},
    {"gateway.cli"},
]
FACES = {"gateway.http", "gateway.mcp", "gateway.api", "gateway.console", "gateway.oauth"}
EXTRA = {
    # What a client is told is shaped once, by the MCP face, and shown alike by the API and the console.
    "gateway.api": {"gateway.mcp.results"},
    "gateway.console": {"gateway.mcp.results"},
    # `writ demo` starts the demo, which stands above the gateway it runs.
    "gateway.cli": {"demo"},
}


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


def unit_of(module: str) -> str:
    """The gateway unit a module belongs to: `gateway.calls.pipeline` -> `gateway.calls`."""
    return ".".join(module.split(".")[:2])


def layer_of(unit: str) -> int:
    return next(i for i, layer in enumerate(GATEWAY_LAYERS) if unit in layer)


def gateway_violations(module: str, imported: set[str]) -> list[str]:
    """Every import of `module` (a gateway module) that reaches up a layer or across faces."""
    unit = unit_of(module)
    found = []
    for name in sorted(imported):
        if name.split(".")[0] == "demo" and "demo" not in EXTRA.get(unit, set()):
            found.append(f"{module} imports {name}")
        if not name.startswith("gateway."):
            continue
        target = unit_of(name)
        if target == unit or any(name == e or name.startswith(e + ".") for e in EXTRA.get(unit, set())):
            continue
        if layer_of(target) > layer_of(unit) or (target in FACES and unit in FACES):
            found.append(f"{module} imports {name}")
    return found


def gateway_module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("package", sorted(OURS))
def test_a_package_imports_only_what_lies_below_it(package: str) -> None:
    assert violations(package, modules(package)) == []


def test_every_gateway_module_belongs_to_a_layer() -> None:
    units = {unit_of(gateway_module(p)) for p in modules("gateway")} - {"gateway"}
    assert units <= set().union(*GATEWAY_LAYERS)


def test_inside_gateway_the_domain_knows_no_face_and_a_face_no_other_face() -> None:
    found = []
    for path in modules("gateway"):
        found += gateway_violations(gateway_module(path), imports_of(path))
    assert found == []


def test_the_layer_check_reports_an_upward_or_foreign_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from gateway.app import build_app\nimport store.model\nimport starlette\n")
    assert sorted(violations("store", [bad])) == ["bad.py imports gateway.app", "bad.py imports starlette"]
    assert sorted(violations("policy", [bad])) == ["bad.py imports gateway.app", "bad.py imports store.model"]


def test_the_gateway_check_reports_an_upward_or_sideways_import() -> None:
    assert gateway_violations("gateway.calls.pipeline", {"gateway.mcp.results", "gateway.errors"}) == [
        "gateway.calls.pipeline imports gateway.mcp.results"
    ]
    assert gateway_violations("gateway.mcp.server", {"gateway.api.routes", "gateway.calls.pipeline"}) == [
        "gateway.mcp.server imports gateway.api.routes"
    ]
    assert gateway_violations("gateway.api.routes", {"gateway.mcp.results", "demo.run"}) == [
        "gateway.api.routes imports demo.run"
    ]
    assert gateway_violations("gateway.cli.main", {"demo.run", "gateway.app"}) == []


def test_only_the_composition_root_and_the_cli_import_the_whole_store() -> None:
    # The rest of the gateway takes the narrow port it needs (store.ports), so its signature says which
    # facts it reads and writes. The CLI opens stores of its own: `writ store migrate` (gateway.cli.main)
    # and, for every other command, the migrated store on the database's clock (gateway.cli.stores).
    whole = {"store.store"}
    importers = set()
    for path in modules("gateway"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("store", "store.store"):
                if node.module == "store.store" or any(a.name == "Store" for a in node.names):
                    importers.add(gateway_module(path))
            elif isinstance(node, ast.Import) and any(a.name in whole for a in node.names):
                importers.add(gateway_module(path))
    assert importers <= {"gateway.app", "gateway.opening", "gateway.cli.main", "gateway.cli.stores"}


WALL_CLOCK = {
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("time", "time"),
}
CLOCK_READERS = {
    # The one reading of business time, which the composition roots hand in (gateway.clock).
    "gateway.clock": {"datetime.now"},
    # Token lifetimes are checked on the clock the JWT library checks `exp` and `iat` on, not on ours.
    "gateway.auth.tokens": {"time.time"},
    "gateway.auth.dev_issuer": {"time.time"},
    # Likewise the sign-in cookies' `exp`; and a signing key's birth, only to know when it may go.
    "gateway.oauth.signin": {"time.time"},
    "gateway.oauth.keys": {"time.time"},
    "gateway.stdio": {"time.time"},
    # Ids start with the time so that they sort by creation: not a fact anything decides on.
    "gateway.calls.actions": {"time.time"},
}


def wall_clock_reads(path: Path) -> set[str]:
    """Every `datetime.now()`, `time.time()` and the like that `path` calls."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if (name, node.func.attr) in WALL_CLOCK:
                found.add(f"{name}.{node.func.attr}")
    return found


def test_business_time_comes_from_the_injected_clock() -> None:
    # A module that reads the wall clock itself cannot be run at another instant by a test, and two
    # such modules can disagree about now within one call.
    found = []
    for path in modules("gateway"):
        module = gateway_module(path)
        found += [
            f"{module} calls {read}" for read in wall_clock_reads(path) - CLOCK_READERS.get(module, set())
        ]
    assert found == []


def test_the_clock_check_reports_a_direct_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import datetime, time\nnow = datetime.datetime.now()\nt = time.time()\nm = time.monotonic()\n"
    )
    assert wall_clock_reads(bad) == {"datetime.now", "time.time"}
