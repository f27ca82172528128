"""The tables: the append-only log, its head, and the projections rebuilt from it."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Sequence,
    String,
    Table,
    Text,
    TypeDecorator,
    false,
    text,
)
from sqlalchemy.types import TypeEngine

from store.events import format_ts, parse_ts
from store.packing import pack, unpack


class _Bytea(LargeBinary):
    """bytea bound as the bytes themselves. SQLAlchemy's `LargeBinary` wraps each value in the driver's
    `Binary`, which psycopg only unwraps again, in Python, to dump the same bytes as its own `bytes`
    dumper does (in C): the server receives the same bytea either way."""

    def bind_processor(self, dialect: Dialect) -> None:
        return None


def _bytes_on(dialect: Dialect, sqlite: TypeEngine[Any]) -> TypeEngine[Any]:
    """The column type of a value kept as bytes: `sqlite`'s on SQLite (as it ever was), bytea elsewhere."""
    if dialect.name == "sqlite":
        return dialect.type_descriptor(sqlite)
    return _Bytea()


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend: timestamptz on PostgreSQL, sortable ISO text on SQLite."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(32))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return format_ts(value)
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            return parse_ts(value)
        moment: datetime = value  # PostgreSQL's timestamptz, which psycopg reads as an aware datetime
        return moment.astimezone(UTC)


class CompactUTCDateTime(UTCDateTime):
    """`UTCDateTime`, but on SQLite the moment as 8 bytes instead of 27 characters of text.

    The microseconds since 0001-01-01 UTC, big-endian, as `EventTime` keeps an event's time: the
    bytes sort as the text did, and a comparison or an ORDER BY on the column binds the same form.
    PostgreSQL's timestamptz is 8 bytes already. Text a row kept from before reads as it did.
    """

    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None or dialect.name != "sqlite":
            return super().process_bind_param(value, dialect)
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")  # as format_ts refuses them
        return _moment_bytes(value.astimezone(UTC).replace(tzinfo=None))

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if isinstance(value, bytes):
            return _bytes_moment(value).replace(tzinfo=UTC)
        return super().process_result_value(value, dialect)


class HexDigest(TypeDecorator[str]):
    """A sha256 digest: 32 bytes in the database, its 64 lowercase hex characters in Python."""

    impl = LargeBinary(32)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return _bytes_on(dialect, self.impl_instance)

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return None if value is None else bytes.fromhex(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):  # text a hand edit left: read as it is
            return value
        return bytes(value).hex()


