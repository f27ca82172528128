"""Client ID Metadata Documents (MCP authorization 2025-11-25, draft-ietf-oauth-client-id-metadata-
document): a client whose `client_id` is an https URL is the client described by the JSON served there.

The URL is fetched by Writ on behalf of anyone who starts a sign-in, so the fetch is fenced in: https
only; the host resolved once and every address it resolves to must be public (no loopback, private,
link-local, shared, reserved or multicast address) unless `allow_private_addresses`; the connection made
to the address that was checked (the TLS name still the URL's host, so a DNS answer that changes between
check and connect, a rebinding, reaches nothing new); no redirect followed; no proxy from the
environment; the whole fetch within `timeout_s`; the body at most `max_bytes` and `application/json`;
at most `fetches_per_minute` fetches from one host (through the store's rate limits, shared by replicas).

The document as fetched is kept in the store (`oauth_clients`, with `document_fresh_until`) for as long
as its Cache-Control allows within the configured bounds, so every replica uses one fetch: /authorize
may run on one replica and /token on another a second later, and both must see the same client. A
document that cannot be fetched or is unfit is never kept, and a stale one is not used in its place.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx2

from gateway.config import ClientMetadataDocumentsConfig
from gateway.errors import ConfigurationError, GatewayError
from gateway.oauth.endpoints import redirect_problem
from store.oauth import RegisteredClient
from store.ports import OAuthGrants

MAX_CLIENT_ID = 128
"""The store keeps client ids in 128 characters: a longer URL cannot be one."""
SECRET_METHODS = frozenset({"client_secret_basic", "client_secret_post", "client_secret_jwt"})


class DocumentRefused(GatewayError):
    """The client's metadata document cannot be used; the message says why (shown to the user)."""


@dataclass(frozen=True, slots=True)
class Fetched:
    body: bytes
    content_type: str
    cache_control: str


FetchLimit = Callable[[str], float | None]
"""Takes one fetch from a host: None if allowed, else the seconds to wait."""


class DocumentFetcher(Protocol):
    def fetch(self, url: str) -> Fetched:
        """The document at `url`, or DocumentRefused saying why not."""
        ...


def url_problem(client_id: str) -> str | None:
    """Why `client_id` cannot be a metadata document URL, or None."""
    if len(client_id) > MAX_CLIENT_ID:
        return f"a client id URL has at most {MAX_CLIENT_ID} characters"
    try:
        parts = urlsplit(client_id)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        return "the client id is not a valid URL"
    if parts.scheme != "https":
        return "a client id URL must be https"
    if not parts.hostname:
        return "the client id URL has no host"
    if parts.username is not None or parts.password is not None:
        return "a client id URL carries no user name or password"
    if parts.fragment or "#" in client_id:
        return "a client id URL has no fragment"
    segments = parts.path.split("/")
    if parts.path in ("", "/") or "." in segments or ".." in segments:
        return "a client id URL needs a path, without . or .. segments"
    return None


def is_document_client_id(client_id: str) -> bool:
    """Whether a client id names a metadata document (Writ's own registrations are never URLs)."""
    return "://" in client_id


class HttpsFetcher:
    """Fetches a document within the SSRF fences described in the module."""

    def __init__(
        self,
        settings: ClientMetadataDocumentsConfig,
        resolve: Callable[[str, int], list[str]] | None = None,
    ) -> None:
        self._settings = settings
        self._resolve = resolve or _resolve
        try:
            self._tls = ssl.create_default_context(cafile=settings.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"auth.authorization_server.client_metadata_documents.ca_file {settings.ca_file}: {exc}"
            ) from exc

    def fetch(self, url: str) -> Fetched:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or 443
        address = self._address(host, port)
        pinned = urlunsplit(parts._replace(netloc=_netloc(address, parts.port)))
        deadline = time.monotonic() + self._settings.timeout_s
        limit = self._settings.max_bytes
        try:
            with (
                httpx2.Client(
                    verify=self._tls,
                    timeout=self._settings.timeout_s,
                    follow_redirects=False,
                    trust_env=False,
                ) as http,
                http.stream(
                    "GET",
                    pinned,
                    headers={
                        "Host": parts.netloc,
                        "Accept": "application/json",
                        "Accept-Encoding": "identity",
                    },
                    extensions={"sni_hostname": host},
                ) as response,
            ):
                if response.is_redirect:
                    raise DocumentRefused(
                        f"{url} answered with a redirect ({response.status_code}); none is followed"
                    )
                if response.status_code != 200:
                    raise DocumentRefused(f"{url} answered {response.status_code}, not 200")
                content_type = response.headers.get("content-type", "")
                if _media_type(content_type) != "application/json":
                    raise DocumentRefused(f"{url} is {content_type or 'untyped'}, not application/json")
                encoding = response.headers.get("content-encoding", "identity").strip().lower()
                if encoding != "identity":
                    # A compressed body's size says little of what it unpacks to: none is taken.
                    raise DocumentRefused(f"{url} is sent {encoding}-encoded; send it uncompressed")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    raise DocumentRefused(f"{url} is larger than {limit} bytes")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise DocumentRefused(f"{url} is larger than {limit} bytes")
                    if time.monotonic() > deadline:
                        raise DocumentRefused(f"{url} took longer than {self._settings.timeout_s:g}s")
                return Fetched(bytes(body), content_type, response.headers.get("cache-control", ""))
        except httpx2.TimeoutException as exc:
            raise DocumentRefused(f"{url} took longer than {self._settings.timeout_s:g}s") from exc
        except httpx2.HTTPError as exc:
            raise DocumentRefused(f"{url} could not be fetched: {exc}") from exc

    def _address(self, host: str, port: int) -> str:
        """The address to connect to: the host's, each of which must be public unless allowed."""
        try:
            addresses = self._resolve(host, port)
        except OSError as exc:
            raise DocumentRefused(f"{host} does not resolve: {exc}") from exc
        if not addresses:
            raise DocumentRefused(f"{host} does not resolve")
        if not self._settings.allow_private_addresses:
            for address in addresses:
                if not _public(address):
                    raise DocumentRefused(
                        f"{host} resolves to {address}, which is not a public address: "
                        "client metadata documents are fetched from the internet only"
                    )
        return addresses[0]


