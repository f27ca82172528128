"""An upstream MCP server on the SDK's own `MCPServer`, moving money in a JSON ledger file (stdio).

python ledger_upstream.py LEDGER_FILE

`transfer` to `printer` commits the transfer, then raises (a receipt that fails to print): the SDK turns
any exception of a tool into a result with `isError: true`, after the effect too. To `nobody` it raises
`ToolError` before moving anything. `find_transfer` lists the transfers made under a key (the lookup);
`balance` is read-only and always errs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

LEDGER = Path(sys.argv[1])
RECEIPT_FAILURE = "the receipt printer is on fire"

mcp = MCPServer("ledger")


def load() -> list[dict[str, Any]]:
    return json.loads(LEDGER.read_text()) if LEDGER.exists() else []


@mcp.tool()
def transfer(to: str, amount: float, ctx: Context) -> dict[str, Any]:
    """Move money to someone's account."""
    if to == "nobody":
        raise ToolError("no account named nobody: nothing was moved")
    meta = ctx.request_context.meta or {}
    rows = load()
    row = {"n": len(rows) + 1, "to": to, "amount": amount, "key": meta.get("writ/idempotencyKey")}
    LEDGER.write_text(json.dumps([*rows, row]))
    if to == "printer":
        raise RuntimeError(RECEIPT_FAILURE)  # after the commit: the SDK answers isError
    return row


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_transfer(key: str) -> dict[str, Any]:
    """The transfers made under this idempotency key."""
    return {"transfers": [row for row in load() if row["key"] == key]}


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
def balance(account: str) -> dict[str, Any]:
    """An account's balance (the ledger keeps none: it always errs)."""
    raise ToolError(f"no balance is kept for {account}")


if __name__ == "__main__":
    mcp.run()
