"""The MCP SDK's wording that the executor classifies transport errors by, pinned.

The SDK's HTTP transport reports what it could not use of an upstream's answer as a JSON-RPC error
whose code an upstream also sends when it refuses a request; no exception type, code or `data` tells
them apart, only the message (capabilities/mcp_upstream.py). These tests fail as soon as an SDK
release rewords one, before the upgrade can turn an `unknown` write into `failed`. How each wording
is classified is proven end to end in test_mcp_hostile.py and test_mcp_limits.py.
"""

from __future__ import annotations

import inspect

import httpx2._sse
import pytest
from mcp.client import session, streamable_http

from capabilities.mcp_midcall import NOT_STATED
from capabilities.mcp_upstream import ANSWERED_UNUSABLY, SESSION_TERMINATED, TOO_LARGE_SSE

TRANSPORT = inspect.getsource(streamable_http)


@pytest.mark.parametrize("prefix", ANSWERED_UNUSABLY)
def test_the_sdk_still_words_an_unusable_answer_as_the_executor_reads_it(prefix: str) -> None:
    assert f'"{prefix}' in TRANSPORT, prefix


@pytest.mark.parametrize("message", NOT_STATED)
def test_the_sdk_still_words_a_request_its_client_cannot_answer_as_the_executor_reads_it(
    message: str,
) -> None:
    assert f'message="{message}"' in inspect.getsource(session)


def test_the_sdk_still_words_a_lost_session_as_the_executor_reads_it() -> None:
    assert f'message="{SESSION_TERMINATED}"' in TRANSPORT


def test_the_sdk_still_words_an_sse_event_over_the_limit_as_the_executor_reads_it() -> None:
    stream_failed, _, event_too_large = TOO_LARGE_SSE.partition(": ")
    assert f'f"{stream_failed}: {{exc}}"' in TRANSPORT
    assert f'SSEError(f"{event_too_large}{{self._max_event_size}} byte limit.")' in inspect.getsource(
        httpx2._sse
    )
