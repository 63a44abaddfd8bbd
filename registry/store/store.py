"""The registry store: the only place that knows SQL.

One ``Store`` per database URL. ``session()`` is the one session scope: it commits on success
and rolls back on any error, so a failed operation leaves no rows behind. On SQLite, write
sessions take the write lock up front (BEGIN IMMEDIATE) with a busy timeout, so concurrent
writers queue instead of failing; on PostgreSQL, row locks (SELECT ... FOR UPDATE) on the
pair and on the audit head serialise what must be serial.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone
from typing import Any, Iterator

from sqlalchemy import event, func, inspect, select
from sqlalchemy import inspect as inspect_object
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from specreg.core.user_names import normalize_user
from specreg.errors import ImmutableError, NotFoundError, SchemaOutOfDateError, StoreError
from specreg.registry.store import audit
from specreg.registry.store.database import create_db_engine, describe_db_error, safe_url
from specreg.core.types import ModelRef
from specreg.registry.store.entities import AuditEvent, Observation, PairState, PairVersion, SpecConfig
from specreg.registry.store.lifecycle import check_transition
from specreg.registry.store.orm import (AuditEventRow, AuditHeadRow, EnvironmentPointerRow, ObservationRow, PairRow,
                                        PairVersionRow)

# The newest migration in migrations/versions; a test checks it equals alembic's head.
SCHEMA_HEAD = "0008"


def utcnow() -> datetime:
    """Naive UTC with microseconds: stored the same way by SQLite and PostgreSQL."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def refuse_changes_to_bound_data(session: Session, _flush_context, _instances) -> None:
    """A registered version binds its models, fingerprints and config for good; audit events
    are append-only. Only ``PairVersionRow.state`` may change."""
    for row in session.dirty:
        if isinstance(row, PairVersionRow):
            state = inspect_object(row)
            changed = [name for name in PairVersionRow.IMMUTABLE_COLUMNS if state.attrs[name].history.has_changes()]
            if changed:
                raise ImmutableError(f"pair version {row.version} is immutable: cannot change {', '.join(changed)}")
        elif isinstance(row, AuditEventRow) and session.is_modified(row):
            raise ImmutableError(f"audit event {row.id} is append-only")
    for row in session.deleted:
        if isinstance(row, (PairVersionRow, AuditEventRow)):
            raise ImmutableError(f"{type(row).__tablename__} rows are never deleted")


