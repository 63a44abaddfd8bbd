"""The policy of record, which governs every approval, promotion, gate, rollback and identity
rule: reading it (the built-in default until a first one is recorded), proposing the next one and
approving it under the four-eyes rule of the one in effect (registry/governance/policy_record.py)."""

from __future__ import annotations

from specreg.usecases.inputs import approval_key, check_text


def policy(registry, path: str | None = None):
    """The policy of record; with ``path``, the policy in that file, to preview only."""
    if path is not None:
        from specreg.registry.governance.policy import load_policy

        return load_policy(path)
    return record(registry).policy


def record(registry):
    """The policy of record with who proposed and approved it (policy_record.PolicyRecord)."""
    from specreg.registry.governance.policy_record import policy_of_record

    return policy_of_record(registry.store)


def propose(registry, path: str, note: str | None = None) -> dict:
    """Propose the policy in the file ``path`` as the next policy of record (audited)."""
    from specreg.registry.governance.policy_record import propose as propose_policy

    check_text("note", note)
    return propose_policy(registry.store, path, actor=registry.user, note=note)


def approve(registry, version: int, *, key: str | None = None, note: str | None = None) -> dict:
    """Sign this user's approval of proposed policy ``version``; the approval that meets the rule
    makes it the policy of record."""
    from specreg.registry.governance.policy_record import approve as approve_policy

    check_text("note", note)
    actor = registry.user
    return approve_policy(registry.store, version, actor=actor, key=approval_key(key, "a policy approval"), note=note)


def history(registry) -> list[dict]:
    from specreg.registry.governance.policy_record import history as policy_history

    return policy_history(registry.store)


def document(registry, version: int) -> str:
    from specreg.registry.governance.policy_record import document as policy_document

    return policy_document(registry.store, version)
