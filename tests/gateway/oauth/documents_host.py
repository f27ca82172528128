"""A real HTTPS server publishing client metadata documents, as a client's web site would: a test CA
of its own (the gateway is told to trust it with `ca_file`), a certificate for 127.0.0.1, localhost and
docs.test, and whatever answer a case sets for a path."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.e2e.harness import free_port
from tests.gateway.mcp.inproc import serving


@dataclass(frozen=True)
class Answer:
    body: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    delay_s: float = 0.0
    """How long the server waits before it answers (a slow site)."""


@dataclass
class DocumentsHost:
    origin: str
    """https://127.0.0.1:PORT"""
    ca_file: Path
    answers: dict[str, Answer] = field(default_factory=dict)
    fetches: dict[str, int] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"{self.origin}{path}"

    def publish(self, path: str, document: dict[str, Any], **headers: str) -> str:
        """Serve `document` (with `client_id` set to its URL unless given) at `path`; its URL."""
        url = self.url(path)
        body = {"client_id": url, **document}
        self.answers[path] = Answer(
            json.dumps(body).encode(), headers={"content-type": "application/json", **headers}
        )
        return url


@contextlib.contextmanager
def documents_host(directory: Path) -> Iterator[DocumentsHost]:
    cert, key, ca = _certificates(directory)
    port = free_port()
    host = DocumentsHost(f"https://127.0.0.1:{port}", ca)

    async def answer(request: Request) -> Response:
        path = request.url.path
        host.fetches[path] = host.fetches.get(path, 0) + 1
        found = host.answers.get(path)
        if found is None:
            return Response("not here", status_code=404)
        if found.delay_s:
            await anyio.sleep(found.delay_s)
        return Response(found.body, status_code=found.status, headers=found.headers)

    app = Starlette(routes=[Route("/{path:path}", answer)])
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
    )
    with serving(config):
        yield host


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Writ test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
        x509.DNSName("docs.test"),
    ]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "cert.pem", directory / "key.pem", directory / "ca.pem"
    paths[0].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths[2].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return paths
