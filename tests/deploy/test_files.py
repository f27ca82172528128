"""The files in deploy/ agree with Writ and with each other: configs, commands, ports, probes, secrets."""

from __future__ import annotations

import importlib.util
import json
import posixpath
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from psycopg import pq
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from capabilities.config import HttpBackend
from gateway.cli.main import app
from gateway.config import WritConfig, load_config
from policy.engine import Policy
from store.db import create_store_engine
from tests.deploy import files

WRIT_SERVICES = ("writ-1", "writ-2")


def _config(text: str, tmp_path: Path) -> WritConfig:
    path = tmp_path / "writ.yaml"
    path.write_text(text)
    config = load_config(path)
    Policy.from_config(config.policy)  # compiles the rules' CEL, which loading leaves to the gateway
    return config


@pytest.mark.parametrize("path", files.yaml_files(), ids=lambda p: str(p.relative_to(files.REPO)))
def test_every_yaml_file_in_deploy_parses(path: Path) -> None:
    assert [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.mark.parametrize("where", ["compose", "configmap"])
def test_the_embedded_writ_yaml_is_a_shared_postgres_config_behind_a_public_url(
    where: str, tmp_path: Path
) -> None:
    text = files.compose_content("writ.yaml") if where == "compose" else files.configmap_config()
    config = _config(text, tmp_path)
    server = config.server
    assert make_url(config.store.url).get_backend_name() == "postgresql"
    assert make_url(config.store.url).password is None, "the password belongs in $PGPASSWORD"
    assert server.public_url and server.host == "0.0.0.0" and server.port == 8080
    assert urlsplit(server.public_url).netloc in (server.allowed_hosts or []), "DNS-rebinding protection"
    assert server.stateless_http, "replicas behind a balancer without sticky sessions"
    for shared in (config.privacy.salt_file, config.confirmations.key_file):
        assert shared and shared.startswith("/run/secrets/writ/"), shared
    if where == "configmap":
        assert not config.auth.dev_issuer.enabled and config.auth.issuers
    else:
        assert config.auth.dev_issuer.key_file.startswith("/run/secrets/writ/")


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source of a Compose service's volumes (short syntax)."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}


def test_every_compose_replica_shares_the_config_the_secrets_and_the_database(tmp_path: Path) -> None:
    compose = files.compose()
    config = _config(files.compose_content("writ.yaml"), tmp_path)
    secret_dir = posixpath.dirname(config.privacy.salt_file)
    services = compose["services"]
    secrets_volume = _mounts(services["secrets"])[secret_dir]
    for name in (*WRIT_SERVICES, "migrate"):
        service = services[name]
        assert service["configs"] == [{"source": "writ.yaml", "target": files.CONFIG_PATH}], name
        assert (
            service["environment"]["PGPASSWORD"] == services["postgres"]["environment"]["POSTGRES_PASSWORD"]
        )
        assert service.get("read_only") is True, f"{name}: Writ writes nothing on PostgreSQL"
    for name in WRIT_SERVICES:
        assert _mounts(services[name])[secret_dir] == secrets_volume, name
        assert services[name]["volumes"] == [f"{secrets_volume}:{secret_dir}:ro"]
        depends = services[name]["depends_on"]
        assert (
            depends["migrate"]["condition"]
            == depends["secrets"]["condition"]
            == "service_completed_successfully"
        )
    url = make_url(config.store.url)
    assert url.host == "postgres" and url.username == services["postgres"]["environment"]["POSTGRES_USER"]
    assert url.database == services["postgres"]["environment"]["POSTGRES_DB"]
    acme = config.backends["acme"]
    assert isinstance(acme, HttpBackend) and acme.base_url.endswith(":8081")
    assert "8081" in services["acme-payments"]["command"]


def test_the_compose_balancer_fronts_both_replicas_at_the_public_url(tmp_path: Path) -> None:
    compose = files.compose()
    config = _config(files.compose_content("writ.yaml"), tmp_path)
    nginx = files.compose_content("nginx.conf")
    upstreams = re.findall(r"^\s*server\s+([\w.-]+:\d+);", nginx, re.MULTILINE)
    assert upstreams == [f"{name}:{config.server.port}" for name in WRIT_SERVICES]
    assert "proxy_set_header Host $http_host;" in nginx, "allowed_hosts sees the client's Host"
    # Writ believes nginx's X-Forwarded-For, so nginx must say who connected, never pass on a claim.
    assert config.server.forwarded_allow_ips
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in nginx
    public = urlsplit(config.server.public_url or "")
    listen = re.search(r"listen\s+(\d+);", nginx)
    assert listen and compose["services"]["lb"]["ports"] == [f"127.0.0.1:{public.port}:{listen.group(1)}"]


def test_the_deployment_mounts_the_configmap_and_the_secrets_where_the_config_names_them(
    tmp_path: Path,
) -> None:
    config = _config(files.configmap_config(), tmp_path)
    pod = files.manifest("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    shared = [config.privacy.salt_file, config.confirmations.key_file]
    for container in (*pod["initContainers"], *pod["containers"]):
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        config_volume = volumes[mounts[posixpath.dirname(files.CONFIG_PATH)]]["configMap"]
        assert config_volume["name"] == "writ-config"
        assert config_volume["items"] == [{"key": "writ.yaml", "path": posixpath.basename(files.CONFIG_PATH)}]
        secret = volumes[mounts[posixpath.dirname(shared[0])]]["secret"]
        assert {i["path"] for i in secret["items"]} == {posixpath.basename(p) for p in shared if p}
        (password,) = [e for e in container["env"] if e["name"] == "PGPASSWORD"]
        assert password["valueFrom"]["secretKeyRef"]["name"] == "writ-database"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert files.manifest("Deployment")["spec"]["replicas"] == 2


def test_probes_ports_and_the_image_agree_with_what_the_config_serves(tmp_path: Path) -> None:
    config = _config(files.configmap_config(), tmp_path)
    (writ,) = files.manifest("Deployment")["spec"]["template"]["spec"]["containers"]
    (port,) = writ["ports"]
    assert port == {"name": "http", "containerPort": config.server.port}
    # Liveness must not depend on the database, or an outage restarts every replica at once.
    assert writ["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert writ["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert writ["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    (service_port,) = files.manifest("Service")["spec"]["ports"]
    assert service_port["targetPort"] == "http"

    runtime = files.dockerfile()[-1]
    assert runtime.all("EXPOSE") == [str(config.server.port)]
    healthcheck = files.exec_form(runtime.last("HEALTHCHECK").split(" CMD ", 1)[1].strip())
    assert f"http://127.0.0.1:{config.server.port}/healthz" in healthcheck[-1]
    assert healthcheck[0] == "python", "slim has no curl"
    user = runtime.last("USER").split(":")
    assert user[0].isdigit() and int(user[0]) != 0, "numeric, so runAsNonRoot can check it"
    pod_security = files.manifest("Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsUser"] == int(user[0])


def _image_commands() -> list[tuple[str, list[str]]]:
    """Every `writ` command line the deploy files run, with where it comes from."""
    runtime = files.dockerfile()[-1]
    assert files.exec_form(runtime.last("ENTRYPOINT")) == ["writ"]
    found = [("Dockerfile CMD", files.exec_form(runtime.last("CMD")))]
    for name, service in files.compose()["services"].items():
        if service["image"].startswith("writ:") and "entrypoint" not in service:
            found.append((f"compose {name}", service.get("command", found[0][1])))
    pod = files.manifest("Deployment")["spec"]["template"]["spec"]
    for container in (*pod["initContainers"], *pod["containers"]):
        found.append((f"kubernetes {container['name']}", container["args"]))
    readme = "\n".join(
        re.findall(r"^```\w*\n(.*?)^```", (files.DEPLOY / "README.md").read_text(), re.M | re.S)
    )
    comments = "\n".join(re.findall(r"^\s*#.*$", (files.DEPLOY / "compose.yaml").read_text(), re.M))
    for where, text in (("deploy/README.md", readme), ("compose.yaml comments", comments)):
        for words in re.findall(r"\bwrit((?: [a-z][a-z-]*)+)", text):
            found.append((where, words.split()))
    return found


def test_every_writ_command_the_deploy_files_run_exists() -> None:
    commands = _image_commands()
    assert ["serve", "-c", files.CONFIG_PATH] in [argv for _, argv in commands]
    assert ["store", "migrate", "-c", files.CONFIG_PATH] in [argv for _, argv in commands]
    runner = CliRunner()
    for where, argv in commands:
        result = runner.invoke(app, [*argv, "--help"])
        assert result.exit_code == 0, f"{where}: writ {' '.join(argv)}: {result.output}"


def test_the_compose_services_that_run_python_run_modules_the_image_has() -> None:
    for name, service in files.compose()["services"].items():
        entrypoint = service.get("entrypoint")
        if entrypoint and entrypoint[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(entrypoint[2]) is not None, name


def test_the_image_copies_only_project_files_and_bakes_in_no_secret() -> None:
    patterns = files.dockerignore()
    for required in (".git", ".venv", ".writ", "**/node_modules", "**/__pycache__", ".pytest_cache"):
        assert required in patterns
    for stage in files.dockerfile():
        for args in stage.all("COPY"):
            if args.startswith("--from="):
                continue
            for source in args.split()[:-1]:
                assert (files.REPO / source).exists() and not files.ignored(source, patterns), source
        for keyword in ("ENV", "ARG"):
            for args in stage.all(keyword):
                assert not re.search(r"(PASSWORD|SECRET|TOKEN|_KEY)\w*=", args, re.IGNORECASE), args
    runtime = files.dockerfile()[-1]
    assert files.exec_form(runtime.last("CMD")) == ["serve", "-c", files.CONFIG_PATH]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_manifests_as_they_were_read_here() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(files.KUBERNETES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered)}
    ours = {(d["kind"], d["metadata"]["name"]): d for d in files.manifests()}
    assert by_kind.keys() == ours.keys() and ("PodDisruptionBudget", "writ") in ours
    assert by_kind[("Deployment", "writ")]["spec"] == ours[("Deployment", "writ")]["spec"]


@pytest.mark.parametrize("where", ["compose", "configmap"])
def test_the_store_url_leaves_the_password_to_libpq_which_reads_pgpassword(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = files.compose_content("writ.yaml") if where == "compose" else files.configmap_config()
    engine = create_store_engine(_config(text, tmp_path).store.url)
    try:
        _, connect = engine.dialect.create_connect_args(engine.url)
    finally:
        engine.dispose()
    assert "password" not in connect, "a password in the connect arguments would override PGPASSWORD"
    monkeypatch.setenv("PGPASSWORD", "from-the-secret")
    defaults = {option.keyword: option.val for option in pq.Conninfo.get_defaults()}
    assert defaults[b"password"] == b"from-the-secret"


# -- telemetry: Writ -> collector -> Jaeger and Prometheus -> Grafana ------------------------------------


def _compose_file(name: str) -> Path:
    """The file a top-level compose `configs:` entry names, as Compose resolves it (beside compose.yaml)."""
    path = (files.DEPLOY / files.compose()["configs"][name]["file"]).resolve()
    assert path.is_file(), f"compose config {name}: no file {path}"
    return path


def _mounted(service: str, config: str) -> str:
    """Where a compose service mounts one of the top-level configs."""
    (target,) = [
        c["target"] for c in files.compose()["services"][service]["configs"] if c["source"] == config
    ]
    return str(target)


def _host_port(url_or_address: str) -> tuple[str, int]:
    parts = urlsplit(url_or_address if "//" in url_or_address else f"//{url_or_address}")
    assert parts.hostname and parts.port, url_or_address
    return parts.hostname, parts.port


def test_writ_sends_otlp_to_the_collector_which_feeds_jaeger_and_prometheus(tmp_path: Path) -> None:
    compose = files.compose()
    services = compose["services"]
    config = _config(files.compose_content("writ.yaml"), tmp_path)
    assert config.telemetry.exporter == "otlp" and config.telemetry.endpoint
    host, port = _host_port(config.telemetry.endpoint)
    assert host in services and "collector" in services[host]["image"]
    for name in WRIT_SERVICES:
        assert services[name]["depends_on"][host] == {"condition": "service_started"}

    collector = yaml.safe_load(_compose_file("otel-collector.yaml").read_text())
    assert f"--config={_mounted(host, 'otel-collector.yaml')}" in services[host]["command"]
    assert _host_port(collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"])[1] == port
    pipelines = collector["service"]["pipelines"]
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            assert all(name in collector[kind] for name in pipeline[kind]), pipeline

    (traces,) = pipelines["traces"]["exporters"]
    jaeger_host, jaeger_port = _host_port(collector["exporters"][traces]["endpoint"])
    assert jaeger_host in services and "jaeger" in services[jaeger_host]["image"]
    assert jaeger_port == 4317 and services[jaeger_host]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"

    (metrics,) = pipelines["metrics"]["exporters"]
    assert metrics == "prometheus"
    served = _host_port(collector["exporters"][metrics]["endpoint"])[1]
    prometheus = yaml.safe_load(_compose_file("prometheus.yaml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert targets == [f"{host}:{served}"]
    assert f"--config.file={_mounted('prometheus', 'prometheus.yaml')}" in services["prometheus"]["command"]


def test_grafana_provisions_the_writ_dashboard_over_the_stacks_prometheus_and_jaeger() -> None:
    services = files.compose()["services"]
    sources = yaml.safe_load(_compose_file("grafana-datasources.yaml").read_text())["datasources"]
    uids = {source["uid"]: source for source in sources}
    for source in sources:
        host, port = _host_port(source["url"])
        assert host in services and source["type"] in services[host]["image"], source
        published = [p for p in services[host].get("ports", []) if p.endswith(f":{port}")]
        assert published or (host, port) == ("prometheus", 9090), source
    assert _mounted("grafana", "grafana-datasources.yaml").startswith(
        "/etc/grafana/provisioning/datasources/"
    )
    assert _mounted("grafana", "grafana-dashboards.yaml").startswith("/etc/grafana/provisioning/dashboards/")

    providers = yaml.safe_load(_compose_file("grafana-dashboards.yaml").read_text())["providers"]
    (provider,) = providers
    dashboard_at = _mounted("grafana", "grafana-dashboard-writ.json")
    assert posixpath.dirname(dashboard_at) == provider["options"]["path"]
    assert services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == dashboard_at

    dashboard = json.loads(_compose_file("grafana-dashboard-writ.json").read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] in uids, panel["title"]
        for target in panel["targets"]:
            assert uids[target["datasource"]["uid"]]["type"] == target["datasource"]["type"], panel["title"]


def _exported_metrics() -> dict[str, set[str]]:
    """Every metric Writ records, by the name the collector's Prometheus exporter gives it, with the
    labels its points carry (OpenTelemetry's translation: dots to underscores, the unit as a suffix,
    `_total` for counters, `{...}` units dropped)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import Histogram as HistogramData
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum

    from gateway.telemetry import Telemetry

    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, MeterProvider(metric_readers=[reader]))
    with telemetry.tool_call("refund_order", {}) as call:
        call.unknown_tool()
    with telemetry.tool_call("refund_order", {}) as call:
        call.status, call.decision, call.reason = "denied", "deny", "amount_over_limit"
    telemetry.mcp_operation(0.1, {"mcp.method.name": "tools/call", "error.type": "-32602"})
    telemetry.authentication_failed("expired")
    telemetry.reconciled("confirmed_success")
    telemetry.observe_waiting(lambda: {"approval_pending": 1, "result_unknown": 2})
    telemetry.checkpoint_age(lambda: 5.0)
    telemetry.security_refused("security.edge_refused", "request_too_large")
    found: dict[str, set[str]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for metric in (m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics):
        name = metric.name.replace(".", "_")
        if metric.unit == "s":
            name += "_seconds"
        if isinstance(metric.data, Sum) and metric.data.is_monotonic:
            name += "_total"
        labels = {key.replace(".", "_") for p in metric.data.data_points for key in p.attributes}
        if isinstance(metric.data, HistogramData):
            labels.add("le")
            for suffix in ("_bucket", "_sum", "_count"):
                found[name + suffix] = labels
        else:
            found[name] = labels
    return found


def test_the_dashboard_queries_only_metrics_and_labels_writ_exports() -> None:
    exported = _exported_metrics()
    assert {
        "writ_approvals_waiting",
        "writ_calls_result_unknown",
        "writ_reconciliations_total",
        "writ_audit_checkpoint_age_seconds",
    } <= set(exported)
    dashboard = json.loads(_compose_file("grafana-dashboard-writ.json").read_text())
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target.get("expr")
            if expr is None:
                continue
            # Metric names: what is left without the grouping labels and the label matchers.
            bare = re.sub(r"\{[^}]*\}", "", re.sub(r"by \([^)]*\)", "", expr))
            names = re.findall(r"\b((?:writ|mcp|gen_ai)_[a-z_]+)", bare)
            assert names, expr
            for name in names:
                assert name in exported, f"{panel['title']}: {name} is not a metric Writ exports"
                queried.add(name)
                for group in re.findall(r"by \(([^)]*)\)", expr):
                    labels = {label.strip() for label in group.split(",")}
                    assert labels <= exported[name], f"{panel['title']}: {labels - exported[name]}"
    # Every gauge and counter Writ has is on the dashboard.
    assert {n for n in exported if not n.endswith(("_bucket", "_sum", "_count"))} <= queried


def test_the_image_has_the_otlp_exporter_the_compose_config_uses() -> None:
    build = files.dockerfile()[0]
    (install,) = [args for args in build.all("RUN") if "pip install" in args]
    assert '".[otlp]"' in install
    extras = tomllib.loads((files.REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    exporter = extras["otlp"][0].split(">=")[0]
    pinned = [line.split("==")[0] for line in (files.DEPLOY / "constraints.txt").read_text().splitlines()]
    assert exporter in pinned
