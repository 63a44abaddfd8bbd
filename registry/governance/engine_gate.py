"""The policy's ``required_engine_baselines``: before a version may hold an environment, each
named engine must have measured it (``specreg validate NAME@V --engine ENGINE``) on the
environment's golden set, on the version's binding, with every check passing (or, where only its
acceptance differs from our runtime's, accepted by an approver), recorded on the audit chain
(registry/governance/engine_baseline_standing.py), and (when the policy has
``max_validation_age_days``) recently enough."""

from __future__ import annotations

from datetime import datetime, timedelta

from specreg.registry.governance.engine_baseline_standing import counted_rows
from specreg.registry.governance.policy import EnvironmentPolicy
from specreg.registry.governance.queries import Condition
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.store import Session


def engine_baseline_conditions(session: Session, row: PairVersion, env: EnvironmentPolicy, *,
                               golden_sha256: str, now: datetime, policy, chain) -> list:
    """One Condition ``engine_baseline.ENGINE`` per engine the policy requires."""
    conditions = []
    label = row.label
    for engine in env.required_engine_baselines:
        name = f"engine_baseline.{engine}"
        # a row with no audit event behind it neither passes nor blocks: it is not specreg's
        judged = [s for s in counted_rows(session, row, engine, policy, chain) if s.on_chain]
        usable = [s for s in judged
                  if s.row.golden_sha256 == golden_sha256 and s.row.binding_sha256 == row.binding_sha256]
        if not usable:
            elsewhere = f" ({len(judged)} on another golden set or binding)" if judged else ""
            conditions.append(Condition(name, False, f"{label} has no {engine} engine baseline on golden set "
                                        f"{env.golden_set}{elsewhere}: run `specreg validate {label} --engine {engine}`"))
            continue
        latest = usable[0]
        stamp = f"{latest.row.engine} {latest.row.engine_version} ({latest.row.engine_build})"
        details = {"engine_baseline_id": latest.row.id, "engine_version": latest.row.engine_version,
                   "engine_build": latest.row.engine_build, "status": latest.row.status,
                   "accepted_by": latest.accepted_by}
        if not latest.counts:
            named = f"engine baseline {latest.row.id}"
            why = latest.why.replace(named, f"{named} on {stamp}", 1)
            conditions.append(Condition(name, False, why, details))
            continue
        if env.max_validation_age_days is not None:
            age_days = (now - latest.row.created_at) / timedelta(days=1)
            if age_days > env.max_validation_age_days:
                conditions.append(Condition(name, False, f"engine baseline {latest.row.id} on {stamp} is {age_days:.1f} "
                                            f"days old (limit {env.max_validation_age_days:g})", details))
                continue
        conditions.append(Condition(name, True, f"engine baseline {latest.row.id} on {stamp} {latest.why}", details))
    return conditions
