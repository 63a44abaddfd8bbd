"""Approve: signed approvals and rejections of a version (four-eyes: never the registrant; only
after a passed validation) and the keyring of the approval keys they are signed with."""

from __future__ import annotations

from pathlib import Path

from specreg.errors import UsageError
from specreg.usecases.inputs import approval_key, check_text, pair_ref


def decide(registry, ref, decision: str, note: str | None, key: str | None, environment: str | None):
    """Sign and record this user's ``decision`` ("approved" or "rejected") of a version, for
    ``environment`` only when given -> approvals.Approval; the MLflow mirror follows."""
    from specreg.registry.governance import approvals

    check_text("note", note)
    actor = registry.user  # who acts comes first: a refused identity is refused before any key is read
    ref = pair_ref(ref)  # so does a malformed NAME@VERSION
    key = approval_key(key, "an approval" if decision == "approved" else "a rejection")
    policy = registry.policy()
    if environment is not None:
        policy.environment(environment)  # an unknown environment: one line, nothing written
    version = registry.get(ref)
    decided = approvals.decide(registry.store, policy, version.name, version.version, actor=actor,
                               decision=decision, note=note, key=key, scope=environment or approvals.ANY_SCOPE)
    registry.mirror(version.label)
    return decided


def enrol_key(registry, person: str, public_key: str):
    """Enrol the public key file ``public_key`` as ``person``'s approval key (this user must be one
    of the policy's [keyring] enrollers) -> signatures.KeyringEntry."""
    from specreg.core.files import read_text_bounded
    from specreg.core.signing import MAX_KEY_BYTES, public_key_pem
    from specreg.registry.governance.keyring import enrol

    path = Path(public_key).expanduser()
    text = read_text_bounded(path, MAX_KEY_BYTES, "public key")
    return enrol(registry.store, registry.policy(), person, public_key_pem(text, f"public key {path}"),
                 actor=registry.user)


def keyring(registry, policy=None):
    """(the enrolled keys that count, one line per keyring row that does not, the revoked keys)
    under ``policy``: the policy of record as the command read it (default: read here)."""
    from specreg.registry.governance.keyring import list_keys

    return list_keys(registry.store, registry.policy() if policy is None else policy)


def revoke_key(registry, key: str, reason: str):
    """Revoke an enrolled approval key (an enroller of the policy of record only; audited): whatever
    it signed stops counting -> signatures.KeyringEntry."""
    from specreg.registry.governance.keyring import revoke

    check_text("reason", reason)
    if not reason or not reason.strip():
        raise UsageError("keys revoke needs --reason: why the key is revoked, for the audit log")
    return revoke(registry.store, registry.policy(), key, actor=registry.user, reason=reason)
