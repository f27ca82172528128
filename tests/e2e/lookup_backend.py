"""A payments backend for end-to-end tests of how Writ reads lookup answers: its refunds never answer in
time, and its lookup answers in the shape of trial 5's (finding F1), `{"refunds": [...], "warnings": []}`,
an envelope of two lists that Writ once read as the record of a refund.

POST /refunds takes the refund, then waits past Writ's timeout and answers 503; with `"outcome":
"declined"` in its body it records the refund `declined` (no money moved) before waiting, otherwise it
records nothing. GET /refunds?idempotency_key=K lists the refunds recorded under K, each naming its
key and the `X-Request-Id` it came with.

    python -m tests.e2e.lookup_backend --port 9100
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.e2e import echo_backend

STALL_S = 3.0
"""Longer than the tests' timeout: Writ gives up on every refund, which is then of unknown outcome."""


def build_app() -> Starlette:
    refunds: list[dict[str, Any]] = []
    sent: list[str] = []

    async def create_refund(request: Request) -> Response:
        body = await request.json()
        key = request.headers.get("idempotency-key", "")
        sent.append(key)
        if body.get("outcome") == "declined":
            refunds.append(
                {
                    "id": f"re_{len(refunds) + 1}",
                    "idempotency_key": key,
                    "request_id": request.headers.get("x-request-id"),
                    "amount": body.get("amount"),
                    "status": "declined",
                    "failure_reason": "card_expired",
                }
            )
        await asyncio.sleep(STALL_S)
        return JSONResponse({"error": "gave up"}, status_code=503)

    async def find_refunds(request: Request) -> Response:
        key = request.query_params.get("idempotency_key")
        found = [refund for refund in refunds if refund["idempotency_key"] == key]
        return JSONResponse({"refunds": found, "warnings": []})

    async def state(request: Request) -> Response:
        return JSONResponse({"refunds": refunds, "sent": sent})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/refunds", create_refund, methods=["POST"]),
            Route("/refunds", find_refunds, methods=["GET"]),
            Route("/_state", state),
            Route("/healthz", healthz),
        ]
    )


if __name__ == "__main__":
    echo_backend.main(build_app)
