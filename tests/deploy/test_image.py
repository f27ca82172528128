"""The image's build and start, emulated without a Docker engine, as closely as this machine allows.

The build context is copied through .dockerignore; the build stage's COPY, WORKDIR and RUN lines run
as written, with the image's absolute paths moved under a temporary root; then the runtime stage's
command starts two replicas of `writ serve` with compose's writ.yaml (a PostgreSQL schema of its own
and free ports instead of the compose network), its secrets made by compose's own `secrets` script,
and the demo backend started as compose starts it. What differs from Docker: the interpreter is this machine's
Python 3.11, not the python:3.11-slim image's; pip keeps its cache (the Dockerfile's PIP_NO_CACHE_DIR
is dropped so a run takes seconds); nothing runs as uid 10001 or on a read-only root filesystem.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.deploy import files
from tests.e2e.harness import free_port, mcp_client, stop, wait_http
from tests.postgres import fresh_schema

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.postgres]

IMAGE_PATHS = ("/opt/writ", "/src", "/etc/writ", "/run/secrets/writ", "/var/lib/writ")
"""Absolute paths the image and compose use, each moved under the emulation's root."""
_IMAGE_PATH = re.compile(r"(?<![\w.-])(?:" + "|".join(map(re.escape, IMAGE_PATHS)) + r")(?![\w.-])")


class Image:
    """A directory standing in for the image's filesystem."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env: dict[str, str] = {}

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def rewrite(self, text: str) -> str:
        """`text` with each image path moved under the root (a path already moved stays as it is)."""
        return _IMAGE_PATH.sub(lambda m: str(self.path(m.group(0))), text)

    def run(self, argv: list[str], *, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.rewrite(a) for a in argv],
            cwd=cwd,
            env=self.environ(**env),
            capture_output=True,
            text=True,
            timeout=300,
        )

    def environ(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **self.env, **extra}


def copy_context(destination: Path) -> None:
    """The build context as Docker sends it: the repository minus what .dockerignore excludes."""
    patterns = files.dockerignore()
    for directory, subdirs, names in os.walk(files.REPO):
        relative = Path(directory).relative_to(files.REPO)
        subdirs[:] = [d for d in subdirs if not files.ignored((relative / d).as_posix(), patterns)]
        for name in names:
            if not files.ignored((relative / name).as_posix(), patterns):
                (destination / relative).mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(directory) / name, destination / relative / name)


def _apply_env(image: Image, args: str) -> None:
    for pair in args.split():
        name, _, value = pair.partition("=")
        if name == "PIP_NO_CACHE_DIR":
            continue
        value = value.replace("$PATH", image.env.get("PATH", os.environ["PATH"]))
        image.env[name] = image.rewrite(value)


def build(root: Path) -> Image:
    """The Dockerfile's stages, instruction by instruction, on this machine."""
    context, image = root / "context", Image(root / "image")
    context.mkdir()
    image.root.mkdir()
    copy_context(context)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(getattr(sys, "_base_executable", sys.executable))
    image.env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    build_stage, runtime = files.dockerfile()
    workdir = image.root
    for keyword, args in build_stage.instructions:
        if keyword == "ENV":
            _apply_env(image, args)
        elif keyword == "WORKDIR":
            workdir = image.path(args)
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, target = args.split()
            for source in sources:
                dest = workdir / target if not target.endswith("/") else workdir / target / Path(source).name
                if (context / source).is_dir():
                    shutil.copytree(context / source, workdir / target)
                else:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(context / source, dest)
        elif keyword == "RUN":
            done = image.run(["sh", "-c", args], cwd=workdir)
            assert done.returncode == 0, f"RUN {args}:\n{done.stdout}\n{done.stderr}"
        else:
            raise AssertionError(f"the emulation does not know {keyword} in the build stage")
    image.env = {"PATH": image.env["PATH"]}
    for keyword, args in runtime.instructions:
        if keyword == "ENV":
            _apply_env(image, " ".join(args.split()))
        elif keyword == "COPY":
            assert args.startswith("--from=build ") and len({*args.split()[1:]}) == 1, args
        elif keyword == "WORKDIR":
            image.path(args).mkdir(parents=True, exist_ok=True)
        elif keyword == "RUN":
            _runtime_run(image, args)
    return image


