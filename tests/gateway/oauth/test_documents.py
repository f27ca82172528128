"""Client ID Metadata Documents: a client whose client_id is an https URL is known by the document a real
HTTPS server (`documents_host.py`) publishes there. Every way a document or its URL is unfit is refused
on the page /authorize answers, saying why, and nothing of it is kept; the fetch stays off non-public
addresses unless the configuration allows them; a fit document is kept for as long as its Cache-Control
says, within bounds, in the store every replica reads."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway.config import ClientMetadataDocumentsConfig
from gateway.errors import ConfigurationError
from gateway.oauth.documents import ClientDocuments, DocumentRefused, HttpsFetcher, url_problem
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.gateway.oauth.documents_host import Answer, DocumentsHost, documents_host
from tests.gateway.oauth.flow import Pkce, authorization_params

REDIRECT = "http://127.0.0.1:47123/callback"
GOOD = {
    "client_name": "Docs test client",
    "redirect_uris": [REDIRECT],
    "grant_types": ["authorization_code", "refresh_token"],
    "response_types": ["code"],
    "token_endpoint_auth_method": "none",
}


def authorization_server(workdir: Path, **documents: Any) -> dict[str, Any]:
    """The demo's authorization server section, with `client_metadata_documents` set."""
    return {
        "authorization_server": {
            "enabled": True,
            "key_file": str(workdir / "oauth-keys.json"),
            "login": {
                "type": "builtin",
                "users": [
                    {"subject": "demo-agent", "tenant": "acme", "roles": ["agent"]},
                    {"subject": "demo-admin", "tenant": "acme", "roles": ["admin"]},
                ],
            },
            "client_metadata_documents": documents,
        }
    }


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocumentsHost]:
    with documents_host(tmp_path_factory.mktemp("docs")) as published:
        yield published


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, host: DocumentsHost) -> Iterator[Writ]:
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir = tmp_path_factory.mktemp("writ")
        auth = authorization_server(workdir, allow_private_addresses=True, ca_file=str(host.ca_file))
        with writ(workdir, backend, f"sqlite:///{workdir / 'writ.db'}", auth=auth) as g:
            yield g


def authorize(gateway: Writ, client_id: str) -> httpx2.Response:
    params = authorization_params(client_id, Pkce.make())
    return httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10)


def refused(gateway: Writ, client_id: str, why: str) -> None:
    """/authorize refuses the client on a page of its own (never a redirect: its redirect URIs are not
    known good), saying why; and the document is not kept."""
    response = authorize(gateway, client_id)
    assert response.status_code == 400, response.text
    assert "location" not in response.headers
    assert "invalid_client" in response.text and why in response.text, response.text
    assert gateway.runtime.store.get_client(client_id) is None


def test_the_metadata_says_client_id_metadata_documents_are_supported(gateway: Writ) -> None:
    metadata = httpx2.get(f"{gateway.url}/.well-known/oauth-authorization-server", timeout=10).json()

    assert metadata["client_id_metadata_document_supported"] is True


def test_a_client_known_by_its_document_gets_the_login_page_naming_it_and_its_host(
    gateway: Writ, host: DocumentsHost
) -> None:
    client_id = host.publish("/clients/good.json", GOOD, **{"cache-control": "max-age=120"})

    page = authorize(gateway, client_id)

    assert page.status_code == 200, page.text
    assert "Docs test client" in page.text and "published at <strong>127.0.0.1</strong>" in page.text
    kept = gateway.runtime.store.get_client(client_id)
    assert kept is not None and kept.metadata["redirect_uris"] == [REDIRECT]
    assert kept.document_fresh_until is not None
    assert kept.document_fresh_until - kept.issued_at == timedelta(seconds=120)


def test_a_kept_document_is_not_fetched_again_while_fresh(gateway: Writ, host: DocumentsHost) -> None:
    client_id = host.publish("/clients/cached.json", GOOD, **{"cache-control": "max-age=600"})

    assert authorize(gateway, client_id).status_code == 200
    assert authorize(gateway, client_id).status_code == 200

    assert host.fetches["/clients/cached.json"] == 1


