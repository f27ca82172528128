"""`writ serve`'s uvicorn settings come from the `server:` section."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config import ServerConfig
from gateway.http.header_deadline import protocol_class
from gateway.serve import uvicorn_config


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
