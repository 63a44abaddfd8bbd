"""The tamper-evident audit log: each event hashes its content together with the hash of the
event before it, so editing or deleting any row breaks the chain at that row."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable

from specreg.core.fingerprint import canonical_json, sha256_hex

GENESIS_HASH = "0" * 64


def event_hash(prev_hash: str, *, pair_name: str, version: int | None, action: str,
               from_state: str | None, to_state: str | None, actor: str, reason: str | None,
               details: dict[str, Any], created_at: datetime) -> str:
    """sha256 over the previous hash and the event's canonical content."""
    content = {
        "prev": prev_hash, "pair": pair_name, "version": version, "action": action,
        "from": from_state, "to": to_state, "actor": actor, "reason": reason,
        "details": details, "at": created_at.isoformat(timespec="microseconds"),
    }
    return sha256_hex(canonical_json(content))


def verify_chain(events: Iterable[Any]) -> tuple[int, str | None]:
    """Walk events in id order. Returns (events checked, None) or (index, reason) at the first
    broken link. ``events`` are AuditEventRow or AuditEvent objects."""
    prev = GENESIS_HASH
    count = 0
    for event in events:
        if event.prev_hash != prev:
            return count, f"event {event.id}: prev_hash does not match the event before it (a row was deleted or reordered)"
        expected = event_hash(
            prev, pair_name=event.pair_name, version=event.version, action=event.action,
            from_state=event.from_state, to_state=event.to_state, actor=event.actor,
            reason=event.reason, details=event.details or {}, created_at=event.created_at,
        )
        if expected != event.event_hash:
            return count, f"event {event.id}: content does not match its hash (the row was edited)"
        prev = event.event_hash
        count += 1
    return count, None
