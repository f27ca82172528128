"""`bench/load.py`'s check of Writ's answers: a run that stops on one says what Writ said."""

from __future__ import annotations

import mcp_types as types
import pytest

from bench import load


def test_an_answer_that_is_not_completed_stops_the_run_with_writs_own_words() -> None:
    failed = types.CallToolResult(
        content=[types.TextContent(type="text", text="the backend did not answer within 5 s")],
        is_error=True,
        _meta={"writ/status": "failed"},
    )
    with pytest.raises(load.BadAnswer, match="status='failed' is_error=True: the backend did not answer"):
        load._check(failed)


def test_a_completed_answer_passes() -> None:
    done = types.CallToolResult(content=[], _meta={"writ/status": "completed"})
    load._check(done)
