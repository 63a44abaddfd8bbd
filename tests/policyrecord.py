"""The policy of record for tests: ``record_policy(db_url, path, folder)`` makes the policy in
``path`` govern the registry at ``db_url`` the way a team does it, by the audited four-eyes
change: proposed by one person, approved with an enrolled key by another (on PostgreSQL each
acts as their own role)."""

from __future__ import annotations

from pathlib import Path

from approvers import approval_key
from pgroles import as_user

PROPOSER, APPROVER = "policy_author", "policy_approver"


def record_policy(db_url: str, path: str | Path, folder: str | Path, *, proposer: str = PROPOSER,
                  approver: str = APPROVER) -> int:
    """Propose and approve the policy in ``path``; returns its version (it governs now)."""
    from specreg.api import Registry

    proposed = Registry(as_user(db_url, proposer), user=proposer).propose_policy(str(path))
    key = approval_key(db_url, approver, Path(folder))
    approved = Registry(as_user(db_url, approver), user=approver).approve_policy(proposed["version"], key=key)
    assert approved["active"], approved
    return proposed["version"]
