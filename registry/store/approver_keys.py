"""The approvers' keyring rows: a person's public key, who enrolled it and when, and the audit
event that recorded the enrolment. Which keys count is registry/governance/keyring.py's to say."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.registry.store.entities import EnrolledKey
from specreg.registry.store.orm import ApproverKeyRow


def enrolled_keys(session: Session) -> list[EnrolledKey]:
    """Every keyring row, oldest first, whether or not it counts."""
    return [row.to_entity() for row in session.scalars(select(ApproverKeyRow).order_by(ApproverKeyRow.id))]


def key_with_id(session: Session, key_id: str) -> EnrolledKey | None:
    row = session.scalar(select(ApproverKeyRow).where(ApproverKeyRow.key_id == key_id))
    return row.to_entity() if row is not None else None


def keys_with_prefix(session: Session, prefix: str) -> list[EnrolledKey]:
    """The rows whose key id starts with ``prefix`` (a person names a key by its first hex digits)."""
    return [row.to_entity() for row in session.scalars(select(ApproverKeyRow)
                                                       .where(ApproverKeyRow.key_id.startswith(prefix)))]


def add_key(session: Session, *, person: str, key_id: str, public_key: str, enrolled_by: str,
            enrolled_at: datetime) -> int:
    """Insert one keyring row -> its id (its enrolment event is appended next, then ``mark_recorded``)."""
    row = ApproverKeyRow(person=person, key_id=key_id, public_key=public_key, enrolled_by=enrolled_by,
                         enrolled_at=enrolled_at)
    session.add(row)
    session.flush()
    return row.id


def mark_recorded(session: Session, key_row: int, event_hash: str) -> EnrolledKey:
    """Name the audit event that recorded the enrolment of ``key_row`` -> the key."""
    row = session.get(ApproverKeyRow, key_row)
    row.event_hash = event_hash
    session.flush()
    return row.to_entity()
