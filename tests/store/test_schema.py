"""The column types that keep text as bytes: bound on PostgreSQL as plain bytes (psycopg dumps them in C;
SQLAlchemy's `Binary` wrapper only made it unwrap them in Python), and read back as written everywhere."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import TypeDecorator, bindparam, create_engine, select

from store import Store
from store.schema import DigestText, EventId, EventTime, HexDigest, PackedText

VALUES: list[tuple[TypeDecorator[Any], str]] = [
    (HexDigest(), "ab" * 32),
    (EventId(), "01934a8e-7f2b-7c3d-8e4f-5a6b7c8d9e0f"),
    (EventId(), "not-a-uuid"),
    (EventTime(), "2026-12-02T11:55:45.285464Z"),
    (EventTime(), "yesterday"),
    (PackedText(), '{"content":[{"text":"order 1001","type":"text"}]}'),
    (DigestText(), "sha256:" + "cd" * 32),
    (DigestText(), "plain key"),
]


@pytest.mark.parametrize(("column_type", "value"), VALUES)
def test_postgresql_binds_the_stored_bytes_themselves(column_type: TypeDecorator[Any], value: str) -> None:
    dialect = create_engine("postgresql+psycopg://").dialect  # never connects
    bind = column_type.dialect_impl(dialect).bind_processor(dialect)
    assert bind is not None

    bound = bind(value)

    assert type(bound) is bytes
    assert bound == column_type.process_bind_param(value, dialect)


@pytest.mark.parametrize(("column_type", "value"), VALUES)
def test_a_value_kept_as_bytes_reads_back_as_written(
    store: Store, column_type: TypeDecorator[Any], value: str
) -> None:
    with store.engine.connect() as conn:
        (read,) = conn.execute(select(bindparam("v", value, type_=column_type))).one()

    assert read == value
