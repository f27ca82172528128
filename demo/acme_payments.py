"""acme-payments: the demo payments backend that `writ demo` runs as a separate process.

It stands for a real third-party payments API: it has its own SQLite file (seeded with orders 1001 to
1010), refunds money for real in that file, and knows nothing of Writ.

It deliberately does NOT deduplicate on the `Idempotency-Key` header. The key is required and stored
with each refund, but every POST /refunds that passes validation executes a new refund, so a gateway
that dispatches the same effect twice leaves two refunds here for everyone to see. GET
/refunds?idempotency_key=K is how a gateway settles an unknown outcome: it lists what was executed
under K. POST /_chaos injects the faults that make outcomes unknown (see `acme_chaos`).

With `--dedupe` it stands for a payments API that does deduplicate, as Stripe's does (a capability
with `dedupes_on_key: true`): a POST /refunds under a key it executed before executes nothing and
answers that first refund (201, header `Idempotent-Replayed: true`), whatever else it asked for.

It honours a commit deadline: a refund sent with `Writ-Commit-Deadline: 2026-12-01T15:40:00.123Z` (RFC
3339) that would commit at or after that instant is not committed (422 commit_deadline_passed), however
long a fault held it, so a lookup by its key after the deadline that finds nothing is final. That is what
makes Writ's commit horizon true here; chaos `ignore_deadline` makes it a lie on purpose.

Endpoints:
    GET  /healthz                      {"ok": true}
    GET  /orders/{order_id}            the order with its refunded_total; 404 order_not_found
    POST /refunds                      execute a refund (Idempotency-Key header required; optional
                                       Writ-Commit-Deadline, past which it is refused, not committed)
    GET  /refunds[?idempotency_key=K]  executed refunds, oldest first
    GET  /_chaos, POST /_chaos         read or replace the in-memory fault injection state
    GET  /_chaos/held                  {"held": [K, ...]}: keys of refunds read, not yet run or refused

Run: python -m demo.acme_payments --port 8081 --db PATH [--host 127.0.0.1] [--dedupe]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path

import anyio.to_thread
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from demo.acme_chaos import DROP_SCOPE_KEY, ChaosState, ConnectionDropper
from demo.acme_store import (
    Order,
    OrderNotFound,
    PaymentsError,
    PaymentsStore,
    Refund,
    RefundRequest,
)

Clock = Callable[[], datetime]

COMMIT_DEADLINE_HEADER = "Writ-Commit-Deadline"
"""The header in which a gateway sends the instant a refund must commit before, or not at all."""


class BadRequest(PaymentsError):
    """The request cannot be read at all (400)."""


class InvalidBody(PaymentsError):
    """The body is readable but a field is wrong (422)."""


def create_app(
    db_path: str | Path, *, clock: Clock = lambda: datetime.now(UTC), dedupe: bool = False
) -> ASGIApp:
    """The acme-payments ASGI app over the SQLite file at `db_path` (created and seeded if new); with
    `dedupe`, a refund under a key executed before answers that refund instead of executing."""
    store = PaymentsStore(db_path)
    chaos = ChaosState()
    held: list[str] = []  # one entry per held refund: the same key can be held twice

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def get_order(request: Request) -> Response:
        order = await anyio.to_thread.run_sync(store.get_order, request.path_params["order_id"])
        return JSONResponse(_order_json(order))

    async def post_refund(request: Request) -> Response:
        refund_request = _parse_refund(
            await request.body(),
            idempotency_key=request.headers.get("idempotency-key", ""),
            request_id=request.headers.get("x-request-id") or None,
            commit_deadline=request.headers.get(COMMIT_DEADLINE_HEADER),
        )
        key = refund_request.idempotency_key
        held.append(key)  # until committed or refused: while held, the record of `key` can still change
        try:
            return await execute_refund(request, refund_request)
        finally:
            held.remove(key)

    async def execute_refund(request: Request, refund_request: RefundRequest) -> Response:
        if dedupe:
            # Answered before the refund is checked: the balance the first one took may be gone.
            earlier = await anyio.to_thread.run_sync(store.first_refund, refund_request.idempotency_key)
            if earlier is not None:
                return _replayed(earlier)
        if chaos.take("freeze"):
            # A frozen process reads nothing, answers nothing and runs nothing; after SIGCONT this refund
            # runs, although its client has long given up, unless its commit deadline has passed.
            os.kill(os.getpid(), signal.SIGSTOP)
        await anyio.to_thread.run_sync(store.check_refund, refund_request)
        if chaos.take("hang"):
            # Never commits; gives up only when the client does (or the server stops).
            while (await request.receive())["type"] != "http.disconnect":
                pass
            return Response(status_code=504)
        # Decided when the refund is read: resetting the chaos later does not make a held refund honest.
        not_after = None if chaos.take("ignore_deadline") else refund_request.commit_deadline
        if chaos.commit_delay_ms:
            # Not cancelled when the client disconnects (Starlette does not cancel a handler): the
            # refund commits late, as a request already queued at a slow backend does, unless its
            # deadline passed meanwhile (checked as it commits, as after a freeze).
            await anyio.sleep(chaos.commit_delay_ms / 1000)
        execute = functools.partial(
            store.execute_refund, refund_request, clock, not_after=not_after, dedupe=dedupe
        )
        refund, executed = await anyio.to_thread.run_sync(execute)
        if not executed:  # the same key, executed by another request meanwhile
            return _replayed(refund)
        # Every fault below happens after the commit: the refund is real whatever the client sees.
        if chaos.delay_ms:
            await anyio.sleep(chaos.delay_ms / 1000)
        if chaos.take("drop_responses"):
            await request.scope[DROP_SCOPE_KEY]()
            return Response(status_code=204)  # discarded: the connection is gone
        if chaos.take("fail_after_commit"):
            return JSONResponse({"error": "internal"}, status_code=500)
        return JSONResponse(_refund_json(refund), status_code=201)

    async def list_refunds(request: Request) -> Response:
        key = request.query_params.get("idempotency_key")
        refunds = await anyio.to_thread.run_sync(store.list_refunds, key)
        return JSONResponse({"refunds": [_refund_json(refund) for refund in refunds]})

    async def get_chaos(request: Request) -> Response:
        return JSONResponse(chaos.as_dict())

    async def get_held(request: Request) -> Response:
        return JSONResponse({"held": sorted(held)})

    async def set_chaos(request: Request) -> Response:
        nonlocal chaos
        try:
            chaos = ChaosState.parse(_json_body(await request.body()))
        except ValueError as exc:
            raise InvalidBody("invalid_chaos", str(exc)) from exc
        return JSONResponse(chaos.as_dict())

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/orders/{order_id}", get_order, methods=["GET"]),
            Route("/refunds", post_refund, methods=["POST"]),
            Route("/refunds", list_refunds, methods=["GET"]),
            Route("/_chaos", get_chaos, methods=["GET"]),
            Route("/_chaos", set_chaos, methods=["POST"]),
            Route("/_chaos/held", get_held, methods=["GET"]),
        ],
        exception_handlers={PaymentsError: _error_response},
    )
    return ConnectionDropper(app)


async def _error_response(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PaymentsError)
    if isinstance(exc, OrderNotFound):
        status = 404
    elif isinstance(exc, BadRequest):
        status = 400
    else:
        status = 422
    return JSONResponse({"error": exc.code, "detail": exc.detail}, status_code=status)


def _json_body(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadRequest("invalid_json", "the body is not JSON") from exc


def _parse_refund(
    raw: bytes, *, idempotency_key: str, request_id: str | None, commit_deadline: str | None
) -> RefundRequest:
    """Raises: BadRequest, InvalidBody."""
    if not idempotency_key.strip():
        raise BadRequest("idempotency_key_required", "send an Idempotency-Key header")
    deadline = _parse_deadline(commit_deadline) if commit_deadline is not None else None
    body = _json_body(raw)
    if not isinstance(body, dict):
        raise BadRequest("invalid_json", "the body must be a JSON object")
    order_id = body.get("order_id")
    if isinstance(order_id, bool) or not isinstance(order_id, int | str) or not str(order_id).strip():
        raise InvalidBody("invalid_request", "order_id must be a non-empty string or an integer")
    currency = body.get("currency")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        raise InvalidBody("invalid_request", "currency must be a three-letter code such as EUR")
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise InvalidBody("invalid_request", "reason must be a string")
    return RefundRequest(
        order_id=str(order_id).strip(),
        amount_cents=_parse_cents(body.get("amount")),
        currency=currency.upper(),
        reason=reason,
        idempotency_key=idempotency_key,
        request_id=request_id,
        commit_deadline=deadline,
    )


def _parse_deadline(text: str) -> datetime:
    """Raises: BadRequest unless `text` is an RFC 3339 date and time with its offset."""
    problem = f"{COMMIT_DEADLINE_HEADER} must be an RFC 3339 time with an offset, e.g. 2026-12-01T15:40:00Z"
    try:
        deadline = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise BadRequest("invalid_commit_deadline", problem) from exc
    if deadline.tzinfo is None:
        raise BadRequest("invalid_commit_deadline", problem)
    return deadline


def _parse_cents(amount: object) -> int:
    """A positive amount with at most two decimals, as a JSON number or a decimal string, in cents."""
    problem = "amount must be a positive number with at most two decimals"
    if isinstance(amount, bool) or not isinstance(amount, int | float | str):
        raise InvalidBody("invalid_amount", problem)
    try:
        value = Decimal(str(amount))
        valid = value.is_finite() and value > 0 and value == value.quantize(Decimal("0.01"))
    except InvalidOperation as exc:  # not a number, or too many digits to quantize
        raise InvalidBody("invalid_amount", problem) from exc
    if not valid:
        raise InvalidBody("invalid_amount", problem)
    return int(value * 100)


def _money(cents: int) -> float:
    return cents / 100


def _order_json(order: Order) -> dict[str, object]:
    return {
        "order_id": order.order_id,
        "customer": order.customer,
        "amount": _money(order.amount_cents),
        "currency": order.currency,
        "status": order.status,
        "refunded_total": _money(order.refunded_cents),
    }


def _replayed(refund: Refund) -> Response:
    return JSONResponse(_refund_json(refund), status_code=201, headers={"Idempotent-Replayed": "true"})


def _refund_json(refund: Refund) -> dict[str, object]:
    return {
        "refund_id": refund.refund_id,
        "order_id": refund.order_id,
        "amount": _money(refund.amount_cents),
        "currency": refund.currency,
        "reason": refund.reason,
        "idempotency_key": refund.idempotency_key,
        "request_id": refund.request_id,
        "status": refund.status,
        "created_at": refund.created_at,
    }


async def serve(app: ASGIApp, host: str, port: int) -> None:
    """Serve `app` with uvicorn; print one line with the URL once the socket is listening."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        # A hanging refund must not keep the process alive forever on shutdown.
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.wait({serving}, timeout=0.02)
    if server.started:
        bound_port = server.servers[0].sockets[0].getsockname()[1]
        shown_host = f"[{host}]" if ":" in host else host
        print(f"acme-payments listening on http://{shown_host}:{bound_port}", flush=True)
    await serving


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m demo.acme_payments",
        description="acme-payments, the demo payments backend of `writ demo`",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081, help="0 picks a free port (printed on start)")
    parser.add_argument("--db", required=True, help="the SQLite file (created and seeded if missing)")
    parser.add_argument(
        "--dedupe",
        action="store_true",
        help="answer a refund under a key executed before with that refund, executing nothing",
    )
    args = parser.parse_args(argv)
    asyncio.run(serve(create_app(args.db, dedupe=args.dedupe), args.host, args.port))


if __name__ == "__main__":
    main()