class ClientDocuments:
    """The client a metadata document URL names: kept while fresh, fetched and checked when not."""

    def __init__(
        self,
        settings: ClientMetadataDocumentsConfig,
        store: OAuthGrants,
        fetcher: DocumentFetcher,
        clock: Callable[[], datetime],
        fetch_limit: FetchLimit | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._fetcher = fetcher
        self._now = clock
        self._fetch_limit = fetch_limit

    def client(self, client_id: str) -> RegisteredClient:
        """The client described by the document at `client_id`.

        Raises:
            DocumentRefused: the URL, the fetch or the document is not fit (the message says which).
        """
        if (problem := url_problem(client_id)) is not None:
            raise DocumentRefused(f"{client_id}: {problem}")
        now = self._now()
        kept = self._store.get_client(client_id)
        if kept is not None and kept.document_fresh_until is not None and kept.document_fresh_until > now:
            return kept
        host = urlsplit(client_id).hostname or ""
        if self._fetch_limit is not None and (wait := self._fetch_limit(host)) is not None:
            raise DocumentRefused(
                f"{client_id}: too many client metadata documents fetched from {host} just now; "
                f"try again in {max(1, round(wait))} s"
            )
        fetched = self._fetcher.fetch(client_id)
        metadata = checked_document(client_id, fetched.body)
        record = RegisteredClient(
            client_id=client_id,
            metadata=metadata,
            issued_at=now,
            document_fresh_until=now + timedelta(seconds=self.lifetime(fetched.cache_control)),
        )
        self._store.keep_client_document(record)
        return record

    def lifetime(self, cache_control: str) -> int:
        """Seconds to use a document for: its Cache-Control max-age, within the configured bounds."""
        s = self._settings
        directives = {d.strip().lower() for d in cache_control.split(",") if d.strip()}
        seconds = s.cache_default_s
        if directives & {"no-store", "no-cache"}:
            seconds = 0
        else:
            for directive in directives:
                found = re.fullmatch(r"max-age=\"?(\d{1,10})\"?", directive)
                if found:
                    seconds = int(found.group(1))
        return max(s.cache_min_s, min(s.cache_max_s, seconds))


def checked_document(client_id: str, body: bytes) -> dict[str, Any]:
    """The document's metadata, checked as the draft and Writ's registration policy require.

    Raises:
        DocumentRefused: not a JSON object, another `client_id`, a shared secret, an unfit redirect URI.
    """
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DocumentRefused(f"{client_id} is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise DocumentRefused(f"{client_id} is not a JSON object")
    if document.get("client_id") != client_id:
        raise DocumentRefused(
            f"the document at {client_id} names client_id {document.get('client_id')!r}: "
            "it must be its own URL"
        )
    if "client_secret" in document or "client_secret_expires_at" in document:
        raise DocumentRefused(
            f"the document at {client_id} holds a client secret: a published one is no secret"
        )
    method = document.get("token_endpoint_auth_method", "none")
    if method != "none":
        why = "a shared secret cannot be published" if method in SECRET_METHODS else "not supported here"
        raise DocumentRefused(
            f"the document at {client_id} asks for token_endpoint_auth_method {method!r} ({why}); use none"
        )
    uris = document.get("redirect_uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise DocumentRefused(f"the document at {client_id} needs redirect_uris, a list of URIs")
    for uri in uris:
        if (problem := redirect_problem(uri)) is not None:
            raise DocumentRefused(f"the document at {client_id}: {problem}")
    name = document.get("client_name")
    if name is not None and not (isinstance(name, str) and len(name) <= 200):
        raise DocumentRefused(
            f"the document at {client_id}: client_name must be a text of at most 200 characters"
        )
    for key in ("grant_types", "response_types"):
        values = document.get(key)
        if values is not None and not (isinstance(values, list) and all(isinstance(v, str) for v in values)):
            raise DocumentRefused(f"the document at {client_id}: {key} must be a list of names")
    metadata: dict[str, Any] = {k: v for k, v in document.items() if k in _KEPT}
    metadata["token_endpoint_auth_method"] = "none"
    metadata.setdefault("grant_types", ["authorization_code"])
    metadata.setdefault("response_types", ["code"])
    return metadata


_KEPT = frozenset(
    {
        "client_id",
        "client_name",
        "client_uri",
        "logo_uri",
        "redirect_uris",
        "grant_types",
        "response_types",
        "scope",
        "software_id",
        "software_version",
    }
)
"""The members kept of a document (the rest is not used, and not stored)."""


def _resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _netloc(address: str, port: int | None) -> str:
    host = f"[{address}]" if ":" in address else address
    return host if port is None else f"{host}:{port}"


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()
