"""The approvers' keyring in the registry: enrolling a person's public key (an audited action by
an enroller the policy names) and the keys that count.

A key counts while (a) the audit event that enrolled it is in the verified chain and records
this very person, key and enroller, (b) its enroller is one of the policy's
``[keyring] enrollers`` and (c) no revocation that counts revoked it. A row written straight
into ``approver_keys`` has no such event and counts for nothing (``keyring_entries`` names it).
A revocation is a ``revoke-key`` event only, and it counts only when made by someone entitled to
make it: written (PostgreSQL) by its actor's own role, who was an enroller of the policy of
record in effect when it was appended. Whatever a leaked key signed stops counting from then on
(pair approvals, and policy approvals not yet in effect); a decision recorded while the key
counted keeps what it did where a revocation must not undo it: a rejection stands, and a policy
change already in effect stays in effect (``keyring_at``). The exported keyring file carries
the revocations that count, so that `specreg verify --keyring` refuses those keys at pod start
too.
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
# which policy governed from which audit event on: ((activation event id, policy), ...), oldest
# first, the built-in default from 0 (policy_record.PolicyRecord.eras)
Eras = tuple[tuple[int, Policy], ...]


def enrol(store: Store, policy: Policy, person: str, public_key_text: str, *, actor: str) -> KeyringEntry:
    """Enrol ``public_key_text`` (PEM) as ``person``'s approval key, as ``actor``. Refused
    (PolicyViolation) unless the policy names ``actor`` an enroller; a key already enrolled
    (to anyone) is refused (SpecregError)."""
    person = normalize_user(person, what="person")
    actor = normalize_user(actor, what="enroller")
    if not is_enroller(policy, actor):
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


def governing(eras: Eras, event_id: int) -> Policy:
    """The policy of ``eras`` in effect when the event ``event_id`` was appended."""
    return [policy for start, policy in eras if start < event_id][-1]


def is_enroller(policy: Policy, person: str) -> bool:
    return any(same_user(person, e) for e in policy.enrollers)


def chain_eras(session: Session, chain: list[AuditEvent], eras: Eras | None) -> Eras:
    """``eras``, or the policy of record's as replayed from ``chain`` when None."""
    if eras is not None:
        return eras
    from specreg.registry.governance.policy_record import replay  # it judges with this module's keyring

    return replay(session, chain).eras


def revocations(chain: list[AuditEvent], eras: Eras) -> tuple[dict[str, AuditEvent], list[str]]:
    """(key id -> the revocation that counts, one line per ``revoke-key`` event that does not).
    One counts when its actor's own role wrote it and that actor was an enroller of the policy
    in effect then (``eras``): whoever `keys revoke` refuses cannot revoke by appending the
    event with their grants. One that counts stays whatever later policies say: a leaked key
    must not come back by a policy change."""
    counted: dict[str, AuditEvent] = {}
    refused: list[str] = []
    for event in chain:
        if event.action != REVOKE_ACTION:
            continue
        kid = str((event.details or {}).get("key_id"))
        label = f"revocation of key {kid[:12]} by {event.actor} (event {event.id})"
        policy = governing(eras, event.id)
        if not written_by_its_actor(event):
            refused.append(f"{label}: its event says {event.actor} but database role {event.session_role} wrote it")
        elif not is_enroller(policy, event.actor):
            refused.append(f"{label}: {event.actor} is not an enroller under {policy.source} "
                           f"([keyring] enrollers: {', '.join(policy.enrollers) or 'nobody'})")
        else:
            counted.setdefault(kid, event)
    return counted, refused


def revocation_entries(revoked: dict[str, AuditEvent]) -> list[dict[str, str | None]]:
    """The revocations that count as the exported keyring file carries them."""
    return [{"key_id": kid, "revoked_by": e.actor, "revoked_at": e.created_at.isoformat(timespec="seconds") + "Z",
             "reason": e.reason} for kid, e in revoked.items()]


def revoke(store: Store, policy: Policy, key: str, *, actor: str, reason: str) -> KeyringEntry:
    """Revoke the enrolled key whose id is or starts with ``key`` (at least 8 hex digits), as
    ``actor``, one of the policy's enrollers: an audited ``revoke-key`` event. Everything the
    key signed stops counting."""
    actor = normalize_user(actor, what="enroller")
    if not is_enroller(policy, actor):
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
        if row.key_id in revocations(chain, chain_eras(session, chain, None))[0]:
            raise SpecregError(f"key {row.key_id[:12]} of {row.person} is already revoked")
        store.append_event(session, pair_name=KEYRING_EVENT_PAIR, version=None, action=REVOKE_ACTION,
                           from_state=None, to_state=None, actor=actor, reason=reason,
                           details={"person": row.person, "key_id": row.key_id, "key_row": row.id})
        return entry_of(row)


def keyring_entries(session: Session, policy: Policy, chain: list[AuditEvent] | None = None,
                    eras: Eras | None = None) -> tuple[dict[str, KeyringEntry], list[str]]:
    """(key id -> entry of every key that counts under ``policy`` at the end of ``chain`` (default:
    the verified chain), one line per keyring row that does not). ``eras``: which policy governed
    when (default: replayed from ``chain``), for whether each revocation counts."""
    if chain is None:
        chain, _ = verified_chain(session)
    revoked = revocations(chain, chain_eras(session, chain, eras))[0]
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
        elif not is_enroller(policy, row.enrolled_by):
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


def keyring_at(session: Session, chain: list[AuditEvent], eras: Eras, event: AuditEvent) -> dict[str, KeyringEntry]:
    """The keys that counted when ``event`` was appended: enrolled before it, not revoked before
    it, under the policy then in effect. What a decision recorded then is judged by, where a
    later revocation must not undo it."""
    before = [e for e in chain if e.id < event.id]
    return keyring_entries(session, governing(eras, event.id), before, eras)[0]


def list_keys(store: Store, policy: Policy) -> tuple[list[KeyringEntry], list[str], list[dict[str, str | None]]]:
    """The keys that count (for `specreg keys list` / `keys export`), one line per keyring row and
    revocation that does not, and the revocations that count (which the exported keyring carries)."""
    with store.session() as session:
        chain, _ = verified_chain(session)
        eras = chain_eras(session, chain, None)
        revoked, refused_revocations = revocations(chain, eras)
        valid, refused = keyring_entries(session, policy, chain, eras)
        return list(valid.values()), refused + refused_revocations, revocation_entries(revoked)
