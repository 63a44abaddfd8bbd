"""The proposed versions of the policy of record, as documents: the text, its hash, who proposed
it and the proposal event. What governs is replayed from the audit chain by
registry/governance/policy_record.py; a row alone decides nothing."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from specreg.registry.store.entities import PolicyDocument
from specreg.registry.store.orm import PolicyVersionRow


def policy_documents(session: Session) -> list[PolicyDocument]:
    """Every proposed policy version, oldest first."""
    return [row.to_entity() for row in session.scalars(select(PolicyVersionRow).order_by(PolicyVersionRow.version))]


def policy_document(session: Session, version: int) -> PolicyDocument | None:
    row = session.scalar(select(PolicyVersionRow).where(PolicyVersionRow.version == version))
    return row.to_entity() if row is not None else None


def add_policy_document(session: Session, *, document: str, format: str, sha256: str, proposed_by: str,
                        proposed_at: datetime, note: str | None) -> PolicyDocument:
    """Insert the next version (one above the highest proposed) -> it, not yet recorded (its
    proposal event is appended next, then ``mark_recorded``)."""
    version = (session.scalar(select(func.max(PolicyVersionRow.version))) or 0) + 1
    row = PolicyVersionRow(version=version, document=document, format=format, sha256=sha256,
                           proposed_by=proposed_by, proposed_at=proposed_at, note=note)
    session.add(row)
    session.flush()
    return row.to_entity()


def mark_recorded(session: Session, document_id: int, event_hash: str) -> PolicyDocument:
    """Name the proposal event of policy row ``document_id`` -> the document."""
    row = session.get(PolicyVersionRow, document_id)
    row.event_hash = event_hash
    session.flush()
    return row.to_entity()
