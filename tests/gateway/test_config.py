"""The configuration file: the documented example and the demo's config are valid, errors are clear."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from capabilities.config import PythonBackend
from capabilities.contract import Capability
from capabilities.registry import Registry
from gateway.config import load_config
from gateway.errors import ConfigurationError
from policy.engine import Policy
from policy.model import CallContext, PolicyInput, Principal

REPO = Path(__file__).resolve().parents[2]


def test_the_commented_example_in_deploy_is_a_valid_configuration() -> None:
    config = load_config(REPO / "deploy" / "writ.example.yaml")
    assert {c.id for c in config.capabilities} == {"refund-order", "lookup-order", "word-count"}
    policy = Policy.from_config(config.policy)
    refund = Capability(
        id="refund-order", version="2", tool_name="refund_order", backend="payments", input_schema={}
    )
    night = datetime(2026, 11, 30, 3, tzinfo=UTC)
    decision = policy.evaluate(
        PolicyInput(
            Principal("alice", roles=frozenset({"agent"})), refund, {"amount": 5}, CallContext(now=night)
        )
    )
    assert (decision.effect, decision.reason) == ("deny", "outside_business_hours")


def test_the_demo_config_is_valid_once_its_ports_are_filled_in(tmp_path: Path) -> None:
    text = (REPO / "demo" / "demo.yaml").read_text()
    text = text.replace("${gateway_port}", "8080").replace("${backend_port}", "8081")
    path = tmp_path / "demo.yaml"
    path.write_text(text.replace("${state_dir}", str(tmp_path)))
    config = load_config(path)
    assert config.server.resource_url == "http://127.0.0.1:8080/mcp"
    assert len(config.capabilities) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("server: [1, 2", "not valid YAML"),
        ("- just\n- a list\n", "top level must be a mapping"),
        ("server: {port: eighty}", "port"),
        ("surprise: true", "surprise"),
        ("server: {header_timeout_s: 0}", "header_timeout_s"),
        ("server: {body_timeout_s: -1}", "body_timeout_s"),
        ("server: {http_parser: picohttp}", "http_parser"),
        ("approvals: {webhook: {url: hooks.example.com/writ}}", "approvals.webhook.url: must be an absolute"),
    ],
)
def test_a_bad_config_file_is_refused_with_a_message_that_names_the_problem(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "writ.yaml"
    path.write_text(content)
    with pytest.raises(ConfigurationError, match=message):
        load_config(path)


def test_a_bad_config_file_gets_one_line_per_problem_without_pydantic_links(tmp_path: Path) -> None:
    path = tmp_path / "writ.yaml"
    path.write_text("server: {port: http}\npolcy: {rules: []}\n")
    with pytest.raises(ConfigurationError) as refused:
        load_config(path)

    assert str(refused.value) == (
        f"{path}: invalid config:\n"
        "  server.port: Input should be a valid integer, unable to parse string as an integer\n"
        "  polcy: Extra inputs are not permitted"
    )


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (
            "backends: {acme: {type: http, base_url: 'http://x', colour: blue}}",
            "backend 'acme': colour: Extra inputs are not permitted",
        ),
        (
            "backends: {acme: {type: http, base_url: 'http://x', auth: {type: header, header: 'X Key', "
            "token_env: K}}}",
            "backend 'acme': auth.header: 'X Key' is not an HTTP header name",
        ),
        (
            "backends: {local: {type: python}}\ncapabilities: [{id: add, backend: local, effect: delete}]",
            "capability 'add': effect: Input should be 'read', 'write', 'irreversible' or 'confirm'",
        ),
        (
            "capabilities: [{id: add, backend: nope, callable: 'm:f'}]",
            "capability 'add': unknown backend 'nope'",
        ),
        (
            "policy: {rules: [{id: big, decision: require_approval}]}",
            "policy.rules.0: rule 'big': approval: decision require_approval needs approval.approver_role",
        ),
        ("policy: {rulez: []}", "policy.rulez: Extra inputs are not permitted"),
    ],
)
def test_backends_capabilities_and_policy_are_validated_when_the_file_is_loaded(
    tmp_path: Path, content: str, line: str
) -> None:
    path = tmp_path / "writ.yaml"
    path.write_text(content)
    with pytest.raises(ConfigurationError) as refused:
        load_config(path)

    assert str(refused.value).startswith(f"{path}: invalid config:\n  {line}")


def test_the_loaded_sections_are_typed_models_the_registry_and_policy_take(tmp_path: Path) -> None:
    path = tmp_path / "writ.yaml"
    path.write_text(
        "backends: {local: {type: python}}\n"
        "capabilities: [{id: add, backend: local, callable: 'tests.capabilities.sample_tools:add'}]\n"
        "policy: {rules: [{id: all, decision: allow, approval: null}]}\n"
    )
    config = load_config(path)

    assert isinstance(config.backends["local"], PythonBackend)
    assert Registry.from_config(config.capabilities_config).get("add") is not None
    assert Policy.from_config(config.policy).config.rules[0].id == "all"


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_no_config_file_means_the_embedded_defaults() -> None:
    config = load_config(None)
    assert config.store.url.startswith("sqlite:///")
    assert yaml.safe_dump(config.model_dump())


SCHEMA_FILE = REPO / "deploy" / "writ.schema.json"


def test_the_published_schema_is_the_one_writ_config_schema_prints() -> None:
    # Regenerate with: writ config schema > deploy/writ.schema.json
    import json

    from typer.testing import CliRunner

    from gateway.cli.main import app

    out = CliRunner().invoke(app, ["config", "schema"])

    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == json.loads(SCHEMA_FILE.read_text())


def test_the_example_config_is_valid_under_the_published_schema() -> None:
    import json

    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    example = yaml.safe_load((SCHEMA_FILE.parent / "writ.example.yaml").read_text())

    assert [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(example)] == []
    assert (
        (SCHEMA_FILE.parent / "writ.example.yaml")
        .read_text()
        .startswith("# yaml-language-server: $schema=./writ.schema.json\n")
    )


def test_the_published_schema_describes_backends_and_capabilities_for_editors() -> None:
    import json

    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    good = {
        "backends": {"acme": {"type": "http", "base_url": "https://acme.example"}},
        "capabilities": [
            {
                "id": "refund",
                "backend": "acme",
                "request": {"method": "post", "path": "/r"},
                "input_schema": {},
            }
        ],
        "policy": {
            "rules": [
                {
                    "id": "big",
                    "decision": "require_approval",
                    "approval": {"approver_role": "finance", "expires_in": "1h"},
                }
            ]
        },
    }
    assert [e.message for e in validator.iter_errors(good)] == []
    for bad in (
        {"backends": {"acme": {"type": "ftp"}}},
        {"backends": {"acme": {"type": "http", "base_url": "https://acme.example", "colour": "blue"}}},
        {"capabilities": [{"id": "refund", "backend": "acme", "effect": "delete"}]},
        {"policy": {"rules": [{"id": "x", "decision": "maybe"}]}},
    ):
        assert list(validator.iter_errors(bad)), bad


def test_rechecks_default_to_one_three_and_ten_horizons_and_take_an_ascending_list(tmp_path: Path) -> None:
    path = tmp_path / "writ.yaml"
    path.write_text("workers: {}\n")
    assert load_config(path).workers.reconcile_recheck_after == [1.0, 3.0, 10.0]
    path.write_text("workers: {reconcile_recheck_after: []}\n")  # off
    assert load_config(path).workers.reconcile_recheck_after == []
    # A zero or negative multiple, an order that is not strictly ascending, or more than ten: refused.
    for bad, message in [
        ("[0, 1]", "each entry must be above 0"),
        ("[-1]", "each entry must be above 0"),
        ("[3, 1]", "must be strictly ascending"),
        ("[1, 1]", "must be strictly ascending"),
        (str(list(range(1, 12))), "at most 10"),
        ("[soon]", "reconcile_recheck_after"),
    ]:
        path.write_text(f"workers: {{reconcile_recheck_after: {bad}}}\n")
        with pytest.raises(ConfigurationError, match=message):
            load_config(path)
