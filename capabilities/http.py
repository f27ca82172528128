"""Executor for capabilities that are plain HTTP endpoints.

One persistent `httpx2.AsyncClient` per backend carries every call (connection reuse). What the
executor reports follows one question: could the backend have acted? Nothing sent -> `failed`;
sent and no usable answer -> `unknown` (for effects other than `read`). It never retries.

A response is read as a stream and given up once its body passes the backend's `max_response_bytes`
(`response_too_large`), and the whole exchange, body included, is bounded by the capability's
timeout, so a backend that sends forever or trickles a byte at a time cannot hold a call or memory.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import anyio
import httpx2
from opentelemetry import propagate

from capabilities.config import HttpBackend, HttpLookup, RequestSpec
from capabilities.contract import (
    BackendUnavailable,
    Capability,
    CapabilityError,
    Invocation,
    Outcome,
    ReconcileResult,
)
from capabilities.credentials import Credentials
from capabilities.lookups import read_answer
from capabilities.oauth_tokens import TokenUnavailable
from capabilities.results import (
    compact_json,
    failed_outcome,
    is_value,
    json_result,
    parse_json,
    text_result,
    unanswered_outcome,
)

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_DETAIL_CHARS = 300

_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)
"""Raised before a byte of the request left: the backend cannot have acted."""
_REFUSED_LOCALLY = (
    httpx2.UnsupportedProtocol,
    httpx2.LocalProtocolError,
    httpx2.ProxyError,
    httpx2.InvalidURL,
)


@dataclass(frozen=True, slots=True)
class HttpRoute:
    """How one capability maps onto its backend's HTTP API."""

    request: RequestSpec
    idempotency_header: str = "Idempotency-Key"
    reconcile: HttpLookup | None = None
    commit_deadline_header: str | None = None
    """Where the commit deadline goes, for a backend that refuses to commit past it."""


class ResponseTooLarge(Exception):
    """The body of an answer passed the backend's `max_response_bytes`; the rest was not read."""

    def __init__(self, status_code: int, limit: int) -> None:
        super().__init__(f"answered {status_code} with a body over {limit} bytes (max_response_bytes)")
        self.status_code = status_code


@dataclass(frozen=True, slots=True)
class _Answer:
    """What came back: the status and the body as text (read whole, within the size limit)."""

    status_code: int
    text: str
    location: str | None = None


class TemplateError(KeyError):
    """A path template names a value the call did not provide."""


class PathSegmentError(ValueError):
    """A value would make a whole path segment empty, `.` or `..`, so the URL would name another resource."""


_NOT_A_SEGMENT = frozenset({"", ".", ".."})


