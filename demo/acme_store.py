"""SQLite storage of acme-payments: orders, refunds, and the one transaction that executes a refund.

Money is kept in integer minor units (cents) so that sums never drift; every seeded currency has two
decimals. Each operation opens its own connection, so the store can be used from worker threads.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id       TEXT PRIMARY KEY,
    customer       TEXT NOT NULL,
    amount_cents   INTEGER NOT NULL CHECK (amount_cents > 0),
    currency       TEXT NOT NULL,
    status         TEXT NOT NULL,
    refunded_cents INTEGER NOT NULL DEFAULT 0,
    created_at     TEXT NOT NULL,
    CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents)
);
CREATE TABLE IF NOT EXISTS refunds (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    refund_id       TEXT NOT NULL UNIQUE,
    order_id        TEXT NOT NULL REFERENCES orders (order_id),
    amount_cents    INTEGER NOT NULL CHECK (amount_cents > 0),
    currency        TEXT NOT NULL,
    reason          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    request_id      TEXT,
    status          TEXT NOT NULL,
    created_at      TEXT NOT NULL
);
-- Deliberately not UNIQUE: acme-payments executes every valid POST, duplicates included (unless it
-- runs with --dedupe, which answers a key executed before with its first refund).
CREATE INDEX IF NOT EXISTS refunds_by_idempotency_key ON refunds (idempotency_key);
"""

# (order_id, customer, amount_cents, currency)
SEED_ORDERS: tuple[tuple[str, str, int, str], ...] = (
    ("1001", "Ada Lovelace", 12_000, "EUR"),
    ("1002", "Grace Hopper", 500_000, "EUR"),
    ("1003", "Katherine Johnson", 2_500_000, "USD"),
    ("1004", "Alan Turing", 4_990, "EUR"),
    ("1005", "Margaret Hamilton", 89_900, "GBP"),
    ("1006", "Edsger Dijkstra", 7_550, "USD"),
    ("1007", "Barbara Liskov", 125_000, "CHF"),
    ("1008", "Donald Knuth", 1_999, "EUR"),
    ("1009", "Radia Perlman", 31_000, "USD"),
    ("1010", "Frances Allen", 10_000, "EUR"),
)
SEED_CREATED_AT = "2025-01-15T09:00:00+00:00"