def _runtime_run(image: Image, args: str) -> None:
    """The runtime stage's RUN: its directories are made; making the user and owning files needs root."""
    for step in (s.split() for s in args.split("&&")):
        if step[:2] == ["mkdir", "-p"]:
            for directory in step[2:]:
                image.path(directory).mkdir(parents=True, exist_ok=True)
        else:
            assert step[0] in ("groupadd", "useradd", "chown"), f"the emulation does not know {step}"


@pytest.fixture
def pg_schema_url(postgres_url: str) -> Iterator[str]:
    with fresh_schema(postgres_url, "writ_deploy") as url:
        yield url


@contextlib.contextmanager
def started(
    image: Image, argv: list[str], *, cwd: Path, log: Path, **env: str
) -> Iterator[subprocess.Popen[str]]:
    with log.open("w") as out:
        process = subprocess.Popen(
            [image.rewrite(a) for a in argv],
            cwd=cwd,
            env=image.environ(**env),
            stdout=out,
            stderr=out,
            text=True,
        )
        try:
            yield process
        finally:
            stop(process)


@contextlib.asynccontextmanager
async def balanced_client(url: str, token: str, headers: dict[str, str]) -> AsyncIterator[Client]:
    """An MCP client at one replica with the headers a balancer in front would pass on (Host)."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}", **headers}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def _snapshot(*roots: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for root in roots for p in root.rglob("*")}


def _adapted_config(image: Image, *, port: int, store_url: str, backend_url: str) -> str:
    """compose's writ.yaml with this machine's database, ports and host names in place of compose's."""
    config = yaml.safe_load(image.rewrite(files.compose_content("writ.yaml")))
    server = config["server"]
    assert {"host", "port", "public_url", "allowed_hosts"} <= server.keys()
    server.update(
        host="127.0.0.1",
        port=port,
        public_url=f"http://localhost:{port}",
        allowed_hosts=[f"localhost:{port}", f"127.0.0.1:{port}"],
    )
    assert config["store"]["url"].startswith("postgresql://")
    config["store"]["url"] = store_url
    assert config["backends"]["acme"]["base_url"].startswith("http://acme-payments:")
    config["backends"]["acme"]["base_url"] = backend_url
    return yaml.safe_dump(config, sort_keys=False)