class Store:
    """SQL access for the registry. Methods return plain entities, never ORM rows."""

    def __init__(self, url: str, *, auto_create: bool = True, check: bool = True):
        self.url = url
        self.engine = create_db_engine(url)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        # merged into every audit event this Store appends (e.g. a claimed user beside the role)
        self.event_details: dict[str, Any] = {}
        self._read_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self.engine.execution_options(specreg_write=True), expire_on_commit=False)
        for factory in (self._read_sessions, self._write_sessions):
            event.listen(factory, "before_flush", refuse_changes_to_bound_data)
        if check:
            self.check_schema(auto_create=auto_create)

    # --- schema -------------------------------------------------------------------------

    def current_revision(self) -> str | None:
        try:
            with self.engine.connect() as connection:
                if not inspect(connection).has_table("alembic_version"):
                    return None
                return connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        except (OperationalError, DBAPIError) as exc:
            raise StoreError(describe_db_error(self.url, exc)) from None

    def check_schema(self, auto_create: bool = True) -> None:
        """A fresh database is migrated to the head; an out-of-date one is refused. Several
        processes starting on one fresh database queue on the migration lock: the first
        migrates, the others find the head when they get the lock (a revision read before it,
        mid-migration, is read again under it)."""
        revision = self.current_revision()
        if revision == SCHEMA_HEAD:
            return
        if auto_create:
            from specreg.registry.store.migrate import migration_lock

            # while another process migrates a fresh database, the revisions between none and the
            # head are visible one by one (a register refused "at 0001" beside five racing ones):
            # decide under the migration lock, which the migrating process holds throughout
            with self._errors(), migration_lock(self.engine):
                revision = self.current_revision()
                if revision is None:
                    self.refuse_unrecorded_tables()
                    self._upgrade()
                    return
            if revision == SCHEMA_HEAD:
                return
        if revision is None:
            self.refuse_unrecorded_tables()
        raise SchemaOutOfDateError(
            f"database {safe_url(self.url)} is at schema revision {revision or 'none'}, this specreg "
            f"needs {SCHEMA_HEAD}: run `specreg db upgrade`"
        )

    def refuse_unrecorded_tables(self) -> None:
        with self._errors(), self.engine.connect() as connection:
            existing = [t for t in inspect(connection).get_table_names() if t in Base_tables()]
        if existing:
            raise SchemaOutOfDateError(
                f"database {safe_url(self.url)} has specreg tables but no migration record; "
                f"run `specreg db upgrade`"
            )

    def authenticated_role(self) -> str | None:
        """The database role this connection authenticated as (PostgreSQL ``session_user``);
        None on SQLite, which has no authentication."""
        if self.is_sqlite:
            return None
        with self.engine.connect() as connection:
            return connection.exec_driver_sql("SELECT session_user").scalar()

    def session_role(self) -> str | None:
        """authenticated_role(), asked once per Store (a connection's session_user never changes)."""
        if not hasattr(self, "_session_role"):
            self._session_role = self.authenticated_role()
        return self._session_role

    def upgrade(self, revision: str = "head") -> None:
        """Migrate to ``revision`` under the migration lock."""
        from specreg.registry.store.migrate import migration_lock

        with self._errors(), migration_lock(self.engine):
            self._upgrade(revision)

    def _upgrade(self, revision: str = "head") -> None:
        from specreg.registry.store.migrate import run_upgrade

        run_upgrade(self.engine, revision)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Database errors as StoreError naming the database (no password)."""
        try:
            yield
        except (OperationalError, DBAPIError) as exc:
            raise StoreError(describe_db_error(self.url, exc)) from None

    # --- sessions -----------------------------------------------------------------------

    @contextlib.contextmanager
    def session(self, write: bool = False) -> Iterator[Session]:
        """The one session scope: commit on success, roll back on any error."""
        factory = self._write_sessions if write else self._read_sessions
        session = factory()
        try:
            yield session
            session.commit()
        except (OperationalError, DBAPIError) as exc:
            session.rollback()
            if isinstance(exc, IntegrityError):
                raise
            raise StoreError(describe_db_error(self.url, exc)) from None
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    # --- pair versions ------------------------------------------------------------------

    def create_version(self, *, name: str, target: ModelRef, draft: ModelRef | None, config: SpecConfig,
                       binding_sha256: str, actor: str, notes: str | None, allow_pickle: bool,
                       model_files: dict[str, list[str]] | None = None) -> tuple[PairVersion, bool]:
        """Insert version N+1 of ``name`` (or return the existing one with the same binding)
        together with its audit event, in one transaction. Returns (version, created)."""
        actor = normalize_user(actor, what="registrant")
        for attempt in range(5):
            try:
                with self.session(write=True) as session:
                    pair = session.scalar(select(PairRow).where(PairRow.name == name).with_for_update())
                    if pair is None:
                        pair = PairRow(name=name, created_at=utcnow())
                        session.add(pair)
                        session.flush()
                    existing = session.scalar(select(PairVersionRow).where(
                        PairVersionRow.pair_id == pair.id, PairVersionRow.binding_sha256 == binding_sha256))
                    if existing is not None:
                        return existing.to_entity(), False
                    latest = session.scalar(select(func.max(PairVersionRow.version)).where(PairVersionRow.pair_id == pair.id))
                    now = utcnow()
                    row = PairVersionRow(
                        pair_id=pair.id, version=(latest or 0) + 1, state=PairState.REGISTERED.value,
                        binding_sha256=binding_sha256, method=config.method.value,
                        num_speculative_tokens=config.num_speculative_tokens,
                        prompt_lookup_min=config.prompt_lookup_min, prompt_lookup_max=config.prompt_lookup_max,
                        max_batch_size_for_speculation=config.max_batch_size_for_speculation,
                        tree=[list(path) for path in config.tree] if config.tree is not None else None,
                        head=config.head,
                        suffix=config.suffix.to_dict() if config.suffix is not None else None,
                        target=target.to_dict(), draft=draft.to_dict() if draft else None,
                        registered_by=actor, registered_at=now, notes=notes, allow_pickle=allow_pickle,
                        model_files=model_files,
                    )
                    session.add(row)
                    session.flush()
                    self.append_event(session, pair_name=name, version=row.version, action="register",
                                      from_state=None, to_state=PairState.REGISTERED.value, actor=actor,
                                      reason=notes, details={"binding_sha256": binding_sha256})
                    session.flush()
                    return row.to_entity(), True
            except IntegrityError:
                # Another process created the pair or the same version number first: retry.
                if attempt == 4:
                    raise StoreError(f"could not register {name}: concurrent registrations kept colliding") from None
        raise AssertionError("unreachable")

    def version_row(self, session: Session, name: str, version: int | None, *, lock: bool = False) -> PairVersionRow:
        """The ORM row of ``name@version`` (the newest when None) inside the caller's session,
        for the registry modules that write next to it; ``lock``: SELECT ... FOR UPDATE."""
        query = select(PairVersionRow).join(PairRow).where(PairRow.name == name)
        if version is None:
            query = query.order_by(PairVersionRow.version.desc()).limit(1)
        else:
            query = query.where(PairVersionRow.version == version)
        if lock:
            query = query.with_for_update()
        row = session.scalar(query)
        if row is None:
            if version is None or session.scalar(select(PairRow.id).where(PairRow.name == name)) is None:
                raise NotFoundError(f"unknown pair {name}")
            raise NotFoundError(f"unknown version {name}@{version}")
        return row

    def pair_version(self, session: Session, name: str, version: int | None, *, lock: bool = False) -> PairVersion:
        """``name@version`` (the newest when None) read inside the caller's transaction; ``lock``:
        its row is held (SELECT ... FOR UPDATE) until the transaction ends."""
        return self.version_row(session, name, version, lock=lock).to_entity()

    def lock_pair(self, session: Session, name: str) -> None:
        """Hold the pair's row until the transaction ends: the first lock of every move of one
        pair's versions or pointers, so that two of them queue. NotFoundError for an unknown pair."""
        if session.scalar(select(PairRow.id).where(PairRow.name == name).with_for_update()) is None:
            raise NotFoundError(f"unknown pair {name}")

    def has_pair(self, session: Session, name: str) -> bool:
        return session.scalar(select(PairRow.id).where(PairRow.name == name)) is not None

    def get_version(self, name: str, version: int | None = None, *, with_events: bool = False) -> PairVersion:
        """A version (the newest when ``version`` is None). Raises NotFoundError."""
        with self.session() as session:
            row = self.version_row(session, name, version)
            events = tuple(self._events(session, name, row.version)) if with_events else ()
            return row.to_entity(events)

    def list_versions(self, name: str | None = None) -> list[PairVersion]:
        with self.session() as session:
            query = select(PairVersionRow).join(PairRow).order_by(PairRow.name, PairVersionRow.version)
            if name is not None:
                query = query.where(PairRow.name == name)
            rows = session.scalars(query).all()
            return [row.to_entity() for row in rows]

    def list_summaries(self) -> list[dict[str, Any]]:
        """Light rows for `specreg list`: no JSON columns decoded, one query."""
        with self.session() as session:
            rows = session.execute(
                select(PairRow.name, PairVersionRow.version, PairVersionRow.state, PairVersionRow.method,
                       PairVersionRow.num_speculative_tokens, PairVersionRow.registered_by,
                       PairVersionRow.registered_at)
                .join(PairRow).order_by(PairRow.name, PairVersionRow.version)
            ).all()
            held: dict[tuple[str, int], list[str]] = {}  # which environments each version holds
            for name, version, environment in session.execute(
                    select(PairRow.name, PairVersionRow.version, EnvironmentPointerRow.environment)
                    .join(PairVersionRow, EnvironmentPointerRow.pair_version_id == PairVersionRow.id)
                    .join(PairRow, PairVersionRow.pair_id == PairRow.id)
                    .order_by(EnvironmentPointerRow.environment)):
                held.setdefault((name, version), []).append(environment)
            return [
                {"name": r.name, "version": r.version, "state": r.state, "method": r.method,
                 "num_speculative_tokens": r.num_speculative_tokens, "registered_by": r.registered_by,
                 "registered_at": r.registered_at.isoformat(timespec="seconds"),
                 "environments": held.get((r.name, r.version), [])}
                for r in rows
            ]

    def transition(self, name: str, version: int, to_state: PairState, *, actor: str, action: str,
                   reason: str | None = None, details: dict[str, Any] | None = None,
                   session: Session | None = None) -> PairVersion:
        """Move a version's lifecycle state (checked) and append the audit event, atomically.
        Pass ``session`` to make the move part of a larger transaction."""
        if session is None:
            with self.session(write=True) as own:
                return self.transition(name, version, to_state, actor=actor, action=action,
                                       reason=reason, details=details, session=own)
        row = self.version_row(session, name, version, lock=True)
        current = PairState(row.state)
        check_transition(f"{name}@{version}", current, to_state)
        row.state = to_state.value
        self.append_event(session, pair_name=name, version=version, action=action, from_state=current.value,
                          to_state=to_state.value, actor=actor, reason=reason, details=details or {})
        session.flush()
        return row.to_entity()

    # --- audit --------------------------------------------------------------------------

    def append_event(self, session: Session, *, pair_name: str, version: int | None, action: str,
                     from_state: str | None, to_state: str | None, actor: str, reason: str | None,
                     details: dict[str, Any]) -> AuditEventRow:
        """Append one event to the hash chain, inside the caller's transaction."""
        actor = normalize_user(actor, what="actor")
        details = {**details, **self.event_details}
        head = session.scalar(select(AuditHeadRow).where(AuditHeadRow.id == 1).with_for_update())
        if head is None:
            head = AuditHeadRow(id=1, last_hash=audit.GENESIS_HASH, last_event_id=None)
            session.add(head)
            session.flush()
        key = audit.audit_key()
        keyed = session.scalar(select(AuditEventRow.id).where(AuditEventRow.action == audit.KEY_ACTION).limit(1))
        if keyed is not None and key is None:
            raise StoreError(f"the audit chain is keyed (event {keyed}): set {audit.KEY_ENV} to write to it")
        if keyed is None and key is not None:
            # the first write with a key: from this event on every hash is an HMAC under it
            self._append(session, head, key, pair_name="-", version=None, action=audit.KEY_ACTION, from_state=None,
                         to_state=None, actor=actor, reason=None, details={"scheme": "hmac-sha256"})
        return self._append(session, head, key, pair_name=pair_name, version=version, action=action,
                            from_state=from_state, to_state=to_state, actor=actor, reason=reason, details=details)

    def lock_audit_head(self, session: Session) -> None:
        """Hold the audit head until the transaction ends: one decision at a time on the chain."""
        session.scalar(select(AuditHeadRow).where(AuditHeadRow.id == 1).with_for_update())

    def head_hash(self, session: Session) -> str:
        """The hash of the newest event, read where this transaction holds the head's lock (it
        appended since): the event a row written beside it names."""
        return session.get(AuditHeadRow, 1).last_hash

    def _append(self, session: Session, head: AuditHeadRow, key: bytes | None, **content: Any) -> AuditEventRow:
        created_at = utcnow()
        # PostgreSQL stamps the row with session_user whatever is sent; the hash covers that role
        role = self.session_role()
        digest = audit.event_hash(head.last_hash, created_at=created_at, key=key, session_role=role, **content)
        row = AuditEventRow(**content, created_at=created_at, prev_hash=head.last_hash, event_hash=digest,
                            session_role=role)
        session.add(row)
        session.flush()
        head.last_hash, head.last_event_id = digest, row.id
        return row

    def _events(self, session: Session, name: str, version: int | None = None) -> list[AuditEvent]:
        query = select(AuditEventRow).where(AuditEventRow.pair_name == name).order_by(AuditEventRow.id)
        if version is not None:
            query = query.where(AuditEventRow.version == version)
        return [row.to_entity() for row in session.scalars(query)]

    def history(self, name: str) -> list[AuditEvent]:
        with self.session() as session:
            if session.scalar(select(PairRow.id).where(PairRow.name == name)) is None:
                raise NotFoundError(f"unknown pair {name}")
            return self._events(session, name)

    def verify_audit(self) -> tuple[int, str | None]:
        """Check the whole chain and that the head points at its last event."""
        with self.session() as session:
            events, problem = verified_chain(session)
            return len(events), problem

    def audit_head(self) -> str:
        """The hash of the newest event of the verified chain (the genesis hash when empty or
        broken at its first event): the value to anchor outside the database."""
        with self.session() as session:
            events, _ = verified_chain(session)
            return events[-1].event_hash if events else audit.GENESIS_HASH

    def anchor_position(self, head: str) -> tuple[int | None, int, str | None]:
        """Where an anchored head sits in the verified chain: (its 1-based position or None
        when the chain does not contain it, events in the verified chain, chain problem)."""
        with self.session() as session:
            events, problem = verified_chain(session)
            if head == audit.GENESIS_HASH:
                return 0, len(events), problem
            position = next((i for i, e in enumerate(events, start=1) if e.event_hash == head), None)
            return position, len(events), problem

    # --- observations -------------------------------------------------------------------

    def add_observation(self, name: str, version: int, *, environment: str | None, engine: str, url: str,
                        figures: dict[str, Any], verdict: str) -> Observation:
        """Store one live observation of a version served by an engine -> it as recorded."""
        with self.session(write=True) as session:
            row = self.version_row(session, name, version)
            observation = ObservationRow(pair_version_id=row.id, environment=environment, engine=engine, url=url,
                                         observed_at=utcnow(), figures=figures, verdict=verdict)
            session.add(observation)
            session.flush()
            return observation.to_entity(name, row.version)

    def observations(self, name: str, version: int, limit: int = 5) -> list[Observation]:
        """The newest observations of a version, newest first."""
        with self.session() as session:
            row = self.version_row(session, name, version)
            rows = session.scalars(select(ObservationRow).where(ObservationRow.pair_version_id == row.id)
                                   .order_by(ObservationRow.id.desc()).limit(limit))
            return [o.to_entity(name, row.version) for o in rows]


def verified_chain(session: Session) -> tuple[list[AuditEvent], str | None]:
    """Every audit event, in order, up to the first broken link; and the problem found (None:
    the whole chain links and the head row points at its last event)."""
    rows = session.scalars(select(AuditEventRow).order_by(AuditEventRow.id)).all()
    checked, problem = audit.verify_chain(rows, key=audit.audit_key())
    if problem:
        return [row.to_entity() for row in rows[:checked]], problem
    head = session.get(AuditHeadRow, 1)
    last_hash = rows[-1].event_hash if rows else audit.GENESIS_HASH
    if head is not None and head.last_hash != last_hash:
        return [row.to_entity() for row in rows], (f"the newest event(s) after event {rows[-1].id if rows else 0} "
                                                   f"were deleted (audit head does not match)")
    return [row.to_entity() for row in rows], None


def Base_tables() -> set[str]:
    from specreg.registry.store.orm import Base

    return set(Base.metadata.tables)
