"""Least-privilege grants for one person's PostgreSQL login role (`specreg db grants ROLE`).

A person's role reads everything and may add rows, but deletes nothing and edits only what
specreg itself edits: a version's lifecycle state, the audit head, environment pointers, a
validation run as it finishes, and the event hash a decision or a keyring row points at. Audit
events are insert-only. The role that wrote each audit event, approval and keyring row is
stamped by the server (a trigger the schema owner owns, migration 0005), so what such a role
can still append is only ever recorded as its own.
"""

from __future__ import annotations

import re

from specreg.errors import UsageError

# every table of the schema (tests/adversarial/test_input_bounds.py holds this list to the ORM's)
INSERT_TABLES = ("pairs", "pair_versions", "audit_events", "audit_head", "validation_runs", "check_results",
                 "approvals", "approver_keys", "environment_pointers", "observations", "engine_baselines",
                 "policy_versions")
# column-level UPDATE: what specreg updates (and SELECT ... FOR UPDATE needs one such column)
UPDATE_COLUMNS = {
    "pairs": ("created_at",),  # never changed by specreg; lets the pair row be locked (FOR UPDATE)
    "pair_versions": ("state",),
    "audit_head": ("last_hash", "last_event_id"),
    "environment_pointers": ("pair_version_id", "previous_version_id", "updated_by", "updated_at"),
    "validation_runs": ("status", "summary", "baselines", "finished_at", "error", "mlflow_run_id", "pid"),
    "approvals": ("event_hash",),
    "approver_keys": ("event_hash",),
    "policy_versions": ("event_hash",),
}


def grants_sql(role: str) -> str:
    """The GRANT statements for ``role`` (run by the schema owner after `specreg db upgrade`)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", role):
        raise UsageError(f"role {role!r}: use a plain lower-case PostgreSQL role name (a-z 0-9 _)")
    lines = [f"GRANT USAGE ON SCHEMA public TO {role};",
              f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role};",
              f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role};",
              f"GRANT INSERT ON {', '.join(INSERT_TABLES)} TO {role};"]
    lines += [f"GRANT UPDATE ({', '.join(columns)}) ON {table} TO {role};" for table, columns in UPDATE_COLUMNS.items()]
    return "\n".join(lines) + "\n"
