"""The Store: one transaction per public write, errors translated once, reads from the projections."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, Unpack

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, delete, exc, func, inspect, select, text

from store import agenda, approving, confirming, ports, recording, revoking, security
from store import archive as archiving
from store import events as ev
from store import oauth_clients as client_records
from store.batching import KNOWN_CALLS, GroupWriter
from store.coming import Coming
from store.commands import DecideApproval, ExpireApproval, RecordOutcome, RestorePrincipal, RevokePrincipal
from store.console_sessions import ConsoleSessionRecords
from store.db import READ_ONLY, EngineOptions, LookOptions, create_store_engine
from store.events import parse_event
from store.log import commits_in_seq_order, envelope_of, lock_all_heads, lock_head, settled_seq
from store.looking import Looks, looks_for
from store.model import (
    Admission,
    ApprovalView,
    ApprovedDenial,
    ApprovedDispatch,
    CallIdentity,
    CallRequest,
    CallView,
    ConfirmationAnswer,
    CorruptEvent,
    ReadRecord,
    RefusalRequest,
    StoreError,
    Unavailable,
)
from store.oauth import OAuthRecords
from store.partitions import SINGLE, UNPARTITIONED, Partitioning, configure, scheme_of
from store.projector import apply
from store.pruning import Pruning
from store.queues import Queues
from store.rate_limits import RateLimits
from store.reads import Reads
from store.running import Runs
from store.schema import PROJECTION_TABLES, events, log_head
from store.settling import Settlement

if TYPE_CHECKING:  # the schema methods load Alembic: `writ --help` and `writ token` need none of it
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
PRODUCER = "writ-gateway"
"""The producer a store records as unless it is opened with another (the CLI is `writ-cli`)."""
T = TypeVar("T")


@contextmanager
def _translated() -> Iterator[None]:
    # The one place where database errors become this package's errors.
    try:
        yield
    except StoreError:
        raise
    except exc.IntegrityError as error:
        raise StoreError(f"write refused by a database constraint: {error.orig}") from error
    except exc.OperationalError as error:
        raise Unavailable(f"database unavailable: {error.orig}") from error
    except exc.DBAPIError as error:
        if error.connection_invalidated:  # e.g. the server ended an idle session: the connection is gone
            raise Unavailable(f"database connection lost: {error.orig}") from error
        raise StoreError(f"database error: {error}") from error
    except exc.SQLAlchemyError as error:
        raise StoreError(f"database error: {error}") from error


def _aware(moment: datetime) -> None:
    if moment.tzinfo is None:
        raise ValueError("the store records timezone-aware datetimes only")


class Store(Settlement, Queues, Reads, RateLimits, OAuthRecords, ConsoleSessionRecords, Runs, Pruning):
    """The append-only event log with its projections and effect ledger, on SQLite or PostgreSQL."""

    def __init__(
        self,
        engine: Engine,
        *,
        producer: str = PRODUCER,
        writer: GroupWriter | None = None,
        looks: Looks | None = None,
    ) -> None:
        self._engine = engine
        self._producer = producer
        # Every write of the process goes through one writer: see store.batching (group commit).
        self._writer = writer or GroupWriter(engine)
        self._looks = looks or looks_for(engine)

    @classmethod
    def open(
        cls,
        url: str,
        *,
        producer: str = PRODUCER,
        partitioning: Partitioning = SINGLE,
        **engine: Unpack[EngineOptions],
    ) -> Store:
        """Connect lazily to `sqlite:///path` or `postgresql://...`.

        `durable=False` relaxes SQLite's fsyncs. On PostgreSQL, a session idle inside a transaction for
        `idle_transaction_timeout_s` is ended by the server, so a writer frozen mid-transaction holds the
        log head at most that long (0 leaves the server's setting); a pooled connection unused for longer
        than `ping_after_idle_s` is checked before it is used again; a process keeps `pool_size`
        connections and opens at most `max_overflow` more (defaults: `store.db`). Every event it records
        names `producer`. `partitioning` chooses the log's partitions (store.partitions; one by default).
        """
        opened = create_store_engine(url, **engine)
        configure(opened, partitioning)
        return cls(opened, producer=producer, looks=looks_for(opened, LookOptions.of(engine)))

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def writer(self) -> GroupWriter:
        """The one writer every write of this store's process goes through (group commit)."""
        return self._writer

    @property
    def producer(self) -> str:
        """What every event this store records names as its `producer`."""
        return self._producer

    def with_producer(self, producer: str) -> Store:
        """The same database and connection pool, recording its events as `producer` (a face's own name)."""
        return type(self)(self._engine, producer=producer, writer=self._writer, looks=self._looks)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._writer.close()
        self._looks.close()
        self._engine.dispose()

    def _errors_translated(self) -> contextlib.AbstractContextManager[None]:
        return _translated()

    # -- schema -------------------------------------------------------------------------------

    def migrate(self) -> None:
        """Upgrade the schema to the newest revision; running it again changes nothing."""
        with _translated(), self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Replicas starting together must not both create the tables.
                lock = text("SELECT pg_advisory_xact_lock(hashtext(current_schema() || :name))")
                conn.execute(lock, {"name": "/writ-migrate"})
            from alembic import command

            config = self._alembic_config()
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    def database_time(self) -> datetime | None:
        """The database server's clock, which every replica of a PostgreSQL store shares; None on SQLite,
        whose processes share their host's clock."""
        if self._engine.dialect.name != "postgresql":
            return None
        with self._read() as conn:
            now: datetime = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        return now.astimezone(UTC)

    def is_migrated(self) -> bool:
        """Whether the database is at the newest schema revision."""
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(self._alembic_config()).get_current_head()
        with self._read() as conn:
            return MigrationContext.configure(conn).get_current_revision() == head

    def is_empty(self) -> bool:
        """Whether the database holds none of Writ's tables yet (safe to migrate without asking)."""
        from alembic.runtime.migration import MigrationContext

        with self._read() as conn:
            return MigrationContext.configure(conn).get_current_revision() is None and not inspect(
                conn
            ).has_table("events")

    @staticmethod
    def _alembic_config() -> Config:
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        return config

    # -- writes -------------------------------------------------------------------------------

    def coming(self, commits: int) -> Coming:
        """Announce a call on its way to at most `commits` writes, for as long as the `with` lasts: the
        group writer holds a transaction back a moment only while such calls are coming (store.coming)."""
        return self._writer.coming(commits)

    def admit(self, req: CallRequest) -> Admission:
        """Record a call's intent and decision and claim its idempotency key, or join/refuse the holder."""
        _aware(req.identity.now)
        with _translated():
            return self._writer.run(
                lambda conn: recording.admit(conn, req, producer=self._producer),
                retry=True,
                heads=self._heads_of(req.identity),
            )

    async def admit_async(self, req: CallRequest) -> Admission:
        """`admit` for a caller on an event loop, which waits for the group commit without a thread."""
        _aware(req.identity.now)
        with _translated():
            return await self._writer.run_async(
                lambda conn: recording.admit(conn, req, producer=self._producer),
                retry=True,
                heads=self._heads_of(req.identity),
            )

    def admissible_read(self, req: CallRequest) -> bool:
        """Whether an allowed read may run before it is recorded (no revocation, no budget passed)."""
        _aware(req.identity.now)
        with self._look() as conn:
            return recording.admissible_read(conn, req)

    async def admissible_read_async(self, req: CallRequest) -> bool:
        """`admissible_read` for a caller on an event loop, made from the loop without a worker thread:
        on SQLite on the loop's own connection, on PostgreSQL awaited (store.looking)."""
        _aware(req.identity.now)
        with _translated():
            return await self._looks.run(lambda conn: recording.admissible_read(conn, req))

    async def due_work_async(self, *, now: datetime) -> agenda.Due:
        """Which kinds of background work are due at `now`, a hint for the periodic passes
        (store.agenda), looked at from the event loop without a worker thread."""
        _aware(now)
        with _translated():
            return await self._looks.run(lambda conn: agenda.due(conn, now=now))

    async def appended_async(self) -> int:
        """How many events were ever appended to the log (every partition's), looked at from the loop:
        whether the log moved since a checkpoint, without a worker thread."""
        with _translated():
            return await self._looks.run(agenda.appended)

    def record_read(self, rec: ReadRecord) -> Admission:
        """Record a read that already ran, intent to outcome, in one transaction (one commit).

        The call is refused instead, its answer unrecorded, if its principal was revoked or a budget
        ran out since `admissible_read`.
        """
        _aware(rec.observed_at)
        with _translated():
            return self._writer.run(
                lambda conn: recording.record_read(conn, rec, producer=self._producer),
                retry=True,
                heads=self._heads_of(rec.request.identity),
            )

    async def record_read_async(self, rec: ReadRecord) -> Admission:
        """`record_read` for a caller on an event loop (see `admit_async`)."""
        _aware(rec.observed_at)
        with _translated():
            return await self._writer.run_async(
                lambda conn: recording.record_read(conn, rec, producer=self._producer),
                retry=True,
                heads=self._heads_of(rec.request.identity),
            )

    def refuse(self, req: RefusalRequest) -> CallView:
        """Record a call refused before it could claim a key (requested + denied)."""
        _aware(req.identity.now)
        return self._write_retrying(lambda conn: recording.refuse(conn, req, producer=self._producer))

    def record_outcome(self, cmd: RecordOutcome) -> CallView:
        """Record the observed outcome of a dispatching call, under the dispatch lease's fencing `token`.

        Raises:
            NotFound: no such call.
            StaleLease: the call is not `dispatching` (settled, recovered, or never dispatched), or a
                newer lease fenced this token.
        """
        _aware(cmd.now)
        with _translated():
            return self._writer.run(
                lambda conn: recording.record_outcome(conn, cmd, producer=self._producer),
                heads=self._heads_known(cmd.tool_call_id),
            )

    async def record_outcome_async(self, cmd: RecordOutcome) -> CallView:
        """`record_outcome` for a caller on an event loop (see `admit_async`)."""
        _aware(cmd.now)
        with _translated():
            return await self._writer.run_async(
                lambda conn: recording.record_outcome(conn, cmd, producer=self._producer),
                heads=self._heads_known(cmd.tool_call_id),
            )

    def decide_approval(self, cmd: DecideApproval) -> ApprovalView:
        """Grant or reject an awaiting approval; the call becomes `approved` or `rejected`.

        Raises:
            NotFound: no such approval (for `tenant`, when given).
            StaleLease: already decided, or past its expiry.
            StoreError: the requester approving their own call where the policy forbids it.
        """
        return self._write(cmd.now, lambda conn: approving.decide(conn, cmd, producer=self._producer))

    def expire_approval(self, cmd: ExpireApproval) -> ApprovalView:
        """Expire an awaiting approval past its expiry; the call becomes `expired`.

        Raises:
            NotFound: no such approval.
            StaleLease: decided meanwhile, or not yet due.
        """
        return self._write(cmd.now, lambda conn: approving.expire(conn, cmd, producer=self._producer))

    def dispatch_approved(self, req: ApprovedDispatch) -> CallView:
        """Claim the dispatch of an approved call (compare-and-set on its status), with a lease.

        Raises:
            NotFound: no such call.
            StaleLease: the call is not `approved` (someone else dispatched or refused it).
        """
        return self._write(req.now, lambda conn: approving.dispatch(conn, req, producer=self._producer))

    def deny_approved(self, req: ApprovedDenial) -> CallView:
        """Refuse an approved call whose re-authorization failed; the call becomes `denied`.

        `policy_version` and `rule_id` name the policy and rule that refused it, when policy did.

        Raises:
            NotFound: no such call.
            StaleLease: the call is not `approved`.
        """
        return self._write(req.now, lambda conn: approving.deny(conn, req, producer=self._producer))

    def answer_confirmation(self, req: ConfirmationAnswer) -> CallView:
        """Consume a call's pending confirmation once: accept -> `dispatching` (ours), else `denied`.

        Raises:
            NotFound: no such call.
            StaleLease: not awaiting confirmation (answered before, expired) or past its expiry.
            ConfirmationMismatch: the answer is bound to another confirmation or action.
        """
        return self._write(
            req.now,
            lambda conn: confirming.answer(
                conn,
                req.tool_call_id,
                confirmation_id=req.confirmation_id,
                action_hash=req.action_hash,
                action=req.action,
                answered_by=req.answered_by,
                now=req.now,
                producer=self._producer,
                lease_owner=req.lease_owner,
                lease_s=req.lease_s,
            ),
        )

    def expire_confirmations(self, *, now: datetime, limit: int = 100) -> list[CallView]:
        """Expire calls still awaiting confirmation past their expiry (`expired`, never dispatched)."""
        _aware(now)
        with self._read() as conn:  # a look first, without the head lock, as in `recover_expired`
            if not confirming.any_due(conn, now=now):
                return []
        return self._write(
            now, lambda conn: confirming.expire_due(conn, now=now, producer=self._producer, limit=limit)
        )

    def revoke_principal(self, cmd: RevokePrincipal) -> revoking.Revocation:
        """Revoke a subject's standing in a tenant: every later call and resume of theirs is refused."""
        _aware(cmd.now)
        with _translated():
            return self._writer.run(
                lambda conn: revoking.revoke(conn, cmd, producer=self._producer),
                heads=frozenset(scheme_of(self._engine).tenant_partitions(cmd.tenant)),
            )

    def restore_principal(self, cmd: RestorePrincipal) -> revoking.Revocation:
        """Give a revoked subject its standing back in a tenant; returns the revocation it lifted.

        Raises:
            NotFound: the subject is not revoked in the tenant.
        """
        return self._write(cmd.now, lambda conn: revoking.restore(conn, cmd, producer=self._producer))

    def oauth_clients(
        self, *, tenant: str | None, now: datetime, live_after: datetime
    ) -> list[client_records.ClientSummary]:
        """The clients that signed someone in at the authorization server (in `tenant`, or anywhere)."""
        with self._read() as conn:
            return client_records.list_clients(conn, tenant=tenant, now=now, live_after=live_after)

    def oauth_client_details(
        self, *, tenant: str | None, now: datetime, live_after: datetime
    ) -> list[client_records.ClientDetail]:
        """`oauth_clients`, each with its live sign-ins and redirect URIs (the console's page)."""
        with self._read() as conn:
            return client_records.describe_clients(conn, tenant=tenant, now=now, live_after=live_after)

    def oauth_client(
        self, client_id: str, *, tenant: str | None, now: datetime, live_after: datetime
    ) -> client_records.ClientDetail:
        """A client and its live sign-ins.

        Raises:
            NotFound: it signed no one in (in `tenant`).
        """
        with self._read() as conn:
            return client_records.show_client(conn, client_id, tenant=tenant, now=now, live_after=live_after)

    def revoke_oauth_client(self, cmd: client_records.RevokeClient) -> client_records.ClientRevocation:
        """End every sign-in of a client in a tenant (`oauth.client_revoked`).

        Raises:
            NotFound: it signed no one in in the tenant.
        """
        return self._write(
            cmd.now, lambda conn: client_records.revoke_client(conn, cmd, producer=self._producer)
        )

    def record_security(self, notes: Sequence[security.SecurityNote]) -> list[ev.Event]:
        """Append a `security.*` event per note (the gateway bounds how many), in one transaction."""
        if not notes:
            return []
        for note in notes:
            _aware(note.last_at)
        return self._write(
            notes[-1].last_at, lambda conn: security.record(conn, notes, producer=self._producer)
        )

    def tenants_of(self, subject: str) -> list[str]:
        """The tenants where `subject` has been seen (runs, calls, approvals, revocations), sorted."""
        with self._read() as conn:
            return revoking.tenants_of(conn, subject)

    def rebuild(self, archive: Path | None = None) -> int:
        """Wipe the projections and effect ledger and replay the whole log in seq order (each
        partition's events archived in `archive` first, then the database's); returns events replayed.

        Raises:
            ArchiveError: the beginning of a partition was archived and `archive` does not hold it.
        """
        with _translated(), self._engine.begin() as conn:
            lock_all_heads(conn)  # so no write lands halfway through the replay
            heads = {p: seq for p, seq in conn.execute(select(log_head.c.partition, log_head.c.last_seq))}
            firsts = {
                p: first
                for p, first in conn.execute(
                    select(events.c.partition, func.min(events.c.pseq)).group_by(events.c.partition)
                )
            }
            index = None if archive is None else archiving.Manifest(archive).refresh()  # read once
            partitions = set(heads) | set(firsts) | archiving.archived_partitions(index)
            for partition in sorted(partitions):
                done = archiving.archived_seq(index, partition)
                first = firsts.get(partition, heads.get(partition, 0) + 1)
                if first > done + 1:
                    where = f"{archive} holds events up to seq {done}" if archive else "no archive was given"
                    chain_name = f"partition {partition!r} of the log" if partition else "the log"
                    raise archiving.ArchiveError(
                        f"{chain_name} in the database starts at seq {first} and {where}: rebuild needs "
                        "the archive of the events before it (`--archive DIR`)",
                        done + 1,
                        "deleted",
                        partition,
                    )
            for table in PROJECTION_TABLES:
                conn.execute(delete(table))
            replayed = 0
            for row in archiving.log_rows(conn, index, partitions):
                try:
                    event = parse_event(envelope_of(row))
                except ValidationError as exc:
                    raise CorruptEvent(row.seq, f"is not a valid {row.type} event") from exc
                apply(conn, event)
                replayed += 1
            return replayed

    def archive(
        self,
        directory: Path,
        *,
        upto_seq: int | Mapping[str, int],
        before: datetime,
        limit: int = archiving.SEGMENT_EVENTS,
    ) -> archiving.Segment | None:
        """Move the oldest sealed events of one partition (up to the seq `upto_seq` names for it: an int
        for partition "", older than `before`, their calls settled; at most `limit`) to a file in
        `directory`; None when none may go yet in any partition (see store.archive). Call it until None,
        or take `archive_all`, which visits each partition once.

        Raises:
            ArchiveError: `directory` does not hold the archive of the beginning of a partition.
        """
        return next(self.archive_all(directory, upto_seq=upto_seq, before=before, limit=limit), None)

    def archive_all(
        self,
        directory: Path,
        *,
        upto_seq: int | Mapping[str, int],
        before: datetime,
        limit: int = archiving.SEGMENT_EVENTS,
    ) -> Iterator[archiving.Segment]:
        """Each segment `archive` would move, partition by partition in name order, each committed
        before it is yielded; a partition is left when it has nothing more to move, and one archived up
        to its `upto_seq` already is not visited at all (no head taken, no query).

        Each segment is moved in a transaction of its own holding partition ""'s head (one archiver at
        a time writes the manifest) and its partition's: the writers of other partitions never wait.

        Raises:
            ArchiveError: `directory` does not hold the archive of the beginning of a partition.
        """
        _aware(before)
        upto = {UNPARTITIONED: upto_seq} if isinstance(upto_seq, int) else dict(upto_seq)
        manifest = archiving.Manifest(directory)
        with _translated():
            manifest.refresh()
            with self._engine.connect() as conn:
                known = set(conn.execute(select(log_head.c.partition)).scalars())
        for partition in sorted(p for p, seq in upto.items() if seq > 0 and p in known):
            # The manifest only grows: a partition archived up to its seq stays so, read now or later.
            while manifest.archived_seq(partition) < upto[partition]:
                with _translated(), self._engine.begin() as conn:
                    lock_head(conn, UNPARTITIONED)
                    lock_head(conn, partition)
                    manifest.refresh()  # another archiver may have moved some since
                    segment = archiving.archive(
                        conn,
                        directory,
                        partition=partition,
                        upto_seq=upto[partition],
                        before=before,
                        limit=limit,
                        done=manifest.archived_seq(partition),
                    )
                if segment is None:
                    break
                with _translated():
                    manifest.refresh()
                yield segment

    def _heads_of(self, identity: CallIdentity) -> frozenset[str]:
        """The partition a call's events go to, remembered for its later writes (a hint: see
        `GroupWriter.run`); none with one partition, whose head every write takes first anyway."""
        scheme = scheme_of(self._engine)
        if scheme.single:
            return frozenset()
        partition = scheme.partition_for(identity.tenant, identity.run_id, identity.tool_call_id)
        known = self._writer.call_heads
        if len(known) >= KNOWN_CALLS:
            del known[next(iter(known))]
        known[identity.tool_call_id] = partition
        return frozenset((partition,))

    def _heads_known(self, tool_call_id: str) -> frozenset[str]:
        partition = self._writer.call_heads.get(tool_call_id)
        return frozenset() if partition is None else frozenset((partition,))

    def _write(self, now: datetime, work: Callable[[Connection], T]) -> T:
        """Run `work` in a write transaction, committed with whatever else the process is writing.

        Every write goes through here (store.batching): a new operation groups its commits for free.
        """
        _aware(now)
        with _translated():
            return self._writer.run(work)

    def _write_retrying(self, work: Callable[[Connection], T]) -> T:
        # A unique-key conflict means a concurrent claim won; the second attempt sees it and joins.
        with _translated():
            return self._writer.run(work, retry=True)

    def _settled_seq(self) -> int | None:
        """What a cursor by seq may pass: every event up to it has committed, or never will (None: every
        committed event, where the log commits in seq order, asked of no connection)."""
        if commits_in_seq_order(self._engine):
            return None
        with self._look() as conn:
            return settled_seq(conn)

    @contextmanager
    def _look(self) -> Iterator[Connection]:
        """A read that needs no snapshot across its statements: on PostgreSQL, no change of isolation
        level (two more round trips) as `_read` makes."""
        with _translated(), self._engine.connect() as conn:
            conn.execution_options(**{READ_ONLY: True})
            with conn.begin():
                yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with _translated(), self._engine.connect() as conn:
            conn.execution_options(**{READ_ONLY: True})
            if conn.dialect.name == "postgresql":
                # One snapshot for multi-statement reads such as the audit walk.
                conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn


# mypy checks here that the one SQL store implements every port (structurally, as callers rely on).
_Standing: type[ports.Standing] = Store
_CallReads: type[ports.CallReads] = Store
_Contradictions: type[ports.Contradictions] = Store
_Outcomes: type[ports.Outcomes] = Store
_CallLedger: type[ports.CallLedger] = Store
_Approvals: type[ports.Approvals] = Store
_Resumption: type[ports.Resumption] = Store
_Reconciliation: type[ports.Reconciliation] = Store
_Agenda: type[ports.Agenda] = Store
_Recovery: type[ports.Recovery] = Store
_Pruning: type[ports.Pruning] = Store
_ManualResolutions: type[ports.ManualResolutions] = Store
_Outbox: type[ports.Outbox] = Store
_Revocations: type[ports.Revocations] = Store
_Oversight: type[ports.Oversight] = Store
_CallStatus: type[ports.CallStatus] = Store
_OAuthGrants: type[ports.OAuthGrants] = Store
_ConsoleSessions: type[ports.ConsoleSessions] = Store
_RunControls: type[ports.RunControls] = Store
