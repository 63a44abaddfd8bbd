"""The tamper-evident audit log: each event hashes its content together with the hash of the
event before it, so editing or deleting any row breaks the chain at that row.

Keyed chain: with ``SPECREG_AUDIT_KEY`` set, specreg first appends an ``audit-key`` event and
from it on every event hash is HMAC-SHA256 under that key, so someone who can write the
database but does not hold the key cannot re-hash the chain after an edit. Verification with
the key set requires the chain to hold that event (a chain re-hashed without the key, or one
never written with the key, fails); without the key a keyed chain cannot be verified (fails
naming the variable). Events before the ``audit-key`` event stay plain sha256.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from datetime import datetime
from typing import Any, Iterable

from specreg.core.digests import canonical_json, sha256_hex

GENESIS_HASH = "0" * 64
KEY_ENV = "SPECREG_AUDIT_KEY"
KEY_ACTION = "audit-key"  # from this event on, every hash is an HMAC under the key


def audit_key() -> bytes | None:
    """``$SPECREG_AUDIT_KEY`` as bytes, or None when unset."""
    value = os.environ.get(KEY_ENV)
    return value.encode() if value else None


def event_hash(prev_hash: str, *, pair_name: str, version: int | None, action: str,
               from_state: str | None, to_state: str | None, actor: str, reason: str | None,
               details: dict[str, Any], created_at: datetime, key: bytes | None = None,
               session_role: str | None = None) -> str:
    """sha256 (HMAC-SHA256 under ``key`` when given) over the previous hash and the event's
    canonical content; ``session_role`` (the PostgreSQL role the server stamped on the row) is
    part of it when there is one, so a row whose stamped role is not the one it was hashed with
    breaks the chain."""
    content = {
        "prev": prev_hash, "pair": pair_name, "version": version, "action": action,
        "from": from_state, "to": to_state, "actor": actor, "reason": reason,
        "details": details, "at": created_at.isoformat(timespec="microseconds"),
    }
    if session_role is not None:
        content["role"] = session_role
    if key is not None:
        return hmac.new(key, canonical_json(content), hashlib.sha256).hexdigest()
    return sha256_hex(canonical_json(content))


def verify_chain(events: Iterable[Any], key: bytes | None = None) -> tuple[int, str | None]:
    """Walk events in id order. Returns (events checked, None) or (index, reason) at the first
    broken link. ``events`` are AuditEventRow or AuditEvent objects; ``key``: the audit key
    (``audit_key()``), needed from the chain's ``audit-key`` event on."""
    prev = GENESIS_HASH
    count = 0
    keyed = False
    for event in events:
        if event.prev_hash != prev:
            return count, f"event {event.id}: prev_hash does not match the event before it (a row was deleted or reordered)"
        keyed = keyed or event.action == KEY_ACTION
        if keyed and key is None:
            return count, (f"event {event.id}: the chain is keyed from here on; set {KEY_ENV} to verify it")
        expected = event_hash(
            prev, pair_name=event.pair_name, version=event.version, action=event.action,
            from_state=event.from_state, to_state=event.to_state, actor=event.actor,
            reason=event.reason, details=event.details or {}, created_at=event.created_at,
            key=key if keyed else None, session_role=getattr(event, "session_role", None),
        )
        if not hmac.compare_digest(expected, event.event_hash):
            return count, (f"event {event.id}: content does not match its hash (the row was edited"
                           + (f", or re-hashed without {KEY_ENV})" if keyed else ")"))
        prev = event.event_hash
        count += 1
    if key is not None and count and not keyed:
        return count, (f"{KEY_ENV} is set but the chain has no {KEY_ACTION} event: it was re-hashed without the "
                       f"key, or never written with it (the next write with the key starts keyed events)")
    return count, None
