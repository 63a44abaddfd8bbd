"""Who acts: the user the registry records in every audit event (docs/governance.md)."""

from __future__ import annotations

import os

from specreg import settings
from specreg.core.user_names import normalize_user, same_user
from specreg.errors import PolicyViolation


def resolve_user(registry, claimed: str | None) -> str:
    """Who acts, normalised (specreg.core.user_names). SQLite: ``claimed`` (``--user``),
    ``$SPECREG_USER`` or the OS user (advisory). PostgreSQL: the authenticated role
    (``session_user``); a claim naming someone else is refused (PolicyViolation) unless the policy
    of record says ``[identity] allow_claimed_user = true``, and is then recorded as claimed beside
    the role in every audit event."""
    role = registry.store.authenticated_role()
    if role is None:
        return normalize_user(settings.current_user(claimed))
    role_name = normalize_user(role, what="database role")
    claimed = claimed or os.environ.get("SPECREG_USER") or None
    if claimed is not None:
        claimed = normalize_user(claimed)  # a confusable claim is refused, not matched
    if claimed is None or same_user(claimed, role_name):
        return role_name
    policy = registry.policy()
    if not policy.allow_claimed_user:
        raise PolicyViolation(
            f"identity: connected to PostgreSQL as role {role_name}, but --user/$SPECREG_USER says "
            f"{claimed!r}; on PostgreSQL the actor is the authenticated role ({policy.source} does not set "
            f"[identity] allow_claimed_user = true)")
    registry.store.event_details = {"claimed_user": claimed, "authenticated_role": role_name}
    return claimed
