"""Ways an attacker with write access to the database might alter the log behind the store's back."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, Table, delete, insert, select, update

from store import Store
from store.canonical import canonical_json
from store.events import Envelope, ToolCallDenied, ToolCallDeniedEvent
from store.schema import events, log_head


def _insert(conn: Connection, placed: list[dict[str, Any]] | Iterable[dict[str, Any]]) -> None:
    """Insert event rows at their seq in the one partition "", as an attacker of a log of one would."""
    conn.execute(insert(events), [{**row, "partition": "", "pseq": row["seq"]} for row in placed])


def rows(store: Store) -> list[dict[str, Any]]:
    with store.engine.begin() as conn:
        return [dict(r._mapping) for r in conn.execute(select(events).order_by(events.c.seq))]


def edit_payload(store: Store, seq: int) -> None:
    row = next(r for r in rows(store) if r["seq"] == seq)
    payload = json.loads(row["payload"])
    payload["tampered"] = True
    with store.engine.begin() as conn:
        conn.execute(update(events).where(events.c.seq == seq).values(payload=canonical_json(payload)))


def delete_event(store: Store, seq: int) -> None:
    with store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.seq == seq))


def insert_forged_event(store: Store, seq: int) -> None:
    """Shift every event from `seq` on up by one and put a well-formed, correctly chained event at `seq`."""
    everything = rows(store)
    previous = next(r for r in everything if r["seq"] == seq - 1)
    moved = [r for r in everything if r["seq"] >= seq]
    forged = ToolCallDeniedEvent(
        occurred_at=previous["occurred_at"],
        producer="attacker",
        tool_call_id=previous["tool_call_id"],
        tenant=previous["tenant"],
        payload=ToolCallDenied(reason="forged"),
    ).sealed(seq, previous["hash"])
    forged_row = forged.envelope()
    forged_row["payload"] = canonical_json(forged_row["payload"])
    with store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.seq >= seq))
        _insert(conn, [forged_row, *({**r, "seq": r["seq"] + 1} for r in moved)])


def append_forged_event(store: Store) -> None:
    """Add a correctly chained event after the last one without moving the head."""
    last = rows(store)[-1]
    forged = ToolCallDeniedEvent(
        occurred_at=last["occurred_at"], producer="attacker", payload=ToolCallDenied(reason="forged")
    ).sealed(last["seq"] + 1, last["hash"])
    forged_row = forged.envelope()
    forged_row["payload"] = canonical_json(forged_row["payload"])
    with store.engine.begin() as conn:
        _insert(conn, [forged_row])


def insert_before_the_first(store: Store, seq: int = 0) -> None:
    """Put a well-formed event at a seq below 1, where no reader that pages from seq 1 looks."""
    first = rows(store)[0]
    forged = ToolCallDeniedEvent(
        occurred_at=first["occurred_at"], producer="attacker", payload=ToolCallDenied(reason="forged")
    ).sealed(seq, first["prev_hash"])
    forged_row = forged.envelope()
    forged_row["payload"] = canonical_json(forged_row["payload"])
    with store.engine.begin() as conn:
        _insert(conn, [forged_row])


def set_payload_text(store: Store, seq: int, text: str) -> None:
    """Overwrite an event's stored payload with `text` as it is, JSON or not."""
    with store.engine.begin() as conn:
        conn.execute(update(events).where(events.c.seq == seq).values(payload=text))


def delete_head(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(delete(log_head))


def swap_events(store: Store, seq: int) -> None:
    """Exchange the events at `seq` and `seq + 1`, each taking the other's position."""
    everything = {r["seq"]: r for r in rows(store)}
    first, second = everything[seq], everything[seq + 1]
    with store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.seq.in_([seq, seq + 1])))
        _insert(conn, [{**second, "seq": seq}, {**first, "seq": seq + 1}])


def delete_and_renumber(store: Store, seq: int) -> None:
    """Remove the event at `seq` and close the gap by moving every later event down one."""
    moved = [r for r in rows(store) if r["seq"] > seq]
    with store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.seq >= seq))
        _insert(conn, [{**r, "seq": r["seq"] - 1} for r in moved])


def rewrite_with_recomputed_hash(store: Store, seq: int) -> None:
    """Edit an event and recompute its own hash, as an attacker who knows the hashing scheme would."""
    from store.events import compute_hash

    row = next(r for r in rows(store) if r["seq"] == seq)
    envelope = {**row, "payload": {**json.loads(row["payload"]), "tampered": True}}
    with store.engine.begin() as conn:
        conn.execute(
            update(events)
            .where(events.c.seq == seq)
            .values(payload=canonical_json(envelope["payload"]), hash=compute_hash(envelope))
        )


def as_written_before_rfc8785(store: Store, upto: int | None = None) -> None:
    """Re-seal events 1..`upto` (all by default) as schema_version 1 events, hashed and stored in the
    JSON spelling used before RFC 8785, and re-chain the rest: the log an older Writ would have left."""
    from store.canonical import legacy_json
    from store.events import compute_hash, json_for

    prev_hash, resealed = "0" * 64, []
    for row in rows(store):
        envelope = {**row, "payload": json.loads(row["payload"]), "prev_hash": prev_hash}
        if upto is None or row["seq"] <= upto:
            envelope["schema_version"] = 1
        envelope["hash"] = compute_hash(envelope)
        spelled = json_for(envelope["schema_version"])(envelope["payload"])
        assert envelope["schema_version"] != 1 or spelled == legacy_json(envelope["payload"])
        resealed.append({**envelope, "payload": spelled})
        prev_hash = envelope["hash"]
    with store.engine.begin() as conn:
        conn.execute(delete(events))
        _insert(conn, resealed)
        conn.execute(update(log_head).values(last_hash=prev_hash))


