"""The statements every call runs, compiled once per dialect and run on the connection's DBAPI cursor.

For the few short statements of admitting and settling a call, SQLAlchemy's per-statement execution
layer (cache key, execution context, bind and result handling, the result object) costs more CPU than
the database does. A `Statement` keeps what that layer decides and skips the rest: SQLAlchemy still
builds and compiles the statement for the connection's dialect, every value still goes through its
column type's bind and result processors (so `UTCDateTime` is stored and read exactly as before), and
the SQL runs on the cursor of the same connection, inside the same transaction. Errors go through the
connection's own handler, so they are wrapped exactly as `conn.execute` wraps them: a unique violation
is an `IntegrityError`, and a lost connection is invalidated and reported as such.

On PostgreSQL every statement is a round trip. A write whose result nobody reads (most inserts, the
head's move) can be `defer`red instead: it is queued on the connection and sent, in psycopg's pipeline
mode, together with the next statement whose result is needed, or by `flush`, in one round trip.
The database runs them in the order they were queued, so what a later statement reads is what the
same statements run one by one would have left. A deferred statement that fails raises from that
next statement or `flush`, wrapped as `conn.execute` would wrap it. Before SQLAlchemy runs anything
on the connection (a query, a SAVEPOINT, a RELEASE) and before a COMMIT, what is queued is sent
first; a ROLLBACK (to a savepoint, or of the transaction) drops it unsent, as it would have been
undone (`install`). On SQLite a deferred statement runs at once: there is no round trip to save.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Connection, Dialect, Engine, event, exc
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

    def rows(self, dialect: Dialect, description: Any, fetched: list[Any]) -> list[Record]:
        if self.row is None:
            # As SQLAlchemy's result metadata does: by position, each column's processor for the
            # type code the driver reports. The processors are in place before `row` says so, for
            # any other thread that reads them.
            self.result_processors = [
                column.type._cached_result_processor(dialect, entry[1])
                for column, entry in zip(self.result_columns, description, strict=True)
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

    def defer(self, conn: Connection, params: Mapping[str, Any]) -> None:
        """Run the statement once, with the next round trip of `conn` (see the module's docstring)."""
        if not _pipelines(conn):
            self._run(conn, params, fetch=False)
            return
        compiled = self._compile(conn, params)
        _queue(conn).append(_Queued(compiled.sql, compiled.values(params), many=False))

    def defer_rows(self, conn: Connection, params: Mapping[str, Any]) -> Later:
        """`rows`, with the next round trip of `conn`: the rows are in the answer once it has returned."""
        later = Later()
        if not _pipelines(conn):
            later.rows = self.rows(conn, params)
            return later
        compiled = self._compile(conn, params)
        values = compiled.values(params)
        _queue(conn).append(_Queued(compiled.sql, values, many=False, later=(compiled, later)))
        return later

    def defer_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """`execute_many`, with the next round trip of `conn`."""
        if not _pipelines(conn):
            self.execute_many(conn, rows)
            return
        compiled = self._compile(conn, rows[0])
        _queue(conn).append(_Queued(compiled.sql, [compiled.values(row) for row in rows], many=True))

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
        if _pipelines(conn):  # in one round trip, as psycopg's would be, but ended as `_send` ends it
            _queue(conn).append(_Queued(compiled.sql, [compiled.values(row) for row in rows], many=True))
            flush(conn)
            return
        dbapi_connection = _dbapi_connection(conn)
        values: Any = None
        cursor: Any = None
        try:
            values = [compiled.values(row) for row in rows]
            cursor = dbapi_connection.cursor()
            cursor.executemany(compiled.sql, values)
        except BaseException as error:
            conn._handle_dbapi_exception(error, compiled.sql, values, cursor, None)
        cursor.close()

    def _run(self, conn: Connection, params: Mapping[str, Any], *, fetch: bool) -> tuple[int, list[Record]]:
        compiled = self._compile(conn, params)
        if conn.info.get(_DEFERRED) or _begins(conn):  # one round trip with the queued ones, or BEGIN
            sent = _send(conn, [*_take(conn), _Queued(compiled.sql, compiled.values(params), many=False)])
            try:
                rows = compiled.rows(conn.dialect, sent.description, sent.fetchall()) if fetch else []
                count = sent.rowcount
            finally:
                sent.close()
            return count, rows
        dbapi_connection = _dbapi_connection(conn)
        values: Any = None
        cursor: Any = None
        try:
            values = compiled.values(params)
            cursor = dbapi_connection.cursor()
            cursor.execute(compiled.sql, values)
            rows = compiled.rows(conn.dialect, cursor.description, cursor.fetchall()) if fetch else []
            count = cursor.rowcount
        except BaseException as error:
            conn._handle_dbapi_exception(error, compiled.sql, values, cursor, None)
        cursor.close()
        return count, rows


_DEFERRED = "writ_deferred_statements"
"""`conn.info` key of the statements queued on a connection for its next round trip."""


class Later:
    """The rows of a deferred statement, there once the round trip it went with has returned."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[Record] | None = None


class _Queued:
    __slots__ = ("sql", "values", "many", "later")

    def __init__(
        self, sql: str, values: Any, *, many: bool, later: tuple[_Compiled, Later] | None = None
    ) -> None:
        self.sql, self.values, self.many, self.later = sql, values, many, later


def _pipelines(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


_IDLE = 0
"""libpq's PQTRANS_IDLE: no transaction open on the connection."""


def _begins(conn: Connection) -> bool:
    """Whether the next statement on `conn` starts its transaction (PostgreSQL, none open yet).

    psycopg sends a transaction's BEGIN alone and waits for it. Sent by `_send` in the same pipeline
    as the first statement instead, it costs no round trip of its own. For that the connection is put
    in autocommit for the rest of the transaction: psycopg then adds no BEGIN of its own, and COMMIT
    and ROLLBACK end the transaction as before. The next transaction's start (`install`) or the
    connection's return to the pool puts it back.
    """
    if not _pipelines(conn):
        return False
    dbapi_connection = conn.connection.dbapi_connection
    return (
        dbapi_connection is not None
        and not dbapi_connection.autocommit
        and dbapi_connection.isolation_level is None
        and dbapi_connection.read_only is None
        and dbapi_connection.deferrable is None
        and dbapi_connection.info.transaction_status == _IDLE
    )


def _queue(conn: Connection) -> list[_Queued]:
    queued: list[_Queued] | None = conn.info.get(_DEFERRED)
    if queued is None:
        queued = conn.info[_DEFERRED] = []
    return queued


def _take(conn: Connection) -> list[_Queued]:
    queued: list[_Queued] = conn.info.pop(_DEFERRED, None) or []
    return queued


def flush(conn: Connection) -> None:
    """Send what is deferred on `conn` now, in one round trip.

    Raises:
        what the first deferred statement that failed raised, wrapped as `conn.execute` wraps it.
    """
    queued = _take(conn)
    if queued:
        _send(conn, queued).close()


def _send(conn: Connection, statements: list[_Queued]) -> Any:
    """Run `statements` in one pipeline (one sync); returns the cursor of the last one, read."""
    dbapi_connection = _dbapi_connection(conn)
    cursor: Any = None
    answers: list[tuple[Any, tuple[_Compiled, Later]]] = []
    if _begins(conn):  # BEGIN goes with them (see `_begins`)
        dbapi_connection.autocommit = True
        statements = [_Queued("BEGIN", None, many=False), *statements]
    try:
        with _pipeline(dbapi_connection):
            for statement in statements:
                cursor = dbapi_connection.cursor()
                if statement.many:
                    cursor.executemany(statement.sql, statement.values)
                else:
                    cursor.execute(statement.sql, statement.values)
                if statement.later is not None:
                    answers.append((cursor, statement.later))
        for answered, (compiled, later) in answers:
            later.rows = compiled.rows(conn.dialect, answered.description, answered.fetchall())
    except BaseException as error:
        failed = _failed(statements)
        conn._handle_dbapi_exception(error, failed.sql, failed.values, cursor, None)
    return cursor


class _SyncedPipeline(psycopg.Pipeline):
    """psycopg's pipeline, left with a Sync as its last message, not a Sync and then a Flush.

    PostgreSQL arms `idle_in_transaction_session_timeout` when it answers a Sync, and disarms it when
    the next message comes: after psycopg's own exit (Sync, Flush), a session that then sat idle in
    its transaction (a replica frozen there) would hold the log head's lock for good.
    """

    def _exit_gen(self) -> Any:
        yield from self._sync_gen()


@contextmanager
def _pipeline(dbapi_connection: Any) -> Iterator[None]:
    # As `psycopg.Connection.pipeline` does, with the pipeline above (not nested: nothing else here
    # opens one on a connection of the store's engine).
    with dbapi_connection.lock:
        if dbapi_connection._pipeline is not None:
            raise exc.InvalidRequestError("a pipeline is already open on this connection")
        pipeline = dbapi_connection._pipeline = _SyncedPipeline(dbapi_connection)
    try:
        with pipeline:
            yield
    finally:
        with dbapi_connection.lock:
            dbapi_connection._pipeline = None


def _failed(statements: list[_Queued]) -> _Queued:
    # What the error's message names: the statement, or every statement of the round trip.
    if len(statements) == 1:
        return statements[0]
    return _Queued(";\n".join(statement.sql for statement in statements), None, many=False)


def install(engine: Engine) -> None:
    """Keep deferred statements in order with what SQLAlchemy itself runs on `engine`'s connections."""

    def _transactions_begin(dbapi_connection: Any) -> None:
        # Undo what `_begins` did: between transactions, psycopg begins them itself again.
        if dbapi_connection.autocommit and dbapi_connection.info.transaction_status == _IDLE:
            dbapi_connection.autocommit = False

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        dbapi_connection = conn.connection.dbapi_connection
        if dbapi_connection is not None:
            _transactions_begin(dbapi_connection)

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Connection, *_args: Any) -> None:
        if conn.info.get(_DEFERRED):
            flush(conn)

    @event.listens_for(engine, "commit")
    def _commit(conn: Connection) -> None:
        if conn.info.get(_DEFERRED):
            flush(conn)

    def _drop(conn: Connection, *_args: Any) -> None:
        # An invalidated connection's queue went with it (and asking for `info` would raise).
        if not conn.invalidated:
            conn.info.pop(_DEFERRED, None)

    event.listen(engine, "rollback", _drop)
    event.listen(engine, "rollback_savepoint", _drop)

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_connection: Any, record: Any) -> None:
        record.info.pop(_DEFERRED, None)  # never sent into another checkout's transaction
        if dbapi_connection is not None and not dbapi_connection.closed:
            _transactions_begin(dbapi_connection)


def _dbapi_connection(conn: Connection) -> Any:
    # As `conn.execute` does before it executes: an invalidated connection raises here, unwrapped.
    dbapi_connection = conn.connection.dbapi_connection
    if dbapi_connection is None:
        raise exc.ResourceClosedError("the connection is closed")
    return dbapi_connection
