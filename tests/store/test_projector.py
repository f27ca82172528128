"""The projector: what it does with an event that cannot be folded into the projections."""

from __future__ import annotations

import pytest

from store import Store, StoreError
from store import events as ev
from store.projector import Pending, apply
from tests.store.builders import NOW


@pytest.mark.parametrize("pending", [None, Pending()], ids=["rebuild", "live"])
def test_a_call_event_naming_no_call_is_refused_rather_than_projected_nowhere(
    store: Store, pending: Pending | None
) -> None:
    completed = ev.ToolCallCompletedEvent(
        occurred_at=ev.format_ts(NOW), producer="test", payload=ev.ToolCallCompleted()
    )
    with store.engine.begin() as conn, pytest.raises(StoreError, match="tool_call_id"):
        apply(conn, completed, pending)