class PaymentsError(Exception):
    """Root error of acme-payments; `code` is the machine-readable error the API answers with."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class OrderNotFound(PaymentsError):
    def __init__(self, order_id: str) -> None:
        super().__init__("order_not_found", f"no order {order_id!r}")


class RefundRejected(PaymentsError):
    """The refund is well-formed but not allowed for this order (currency, refundable balance)."""


class DeadlinePassed(PaymentsError):
    """The refund would commit after the deadline its client sent: refused, nothing was done."""

    def __init__(self, deadline: datetime, now: datetime) -> None:
        super().__init__(
            "commit_deadline_passed",
            f"the commit deadline {deadline.isoformat(timespec='milliseconds')} passed before the refund"
            f" could commit (at {now.isoformat(timespec='milliseconds')}); nothing was refunded",
        )


@dataclass(frozen=True)
class Order:
    order_id: str
    customer: str
    amount_cents: int
    currency: str
    status: str
    refunded_cents: int

    @property
    def refundable_cents(self) -> int:
        return self.amount_cents - self.refunded_cents


@dataclass(frozen=True)
class RefundRequest:
    order_id: str
    amount_cents: int
    currency: str
    reason: str
    idempotency_key: str
    request_id: str | None
    commit_deadline: datetime | None = None
    """The instant past which the client says this refund must not commit (`Writ-Commit-Deadline`)."""


@dataclass(frozen=True)
class Refund:
    refund_id: str
    order_id: str
    amount_cents: int
    currency: str
    reason: str
    idempotency_key: str
    request_id: str | None
    status: str
    created_at: str


def format_cents(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


class PaymentsStore:
    """Orders and refunds in one SQLite file (WAL)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._path = str(path)
        with closing(self._connect()) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(SCHEMA)
            with _transaction(conn):
                conn.executemany(
                    "INSERT OR IGNORE INTO orders (order_id, customer, amount_cents, currency, status,"
                    " refunded_cents, created_at) VALUES (?, ?, ?, ?, 'paid', 0, ?)",
                    [(*seed, SEED_CREATED_AT) for seed in SEED_ORDERS],
                )

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are begun explicitly, so BEGIN IMMEDIATE is ours to choose.
        conn = sqlite3.connect(self._path, timeout=10.0, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def get_order(self, order_id: str) -> Order:
        """Raises: OrderNotFound."""
        with closing(self._connect()) as conn:
            return _load_order(conn, order_id)

    def check_refund(self, request: RefundRequest) -> Order:
        """Validate a refund against the current order without executing it.

        Raises: OrderNotFound, RefundRejected.
        """
        with closing(self._connect()) as conn:
            order = _load_order(conn, request.order_id)
        _check_refundable(order, request)
        return order

    def execute_refund(
        self,
        request: RefundRequest,
        clock: Callable[[], datetime],
        *,
        not_after: datetime | None,
        dedupe: bool = False,
    ) -> tuple[Refund, bool]:
        """Check and execute one refund in a single transaction; the refund, and whether it was new.

        No deduplication by key unless `dedupe`: then a refund under a key already executed is that
        refund, and nothing is executed (found under the same write lock, so two at once make one).
        Refused, nothing written, when the transaction's clock is already at or past `not_after`: read
        once the write lock is held, so no other commit or lookup comes between the check and the commit.

        Raises: OrderNotFound, RefundRejected, DeadlinePassed.
        """
        with closing(self._connect()) as conn, _transaction(conn, immediate=True):
            # IMMEDIATE takes the write lock before reading, so two concurrent refunds cannot both
            # pass the refundable check against the same balance.
            if dedupe and (earlier := _first_refund(conn, request.idempotency_key)) is not None:
                return earlier, False
            now = clock()
            if not_after is not None and now >= not_after:
                raise DeadlinePassed(not_after, now)
            refund = Refund(
                refund_id=f"rf_{uuid.uuid4().hex[:20]}",
                order_id=request.order_id,
                amount_cents=request.amount_cents,
                currency=request.currency,
                reason=request.reason,
                idempotency_key=request.idempotency_key,
                request_id=request.request_id,
                status="succeeded",
                created_at=now.isoformat(timespec="milliseconds"),
            )
            order = _load_order(conn, request.order_id)
            _check_refundable(order, request)
            refunded = order.refunded_cents + request.amount_cents
            status = "refunded" if refunded == order.amount_cents else "partially_refunded"
            conn.execute(
                "INSERT INTO refunds (refund_id, order_id, amount_cents, currency, reason,"
                " idempotency_key, request_id, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    refund.refund_id,
                    refund.order_id,
                    refund.amount_cents,
                    refund.currency,
                    refund.reason,
                    refund.idempotency_key,
                    refund.request_id,
                    refund.status,
                    refund.created_at,
                ),
            )
            conn.execute(
                "UPDATE orders SET refunded_cents = ?, status = ? WHERE order_id = ?",
                (refunded, status, order.order_id),
            )
        return refund, True

    def first_refund(self, idempotency_key: str) -> Refund | None:
        """The first refund executed under `idempotency_key`, if any."""
        with closing(self._connect()) as conn:
            return _first_refund(conn, idempotency_key)

    def list_refunds(self, idempotency_key: str | None = None) -> list[Refund]:
        """Every executed refund, oldest first; only those with `idempotency_key` when it is given."""
        query = "SELECT * FROM refunds"
        params: tuple[str, ...] = ()
        if idempotency_key is not None:
            query += " WHERE idempotency_key = ?"
            params = (idempotency_key,)
        # Under the write lock, as a refund commits: a lookup made after a refund's deadline sees it if it
        # passed its deadline check before the lookup began, and otherwise the check comes later and
        # refuses it. A plain WAL read could miss a refund checked just in time and not yet committed.
        with closing(self._connect()) as conn, _transaction(conn, immediate=True):
            rows = conn.execute(query + " ORDER BY seq", params).fetchall()
        return [_refund(row) for row in rows]


def _first_refund(conn: sqlite3.Connection, idempotency_key: str) -> Refund | None:
    row = conn.execute(
        "SELECT * FROM refunds WHERE idempotency_key = ? ORDER BY seq LIMIT 1", (idempotency_key,)
    ).fetchone()
    return None if row is None else _refund(row)


def _refund(row: sqlite3.Row) -> Refund:
    return Refund(
        refund_id=row["refund_id"],
        order_id=row["order_id"],
        amount_cents=row["amount_cents"],
        currency=row["currency"],
        reason=row["reason"],
        idempotency_key=row["idempotency_key"],
        request_id=row["request_id"],
        status=row["status"],
        created_at=row["created_at"],
    )


@contextmanager
def _transaction(conn: sqlite3.Connection, *, immediate: bool = False) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _load_order(conn: sqlite3.Connection, order_id: str) -> Order:
    row = conn.execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone()
    if row is None:
        raise OrderNotFound(order_id)
    return Order(
        order_id=row["order_id"],
        customer=row["customer"],
        amount_cents=row["amount_cents"],
        currency=row["currency"],
        status=row["status"],
        refunded_cents=row["refunded_cents"],
    )


def _check_refundable(order: Order, request: RefundRequest) -> None:
    if request.currency != order.currency:
        raise RefundRejected(
            "currency_mismatch",
            f"order {order.order_id} is in {order.currency}, the refund asks for {request.currency}",
        )
    if request.amount_cents > order.refundable_cents:
        raise RefundRejected(
            "exceeds_refundable",
            f"order {order.order_id} has {format_cents(order.refundable_cents)} {order.currency} left to"
            f" refund, the refund asks for {format_cents(request.amount_cents)} {request.currency}",
        )
