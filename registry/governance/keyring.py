"""The approvers' keyring in the registry: enrolling a person's public key (an audited action by
an enroller the policy names) and the keys that count.

A key counts while (a) the audit event that enrolled it is in the verified chain and records
this very person, key and enroller, (b) its enroller is one of the policy's
``[keyring] enrollers`` and (c) no ``revoke-key`` event in the verified chain revoked it. A row
written straight into ``approver_keys`` has no such event and counts for nothing
(``keyring_entries`` names it). A revocation is an event only: whatever a leaked key signed stops
counting from then on, approvals and policy changes alike, and the exported keyring file carries
the revocation so that `specreg verify --keyring` refuses it at pod start too.
"""

from __future__ import annotations

from specreg.core.user_names import normalize_user, same_user
from specreg.core.signing import key_id, public_key_pem
from specreg.errors import PolicyViolation, SpecregError
from specreg.registry.governance.policy import Policy
from specreg.registry.governance.signatures import KeyringEntry
from specreg.registry.store import approver_keys
from specreg.registry.store.entities import AuditEvent, EnrolledKey
from specreg.registry.store.store import Session, Store, utcnow, verified_chain

ENROL_ACTION = "enrol-key"
REVOKE_ACTION = "revoke-key"
KEYRING_EVENT_PAIR = "-"  # keyring events belong to no pair


def enrol(store: Store, policy: Policy, person: str, public_key_text: str, *, actor: str) -> KeyringEntry:
    """Enrol ``public_key_text`` (PEM) as ``person``'s approval key, as ``actor``. Refused
    (PolicyViolation) unless the policy names ``actor`` an enroller; a key already enrolled
    (to anyone) is refused (SpecregError)."""
    person = normalize_user(person, what="person")
    actor = normalize_user(actor, what="enroller")
    if not any(same_user(actor, e) for e in policy.enrollers):
        raise PolicyViolation(f"{actor} may not enrol keys: policy {policy.source} names "
                              f"{', '.join(policy.enrollers) or 'nobody'} ([keyring] enrollers)")
    pem = public_key_pem(public_key_text, "public key")
    kid = key_id(pem)
    with store.session(write=True) as session:
        existing = approver_keys.key_with_id(session, kid)
        if existing is not None:
            raise SpecregError(f"key {kid[:12]} is already enrolled to {existing.person} "
                               f"(by {existing.enrolled_by} at {existing.enrolled_at.isoformat(timespec='seconds')})")
        key_row = approver_keys.add_key(session, person=person, key_id=kid, public_key=pem, enrolled_by=actor,
                                        enrolled_at=utcnow())
        store.append_event(session, pair_name=KEYRING_EVENT_PAIR, version=None, action=ENROL_ACTION, from_state=None,
                           to_state=None, actor=actor, reason=None,
                           details={"person": person, "key_id": kid, "key_row": key_row})
        return entry_of(approver_keys.mark_recorded(session, key_row, store.head_hash(session)))


def written_by_its_actor(event: AuditEvent) -> bool:
    """On PostgreSQL the server stamps each event with the role that wrote it (session_role,
    covered by the event hash): an event counts as its actor's only when that role is the actor,
    or the authenticated role recorded beside a claimed user. Events without a stamp (SQLite,
    or written before schema 0005) pass: there is no authenticated role to compare."""
    role = event.session_role
    if role is None:
        return True
    return same_user(role, str((event.details or {}).get("authenticated_role") or event.actor))


def entry_of(row: EnrolledKey) -> KeyringEntry:
    return KeyringEntry(row.person, row.key_id, row.public_key, row.enrolled_by,
                        row.enrolled_at.isoformat(timespec="seconds") + "Z")


def revocations(chain: list[AuditEvent]) -> dict[str, AuditEvent]:
    """key id -> the event that revoked it. Every revocation on the verified chain counts
    (written by its actor): a wrongly revoked key is enrolled again; a leaked one must not
    outlive a doubt about who revoked it."""
    return {str((e.details or {}).get("key_id")): e for e in chain
            if e.action == REVOKE_ACTION and written_by_its_actor(e)}


def revocation_entries(chain: list[AuditEvent]) -> list[dict[str, str | None]]:
    """The revocations as the exported keyring file carries them."""
    return [{"key_id": kid, "revoked_by": e.actor, "revoked_at": e.created_at.isoformat(timespec="seconds") + "Z",
             "reason": e.reason} for kid, e in revocations(chain).items()]