def fill_template(template: str, values: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The template with its fields URL-quoted from `values`, and the values it did not use.

    Raises:
        TemplateError: a field has no value.
        PathSegmentError: a value would turn its path segment into `""`, `.` or `..`.
    """
    used: set[str] = set()
    pieces: list[tuple[str, str | None]] = []
    for literal, name, _, _ in string.Formatter().parse(template):
        pieces.append((literal, None))
        if name is None:
            continue
        if name not in values or values[name] is None:
            raise TemplateError(name)
        used.add(name)
        pieces.append((quote(_as_text(values[name]), safe=""), name))
    _check_segments(pieces)
    return "".join(text for text, _ in pieces), {k: v for k, v in values.items() if k not in used}


def _check_segments(pieces: list[tuple[str, str | None]]) -> None:
    # quote() leaves "." alone, and an HTTP client resolves dot segments before sending (RFC 3986
    # 5.2.4): `/orders/{id}/cancel` with id ".." is `POST /cancel`, and an empty id names the
    # collection. Policy judged the arguments, so the request must stay on the resource they name.
    segment, names = "", set[str]()

    def close() -> None:
        if names and segment in _NOT_A_SEGMENT:
            shown = ", ".join(repr(n) for n in sorted(names))
            raise PathSegmentError(
                f"argument {shown} cannot be {segment!r} in the path: it would name another resource"
            )

    for text, name in pieces:
        if name is not None:
            segment += text
            names.add(name)
            continue
        path, query, _ = text.partition("?")
        *ended, last = path.split("/")
        for part in ended:
            segment += part
            close()
            segment, names = "", set()
        segment += last
        if query:
            break
    close()


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return compact_json(value)


def _with_query(path: str, values: Mapping[str, Any]) -> str:
    """The path with `values` added to the query it already has.

    httpx2's `params=` replaces a URL's query instead of extending it, even when empty, so a template
    such as `/search?kind=open&q={q}` would lose `kind` (and `q`) on every GET or DELETE.
    """
    if not values:
        return path
    query = str(
        httpx2.QueryParams(
            {
                key: value
                if isinstance(value, str | int | float | bool) or value is None
                else compact_json(value)
                for key, value in values.items()
            }
        )
    )
    if "?" not in path:
        return f"{path}?{query}"
    return path + query if path.endswith(("?", "&")) else f"{path}&{query}"


class HttpExecutor:
    """Performs effects against one HTTP backend; one instance per backend, shared by all calls."""

    def __init__(
        self,
        name: str,
        config: HttpBackend,
        routes: Mapping[str, HttpRoute] | None = None,
        credentials: Credentials | None = None,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self._config = config
        self._routes: dict[str, HttpRoute] = dict(routes or {})
        self._credentials = credentials or Credentials.none()
        self._transport = transport
        self._client: httpx2.AsyncClient | None = None

    def add_route(self, capability_id: str, route: HttpRoute) -> None:
        self._routes[capability_id] = route

    async def start(self) -> None:
        if self._client is not None:
            return
        limits = httpx2.Limits(max_connections=self._config.max_connections)
        self._client = httpx2.AsyncClient(
            base_url=self._config.base_url,
            headers={**self._config.headers, **self._credentials.headers},
            timeout=self._config.timeout_s,
            limits=limits,
            follow_redirects=False,
            transport=self._transport,
        )

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def discover(self) -> Sequence[Capability]:
        return ()

    async def execute(self, invocation: Invocation) -> Outcome:
        """Send the request once and report what came back (never raises for backend behaviour)."""
        capability = invocation.capability
        route = self._routes.get(capability.id)
        if route is None:
            return failed_outcome(
                invocation, "unknown_capability", f"{capability.ref} is not served by {self.name}"
            )
        try:
            path, rest = fill_template(route.request.path, invocation.arguments)
        except TemplateError as missing:
            return failed_outcome(
                invocation, "invalid_arguments", f"argument {missing.args[0]!r} is required"
            )
        except PathSegmentError as exc:
            return failed_outcome(invocation, "invalid_arguments", str(exc))
        method = route.request.method
        if method in _BODY_METHODS:
            body: dict[str, Any] = {"json": rest}
        else:
            path, body = _with_query(path, rest), {}
        headers = {route.idempotency_header: invocation.idempotency_key}
        if route.idempotency_header.lower() != "x-request-id":
            # A backend that dedupes on X-Request-Id gets the key there, once: this came second and
            # replaced it (or, spelt x-request-id, went out as a second header beside it).
            headers["X-Request-Id"] = invocation.external_request_id
        deadline = invocation.commit_deadline_text()
        if route.commit_deadline_header and deadline is not None:
            headers[route.commit_deadline_header] = deadline
        read_only = capability.effect == "read"
        try:
            response = await self._send(method, path, headers, capability.timeout_s, **body)
        except BackendUnavailable as exc:
            return failed_outcome(invocation, "backend_unreachable", self._credentials.scrub(str(exc)))
        except _NOT_SENT as exc:
            return failed_outcome(invocation, "backend_unreachable", self._describe(exc))
        except _REFUSED_LOCALLY as exc:
            return failed_outcome(invocation, "request_error", self._describe(exc))
        except (TimeoutError, httpx2.TimeoutException) as exc:
            detail = f"{self.name}: no complete answer within {capability.timeout_s:g}s"
            if isinstance(exc, httpx2.TimeoutException):
                detail += f" ({type(exc).__name__})"
            return unanswered_outcome(invocation, read_only, "response_timeout", detail)
        except httpx2.TransportError as exc:
            return unanswered_outcome(invocation, read_only, "connection_lost", self._describe(exc))
        except httpx2.DecodingError as exc:
            # Answered, with a body its Content-Encoding cannot decode: no usable answer.
            return unanswered_outcome(invocation, read_only, "undecodable_response", self._describe(exc))
        except ResponseTooLarge as exc:
            return self._too_large(invocation, exc, read_only)
        return self._outcome(invocation, response, read_only)

    async def reconcile(self, invocation: Invocation) -> ReconcileResult:
        """Look the earlier dispatch up with the capability's `reconcile:` request.

        Raises:
            CapabilityError: the capability has no lookup configured.
        """
        capability = invocation.capability
        route = self._routes.get(capability.id)
        if route is None or route.reconcile is None:
            raise CapabilityError(f"{capability.ref} has no reconcile lookup")
        values = {
            **invocation.arguments,
            "idempotency_key": invocation.idempotency_key,
            "external_request_id": invocation.external_request_id,
            "tool_call_id": invocation.tool_call_id,
        }
        try:
            path, _ = fill_template(route.reconcile.path, values)
        except TemplateError as missing:
            return ReconcileResult(
                "inconclusive", evidence={"error": "invalid_lookup", "missing": missing.args[0]}
            )
        except PathSegmentError as exc:
            return ReconcileResult("inconclusive", evidence={"error": "invalid_lookup", "detail": str(exc)})
        headers = {"X-Request-Id": invocation.external_request_id}
        try:
            response = await self._send(route.reconcile.method, path, headers, capability.timeout_s)
        except (TimeoutError, httpx2.HTTPError, BackendUnavailable, ResponseTooLarge) as exc:
            return ReconcileResult("inconclusive", evidence={"error": type(exc).__name__, "lookup": path})
        evidence: dict[str, Any] = {"lookup": path, "status_code": response.status_code}
        if response.status_code == 404:
            return ReconcileResult("not_found", evidence=evidence)
        if not 200 <= response.status_code < 300:
            return ReconcileResult("inconclusive", evidence=evidence)
        body = parse_json(self._credentials.scrub(response.text))
        if not is_value(body):
            return ReconcileResult("inconclusive", evidence={**evidence, "error": "unreadable_lookup"})
        return read_answer(body, route.reconcile, invocation, evidence)

    async def _send(
        self, method: str, path: str, headers: Mapping[str, str], timeout_s: float, **kwargs: Any
    ) -> _Answer:
        """One request and its whole answer; getting an access token first counts against the same
        timeout, and so does reading the body.

        Raises:
            TokenUnavailable: no access token; nothing was sent.
            ResponseTooLarge: the body passed `max_response_bytes`.
        """
        if self._client is None:
            raise CapabilityError(f"backend {self.name!r} is not started")
        started = anyio.current_time()
        authorization = await self._authorization(timeout_s)
        remaining = timeout_s - (anyio.current_time() - started)
        if remaining <= 0:
            raise TokenUnavailable(f"{self.name}: getting an access token used up the {timeout_s:g}s timeout")
        # The trace goes on at the backend (W3C `traceparent`, `tracestate`): no-op when nothing traces.
        traced: dict[str, str] = {}
        propagate.inject(traced)
        # httpx2's timeouts bound each phase; the deadline bounds the whole exchange, body included.
        with anyio.fail_after(remaining):
            async with self._client.stream(
                method,
                path,
                headers={**traced, **headers, **authorization},
                timeout=httpx2.Timeout(remaining),
                **kwargs,
            ) as response:
                content = await self._read_body(response)
        tokens = self._credentials.tokens
        if response.status_code == 401 and tokens is not None:
            tokens.invalidate(authorization["Authorization"])
        text = content.decode(response.encoding or "utf-8", errors="replace")
        return _Answer(response.status_code, text, response.headers.get("location"))

    async def _read_body(self, response: httpx2.Response) -> bytes:
        """The decoded body, read no further than `max_response_bytes`.

        Raises:
            ResponseTooLarge: the body is longer.
        """
        limit = self._config.max_response_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise ResponseTooLarge(response.status_code, limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _authorization(self, timeout_s: float) -> dict[str, str]:
        """The per-request `Authorization` header of an OAuth backend; {} for static credentials.

        Raises:
            TokenUnavailable: the token endpoint failed or did not answer in time.
        """
        tokens = self._credentials.tokens
        if tokens is None:
            return {}
        try:
            with anyio.fail_after(timeout_s):
                return {"Authorization": await tokens.authorization()}
        except TimeoutError:
            raise TokenUnavailable(f"{self.name}: no access token within {timeout_s:g}s") from None

    def _outcome(self, invocation: Invocation, response: _Answer, read_only: bool) -> Outcome:
        status = response.status_code
        text = self._credentials.scrub(response.text)
        evidence = {"status_code": status}
        if 200 <= status < 300:
            body = parse_json(text) if text else None
            result = json_result(body) if is_value(body) and body is not None else text_result(text)
            return Outcome(
                "completed", result, external_request_id=invocation.external_request_id, evidence=evidence
            )
        error = f"http_{status}"
        if 400 <= status < 500:
            return Outcome(
                "failed",
                text_result(text, is_error=True),
                error=error,
                detail=f"{self.name} answered {status}: {text[:_DETAIL_CHARS]}",
                external_request_id=invocation.external_request_id,
                evidence=evidence,
            )
        detail = f"{self.name} answered {status}: {text[:_DETAIL_CHARS]}"
        shown = text or detail
        if 300 <= status < 400:
            # Never followed: the request carries the backend's credentials and the idempotency key.
            where = self._credentials.scrub(response.location or "nowhere")[:_DETAIL_CHARS]
            detail = shown = f"{self.name} answered {status}, a redirect to {where} (not followed)"
        # A 5xx (or an unexpected 1xx/3xx) may come after the backend committed the effect.
        return Outcome(
            "failed" if read_only else "unknown",
            text_result(shown, is_error=True) if read_only else None,
            error=error,
            detail=detail,
            external_request_id=invocation.external_request_id,
            evidence=evidence,
        )

    def _too_large(self, invocation: Invocation, exc: ResponseTooLarge, read_only: bool) -> Outcome:
        status = exc.status_code
        detail = f"{self.name} {exc}"
        if 400 <= status < 500:
            # The status alone says the backend refused; the body was only an explanation.
            return failed_outcome(invocation, f"http_{status}", detail)
        return unanswered_outcome(invocation, read_only, "response_too_large", detail)

    def _describe(self, exc: BaseException) -> str:
        message = str(exc) or "no message"
        return self._credentials.scrub(f"{self.name}: {type(exc).__name__}: {message}")[:_DETAIL_CHARS]