def test_a_document_naming_another_client_id_is_refused(gateway: Writ, host: DocumentsHost) -> None:
    client_id = host.publish("/clients/other.json", GOOD | {"client_id": host.url("/clients/someone.json")})

    refused(gateway, client_id, "it must be its own URL")


def test_a_document_larger_than_the_limit_is_refused(gateway: Writ, host: DocumentsHost) -> None:
    client_id = host.publish("/clients/large.json", GOOD | {"software_statement": "x" * 6000})

    refused(gateway, client_id, "is larger than 5120 bytes")


def test_a_document_that_is_not_json_is_refused(gateway: Writ, host: DocumentsHost) -> None:
    host.answers["/clients/html.json"] = Answer(b"<html>hello</html>", headers={"content-type": "text/html"})
    host.answers["/clients/broken.json"] = Answer(b"{not json", headers={"content-type": "application/json"})

    refused(gateway, host.url("/clients/html.json"), "is text/html, not application/json")
    refused(gateway, host.url("/clients/broken.json"), "is not JSON")


def test_a_document_with_a_redirect_uri_registration_would_refuse_is_refused(
    gateway: Writ, host: DocumentsHost
) -> None:
    client_id = host.publish("/clients/http.json", GOOD | {"redirect_uris": ["http://evil.example/cb"]})

    refused(gateway, client_id, "must be https, or http on loopback")


def test_a_document_asking_for_a_shared_secret_is_refused(gateway: Writ, host: DocumentsHost) -> None:
    client_id = host.publish(
        "/clients/secret.json", GOOD | {"token_endpoint_auth_method": "client_secret_basic"}
    )

    refused(gateway, client_id, "a shared secret cannot be published")


def test_a_redirect_from_the_document_url_is_not_followed(gateway: Writ, host: DocumentsHost) -> None:
    target = host.publish("/clients/target.json", GOOD)
    host.answers["/clients/moved.json"] = Answer(b"", status=302, headers={"location": target})

    refused(gateway, host.url("/clients/moved.json"), "answered with a redirect (302)")
    assert "/clients/target.json" not in host.fetches


def test_a_document_slower_than_the_time_limit_is_refused(host: DocumentsHost) -> None:
    host.answers["/clients/slow.json"] = Answer(b"{}", delay_s=3)
    settings = ClientMetadataDocumentsConfig(
        allow_private_addresses=True, ca_file=str(host.ca_file), timeout_s=0.5
    )

    with pytest.raises(DocumentRefused, match=r"took longer than 0.5s"):
        HttpsFetcher(settings).fetch(host.url("/clients/slow.json"))


def test_fetches_from_one_host_are_limited_and_the_limit_is_said(
    tmp_path_factory: pytest.TempPathFactory, host: DocumentsHost
) -> None:
    first, second, third = (host.publish(f"/limited/{n}.json", GOOD) for n in ("a", "b", "c"))
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir = tmp_path_factory.mktemp("writ")
        auth = authorization_server(
            workdir,
            allow_private_addresses=True,
            ca_file=str(host.ca_file),
            fetches_per_minute=0.1,
            fetch_burst=2,
        )
        with writ(workdir, backend, f"sqlite:///{workdir / 'writ.db'}", auth=auth) as limited:
            assert authorize(limited, first).status_code == 200
            assert authorize(limited, second).status_code == 200
            assert authorize(limited, first).status_code == 200, "a kept document costs no fetch"
            refused(limited, third, "too many client metadata documents fetched from 127.0.0.1 just now")
    assert "/limited/c.json" not in host.fetches


def test_a_compressed_document_is_refused(gateway: Writ, host: DocumentsHost) -> None:
    host.answers["/clients/gzip.json"] = Answer(
        gzip.compress(b"{}"), headers={"content-type": "application/json", "content-encoding": "gzip"}
    )

    refused(gateway, host.url("/clients/gzip.json"), "is sent gzip-encoded; send it uncompressed")


