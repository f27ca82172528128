"""`writ serve`'s uvicorn settings come from the `server:` section."""

from __future__ import annotations

import logging
import threading

import httpx2
import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config import ServerConfig
from gateway.http.header_deadline import protocol_class
from gateway.serve import WritServer, uvicorn_config
from tests.e2e.harness import free_port
from tests.eventually import eventually_sync
from tests.gateway.mcp.inproc import serving


def test_the_server_section_sets_uvicorns_timeouts_and_concurrency_cap() -> None:
    server = ServerConfig(port=9999, header_timeout_s=3, keep_alive_timeout_s=7, limit_concurrency=100)
    config = uvicorn_config(Starlette(), server)
    assert (config.port, config.timeout_keep_alive, config.limit_concurrency) == (9999, 7, 100)
    assert isinstance(config.http, type) and config.http.header_timeout_s == 3  # type: ignore[attr-defined]
    assert config.ws == "none"


def test_by_default_there_is_no_concurrency_cap_and_uvicorns_keep_alive_timeout() -> None:
    server = ServerConfig()
    assert (server.header_timeout_s, server.body_timeout_s) == (10.0, 30.0)
    config = uvicorn_config(Starlette(), server)
    assert (config.timeout_keep_alive, config.limit_concurrency) == (5, None)


@pytest.mark.parametrize(
    ("parser", "base"), [("auto", HttpToolsProtocol), ("httptools", HttpToolsProtocol), ("h11", H11Protocol)]
)
def test_each_parser_setting_gets_uvicorns_protocol_for_it_with_the_deadline(parser: str, base: type) -> None:
    cls = protocol_class(parser, 2.5)  # type: ignore[arg-type]
    assert issubclass(cls, base) and cls.header_timeout_s == 2.5  # type: ignore[attr-defined]
    assert protocol_class(parser, 4).header_timeout_s == 4  # type: ignore[attr-defined]
    assert cls.header_timeout_s == 2.5  # type: ignore[attr-defined]


async def _client_address(request: Request) -> Response:
    return PlainTextResponse(request.client.host if request.client else "")


def _address_seen(server: ServerConfig, forwarded_for: str) -> str:
    """The client address an app served with `server`'s settings sees for a request from 127.0.0.1."""
    app = Starlette(routes=[Route("/", _client_address)])
    with serving(uvicorn_config(app, server.model_copy(update={"port": free_port()}))) as running:
        url = f"http://127.0.0.1:{running.config.port}/"
        return httpx2.get(url, headers={"X-Forwarded-For": forwarded_for}, timeout=10).text


def test_by_default_a_local_client_cannot_choose_its_address_with_x_forwarded_for() -> None:
    assert _address_seen(ServerConfig(), "10.0.0.7") == "127.0.0.1"


def test_a_proxy_named_in_forwarded_allow_ips_says_who_its_client_is() -> None:
    assert _address_seen(ServerConfig(forwarded_allow_ips=["127.0.0.0/8"]), "10.0.0.7") == "10.0.0.7"
    assert _address_seen(ServerConfig(forwarded_allow_ips=["10.9.9.9"]), "10.0.0.7") == "127.0.0.1"


@pytest.mark.parametrize("entry", ["localhost", "10.0.0.1/24", "10.0.0.300", ""])
def test_forwarded_allow_ips_takes_only_addresses_and_networks(entry: str) -> None:
    with pytest.raises(ValidationError, match="forwarded_allow_ips"):
        ServerConfig(forwarded_allow_ips=[entry])


def test_forwarded_allow_ips_takes_addresses_networks_and_any_peer() -> None:
    entries = ["10.0.0.1", "10.0.0.0/24", "::1", "*"]
    assert ServerConfig(forwarded_allow_ips=entries).forwarded_allow_ips == entries


def test_writ_says_it_is_ready_once_uvicorn_listens(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.serve")
    port = free_port()
    server = WritServer(uvicorn_config(Starlette(), ServerConfig(port=port)), "http://writ.test/mcp")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        ready = eventually_sync(lambda: [r.getMessage() for r in caplog.records if r.name == "gateway.serve"])
        assert ready == [f"writ ready: MCP at http://writ.test/mcp (listening on 127.0.0.1:{port})"]
        assert server.started
    finally:
        server.should_exit = True
        thread.join(10)
