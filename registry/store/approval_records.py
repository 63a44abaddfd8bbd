"""Approval and rejection rows of pair versions, as recorded. Which of them count (their audit
event on the verified chain, a signature by an enrolled key) is
registry/governance/approvals.py's to say."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.registry.store.entities import Approval, PairVersion
from specreg.registry.store.orm import ApprovalRow


def approvals_of(session: Session, version: PairVersion) -> list[Approval]:
    """Every decision row of ``version``, oldest first, whether or not it counts."""
    rows = session.scalars(select(ApprovalRow).where(ApprovalRow.pair_version_id == version.id)
                           .order_by(ApprovalRow.id))
    return [row.to_entity(version.name, version.version) for row in rows]


def add_approval(session: Session, version: PairVersion, *, decision: str, actor: str, note: str | None,
                 created_at: datetime, signature: dict, key_id: str, scope: str, source: str = "cli") -> int:
    """Insert one decision row -> its id (its audit event is appended next, then ``mark_recorded``)."""
    row = ApprovalRow(pair_version_id=version.id, decision=decision, actor=actor, note=note, source=source,
                      created_at=created_at, signature=signature, key_id=key_id, scope=scope)
    session.add(row)
    session.flush()
    return row.id


def mark_recorded(session: Session, version: PairVersion, approval_id: int, event_hash: str) -> Approval:
    """Name the audit event that recorded decision ``approval_id`` -> the decision."""
    row = session.get(ApprovalRow, approval_id)
    row.event_hash = event_hash
    session.flush()
    return row.to_entity(version.name, version.version)