class PackedText(TypeDecorator[str]):
    """JSON text kept deflated against a preset dictionary (store.packing); text in Python.

    PostgreSQL: bytea. SQLite: the column stays TEXT, whose affinity keeps a blob a blob, so rows
    written before packing are read as the text they are and need no migration.
    """

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return _bytes_on(dialect, Text())

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return None if value is None else pack(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else unpack(value)


_YEAR_ONE = datetime(1, 1, 1)  # noqa: DTZ001 (naive on purpose: micros since it, in UTC)
_MICRO = timedelta(microseconds=1)


def _moment_bytes(naive_utc: datetime) -> bytes:
    """A moment in UTC as `EventTime` and `CompactUTCDateTime` keep it: the microseconds since
    0001-01-01, 8 bytes big-endian, which sort as the moments do."""
    return ((naive_utc - _YEAR_ONE) // _MICRO).to_bytes(8, "big")


def _bytes_moment(stored: bytes) -> datetime:
    """The naive UTC moment `_moment_bytes` kept.

    Raises:
        OverflowError: the bytes name a moment past year 9999.
    """
    return _YEAR_ONE + int.from_bytes(stored, "big") * _MICRO


_TIME_TEXT = 0xFF
_FORMATTED = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", re.ASCII)


class EventTime(TypeDecorator[str]):
    """An event's `occurred_at`: the moment as 8 bytes instead of its 27 characters; text in Python.

    The text `format_ts` writes (`2026-12-02T11:55:45.285464Z`) is stored as the microseconds since
    0001-01-01 UTC, big-endian, so the bytes sort as the text did and a range on the column (the audit
    export's `since` and `until`, archiving's `before`) binds and compares the same form; any other
    text as byte 0xFF and its UTF-8 (SQLite: the text itself). It reads back as the very text written,
    which is what the event's hash covers.
    """

    impl = String(32)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return _bytes_on(dialect, String(32))

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | str | None:
        if value is None:
            return None
        stored = time_bytes(value)
        if stored is None:
            return value if dialect.name == "sqlite" else bytes((_TIME_TEXT,)) + value.encode("utf-8")
        return stored

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return time_text(bytes(value))


def time_bytes(value: str) -> bytes | None:
    """The 8 bytes `EventTime` keeps for a text as `format_ts` writes it, or None for any other."""
    if not _FORMATTED.fullmatch(value):
        return None
    try:
        moment = datetime.fromisoformat(value[:-1])
    except ValueError:  # matches the pattern, names no moment (month 13, second 60)
        return None
    return _moment_bytes(moment)


def time_text(stored: bytes) -> str:
    """The text `EventTime` stored."""
    if len(stored) == 8 and stored[0] != _TIME_TEXT:
        try:
            m = _bytes_moment(stored)
        except OverflowError:  # past year 9999: a damaged row, whose hash will not match
            return stored.hex()
        return (
            f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"
            f".{m.microsecond:06d}Z"
        )
    if stored[:1] == bytes((_TIME_TEXT,)):
        stored = stored[1:]
    return stored.decode("utf-8", "replace")


_NOT_A_UUID = 0xFF
_CANONICAL_UUID = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII)


class EventId(TypeDecorator[str]):
    """An event id: a UUID's 16 bytes in the database instead of its 36 characters; text in Python.

    An id that is not a UUID in its canonical spelling (lowercase, hyphenated), or whose first byte
    would be 0xFF, is stored as byte 0xFF and its UTF-8, so every id reads back as it was written.
    """

    impl = String(64)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return _bytes_on(dialect, String(64))

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return None if value is None else id_bytes(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):  # text a hand edit left: read as it is
            return value
        return id_text(bytes(value))


def id_bytes(value: str) -> bytes:
    """The stored form of an event id (`EventId`)."""
    if _CANONICAL_UUID.fullmatch(value) and not value.startswith("ff"):
        return bytes.fromhex(value.replace("-", ""))
    return bytes((_NOT_A_UUID,)) + value.encode("utf-8")


def id_text(stored: bytes) -> str:
    """The event id `id_bytes` stored."""
    if stored[:1] == bytes((_NOT_A_UUID,)):
        return stored[1:].decode("utf-8", "replace")
    if len(stored) == 16:
        h = stored.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"  # str(uuid.UUID(bytes=...)), faster
    return stored.decode("utf-8", "replace")  # neither form (a damaged row): its hash will not match


_DIGEST_TAIL = 0xFE
_SHORT_DIGEST_TAIL = 0xFD
# (first byte, hex digits at the end): the longer first, so a sha256 keeps its 0xFE form.
_DIGEST_TAILS = ((_DIGEST_TAIL, 64), (_SHORT_DIGEST_TAIL, 40))
_HEX = frozenset("0123456789abcdef")


class _CompactText(TypeDecorator[str]):
    """Text kept in a compact form of bytes where it has one (`compact`), and as it is where it has
    none: on PostgreSQL its UTF-8, on SQLite the text itself. Read back as the text written."""

    impl: TypeEngine[Any] | type[TypeEngine[Any]] = String
    cache_ok = True

    @staticmethod
    def compact(value: str) -> bytes | None:
        raise NotImplementedError

    @staticmethod
    def expand(stored: bytes) -> str:
        raise NotImplementedError

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return _bytes_on(dialect, self.impl_instance)

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | str | None:
        if value is None:
            return None
        packed = self.compact(value)
        if packed is None:
            return value if dialect.name == "sqlite" else value.encode("utf-8")
        return packed

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return self.expand(bytes(value))


def digest_bytes(value: str) -> bytes | None:
    """`value` as `DigestText` stores it, or None if it does not end in 40 lowercase hex digits."""
    for marker, digits in _DIGEST_TAILS:
        if len(value) >= digits and _HEX.issuperset(value[-digits:]):
            return bytes((marker,)) + value[:-digits].encode("utf-8") + bytes.fromhex(value[-digits:])
    return None


def digest_text(stored: bytes) -> str:
    """The text `DigestText` stored."""
    for marker, digits in _DIGEST_TAILS:
        if stored[:1] == bytes((marker,)) and len(stored) > digits // 2:
            return stored[1 : -digits // 2].decode("utf-8", "replace") + stored[-digits // 2 :].hex()
    return stored.decode("utf-8", "replace")


class DigestText(_CompactText):
    """Text that ends in a hex digest (an action hash `sha256:<64 hex>`, a derived key
    `derived:<40 hex>`): the digest as its bytes in the database instead of its hex; text in Python.

    Stored as byte 0xFE, the text before the digest and the 32 bytes of a 64-digit digest, or byte
    0xFD, the text before it and the 20 bytes of a 40-digit one (the gateway's derived keys); any other
    text as it is (PostgreSQL: its UTF-8, which never holds byte 0xFE or 0xFD; SQLite: the text itself).
    """

    cache_ok = True
    compact = staticmethod(digest_bytes)
    expand = staticmethod(digest_text)


_MINTED_ID = 0xFC
_MINTED = re.compile("([a-z]{1,16})_([0-9a-f]{28})", re.ASCII)


@functools.lru_cache(maxsize=4096)
def call_id_bytes(value: str) -> bytes | None:
    """`value` as `CallId` stores it, or None if it is not a minted id (`<prefix>_<28 hex digits>`).

    Both ways are remembered: a write binds and reads its call's id a dozen times, and on PostgreSQL
    the match and the spelling cost about 90,000 instructions a write (+1.7 %) unremembered."""
    minted = _MINTED.fullmatch(value)
    if minted is None:
        return None
    return bytes((_MINTED_ID,)) + minted[1].encode("ascii") + bytes.fromhex(minted[2])


@functools.lru_cache(maxsize=4096)
def call_id_text(stored: bytes) -> str:
    """The id `CallId` stored."""
    if stored[:1] == bytes((_MINTED_ID,)) and 16 <= len(stored) <= 31:
        return stored[1:-14].decode("ascii", "replace") + "_" + stored[-14:].hex()
    return stored.decode("utf-8", "replace")


class CallId(_CompactText):
    """A tool call's id: an id the gateway mints (`tc_` and 28 hex digits) in 17 bytes instead of 31
    characters; text in Python.

    Every column that holds a tool_call_id has this type, so a join or a lookup compares one stored
    form with the same. Stored as byte 0xFC, the prefix before `_` and the 14 bytes of the digits (which
    sort as the digits did); any other id as it is (PostgreSQL: its UTF-8, which never holds byte
    0xFC; SQLite: the text itself), so every id reads back as it was written.
    """

    impl = String(128)
    cache_ok = True
    compact = staticmethod(call_id_bytes)
    expand = staticmethod(call_id_text)


_ESCAPED = "\x01"


def stored_correlation(correlation_id: str | None, tool_call_id: str | None) -> str | None:
    """A correlation id as `events` and `tool_calls` keep it: "" for the call's own id.

    The gateway correlates a call in no run by its own tool_call_id, so each of its events and its
    row would repeat those 31 characters. Read back with `read_correlation`, given the same
    tool_call_id; a real "" or a text starting with byte 0x01 gets a 0x01 in front, so every value
    reads back as it was written (rows written before hold neither form and read back as they are).
    """
    if correlation_id is None:
        return None
    if correlation_id == tool_call_id:
        return ""
    if not correlation_id or correlation_id.startswith(_ESCAPED):
        return _ESCAPED + correlation_id
    return correlation_id


def read_correlation(stored: str | None, tool_call_id: str | None) -> str | None:
    """The correlation id `stored_correlation` kept."""
    if not stored:
        return stored if stored is None or tool_call_id is None else tool_call_id
    return stored[1:] if stored.startswith(_ESCAPED) else stored


def _only(condition: str) -> dict[str, Any]:
    """A partial index's condition, on both stores."""
    return {"sqlite_where": text(condition), "postgresql_where": text(condition)}


metadata = MetaData()

# The run_id indexes hold only calls in a run (0017): a call of a stateless client that names none
# is in no run, and nothing looks up the calls or events of no run; `run_id = :id` uses them as before.
_IN_A_RUN = _only("run_id IS NOT NULL")

events = Table(
    "events",
    metadata,
    # The log's global order. One partition: assigned from its head under its lock, never by a
    # sequence (a sequence can leave gaps), so it equals `pseq`. Several: from `events_seq` on
    # PostgreSQL (taken under the partition's head lock, so it grows along each chain) and the next
    # after the largest on SQLite (one writer at a time).
    # On SQLite INTEGER PRIMARY KEY: the rowid itself, so the table needs no index of seq beside it.
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False),
    # Not indexed: nothing looks an event up by its id (UUIDv7s, minted by the writer).
    Column("event_id", EventId, nullable=False),
    Column("type", String(64), nullable=False),
    Column("schema_version", Integer, nullable=False),
    # 8 bytes, not 27 characters (EventTime): the same text back.
    Column("occurred_at", EventTime, nullable=False),
    Column("producer", String(128), nullable=False),
    Column("run_id", String(128)),
    Column("tool_call_id", CallId),
    Column("approval_id", String(128)),
    Column("capability_id", String(256)),
    Column("capability_version", String(64)),
    Column("policy_version", String(128)),
    Column("correlation_id", String(256)),
    Column("causation_id", EventId),
    Column("tenant", String(128)),
    # Canonical JSON text, not a JSON type, so the text that was hashed is the text read back; stored
    # packed (store.packing), which gives back exactly that text.
    Column("payload", PackedText, nullable=False),
    # Bytes, not hex text: half the size; the hash is still computed over the hex spelling.
    Column("prev_hash", HexDigest, nullable=False),
    Column("hash", HexDigest, nullable=False),
    # The chain the event is sealed on (store.partitions) and its place in it: each partition has its
    # own head row, seq from 1 without gaps and hash chain. "" is the one partition of an unpartitioned
    # log (every log written before partitions) and the partition of events of no tenant.
    Column("partition", String(160), nullable=False, server_default=""),
    Column("pseq", BigInteger, nullable=False),
    Index("ux_events_partition_pseq", "partition", "pseq", unique=True),
    Index("ix_events_run_id", "run_id", **_IN_A_RUN),
    Index("ix_events_tool_call_id", "tool_call_id"),
    # (tenant, seq): one tenant's events in log order, as the audit export pages them.
    Index("ix_events_tenant_seq", "tenant", "seq"),
)

# PostgreSQL: the global seq of a partitioned log (no lock, so partitions do not queue on one row).
events_seq = Sequence("events_seq", metadata=metadata)

log_head = Table(
    "log_head",
    metadata,
    # One row per partition of the log: its last pseq and hash. Writers lock the rows they append to.
    Column("partition", String(160), primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
    Column("last_hash", HexDigest, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("subject", String(256), nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("call_count", Integer, nullable=False),
    # What groups its calls: `client` (writ/runId), `session` (the MCP session); None for runs made
    # per call before Writ owned its runs.
    Column("origin", String(16)),
    # `active` or `stopped` (run.stopped, run.resumed): admission refuses a stopped run's calls.
    Column("status", String(16), nullable=False, server_default="active"),
    Column("stopped_at", UTCDateTime),
    Column("stopped_by", String(256)),
    Column("stop_reason", Text),
    Index("ix_runs_tenant_started_at", "tenant", "started_at"),
)

tool_calls = Table(
    "tool_calls",
    metadata,
    Column("tool_call_id", CallId, primary_key=True),
    # None: a call in no run (a stateless client that named none).
    Column("run_id", String(128)),
    Column("tenant", String(128), nullable=False),
    Column("subject", String(256), nullable=False),
    # The call's JSON columns, packed as the payloads they repeat are.
    Column("principal", PackedText, nullable=False),
    Column("tool_name", String(256), nullable=False),
    Column("capability_id", String(256), nullable=False),
    Column("capability_version", String(64), nullable=False),
    # Hashes and derived keys as bytes (DigestText), here and in the ledger.
    Column("action_hash", DigestText(128), nullable=False),
    Column("idempotency_key", DigestText(256), nullable=False),
    Column("key_source", String(16), nullable=False),
    Column("status", String(32), nullable=False),
    Column("verification_status", String(32), nullable=False),
    Column("decision_effect", String(32), nullable=False),
    Column("reason", String(256)),
    Column("policy_version", String(128), nullable=False),
    Column("arguments", PackedText, nullable=False),
    Column("summary", Text, nullable=False),
    Column("effect_class", String(32), nullable=False),
    Column("external_request_id", String(256), nullable=False),
    Column("approval_id", String(128)),
    Column("approval_expires_at", UTCDateTime),
    Column("result", PackedText),
    Column("error", Text),
    Column("attempts", Integer, nullable=False),
    Column("dedupe_window_s", Integer, nullable=False),
    Column("correlation_id", String(256)),
    # Lets an outcome name its cause without reading the log.
    Column("last_event_id", EventId, nullable=False),
    # 8 bytes on SQLite (0019), as the ledger's claimed_at.
    Column("created_at", CompactUTCDateTime, nullable=False),
    Column("updated_at", CompactUTCDateTime, nullable=False),
    # The current lease (dispatch or reconciliation): who holds it, until when, and its fencing token.
    # The token only grows; a writer presenting an older one is refused (StaleLease).
    Column("lease_owner", String(128)),
    Column("lease_token", Integer, nullable=False, default=0),
    Column("lease_expires_at", UTCDateTime),
    Column("reconcile_attempts", Integer, nullable=False, default=0),
    Column("next_reconcile_at", UTCDateTime),
    Column("resolved_by", String(256)),
    # A call of a `confirm` capability waits for the user's answer in the client until this expiry.
    Column("confirmation_id", String(128)),
    Column("confirmation_expires_at", UTCDateTime),
    # The capability's contract when the call was requested: a pending approval for another is refused.
    Column("contract_hash", DigestText(80)),
    # Whether its last `tool_call.dispatching` sent the key scoped to the principal (store.keys), so a
    # lookup and a re-send use the key the backend got: false for calls dispatched before 0025.
    Column("key_scoped", Boolean, nullable=False, server_default=false()),
    Index("ix_tool_calls_tenant_status", "tenant", "status"),
    Index("ix_tool_calls_status_lease", "status", "lease_expires_at"),
    Index("ix_tool_calls_run_id", "run_id", **_IN_A_RUN),
    Index("ix_tool_calls_created_at", "created_at"),
    # Only calls with a lookup or a re-check scheduled (0023): every pass asks for failures due for a
    # re-check, and failed calls, which only accumulate, would otherwise be read to answer it.
    Index(
        "ix_tool_calls_status_next_reconcile",
        "status",
        "next_reconcile_at",
        **_only("next_reconcile_at IS NOT NULL"),
    ),
)

approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", String(128), primary_key=True),
    Column("tool_call_id", CallId, nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("status", String(32), nullable=False),
    Column("requester", String(256), nullable=False),
    Column("approver_role", String(128), nullable=False),
    Column("requester_may_approve", Boolean, nullable=False),
    Column("action_hash", String(128), nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("decided_by", String(256)),
    Column("decided_at", UTCDateTime),
    Column("reason", Text),
    Index("ix_approvals_tenant_status", "tenant", "status"),
    Index("ix_approvals_status_expires_at", "status", "expires_at"),  # the expiry worker's look (0020)
)

# The uniqueness of (tenant, subject, idempotency_key) is what refuses a second dispatch. A key is the
# principal's own: another agent's key of the same text neither joins nor conflicts with it.
effect_ledger = Table(
    "effect_ledger",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("subject", String(256), primary_key=True),
    Column("idempotency_key", DigestText(256), primary_key=True),
    Column("tool_call_id", CallId, nullable=False),
    Column("action_hash", DigestText(128), nullable=False),
    Column("key_source", String(16), nullable=False),
    Column("claimed_at", CompactUTCDateTime, nullable=False),
    # On SQLite the key is the table (WITHOUT ROWID): most of the row, stored once instead of twice.
    sqlite_with_rowid=False,
)

# The full arguments of a call awaiting approval, which redaction keeps out of the log: the approved call
# is dispatched with exactly these (their action hash is checked against the approval first). Not a
# projection: written with `approval.required`, deleted once the call no longer needs them.
held_arguments = Table(
    "held_arguments",
    metadata,
    Column("approval_id", String(128), primary_key=True),
    Column("tool_call_id", CallId, nullable=False),
    Column("arguments", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

# The transactional outbox: a notification is written in the transaction of the fact it announces and
# delivered at least once by a worker. Not a projection: its delivery state is not in the log.
outbox = Table(
    "outbox",
    metadata,
    Column("message_id", String(128), primary_key=True),
    Column("topic", String(64), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("approval_id", String(128)),
    Column("tool_call_id", CallId),
    Column("payload", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("last_error", Text),
    Column("lease_owner", String(128)),
    Column("lease_expires_at", UTCDateTime),
    Column("created_at", UTCDateTime, nullable=False),
    Column("delivered_at", UTCDateTime),
    Index("ix_outbox_status_next", "status", "next_attempt_at"),
)

# Subjects whose standing is revoked, per tenant (projection of `principal.revoked`).
revocations = Table(
    "revocations",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("subject", String(256), primary_key=True),
    Column("revoked_at", UTCDateTime, nullable=False),
    Column("revoked_by", String(256), nullable=False),
    Column("reason", Text),
    Column("event_id", String(64), nullable=False),
)

# Rate-limit buckets (GCRA): each key's theoretical arrival time, in seconds since the epoch. Soft
# state, not a projection: nothing in the log describes it, and losing it only forgets recent calls,
# so on PostgreSQL the migration makes it UNLOGGED (no WAL: taking a token needs no flush at commit).
rate_buckets = Table(
    "rate_buckets",
    metadata,
    Column("bucket", String(512), primary_key=True),
    Column("tat", Float(precision=53), nullable=False),
)

# Budget counters (issue 13): the sum of the charges recorded with each `tool_call.requested`, per
# budget, scope and window. A projection: `writ store rebuild` sums them again from the log.
budget_counters = Table(
    "budget_counters",
    metadata,
    Column("counter_key", String(64), primary_key=True),
    Column("budget_id", String(256), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("used_micros", BigInteger, nullable=False),
    Column("window_start", UTCDateTime),
    Column("resets_at", UTCDateTime),
    Index("ix_budget_counters_resets_at", "resets_at"),
)

# Loop marks (issue 13): one row per call counted in a loop pattern (`tool_call.requested` loops) and
# one per pattern found to loop (`loop.detected`, kind "detected"). A projection, rebuilt from the log.
loop_marks = Table(
    "loop_marks",
    metadata,
    Column("pattern_key", String(64), primary_key=True),
    Column("tool_call_id", CallId, primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("seq", BigInteger, nullable=False),
    # When the pattern's window ends (None for marks recorded before it was kept): the prune's key.
    Column("resets_at", UTCDateTime),
    Index("ix_loop_marks_resets_at", "resets_at"),
)

# The authorization server's state (issue 12). Not projections: none of it is in the log, and a
# rebuild leaves it alone. Secrets (client secrets, codes, refresh tokens) are kept as sha256 digests.
oauth_clients = Table(
    "oauth_clients",
    metadata,
    Column("client_id", String(128), primary_key=True),
    Column("secret_hash", String(64)),
    # The RFC 7591 metadata as registered (canonical JSON).
    Column("metadata", Text, nullable=False),
    Column("issued_at", UTCDateTime, nullable=False),
    # A client known by its Client ID Metadata Document (client_id is the document's https URL): the
    # document as last fetched is kept until this time, shared by every replica. NULL: registered.
    Column("document_fresh_until", UTCDateTime),
)

# A grant family: one sign-in, and every code, refresh token and access token descending from it.
# Revoking it (a replayed code, a reused refresh token, `writ principals revoke`, RFC 7009) ends them all.
oauth_families = Table(
    "oauth_families",
    metadata,
    Column("family_id", String(64), primary_key=True),
    Column("client_id", String(128), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("subject", String(256), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("revoked_at", UTCDateTime),
    Column("revoked_reason", String(64)),
    Index("ix_oauth_families_principal", "tenant", "subject"),
)

oauth_codes = Table(
    "oauth_codes",
    metadata,
    Column("code_hash", String(64), primary_key=True),
    Column("family_id", String(64), nullable=False),
    Column("client_id", String(128), nullable=False),
    Column("redirect_uri", Text, nullable=False),
    Column("scope", Text, nullable=False),
    Column("resource", Text, nullable=False),
    Column("code_challenge", String(128), nullable=False),
    Column("code_challenge_method", String(16), nullable=False),
    # The principal the code speaks for: subject, tenant, roles, groups (canonical JSON).
    Column("grantee", Text, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("used_at", UTCDateTime),
    # OpenID Connect: the request's nonce (for the ID token, and to refuse a replayed request) and
    # when the user signed in.
    Column("nonce", Text),
    Column("auth_time", UTCDateTime),
    # Every code issued deletes the long-expired ones: by this index, not by reading the table.
    Index("ix_oauth_codes_expires_at", "expires_at"),
    Index("ix_oauth_codes_client_nonce", "client_id", "nonce"),
)

oauth_refresh_tokens = Table(
    "oauth_refresh_tokens",
    metadata,
    Column("token_hash", String(64), primary_key=True),
    Column("family_id", String(64), nullable=False),
    Column("client_id", String(128), nullable=False),
    Column("scope", Text, nullable=False),
    Column("resource", Text, nullable=False),
    Column("grantee", Text, nullable=False),
    Column("issued_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("used_at", UTCDateTime),
    Column("auth_time", UTCDateTime),  # the family's sign-in, for the ID tokens of refreshes
    # Likewise every rotation; a family is revoked in oauth_families, never looked up here.
    Index("ix_oauth_refresh_tokens_expires_at", "expires_at"),
)

# The web console's sign-in sessions (store.console_sessions). Not a projection: none of it is in the
# log, and a rebuild leaves it alone. The browser holds the session id; only its sha256 is kept here.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("session_hash", HexDigest, primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("subject", String(256), nullable=False),
    # The principal the console acts as (`PrincipalRecord.to_json()`, canonical JSON).
    Column("principal", Text, nullable=False),
    # The sign-in at Writ's authorization server the pasted token came from, if it did: revoking that
    # grant family ends the session too. None for a token of any other issuer.
    Column("grant_family", String(64)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    # A revocation deletes the principal's sessions; every login deletes the expired ones.
    Index("ix_console_sessions_principal", "tenant", "subject"),
    Index("ix_console_sessions_expires_at", "expires_at"),
)

PROJECTION_TABLES: tuple[Table, ...] = (
    runs,
    tool_calls,
    approvals,
    effect_ledger,
    revocations,
    budget_counters,
    loop_marks,
)
