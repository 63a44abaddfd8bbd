"""Environment pointers: which version of a pair holds an environment, and which held it before
(for rollback). Read and moved inside the caller's transaction: the pointer moves
(registry/governance/pointer_moves.py) lock the pair first (``Store.lock_pair``), then the
pointer (``lock=True``), so two moves of one pair queue. Whether a pointer counts (the audit
chain's newest move of it names the same holder) is governance's to say."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.registry.store.entities import EnvironmentPointer, PairVersion
from specreg.registry.store.orm import EnvironmentPointerRow, PairRow


def _row(session: Session, name: str, environment: str, *, lock: bool = False) -> EnvironmentPointerRow | None:
    pair_id = session.scalar(select(PairRow.id).where(PairRow.name == name))
    if pair_id is None:
        return None
    query = select(EnvironmentPointerRow).where(EnvironmentPointerRow.pair_id == pair_id,
                                                EnvironmentPointerRow.environment == environment)
    return session.scalar(query.with_for_update() if lock else query)


def pointer(session: Session, name: str, environment: str, *, lock: bool = False) -> EnvironmentPointer | None:
    """The pointer of ``name``'s ``environment`` (None: no version of the pair ever held it);
    ``lock``: its row is held until the transaction ends."""
    row = _row(session, name, environment, lock=lock)
    return row.to_entity() if row is not None else None


def pointers_of(session: Session, name: str | None = None) -> list[EnvironmentPointer]:
    """Every pointer (of one pair, or of all), by pair name and environment."""
    query = select(EnvironmentPointerRow).join(PairRow, PairRow.id == EnvironmentPointerRow.pair_id)
    if name is not None:
        query = query.where(PairRow.name == name)
    return [row.to_entity() for row in session.scalars(query.order_by(PairRow.name, EnvironmentPointerRow.environment))]


def pointers_in_written_order(session: Session) -> list[EnvironmentPointer]:
    """Every pointer, in the order their rows were written."""
    return [row.to_entity() for row in session.scalars(select(EnvironmentPointerRow).order_by(EnvironmentPointerRow.id))]


def hold(session: Session, name: str, environment: str, version: PairVersion, *, actor: str, now: datetime) -> None:
    """Make ``version`` the holder of ``environment``, remembering the holder it replaces (the
    pair's first holder of it gets a new pointer)."""
    row = _row(session, name, environment)
    if row is None:
        pair_id = session.scalar(select(PairRow.id).where(PairRow.name == name))
        session.add(EnvironmentPointerRow(pair_id=pair_id, environment=environment, pair_version_id=version.id,
                                          previous_version_id=None, updated_by=actor, updated_at=now))
    else:
        row.previous_version_id = row.pair_version_id
        row.pair_version_id, row.updated_by, row.updated_at = version.id, actor, now
        _moved(session, row)
    session.flush()


def restore_previous(session: Session, name: str, environment: str, *, actor: str, now: datetime) -> None:
    """Hand ``environment`` back to the holder before the current one; no earlier holder is
    remembered afterwards."""
    row = _row(session, name, environment)
    row.pair_version_id, row.previous_version_id = row.previous_version_id, None
    row.updated_by, row.updated_at = actor, now
    _moved(session, row)
    session.flush()


def held_by(session: Session, version: PairVersion) -> list[str]:
    """The environments ``version`` holds, sorted; their pointers are held until the transaction ends."""
    rows = session.scalars(select(EnvironmentPointerRow).where(
        EnvironmentPointerRow.pair_version_id == version.id).with_for_update())
    return sorted(row.environment for row in rows)


def holds_another(session: Session, version: PairVersion, environment: str) -> bool:
    """Whether ``version`` holds an environment other than ``environment``."""
    return session.scalar(select(EnvironmentPointerRow.id).where(
        EnvironmentPointerRow.pair_version_id == version.id, EnvironmentPointerRow.environment != environment)) \
        is not None


def let_go(session: Session, version: PairVersion, *, actor: str, now: datetime) -> None:
    """``version`` (being retired) holds nothing any more and is no rollback target."""
    for row in session.scalars(select(EnvironmentPointerRow).where(
            EnvironmentPointerRow.pair_version_id == version.id).with_for_update()):
        row.pair_version_id, row.updated_by, row.updated_at = None, actor, now
        _moved(session, row)
    for row in session.scalars(select(EnvironmentPointerRow).where(
            EnvironmentPointerRow.previous_version_id == version.id).with_for_update()):
        row.previous_version_id = None
        _moved(session, row)
    session.flush()


def _moved(session: Session, row: EnvironmentPointerRow) -> None:
    """The holder and previous holder are read again from the ids just set."""
    session.expire(row, ["holder", "previous"])
