"""The HTTP executor against a real backend: each outcome mapping, credentials, no retries, reconcile."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest

from bench.processes import free_port
from capabilities.config import parse_config
from capabilities.http import PathSegmentError, fill_template
from capabilities.registry import Registry
from tests.capabilities.conftest import invocation
from tests.capabilities.servers import TOKEN, ServerState

pytestmark = pytest.mark.anyio

OBJECT = {"type": "object"}


def capability(id: str, method: str, path: str, effect: str = "write", **extra: Any) -> dict[str, Any]:
    return {
        "id": id,
        "backend": "acme",
        "effect": effect,
        "input_schema": OBJECT,
        "request": {"method": method, "path": path},
        **extra,
    }


CAPABILITIES = [
    capability(
        "refund-order",
        "POST",
        "/refunds",
        version="2",
        tool="refund_order",
        reconcile={"method": "GET", "path": "/refunds?idempotency_key={idempotency_key}"},
    ),
    capability("get-order", "GET", "/orders/{order_id}", effect="read", tool="get_order"),
    capability(
        "refund-flagged",
        "POST",
        "/refunds",
        reconcile={"method": "GET", "path": "/refunds/lookup?idempotency_key={idempotency_key}"},
    ),
    capability(
        "refund-answered",
        "POST",
        "/refunds",
        reconcile={"method": "GET", "path": "/answer?key={idempotency_key}"},
    ),
    capability(
        "refund-declared",
        "POST",
        "/refunds",
        reconcile={
            "method": "GET",
            "path": "/answer?key={idempotency_key}",
            "records": "/refunds",
            "outcome": {"field": "/status", "succeeded": ["succeeded"], "failed": ["failed"]},
        },
    ),
    capability("get-order-view", "GET", "/orders/{order_id}?view=full&by={who}", effect="read"),
    capability("reject", "POST", "/reject"),
    capability("refund-by-request-id", "POST", "/refunds", idempotency_header="X-Request-Id"),
    capability("refund-with-deadline", "POST", "/refunds", commit_deadline_header="Writ-Commit-Deadline"),
    capability("commit-then-500", "POST", "/commit-then-500"),
    capability("read-500", "GET", "/commit-then-500", effect="read"),
    capability("hang", "POST", "/hang", timeout_s=0.5),
    capability("hang-read", "GET", "/hang", effect="read", timeout_s=0.5),
    capability("drop", "POST", "/drop"),
    capability("text", "GET", "/text", effect="read"),
    capability("numbers", "GET", "/numbers", effect="read"),
    capability("leak", "GET", "/leak", effect="read"),
    capability("echo_encoded", "GET", "/echo-encoded", effect="read"),
]


def build(url: str, auth: dict[str, Any] | None = None, **environ: str) -> Registry:
    backend: dict[str, Any] = {
        "type": "http",
        "base_url": url,
        "timeout_s": 5,
        "headers": {"X-Api-Version": "2"},
    }
    if auth is not None:
        backend["auth"] = auth
    return Registry.from_config(parse_config({"acme": backend}, CAPABILITIES), environ=environ)


@pytest.fixture
async def acme(backend_url: str) -> AsyncIterator[Registry]:
    registry = build(backend_url, {"type": "bearer", "token_env": "ACME_TOKEN"}, ACME_TOKEN=TOKEN)
    async with registry:
        yield registry


async def call(registry: Registry, tool: str, arguments: dict[str, Any] | None = None, **fields: Any) -> Any:
    cap = registry.get(tool)
    assert cap is not None
    return await registry.executor(cap).execute(invocation(cap, arguments, **fields))


async def test_a_2xx_json_object_completes_with_compact_text_and_structured_content(
    acme: Registry, backend_state: ServerState
) -> None:
    outcome = await call(acme, "refund_order", {"order_id": "1001", "amount": 25}, idempotency_key="k-1")

    assert outcome.kind == "completed"
    assert outcome.result.structured == {
        "refund_id": "r1",
        "idempotency_key": "k-1",
        "order_id": "1001",
        "amount": 25,
    }
    assert outcome.result.content == (
        {"type": "text", "text": '{"refund_id":"r1","idempotency_key":"k-1","order_id":"1001","amount":25}'},
    )
    assert outcome.evidence == {"status_code": 201}
    assert backend_state.bodies == [{"order_id": "1001", "amount": 25}]


async def test_the_request_carries_the_idempotency_key_request_id_static_headers_and_auth(
    acme: Registry, backend_state: ServerState
) -> None:
    outcome = await call(
        acme, "refund_order", {"amount": 1}, idempotency_key="k-9", external_request_id="req-9"
    )

    headers = backend_state.headers[0]
    assert headers["idempotency-key"] == "k-9"
    assert headers["x-request-id"] == "req-9"
    assert headers["x-api-version"] == "2"
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert outcome.external_request_id == "req-9"


async def test_an_idempotency_header_named_x_request_id_carries_the_key(
    acme: Registry, backend_state: ServerState
) -> None:
    # Writ's own X-Request-Id was set after it and replaced the key: the backend deduped on nothing.
    await call(
        acme, "refund-by-request-id", {"amount": 1}, idempotency_key="k-3", external_request_id="req-3"
    )

    assert backend_state.headers[0]["x-request-id"] == "k-3"


async def test_the_commit_deadline_goes_in_the_configured_header_only(
    acme: Registry, backend_state: ServerState
) -> None:
    deadline = datetime(2026, 12, 1, 15, 40, 0, 123456, tzinfo=UTC)

    await call(acme, "refund-with-deadline", {"amount": 1}, commit_deadline=deadline)
    await call(acme, "refund_order", {"amount": 1}, commit_deadline=deadline)

    assert backend_state.headers[0]["writ-commit-deadline"] == "2026-12-01T15:40:00.123Z"
    assert "writ-commit-deadline" not in backend_state.headers[1]


async def test_path_arguments_are_url_quoted_and_the_rest_become_query_parameters_for_get(
    acme: Registry, backend_state: ServerState
) -> None:
    outcome = await call(acme, "get_order", {"order_id": "a b?c#d", "expand": "lines"})

    assert outcome.kind == "completed"
    assert outcome.result.structured == {"order_id": "a b?c#d", "query": {"expand": "lines"}}


async def test_a_query_in_the_path_template_is_kept_and_the_other_arguments_are_added_to_it(
    acme: Registry,
) -> None:
    alone = await call(acme, "get-order-view", {"order_id": "1", "who": "a&b=c"})
    more = await call(acme, "get-order-view", {"order_id": "1", "who": "ü", "expand": "lines", "n": 2})

    assert alone.result.structured["query"] == {"view": "full", "by": "a&b=c"}
    assert more.result.structured["query"] == {"view": "full", "by": "ü", "expand": "lines", "n": "2"}


async def test_a_text_body_becomes_one_text_block_and_a_json_list_is_wrapped_as_result(
    acme: Registry,
) -> None:
    text = await call(acme, "text")
    numbers = await call(acme, "numbers")

    assert text.result.content == ({"type": "text", "text": "pong"},)
    assert text.result.structured is None
    assert numbers.result.structured == {"result": [1, 2, 3]}


async def test_a_4xx_is_failed_with_the_status_as_error_and_the_body_as_an_error_result(
    acme: Registry,
) -> None:
    outcome = await call(acme, "reject", {"amount": 99999})

    assert outcome.kind == "failed"
    assert outcome.error == "http_422"
    assert outcome.result.is_error
    assert "amount over limit" in outcome.result.content[0]["text"]


async def test_a_404_on_a_read_is_failed(acme: Registry) -> None:
    outcome = await call(acme, "get_order", {"order_id": "missing"})

    assert (outcome.kind, outcome.error) == ("failed", "http_404")


async def test_a_500_after_commit_is_unknown_for_a_write_and_sent_once(
    acme: Registry, backend_state: ServerState
) -> None:
    outcome = await call(acme, "commit-then-500", {"amount": 5})

    assert (outcome.kind, outcome.error) == ("unknown", "http_500")
    assert backend_state.hits["commit_then_500"] == 1


async def test_a_500_on_a_read_is_failed(acme: Registry) -> None:
    outcome = await call(acme, "read-500")

    assert (outcome.kind, outcome.error) == ("failed", "http_500")


async def test_a_write_that_times_out_is_unknown_and_is_not_retried(
    acme: Registry, backend_state: ServerState
) -> None:
    outcome = await call(acme, "hang", {"amount": 1})

    assert (outcome.kind, outcome.error) == ("unknown", "response_timeout")
    assert backend_state.hits["hang"] == 1


async def test_a_read_that_times_out_is_failed(acme: Registry, backend_state: ServerState) -> None:
    outcome = await call(acme, "hang-read")

    assert (outcome.kind, outcome.error) == ("failed", "response_timeout")
    assert backend_state.hits["hang"] == 1


async def test_a_connection_dropped_mid_response_is_unknown_and_not_retried(
    acme: Registry, backend_state: ServerState
) -> None:
    outcome = await call(acme, "drop", {"amount": 1})

    assert (outcome.kind, outcome.error) == ("unknown", "connection_lost")
    assert backend_state.hits["drop"] == 1


async def test_a_backend_that_refuses_connections_is_failed_as_unreachable() -> None:
    registry = build(f"http://127.0.0.1:{free_port()}")
    async with registry:
        outcome = await call(registry, "refund_order", {"amount": 1})

    assert (outcome.kind, outcome.error) == ("failed", "backend_unreachable")
    assert outcome.result.is_error


async def test_a_missing_path_argument_fails_before_anything_is_sent(
    acme: Registry, backend_state: ServerState
) -> None:
    outcome = await call(acme, "get_order", {})

    assert (outcome.kind, outcome.error) == ("failed", "invalid_arguments")
    assert backend_state.hits["orders"] == 0


@pytest.mark.parametrize("order_id", ["..", ".", ""])
async def test_a_path_argument_that_is_no_path_segment_fails_before_anything_is_sent(
    acme: Registry, backend_state: ServerState, order_id: str
) -> None:
    # `/orders/..` is `GET /` once the client resolves dot segments: another resource than policy saw.
    outcome = await call(acme, "get_order", {"order_id": order_id})

    assert (outcome.kind, outcome.error) == ("failed", "invalid_arguments")
    assert "order_id" in (outcome.detail or "")
    assert backend_state.headers == []


def test_a_value_inside_a_segment_or_in_the_query_may_be_dots_or_empty() -> None:
    assert fill_template("/files/{name}.json", {"name": ".."}) == ("/files/...json", {})
    assert fill_template("/a/{x}{y}/b", {"x": ".", "y": "x"}) == ("/a/.x/b", {})
    assert fill_template("/refunds?key={k}&o={o}", {"k": "", "o": ".."}) == ("/refunds?key=&o=..", {})
    with pytest.raises(PathSegmentError):
        fill_template("/a/{x}{y}/b", {"x": ".", "y": "."})
    with pytest.raises(PathSegmentError):
        fill_template("/orders/{id}/cancel", {"id": ".."})


async def test_one_client_connection_is_reused_across_calls(
    acme: Registry, backend_state: ServerState
) -> None:
    cap = acme.get("text")
    assert cap is not None
    executor = acme.executor(cap)
    for _ in range(5):
        assert (await executor.execute(invocation(cap))).kind == "completed"

    pool = executor._client._transport._pool  # type: ignore[attr-defined]
    assert len(pool.connections) == 1


async def test_a_token_from_a_file_is_sent(
    backend_url: str, backend_state: ServerState, tmp_path: Any
) -> None:
    (tmp_path / "acme.token").write_text(TOKEN + "\n")
    registry = Registry.from_config(
        parse_config(
            {
                "acme": {
                    "type": "http",
                    "base_url": backend_url,
                    "auth": {"type": "bearer", "token_file": "acme.token"},
                }
            },
            CAPABILITIES,
        ),
        environ={},
        base_dir=tmp_path,
    )
    async with registry:
        outcome = await call(registry, "refund_order", {"amount": 3})

    assert outcome.kind == "completed"
    assert backend_state.headers[0]["authorization"] == f"Bearer {TOKEN}"


async def test_header_and_basic_auth_send_their_headers(backend_url: str, backend_state: ServerState) -> None:
    header = build(
        backend_url, {"type": "header", "header": "X-Api-Key", "token_env": "KEY"}, KEY="k3y-value"
    )
    basic = build(
        backend_url, {"type": "basic", "username": "writ", "password_env": "PASSWORD"}, PASSWORD="pa55word"
    )
    async with header, basic:
        await call(header, "text")
        await call(basic, "text")

    assert backend_state.headers[0]["x-api-key"] == "k3y-value"
    assert backend_state.headers[1]["authorization"] == "Basic d3JpdDpwYTU1d29yZA=="


async def test_credentials_echoed_by_the_backend_never_reach_the_outcome(acme: Registry) -> None:
    outcome = await call(acme, "leak")

    assert outcome.kind == "failed"
    assert TOKEN not in repr(outcome)
    assert "***" in outcome.result.content[0]["text"]


async def test_a_credential_echoed_json_escaped_url_encoded_or_in_base64_never_reaches_the_result(
    backend_url: str, backend_state: ServerState
) -> None:
    # `/` and `+` change under each encoding: the plain value alone matched none of the echoes.
    token = "tok/with+slash=and-more-0123456789"
    registry = build(backend_url, {"type": "bearer", "token_env": "T"}, T=token)
    async with registry:
        outcome = await call(registry, "echo_encoded")

    assert backend_state.headers[-1]["authorization"] == f"Bearer {token}"
    assert outcome.kind == "completed"
    shown = repr(outcome)
    for form in (
        token,
        token.replace("/", "\\/"),
        quote(token, safe=""),
        base64.b64encode(token.encode()).decode().rstrip("="),
        base64.b64encode(f"writ:{token}".encode()).decode()[8:-4],  # the part made of the token alone
    ):
        assert form not in shown, form
    assert outcome.result.structured["you_sent"] == "***"
    assert outcome.result.structured["next"] == "/continue?token=***"


async def test_reconcile_finds_the_record_of_an_earlier_dispatch(acme: Registry) -> None:
    cap = acme.get("refund_order")
    assert cap is not None and cap.reconcilable
    first = invocation(cap, {"order_id": "1001", "amount": 10})
    await acme.executor(cap).execute(first)

    found = await acme.executor(cap).reconcile(first)

    assert found.verdict == "succeeded"
    assert found.result is not None and found.result.structured["idempotency_key"] == first.idempotency_key
    assert found.evidence["status_code"] == 200


async def test_reconcile_reports_not_found_when_the_backend_has_no_record(acme: Registry) -> None:
    cap = acme.get("refund_order")
    assert cap is not None

    result = await acme.executor(cap).reconcile(invocation(cap, {"amount": 10}))

    assert result.verdict == "not_found"


async def test_reconcile_honours_a_found_flag_as_mcp_lookups_do(acme: Registry) -> None:
    # {"found": false, ...} is a non-empty object: it was the record of a success.
    cap = acme.get("refund-flagged")
    assert cap is not None
    sent = invocation(cap, {"order_id": "1001", "amount": 10})
    await acme.executor(cap).execute(sent)

    missing = await acme.executor(cap).reconcile(invocation(cap, {"amount": 10}))
    found = await acme.executor(cap).reconcile(sent)

    assert (missing.verdict, missing.evidence["found"]) == ("not_found", False)
    assert found.verdict == "succeeded" and found.result is not None
    assert found.result.structured == {
        "refund_id": "r1",
        "idempotency_key": sent.idempotency_key,
        "order_id": "1001",
        "amount": 10,
    }


KEY = "k-lookup"
F1_ANSWERS = [
    # Trial 5's lookup answers, each once settled `completed` with itself as the result: what each
    # gives now, undeclared, and with `records: /refunds` and `outcome:` declared.
    ({"refund": None}, "not_found", "inconclusive"),  # nothing at /refunds: unreadable, not nothing
    ({"refunds": [], "warnings": []}, "inconclusive", "not_found"),
    ({"data": [], "included": []}, "inconclusive", "inconclusive"),
    ({"error": "not_found", "message": "no refund with that key"}, "inconclusive", "inconclusive"),
    ({"refunds": [{"id": "re_x", "idempotency_key": KEY, "status": "failed"}]}, "inconclusive", "failed"),
    ({"id": "re_x", "idempotency_key": KEY, "status": "failed"}, "inconclusive", "inconclusive"),
]


@pytest.mark.parametrize(("body", "undeclared", "declared"), F1_ANSWERS)
async def test_a_lookup_answer_meaning_nothing_or_failed_is_never_the_effect(
    acme: Registry, backend_state: ServerState, body: Any, undeclared: str, declared: str
) -> None:
    backend_state.answer = (200, json.dumps(body))

    verdicts = []
    for tool in ("refund-answered", "refund-declared"):
        cap = acme.get(tool)
        assert cap is not None
        verdicts.append((await acme.executor(cap).reconcile(invocation(cap, idempotency_key=KEY))).verdict)

    assert verdicts == [undeclared, declared]


@pytest.mark.parametrize(
    ("status", "body", "verdict", "error"),
    [
        (404, '{"refunds": [{"idempotency_key": "k-lookup"}]}', "not_found", None),
        (500, '{"refunds": []}', "inconclusive", None),
        (200, "no refunds today", "inconclusive", "unreadable_lookup"),
        (204, "", "inconclusive", "unreadable_lookup"),
        (200, '{"refunds": [{"idempotency_key": "k-lookup", "status": "failed"}]}', "failed", None),
    ],
)
async def test_what_a_lookups_http_answer_says_before_its_body_is_read(
    acme: Registry, backend_state: ServerState, status: int, body: str, verdict: str, error: str | None
) -> None:
    backend_state.answer = (status, body)
    cap = acme.get("refund-declared")
    assert cap is not None

    found = await acme.executor(cap).reconcile(invocation(cap, idempotency_key=KEY))

    assert (found.verdict, found.evidence.get("error")) == (verdict, error)
    assert found.evidence["status_code"] == status
    assert found.evidence["lookup"] == f"/answer?key={KEY}"


async def test_reconcile_is_inconclusive_when_the_backend_is_unreachable() -> None:
    registry = build(f"http://127.0.0.1:{free_port()}")
    async with registry:
        cap = registry.get("refund_order")
        assert cap is not None
        result = await registry.executor(cap).reconcile(invocation(cap, {"amount": 1}))

    assert result.verdict == "inconclusive"


async def test_reconcile_without_a_configured_lookup_raises(acme: Registry) -> None:
    from capabilities.contract import CapabilityError

    cap = acme.get("get_order")
    assert cap is not None and not cap.reconcilable
    with pytest.raises(CapabilityError):
        await acme.executor(cap).reconcile(invocation(cap, {"order_id": "1"}))
