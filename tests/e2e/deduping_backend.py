"""A payments backend that deduplicates on the `Idempotency-Key` header as Stripe does, and is slow.

    python -m tests.e2e.deduping_backend --port 9100 --hold-s 3

POST /payments takes `--hold-s` seconds before it commits a payment and answers with it. Another request
with the same key gets the committed payment again (200) once there is one, and while the first is still
running a 409 (`A request with this key is in progress`): that refusal says nothing of the first request,
which goes on and commits. GET /payments?idempotency_key=K lists the payments committed under K.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

IN_PROGRESS = {"error": {"type": "idempotency_error", "message": "A request with this key is in progress"}}


def build_app(hold_s: float) -> Starlette:
    payments: list[dict[str, Any]] = []
    running: set[str] = set()

    def committed(key: str) -> list[dict[str, Any]]:
        return [p for p in payments if p["idempotency_key"] == key]

    async def pay(request: Request) -> Response:
        key = request.headers.get("idempotency-key", "")
        body = await request.json()
        if done := committed(key):
            return JSONResponse(done[0])
        if key in running:
            return JSONResponse(IN_PROGRESS, status_code=409)
        running.add(key)
        try:
            await anyio.sleep(hold_s)  # goes on when the client stops waiting, as a real backend does
            payment = {
                "id": f"py_{uuid.uuid4().hex[:12]}",
                "idempotency_key": key,
                "request_id": request.headers.get("x-request-id"),
                "amount": body.get("amount"),
            }
            payments.append(payment)
            return JSONResponse(payment)
        finally:
            running.discard(key)

    async def listed(request: Request) -> Response:
        key = request.query_params.get("idempotency_key")
        return JSONResponse({"payments": payments if key is None else committed(key)})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/payments", pay, methods=["POST"]),
            Route("/payments", listed, methods=["GET"]),
            Route("/healthz", healthz),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hold-s", type=float, required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(args.hold_s), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
