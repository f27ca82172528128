"""A client metadata document is fetched once for every replica: two gateways in-process on one
PostgreSQL database find the document the first one kept, so /authorize at one and /authorize and
/token at the other fetch nothing more while it is fresh."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.e2e.harness import free_port
from tests.gateway.mcp.inproc import Backend, Writ, acme, writ
from tests.gateway.oauth.documents_host import DocumentsHost, documents_host
from tests.gateway.oauth.flow import Pkce, authorization_params, code_for, exchange
from tests.gateway.oauth.test_documents import GOOD, authorization_server
from tests.postgres import fresh_schema

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocumentsHost]:
    with documents_host(tmp_path_factory.mktemp("docs")) as published:
        yield published


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, host: DocumentsHost
) -> Iterator[tuple[Writ, Writ]]:
    root: Path = tmp_path_factory.mktemp("replicas")
    auth = authorization_server(root, allow_private_addresses=True, ca_file=str(host.ca_file))
    server = {"public_url": f"http://127.0.0.1:{free_port()}"}
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(fresh_schema(postgres_url, "writ_documents"))
        backend: Backend = stack.enter_context(acme(tmp_path_factory.mktemp("acme")))
        a, b = (
            stack.enter_context(writ(tmp_path_factory.mktemp(name), backend, url, server=server, auth=auth))
            for name in ("a", "b")
        )
        yield a, b


def test_a_document_kept_by_one_replica_is_used_by_the_other(
    replicas: tuple[Writ, Writ], host: DocumentsHost
) -> None:
    a, b = replicas
    client_id = host.publish("/shared/client.json", GOOD, **{"cache-control": "max-age=600"})
    pkce = Pkce.make()

    code = code_for(a.url, client_id, pkce)
    at_b = httpx2.get(f"{b.url}/authorize", params=authorization_params(client_id, Pkce.make()), timeout=10)
    tokens = exchange(b.url, client_id, code, pkce.verifier)

    assert at_b.status_code == 200 and "Docs test client" in at_b.text
    assert tokens.status_code == 200, tokens.text
    assert host.fetches["/shared/client.json"] == 1
