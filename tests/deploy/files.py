"""What the files under deploy/ say, read the way Docker, Compose and Kubernetes read them."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
CONFIG_PATH = "/etc/writ/writ.yaml"


def yaml_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def compose_content(name: str) -> str:
    """A top-level `configs:` entry's text as Compose hands it to a container (`$$` is a `$`).

    Raises:
        AssertionError: the text has a lone `$`, which Compose would substitute from the environment.
    """
    text = compose()["configs"][name]["content"]
    lone = re.search(r"(?<!\$)\$(?!\$)", text.replace("$$", ""))
    assert lone is None, f"compose config {name} has a `$` Compose would interpolate: {text[lone.start() :]}"
    return text.replace("$$", "$")


def manifests() -> Iterator[dict[str, Any]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if (
                isinstance(document, dict)
                and "apiVersion" in document
                and document.get("kind") != "Kustomization"
            ):
                yield document


def manifest(kind: str, name: str = "writ") -> dict[str, Any]:
    found = [m for m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def configmap_config() -> str:
    return manifest("ConfigMap", "writ-config")["data"]["writ.yaml"]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base} has no {keyword}"
        return found[-1]


def dockerfile() -> list[Stage]:
    """The Dockerfile's stages, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            base, _, name = args.partition(" AS ")
            stages.append(Stage(base.strip(), name.strip() or None))
        else:
            stages[-1].instructions.append((keyword, args))
    return stages


def exec_form(args: str) -> list[str]:
    """A JSON (exec form) argument list, as for CMD, ENTRYPOINT or a HEALTHCHECK's CMD; else shell words."""
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `relative` (a POSIX path in the context) out: the last matching pattern wins.

    Docker's rules in the subset this repository uses: a pattern matches a path or any of its parent
    directories; `**` matches any number of directories; `!` re-includes.
    """
    parts = relative.split("/")
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        regex = _glob_regex(body.strip("/"))
        if any(regex.fullmatch("/".join(parts[: n + 1])) for n in range(len(parts))):
            result = not negate
    return result


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = []
    for piece in re.split(r"(\*\*/|\*\*)", pattern):
        if piece == "**/":
            out.append(r"(?:.*/)?")
        elif piece == "**":
            out.append(r".*")
        else:
            out.append(
                fnmatch.translate(piece).removeprefix("(?s:").removesuffix(r")\Z").replace(".*", "[^/]*")
            )
    return re.compile("".join(out))