def test_a_ca_file_that_cannot_be_read_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="ca_file"):
        HttpsFetcher(ClientMetadataDocumentsConfig(ca_file=str(tmp_path / "missing.pem")))


def test_a_missing_document_is_refused(gateway: Writ, host: DocumentsHost) -> None:
    refused(gateway, host.url("/clients/nowhere.json"), "answered 404, not 200")


def test_a_client_id_url_that_is_not_https_is_refused_unfetched(gateway: Writ) -> None:
    refused(gateway, "http://127.0.0.1:9/client.json", "a client id URL must be https")


@pytest.mark.parametrize(
    ("client_id", "problem"),
    [
        ("https://example.com", "needs a path"),
        ("https://example.com/", "needs a path"),
        ("https://example.com/a/../b.json", "needs a path, without . or .. segments"),
        ("https://user:pw@example.com/c.json", "no user name or password"),
        ("https://example.com/c.json#x", "no fragment"),
        ("https://example.com/" + "c" * 120, "at most 128 characters"),
        ("ftp://example.com/c.json", "must be https"),
    ],
)
def test_a_client_id_url_of_the_wrong_shape_is_named(client_id: str, problem: str) -> None:
    found = url_problem(client_id)

    assert found is not None and problem in found


def test_a_well_formed_client_id_url_has_no_problem() -> None:
    assert url_problem("https://app.example.com/oauth/client.json") is None


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.7",
        "169.254.169.254",
        "100.64.0.1",
        "::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "224.0.0.1",
    ],
)
def test_a_host_resolving_to_a_non_public_address_is_not_fetched(address: str, tmp_path: Path) -> None:
    fetcher = HttpsFetcher(ClientMetadataDocumentsConfig(timeout_s=1), resolve=lambda host, port: [address])

    with pytest.raises(DocumentRefused, match=f"resolves to {address}, which is not a public address"):
        fetcher.fetch("https://docs.test/client.json")


def test_a_name_resolving_to_loopback_is_refused_by_its_real_resolution() -> None:
    fetcher = HttpsFetcher(ClientMetadataDocumentsConfig(timeout_s=1))

    with pytest.raises(DocumentRefused, match="localhost resolves to .*not a public address"):
        fetcher.fetch("https://localhost/client.json")


def test_the_fetch_connects_to_the_address_checked_and_checks_tls_for_the_url_host(
    host: DocumentsHost,
) -> None:
    """docs.test resolves (here) to the host's loopback address once: the connection goes there, and the
    certificate is checked for docs.test, not for the address."""
    port = int(host.origin.rsplit(":", 1)[1])
    host.publish("/clients/pinned.json", GOOD)
    settings = ClientMetadataDocumentsConfig(allow_private_addresses=True, ca_file=str(host.ca_file))
    asked: list[str] = []

    def resolve(name: str, p: int) -> list[str]:
        asked.append(name)
        return ["127.0.0.1"]

    fetched = HttpsFetcher(settings, resolve=resolve).fetch(f"https://docs.test:{port}/clients/pinned.json")

    assert asked == ["docs.test"] and fetched.content_type == "application/json"
    # Without the test CA the same server is not trusted: TLS is really checked.
    with pytest.raises(DocumentRefused, match="could not be fetched"):
        HttpsFetcher(ClientMetadataDocumentsConfig(allow_private_addresses=True), resolve=resolve).fetch(
            f"https://docs.test:{port}/clients/pinned.json"
        )


@pytest.mark.parametrize(
    ("cache_control", "seconds"),
    [
        ("max-age=120", 120),
        ("public, max-age=999999", 86400),
        ("max-age=5", 60),
        ("no-store", 60),
        ("", 300),
    ],
)
def test_a_document_is_kept_as_its_cache_control_says_within_the_bounds(
    cache_control: str, seconds: int
) -> None:
    documents = ClientDocuments(ClientMetadataDocumentsConfig(), None, None, None)  # type: ignore[arg-type]

    assert documents.lifetime(cache_control) == seconds
