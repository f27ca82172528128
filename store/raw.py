"""The statements every call runs, compiled once per dialect and run on the connection's DBAPI cursor.

For the few short statements of admitting and settling a call, SQLAlchemy's per-statement execution
layer (cache key, execution context, bind and result handling, the result object) costs more CPU than
the database does. A `Statement` keeps what that layer decides and skips the rest: SQLAlchemy still
builds and compiles the statement for the connection's dialect, every value still goes through its
column type's bind and result processors (so `UTCDateTime` is stored and read exactly as before), and
the SQL runs on the cursor of the same connection, inside the same transaction. Errors go through the
connection's own handler, so they are wrapped exactly as `conn.execute` wraps them: a unique violation
is an `IntegrityError`, and a lost connection is invalidated and reported as such.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from sqlalchemy import Connection, Dialect, exc
from sqlalchemy.sql import ClauseElement

Record = Any
"""A row read by attribute: SQLAlchemy's `Row`, or the named tuple a `Statement` returns."""

_Processor = Callable[[Any], Any] | None


class _Compiled:
    """One statement compiled for one dialect and one set of parameter names."""

    def __init__(self, statement: ClauseElement, dialect: Dialect, keys: frozenset[str]) -> None:
        compiled: Any = statement.compile(dialect=dialect, column_keys=sorted(keys))
        # What this class does not reproduce of the execution layer: Python-side column defaults,
        # expanding (IN) and late-rendered parameters, escaped parameter names.
        if (
            compiled.insert_prefetch
            or compiled.update_prefetch
            or compiled.literal_execute_params
            or compiled.post_compile_params
            or compiled.escaped_bind_names
        ):
            raise exc.InvalidRequestError(f"statement cannot run on the raw cursor: {compiled.string}")
        self.sql: str = compiled.string
        self.positional: bool = compiled.positional
        processors: Mapping[str, _Processor] = compiled._bind_processors
        binds = {name: bind for bind, name in compiled.bind_names.items()}
        names: Sequence[str] = compiled.positiontup if self.positional else list(binds)
        self.names = list(names)
        # Per bound name: the parameter it takes (None: the statement's own value), that value, and
        # the processor, as `construct_params` and the execution context would pick them.
        self.binds: list[tuple[str | None, Any, _Processor]] = []
        for name in self.names:
            bind = binds[name]
            key = bind.key if bind.key in keys else name if name in keys else None
            if key is None and bind.required:
                raise exc.InvalidRequestError(f"a value is required for bind parameter {bind.key!r}")
            processor = processors.get(name)
            value = None if key is not None else bind.effective_value
            if key is None and processor is not None:
                value, processor = processor(value), None
            self.binds.append((key, value, processor))
        self.result_columns = compiled._result_columns
        self.row: Any = None
        self.result_processors: list[_Processor] = []

    def values(self, params: Mapping[str, Any]) -> Sequence[Any] | dict[str, Any]:
        values = []
        for key, value, processor in self.binds:
            if key is not None:
                value = params[key]
            values.append(value if processor is None else processor(value))
        return values if self.positional else dict(zip(self.names, values, strict=True))

    def rows(self, dialect: Dialect, cursor: Any) -> list[Record]:
        fetched = cursor.fetchall()
        if self.row is None:
            # As SQLAlchemy's result metadata does: by position, each column's processor for the
            # type code the driver reports. The processors are in place before `row` says so, for
            # any other thread that reads them. The description is read this once: psycopg builds
            # it anew, an object per column, each time it is asked for.
            self.result_processors = [
                column.type._cached_result_processor(dialect, entry[1])
                for column, entry in zip(self.result_columns, cursor.description, strict=True)
            ]
            self.row = namedtuple("Record", [column.keyname for column in self.result_columns])  # type: ignore[misc]
        make, processors = self.row._make, self.result_processors
        if not any(processors):
            return [make(row) for row in fetched]
        return [
            make([v if p is None else p(v) for v, p in zip(row, processors, strict=True)]) for row in fetched
        ]


class Statement:
    """A SQLAlchemy statement run below SQLAlchemy's execution layer, on the connection's transaction."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: dict[tuple[Dialect, frozenset[str]], _Compiled] = {}

    def _compile(self, conn: Connection, params: Mapping[str, Any]) -> _Compiled:
        key = (conn.dialect, frozenset(params))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = _Compiled(self.statement, conn.dialect, key[1])
        return compiled

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> int:
        """Run the statement once; returns the rows it matched (an UPDATE's rowcount)."""
        count, _ = self._run(conn, params, fetch=False)
        return count

    def rows(self, conn: Connection, params: Mapping[str, Any]) -> list[Record]:
        """Run the statement once and return every row it produced (a SELECT, or RETURNING)."""
        _, rows = self._run(conn, params, fetch=True)
        return rows

    def one_or_none(self, conn: Connection, params: Mapping[str, Any]) -> Record | None:
        rows = self.rows(conn, params)
        if len(rows) > 1:
            raise exc.MultipleResultsFound("Multiple rows were found when one or none was required")
        return rows[0] if rows else None

    def one(self, conn: Connection, params: Mapping[str, Any]) -> Record:
        row = self.one_or_none(conn, params)
        if row is None:
            raise exc.NoResultFound("No row was found when one was required")
        return row

    def execute_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run the statement once per parameter set (at least one, all with the same names)."""
        compiled = self._compile(conn, rows[0])
        cursor = _cursor(conn)
        values: Any = None
        try:
            values = [compiled.values(row) for row in rows]
            cursor.executemany(compiled.sql, values)
        except BaseException as error:
            _failed(conn, error, compiled.sql, values, cursor)

    def _run(self, conn: Connection, params: Mapping[str, Any], *, fetch: bool) -> tuple[int, list[Record]]:
        compiled = self._compile(conn, params)
        cursor = _cursor(conn)
        values: Any = None
        try:
            values = compiled.values(params)
            cursor.execute(compiled.sql, values)
            rows = compiled.rows(conn.dialect, cursor) if fetch else []
            count = cursor.rowcount
        except BaseException as error:
            _failed(conn, error, compiled.sql, values, cursor)
        return count, rows


_CURSOR = "writ.raw_cursor"
"""The pool record's `info` key of (DBAPI connection, the cursor statements run on there)."""


def _cursor(conn: Connection) -> Any:
    """The cursor statements run on, made once per DBAPI connection and kept with it (psycopg builds a
    cursor in Python: about a tenth of a statement's CPU). Each execute replaces what the last one left.
    """
    # As `conn.execute` does before it executes: an invalidated connection raises here, unwrapped.
    proxied = conn.connection
    dbapi_connection = proxied.dbapi_connection
    if dbapi_connection is None:
        raise exc.ResourceClosedError("the connection is closed")
    kept = proxied.info.get(_CURSOR)
    if kept is not None and kept[0] is dbapi_connection:
        return kept[1]
    cursor = dbapi_connection.cursor()
    proxied.info[_CURSOR] = (dbapi_connection, cursor)
    return cursor


def _failed(conn: Connection, error: BaseException, sql: str, values: Any, cursor: Any) -> NoReturn:
    # The handler closes the cursor (and may invalidate the connection): the next statement makes another.
    conn.connection.info.pop(_CURSOR, None)
    conn._handle_dbapi_exception(error, sql, values, cursor, None)