def revoke(store: Store, policy: Policy, key: str, *, actor: str, reason: str) -> KeyringEntry:
    """Revoke the enrolled key whose id is or starts with ``key`` (at least 8 hex digits), as
    ``actor``, one of the policy's enrollers: an audited ``revoke-key`` event. Everything the
    key signed stops counting."""
    actor = normalize_user(actor, what="enroller")
    if not any(same_user(actor, e) for e in policy.enrollers):
        raise PolicyViolation(f"{actor} may not revoke keys: policy {policy.source} names "
                              f"{', '.join(policy.enrollers) or 'nobody'} ([keyring] enrollers)")
    wanted = key.strip().lower()
    if len(wanted) < 8 or any(c not in "0123456789abcdef" for c in wanted):
        raise SpecregError(f"key {key!r}: give the key id (`specreg keys list` shows it), at least 8 hex digits")
    with store.session(write=True) as session:
        chain, problem = verified_chain(session)
        if problem is not None:
            raise SpecregError(f"cannot revoke a key: the audit chain does not verify ({problem})")
        rows = approver_keys.keys_with_prefix(session, wanted)
        if len(rows) != 1:
            raise SpecregError(f"key {key}: {'no enrolled key' if not rows else f'{len(rows)} enrolled keys'} "
                               f"with that id (`specreg keys list`)")
        row = rows[0]
        if row.key_id in revocations(chain):
            raise SpecregError(f"key {row.key_id[:12]} of {row.person} is already revoked")
        store.append_event(session, pair_name=KEYRING_EVENT_PAIR, version=None, action=REVOKE_ACTION,
                           from_state=None, to_state=None, actor=actor, reason=reason,
                           details={"person": row.person, "key_id": row.key_id, "key_row": row.id})
        return entry_of(row)


def keyring_entries(session: Session, policy: Policy,
                    chain: list[AuditEvent] | None = None) -> tuple[dict[str, KeyringEntry], list[str]]:
    """(key id -> entry of every key that counts, one line per keyring row that does not)."""
    if chain is None:
        chain, _ = verified_chain(session)
    revoked = revocations(chain)
    events = {e.event_hash: e for e in chain if e.action == ENROL_ACTION}
    valid: dict[str, KeyringEntry] = {}
    refused: list[str] = []
    for row in approver_keys.enrolled_keys(session):
        label = f"key {row.key_id[:12]} of {row.person}"
        event = events.get(row.event_hash) if row.event_hash else None
        details = (event.details or {}) if event is not None else {}
        if event is None or details.get("key_row") != row.id or details.get("key_id") != row.key_id \
                or not same_user(str(details.get("person")), row.person) or not same_user(event.actor, row.enrolled_by):
            refused.append(f"{label}: no matching enrolment event in the verified audit chain")
        elif not written_by_its_actor(event):
            refused.append(f"{label}: its enrolment event says {event.actor} but database role {event.session_role} "
                           f"wrote it")
        elif row.key_id in revoked:
            when = revoked[row.key_id].created_at.isoformat(timespec="seconds")
            refused.append(f"{label}: revoked by {revoked[row.key_id].actor} at {when}Z")
        elif key_id(row.public_key) != row.key_id:
            refused.append(f"{label}: its public key does not hash to its key id")
        elif not any(same_user(row.enrolled_by, e) for e in policy.enrollers):
            refused.append(f"{label}: enrolled by {row.enrolled_by}, whom policy {policy.source} does not name "
                           f"an enroller")
        else:
            valid[row.key_id] = entry_of(row)
    return valid, refused


def enrolled_entry(keyring: dict[str, KeyringEntry], kid: str, key_path: str, actor: str) -> KeyringEntry:
    """The entry of key ``kid`` (the file ``key_path``) when it counts and is enrolled to
    ``actor``, who signs with it; PolicyViolation naming the enrolment that fixes it otherwise."""
    entry = keyring.get(kid)
    if entry is None or not same_user(entry.person, actor):
        whose = f"is enrolled to {entry.person}" if entry else "is not enrolled (or its enrolment does not count)"
        raise PolicyViolation(f"key {kid[:12]} ({key_path}) {whose}, not to {actor}: an enroller runs "
                              f"`specreg keys enrol {actor} --public-key FILE.pub`")
    return entry


def list_keys(store: Store, policy: Policy) -> tuple[list[KeyringEntry], list[str], list[dict[str, str | None]]]:
    """The keys that count (for `specreg keys list` / `keys export`), the rows that do not, and
    the revocations (which the exported keyring carries)."""
    with store.session() as session:
        chain, _ = verified_chain(session)
        valid, refused = keyring_entries(session, policy, chain)
        return list(valid.values()), refused, revocation_entries(chain)