@pytest.mark.timeout(1200)  # pip installs the image from its context: several steps of up to 300 s
async def test_the_image_installs_from_its_context_and_serves_compose_config_on_postgres(
    tmp_path: Path, pg_schema_url: str
) -> None:
    image = build(tmp_path)
    writ = [str(image.path("/opt/writ/bin/writ"))]
    helped = image.run([*writ, "--help"], cwd=tmp_path)
    assert helped.returncode == 0 and "serve" in helped.stdout, helped.stderr
    frozen = image.run(
        [str(image.path("/opt/writ/bin/pip")), "freeze", "--exclude", "writ-gateway"], cwd=tmp_path
    )
    pinned = [line for line in (files.DEPLOY / "constraints.txt").read_text().splitlines() if "==" in line]
    assert sorted(frozen.stdout.lower().split()) == sorted(p.lower() for p in pinned), (
        "every dependency pinned"
    )

    services = files.compose()["services"]
    secret_dir = image.path("/run/secrets/writ")
    secret_dir.mkdir(parents=True)
    made = image.run(
        [*services["secrets"]["entrypoint"], *services["secrets"]["command"], str(secret_dir)], cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr

    acme = services["acme-payments"]
    backend_port, port = free_port(), free_port()
    acme_args = [*acme["entrypoint"], *acme["command"]]
    acme_args[acme_args.index("--port") + 1] = str(backend_port)
    acme_args[acme_args.index("--host") + 1] = "127.0.0.1"
    acme_dir = tmp_path / "acme-data"
    acme_dir.mkdir()
    acme_args[acme_args.index("--db") + 1] = str(acme_dir / "acme.db")

    config_file = image.path(files.CONFIG_PATH)
    config_file.write_text(
        _adapted_config(
            image, port=port, store_url=pg_schema_url, backend_url=f"http://127.0.0.1:{backend_port}"
        )
    )
    password = services["writ-1"]["environment"]
    migrated = image.run([*writ, *services["migrate"]["command"]], cwd=tmp_path, **password)
    assert migrated.returncode == 0, migrated.stderr

    home, workdir = tmp_path / "home", image.path("/var/lib/writ")
    home.mkdir()
    before = _snapshot(image.path("/etc/writ"), secret_dir, workdir, home)
    runtime = files.dockerfile()[-1]
    command = [*files.exec_form(runtime.last("ENTRYPOINT")), *files.exec_form(runtime.last("CMD"))]
    # Two replicas of one config, as writ-1 and writ-2; on one host the second needs another port.
    ports = [port, free_port()]
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(started(image, acme_args, cwd=acme_dir, log=tmp_path / "acme.log"))
        servers = [
            stack.enter_context(
                started(
                    image,
                    command if n == 0 else [*command, "--port", str(p)],
                    cwd=workdir,
                    log=tmp_path / f"writ-{n + 1}.log",
                    HOME=str(home),
                    **password,
                )
            )
            for n, p in enumerate(ports)
        ]
        wait_http(f"http://127.0.0.1:{backend_port}/healthz", backend)
        healthcheck = files.exec_form(runtime.last("HEALTHCHECK").split(" CMD ", 1)[1].strip())
        for n, (p, server) in enumerate(zip(ports, servers, strict=True)):
            try:
                wait_http(f"http://127.0.0.1:{p}/readyz", server)
            except (RuntimeError, TimeoutError) as exc:
                log = (tmp_path / f"writ-{n + 1}.log").read_text()[-3000:]
                raise AssertionError(f"{exc}:\n{log}") from exc
            check = [*healthcheck[:-1], healthcheck[-1].replace("127.0.0.1:8080", f"127.0.0.1:{p}")]
            assert image.run(check, cwd=workdir).returncode == 0, "the image's HEALTHCHECK"

        minted = image.run(
            [*writ, "token", "--sub", "alice", "--roles", "agent", "--tenant", "acme"], cwd=workdir
        )
        assert minted.returncode == 0, minted.stderr
        token = minted.stdout.strip().splitlines()[-1]
        refund = {"order_id": "1001", "amount": 5, "currency": "EUR"}
        # A 2025-11-25 client at writ-1 (stateless_http: no session to lose to the other replica).
        async with mcp_client(f"http://localhost:{port}/mcp", token, mode="legacy") as client:
            first = await client.call_tool("refund_order", {**refund, "reason": "at writ-1"})
            assert first.meta and first.meta["writ/status"] == "completed", first
        # A 2026-07-28 client at writ-2, reached as through the balancer: the Host is public_url's.
        public_host = {"Host": f"localhost:{port}"}
        async with balanced_client(f"http://127.0.0.1:{ports[1]}/mcp", token, public_host) as client:
            second = await client.call_tool("refund_order", {**refund, "reason": "at writ-2"})
            assert second.meta and second.meta["writ/status"] == "completed", second
            status = await client.call_tool("writ_call_status", {"toolCallId": first.meta["writ/toolCallId"]})
            assert status.structured_content and status.structured_content["status"] == "completed", status
        refunds = httpx2.get(f"http://127.0.0.1:{backend_port}/refunds", timeout=5).json()["refunds"]
        assert len(refunds) == 2, refunds  # one refund per call, at the backend itself
        rebinding = httpx2.post(
            f"http://127.0.0.1:{ports[1]}/mcp",
            headers={"Host": f"127.0.0.1:{ports[1]}", "Authorization": f"Bearer {token}"},
            json={},
            timeout=5,
        )
        assert rebinding.status_code == 421, "allowed_hosts protects /mcp when bound to 0.0.0.0"
    assert _snapshot(image.path("/etc/writ"), secret_dir, workdir, home) == before, "Writ wrote to disk"
