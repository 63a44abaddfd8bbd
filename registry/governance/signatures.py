"""Approvals as signatures: the statement an approver signs, checking one against a
keyring, and counting the signed decisions of a version against a threshold.

An approval or rejection is an in-toto Statement v1 (predicate ``PREDICATE_TYPE``) in a DSSE
envelope, signed with the approver's own ECDSA key (``specreg keys create``) the way the pair
lock is signed (specreg.core.signing). Its subject is ``NAME@VERSION`` with the version's binding
hash; its predicate names the decision, the environment it is for (``*``: any), the policy's
hash, the validation run the approver saw, the approver and the time. It counts only when it
verifies with a key that a keyring enrols to that very approver.

The same code counts signatures for the gate (keyring: the registry's, registry/governance/
keyring.py) and for `specreg verify` at pod start (keyring: a file the platform mounts), so the
deploy-time check needs nothing from the database. No SQLAlchemy here: verify runs in a slim
image.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from specreg.core.user_names import normalize_user, same_user
from specreg.core.signing import bundle_key_id, key_id, public_key_pem, sign_statement, verified_statement
from specreg.errors import IdentityError, SpecregError

PREDICATE_TYPE = "https://specreg.dev/approval/v1"
# a policy's approval signs another predicate type, so it can never be replayed as a pair's
POLICY_PREDICATE_TYPE = "https://specreg.dev/policy-approval/v1"
KEYRING_FORMAT = "specreg.keyring/v1"
KEYRING_FILE = "approvers.json"  # the name `specreg keys export` suggests and the k8s manifest mounts
ANY_SCOPE = "*"
APPROVED, REJECTED = "approved", "rejected"
MAX_KEYRING_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class KeyringEntry:
    """One enrolled key: whose it is, who enrolled it when."""

    person: str
    key_id: str
    public_key: str  # SubjectPublicKeyInfo PEM
    enrolled_by: str
    enrolled_at: str

    def to_dict(self) -> dict[str, str]:
        return {"person": self.person, "key_id": self.key_id, "public_key": self.public_key,
                "enrolled_by": self.enrolled_by, "enrolled_at": self.enrolled_at}


@dataclass(frozen=True)
class SignedDecision:
    """A decision whose signature verified with a key enrolled to its approver."""

    approver: str
    decision: str
    scope: str
    signed_at: datetime
    key_id: str
    enrolled_by: str
    predicate: dict[str, Any]


def approval_predicate(*, pair: str, version: int, binding_sha256: str, decision: str, scope: str,
                       policy_sha256: str, validation_run: int | None, approver: str, signed_at: datetime,
                       note: str | None) -> dict[str, str | None]:
    """What an approver signs (string values: see core.signing.sign_statement)."""
    return {"pair": pair, "version": str(version), "binding_sha256": binding_sha256, "decision": decision,
            "scope": scope, "policy_sha256": policy_sha256,
            "validation_run": str(validation_run) if validation_run is not None else None,
            "approver": approver, "signed_at": signed_at.isoformat(timespec="microseconds"), "note": note}


def sign_decision(signer, predicate: dict[str, str | None], predicate_type: str = PREDICATE_TYPE) -> dict[str, Any]:
    """The Sigstore bundle of one decision (``signer``: core.signing.load_signer)."""
    return sign_statement(signer, subject_name=f"{predicate['pair']}@{predicate['version']}",
                          subject_sha256=str(predicate["binding_sha256"]), predicate_type=predicate_type,
                          predicate=predicate)


def check_decision(bundle: Any, keyring: dict[str, KeyringEntry], *, pair: str, version: int,
                   binding_sha256: str, predicate_type: str = PREDICATE_TYPE) -> SignedDecision:
    """The decision ``bundle`` signs about ``pair@version`` with that binding, once its signature
    verifies with a key of ``keyring`` (key id -> entry) enrolled to the approver it names.
    ValueError with the reason otherwise."""
    kid = bundle_key_id(bundle)
    if kid is None:
        raise ValueError("no signature")
    entry = keyring.get(kid)
    if entry is None:
        raise ValueError(f"signed with key {kid[:12]}, which the keyring does not enrol")
    statement = verified_statement(bundle, entry.public_key, predicate_type)
    predicate = statement.get("predicate") or {}
    subject = (statement.get("subject") or [{}])[0]
    if (subject.get("name") != f"{pair}@{version}" or (subject.get("digest") or {}).get("sha256") != binding_sha256
            or predicate.get("pair") != pair or predicate.get("version") != str(version)
            or predicate.get("binding_sha256") != binding_sha256):
        raise ValueError(f"the signature is about {subject.get('name')} binding "
                         f"{str((subject.get('digest') or {}).get('sha256'))[:12]}, not {pair}@{version} "
                         f"binding {binding_sha256[:12]}")
    if predicate.get("decision") not in (APPROVED, REJECTED):
        raise ValueError(f"the signed decision {predicate.get('decision')!r} is neither approved nor rejected")
    if not same_user(str(predicate.get("approver")), entry.person):
        raise ValueError(f"signed by {entry.person}'s key but names {predicate.get('approver')!r} as approver")
    try:
        signed_at = datetime.fromisoformat(str(predicate.get("signed_at")))
    except ValueError:
        raise ValueError(f"the signed time {predicate.get('signed_at')!r} is not a time") from None
    return SignedDecision(entry.person, predicate["decision"], str(predicate.get("scope") or ANY_SCOPE),
                          signed_at.replace(tzinfo=None), kid, entry.enrolled_by, predicate)


@dataclass(frozen=True)
class Tally:
    """Signed decisions counted against a threshold."""

    passed: bool
    reason: str
    approvers: tuple[str, ...]  # the distinct people whose approvals count now
    rejected_by: str | None  # the newest standing rejection, if any


def tally(decisions: Iterable[SignedDecision], *, registrant: str, approvers: tuple[str, ...] = (),
          scope: str | None = None, threshold: int = 1, since: datetime | None = None,
          what: str = "this version") -> Tally:
    """Count ``decisions`` (in signing order): those for ``scope`` (None: any), by someone other
    than the registrant with a key not enrolled by the registrant, by one of ``approvers`` when
    given, signed at or after ``since``. A rejection withdraws every approval signed before it;
    ``threshold`` distinct people must have approved since the newest rejection."""
    who = f" from one of {', '.join(approvers)}" if approvers else ""
    relevant = [d for d in sorted(decisions, key=lambda d: d.signed_at)
                if (scope is None or d.scope in (ANY_SCOPE, scope)) and (since is None or d.signed_at >= since)]
    counted = [d for d in relevant
               if not same_user(d.approver, registrant) and not same_user(d.enrolled_by, registrant)
               and (not approvers or any(same_user(d.approver, a) for a in approvers))]
    rejections = [i for i, d in enumerate(counted) if d.decision == REJECTED]
    rejected_by = counted[rejections[-1]].approver if rejections else None
    after = counted[rejections[-1] + 1:] if rejections else counted
    people: list[str] = []
    for d in after:
        if d.decision == APPROVED and not any(same_user(d.approver, p) for p in people):
            people.append(d.approver)
    if rejected_by is not None and not people:
        note = counted[rejections[-1]].predicate.get("note")
        return Tally(False, f"rejected by {rejected_by}" + (f": {note}" if note else ""), (), rejected_by)
    if len(people) >= threshold:
        return Tally(True, f"approved by {', '.join(people)}: {len(people)} valid signature(s), {threshold} needed",
                     tuple(people), None)
    others = [d for d in relevant if d.decision == APPROVED and d not in counted]
    if not people and others:
        last = others[-1]
        if same_user(last.approver, registrant):
            why = f"approved only by the registrant {registrant} (four-eyes: another person must approve)"
        elif same_user(last.enrolled_by, registrant):
            why = (f"approved by {last.approver} with a key the registrant {registrant} enrolled "
                   f"(four-eyes: another enroller must enrol it)")
        else:
            why = f"approved by {last.approver}, who may not approve for {scope or 'this export'}{who}"
        return Tally(False, why, (), rejected_by)
    need = "an approval" if threshold == 1 else f"approvals by {threshold} people"
    have = f"signed by {', '.join(people)} only" if people else "no signed approval counts"
    return Tally(False, f"{what} needs {need} by someone other than the registrant {registrant}{who} "
                        f"({have})", tuple(people), rejected_by)


# --- the keyring file `specreg verify` reads ------------------------------------------------

def keyring_document(entries: Iterable[KeyringEntry], threshold: int | None = None,
                     revoked: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """The keyring as the file the platform mounts (`specreg keys export`): the keys that count
    and the revoked key ids (a key listed there counts for nothing, whatever else lists it)."""
    document: dict[str, Any] = {"keyring_format": KEYRING_FORMAT, "keys": [e.to_dict() for e in entries],
                                "revoked": list(revoked)}
    if threshold is not None:
        document["approvals_required"] = threshold
    return document


def read_keyring_file(path: str | Path) -> tuple[dict[str, KeyringEntry], int | None]:
    """(key id -> entry, the file's approvals_required or None) of a keyring file; SpecregError
    naming the file and field when it is not one."""
    file = Path(path)
    from specreg.core.files import read_bounded

    data = read_bounded(file, MAX_KEYRING_BYTES, "keyring")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SpecregError(f"keyring {file}: not readable JSON ({type(exc).__name__})") from None
    if not isinstance(document, dict) or document.get("keyring_format") != KEYRING_FORMAT \
            or not isinstance(document.get("keys"), list):
        raise SpecregError(f"keyring {file}: not a {KEYRING_FORMAT} file (`specreg keys export` writes one)")
    threshold = document.get("approvals_required")
    if threshold is not None and (not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1):
        raise SpecregError(f"keyring {file}: approvals_required = {threshold!r} must be a whole number >= 1")
    revoked = document.get("revoked", [])
    if not isinstance(revoked, list) or not all(isinstance(r, dict) and isinstance(r.get("key_id"), str)
                                                for r in revoked):
        raise SpecregError(f"keyring {file}: revoked must be a list of {{\"key_id\": ...}} entries")
    revoked_ids = {r["key_id"] for r in revoked}
    entries: dict[str, KeyringEntry] = {}
    for index, item in enumerate(document["keys"]):
        where = f"keyring {file}: keys[{index}]"
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("person", "public_key")):
            raise SpecregError(f"{where}: needs person and public_key")
        try:
            person = normalize_user(item["person"], what="person")
        except IdentityError as exc:
            raise SpecregError(f"{where}: {exc}") from None
        pem = public_key_pem(item["public_key"], where)
        if key_id(pem) in revoked_ids:
            continue  # revoked: what it signed counts for nothing
        entries[key_id(pem)] = KeyringEntry(person, key_id(pem), pem, str(item.get("enrolled_by") or "?"),
                                            str(item.get("enrolled_at") or "?"))
    return entries, threshold
