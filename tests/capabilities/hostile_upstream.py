"""An upstream MCP server that lies, speaking raw JSON-RPC so it can break the protocol on purpose.

Run as a stdio subprocess (`python hostile_upstream.py`), or served over streamable HTTP with
`http_app()`. It completes the handshake properly; each tool then misbehaves in its own way.

The `big*` and `flood*` tools (stdio only) write answers longer than Writ reads, of BIG_BYTES and
FLOOD_BYTES from the environment (`exact` answers with a line of EXACT_BYTES); `pid` says which
process answered, so a test can tell a restart.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

OUTPUT_SCHEMA = {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}

TOOLS = [
    "ok",
    "garbage",
    "garbage_then_answer",
    "not_jsonrpc",
    "wrong_id",
    "malformed_result",
    "error_result",
    "bad_schema",
    "nan",
    "internal_error",
    "invalid_params",
    "exit",
    "hang",
    "wrong_content_type",
    "accepted_202",
    "redirect",
    "bad_sse",
    "pid",
    "answer_then_exit",
    "exact",
    "stderr_noise",
    "big",
    "big_then_answer",
    "flood",
    "flood_no_newline",
]
"""`wrong_content_type` to `bad_sse` misbehave over HTTP only (over stdio they never answer); the
rest, from `pid` on, are for stdio only."""


def _tool(name: str) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": name, "inputSchema": {"type": "object"}}
    if name == "bad_schema":
        tool["outputSchema"] = OUTPUT_SCHEMA
    return tool


def _result(id: Any, result: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": id, "result": result})


def answer(message: dict[str, Any]) -> list[str] | None:
    """The lines to send for one incoming message ([] for nothing, None to exit at once)."""
    method, id = message.get("method"), message.get("id")
    if id is None:
        return []  # a notification
    if method == "initialize":
        return [
            _result(
                id,
                {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "1"},
                },
            )
        ]
    if method == "tools/list":
        return [_result(id, {"tools": [_tool(name) for name in TOOLS]})]
    if method != "tools/call":
        return [json.dumps({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}})]
    name = message["params"]["name"]
    text = {"content": [{"type": "text", "text": "done"}]}
    if name == "ok":
        return [_result(id, text)]
    if name == "garbage":
        return ["this is not JSON at all {{{"]
    if name == "garbage_then_answer":
        return ["<html>oops</html>", _result(id, text)]
    if name == "not_jsonrpc":
        return [json.dumps({"hello": "world", "id": id})]
    if name == "wrong_id":
        return [_result(f"{id}-other" if isinstance(id, str) else id + 1000, text)]
    if name == "malformed_result":
        return [_result(id, {"content": "not a list of blocks"})]
    if name == "error_result":
        return [_result(id, {"content": [{"type": "text", "text": "quota exceeded"}], "isError": True})]
    if name == "bad_schema":
        return [_result(id, {**text, "structuredContent": {"total": "lots"}})]
    if name == "nan":
        return [_result(id, {"content": [], "structuredContent": {"v": float("nan")}})]  # json writes NaN
    if name == "internal_error":
        return [json.dumps({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "db down"}})]
    if name == "invalid_params":
        return [
            json.dumps({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": "no such order"}})
        ]
    if name == "exit":
        return None
    if name == "answer_then_exit":
        return [_result(id, text), ""]  # "" exits once the answer is out
    if name == "pid":
        return [_result(id, {"content": [{"type": "text", "text": str(os.getpid())}]})]
    if name == "exact":
        empty = _result(id, {"content": [{"type": "text", "text": ""}]})
        padding = "x" * (int(os.environ.get("EXACT_BYTES", len(empty))) - len(empty))
        return [_result(id, {"content": [{"type": "text", "text": padding}]})]
    if name == "stderr_noise":  # far more than a pipe holds: a child whose stderr nobody reads blocks
        for _ in range(16 * 1024):
            sys.stderr.write("noise on stderr " * 4 + "\n")
        sys.stderr.flush()
        return [_result(id, text)]
    if name == "hang":
        time.sleep(3600)
    return []


def flood(name: str, id: Any) -> None:
    """Write `name`'s oversized answer straight to stdout, a megabyte at a time."""
    out = sys.stdout.buffer
    size = int(os.environ.get("BIG_BYTES" if name.startswith("big") else "FLOOD_BYTES", 64 * 1024 * 1024))
    text = b'{"type": "text", "text": "'
    if name == "big":  # a whole answer, ordered as the TypeScript SDK writes it: the id comes last
        out.write(b'{"result": {"content": [' + text)
        end = b'"}]}, "jsonrpc": "2.0", "id": %s}\n' % json.dumps(id).encode()
    elif name == "big_then_answer":  # a log message no call waits for, then the answer
        out.write(
            b'{"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "'
        )
        end = b'"}}\n' + _result(id, {"content": [{"type": "text", "text": "done"}]}).encode() + b"\n"
    else:  # the id first, as Writ's own SDK writes it; `flood_no_newline` never ends the line
        out.write(b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [' % json.dumps(id).encode() + text)
        end = b'"}]}}\n' if name == "flood" else b""
    chunk = b"a" * (1024 * 1024)
    for _ in range(size // len(chunk)):
        out.write(chunk)
    out.write(end)
    out.flush()
    if name == "flood_no_newline":
        time.sleep(3600)  # alive, the line still open


def main() -> None:
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        name = message.get("params", {}).get("name", "") if message.get("method") == "tools/call" else ""
        if name.startswith(("big", "flood")):
            flood(name, message["id"])
            continue
        lines = answer(message)
        if lines is None:
            os._exit(3)
        for out in lines:
            if not out:
                sys.stdout.flush()
                os._exit(0)
            sys.stdout.write(out + "\n")
        sys.stdout.flush()


def http_app() -> Any:
    """The same upstream over streamable HTTP (one JSON body per POST)."""
    import anyio
    from starlette.requests import Request
    from starlette.responses import Response

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        if request.method != "POST":
            await Response(status_code=405)(scope, receive, send)
            return
        message = json.loads(await request.body())
        name = message.get("params", {}).get("name")
        if name == "hang":
            await anyio.sleep(3600)
        if name == "wrong_content_type":
            await Response("<html>done, probably</html>", media_type="text/html")(scope, receive, send)
            return
        if name == "redirect":  # to another origin, which the SDK does not follow
            await Response(status_code=307, headers={"location": "http://elsewhere.invalid/mcp"})(
                scope, receive, send
            )
            return
        if name == "bad_sse":
            await Response("event: message\ndata: not JSON {{{\n\n", media_type="text/event-stream")(
                scope, receive, send
            )
            return
        lines = answer(message)
        if lines is None:
            raise ConnectionAbortedError("the upstream died mid-call")
        if not lines:
            await Response(status_code=202)(scope, receive, send)
            return
        body = lines[-1] if len(lines) == 1 or not lines[0].startswith("<") else lines[0]
        await Response(body, media_type="application/json")(scope, receive, send)

    return app


if __name__ == "__main__":
    main()