def as_dispatched_before_keys_were_scoped(store: Store, tool_call_id: str) -> None:
    """Re-seal the call's `tool_call.dispatching` events with its plain client key, and every later event,
    and set its row as migration 0025 leaves a row written before: the log and projection an older Writ
    would have left for a call it sent with the key as the client gave it. Not an attack: an upgrade."""
    from store.schema import tool_calls

    call = store.get_call(tool_call_id)
    assert call is not None

    def dispatched(row: dict[str, Any]) -> bool:
        return row["tool_call_id"] == tool_call_id and row["type"] == "tool_call.dispatching"

    def plain(row: dict[str, Any], payload: dict[str, Any]) -> None:
        if dispatched(row):
            payload["idempotency_key"] = call.idempotency_key

    _reseal_from(store, next(r["seq"] for r in rows(store) if dispatched(r)), plain)
    set_projection(store, tool_calls, {"tool_call_id": tool_call_id}, key_scoped=False)


def rewrite_from(store: Store, seq: int) -> None:
    """Edit the event at `seq`, re-seal it and every later event, and move the head to the new last hash:
    what someone with write access to the database and the hashing scheme can do unseen by the chain."""

    def tampered(row: dict[str, Any], payload: dict[str, Any]) -> None:
        if row["seq"] == seq:
            payload["tampered"] = True

    _reseal_from(store, seq, tampered)


def _reseal_from(store: Store, seq: int, edit: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
    """Let `edit` change the payload of each event from `seq` on, re-seal them all and move the head."""
    from store.events import compute_hash, json_for
    from store.schema import read_correlation

    everything = rows(store)
    prev_hash, resealed = everything[seq - 2]["hash"] if seq > 1 else "0" * 64, []
    for row in everything[seq - 1 :]:
        payload = json.loads(row["payload"])
        edit(row, payload)
        envelope = {**row, "payload": payload, "prev_hash": prev_hash}
        # Hashed as written: a call's own id as its correlation is stored as "" (store.schema).
        hashed = {**envelope, "correlation_id": read_correlation(row["correlation_id"], row["tool_call_id"])}
        envelope["hash"] = compute_hash(hashed)
        resealed.append({**envelope, "payload": json_for(envelope["schema_version"])(payload)})
        prev_hash = envelope["hash"]
    with store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.seq >= seq))
        _insert(conn, resealed)
        conn.execute(update(log_head).values(last_hash=prev_hash))


def truncate_to(store: Store, seq: int) -> None:
    """Delete every event after `seq` and move the head back to `seq`, so the chain ends cleanly there."""
    kept = next(r for r in rows(store) if r["seq"] == seq)
    with store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.seq > seq))
        conn.execute(update(log_head).values(last_seq=seq, last_hash=kept["hash"]))


# -- the projections: what the runtime acts on, changed behind the log's back -----------------------


def set_projection(store: Store, table: Table, where: dict[str, Any], **values: Any) -> None:
    """`UPDATE table SET values WHERE where`, one row: what `UPDATE approvals SET status=...` does."""
    condition = [table.c[name] == value for name, value in where.items()]
    with store.engine.begin() as conn:
        changed = conn.execute(update(table).where(*condition).values(**values)).rowcount
    assert changed == 1, f"{table.name} has no single row where {where}"


def delete_projection_rows(store: Store, table: Table, **where: Any) -> None:
    """Delete the rows of `table` matching `where` (every row without it): an emptied effect ledger."""
    condition = [table.c[name] == value for name, value in where.items()]
    with store.engine.begin() as conn:
        conn.execute(delete(table).where(*condition))


# -- the grammar: a forged event the chain and the projections agree with ---------------------------


def envelope_of_call(store: Store, tool_call_id: str) -> dict[str, Any]:
    """The envelope fields a new event about the call would carry, caused by its last event."""
    last = store.events(tool_call_id=tool_call_id)[-1]
    return {
        "occurred_at": last.occurred_at,
        "producer": "attacker",
        "run_id": last.run_id,
        "tool_call_id": last.tool_call_id,
        "approval_id": last.approval_id,
        "capability_id": last.capability_id,
        "capability_version": last.capability_version,
        "policy_version": last.policy_version,
        "correlation_id": last.correlation_id,
        "causation_id": last.event_id,
        "tenant": last.tenant,
    }


def inject_resealed(store: Store, seq: int, forged: Envelope) -> None:
    """Put `forged` at `seq` (later events move up one), re-seal it and every later event, move the head,
    and rebuild the projections from the forged log: chain, head and projections all agree with the
    forgery, so only the grammar can tell that no store could have written it."""
    from store.events import compute_hash, json_for

    everything = rows(store)
    prev_hash = everything[seq - 2]["hash"] if seq > 1 else "0" * 64
    first = {**forged.envelope(), "seq": seq}
    later = [{**r, "payload": json.loads(r["payload"]), "seq": r["seq"] + 1} for r in everything[seq - 1 :]]
    resealed = []
    for envelope in [first, *later]:
        envelope = {**envelope, "prev_hash": prev_hash}
        envelope["hash"] = compute_hash(envelope)
        resealed.append({**envelope, "payload": json_for(envelope["schema_version"])(envelope["payload"])})
        prev_hash = envelope["hash"]
    with store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.seq >= seq))
        _insert(conn, resealed)
        conn.execute(update(log_head).values(last_seq=resealed[-1]["seq"], last_hash=prev_hash))
    store.rebuild()
