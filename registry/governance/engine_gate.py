"""The policy's ``required_engine_baselines``: before a version may hold an environment, each
named engine must have measured it (``specreg validate NAME@V --engine ENGINE``) on the
environment's golden set, on the version's binding, with parity and equivalence passing, and
(when the policy has ``max_validation_age_days``) recently enough."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.registry.governance.policy import EnvironmentPolicy
from specreg.registry.governance.queries import Condition
from specreg.registry.store.orm import EngineBaselineRow, PairVersionRow


def engine_baseline_conditions(session: Session, row: PairVersionRow, env: EnvironmentPolicy, *,
                               golden_sha256: str, now: datetime) -> list:
    """One Condition ``engine_baseline.ENGINE`` per engine the policy requires."""
    conditions = []
    label = f"{row.pair.name}@{row.version}"
    for engine in env.required_engine_baselines:
        name = f"engine_baseline.{engine}"
        rows = session.scalars(select(EngineBaselineRow)
                               .where(EngineBaselineRow.pair_version_id == row.id, EngineBaselineRow.engine == engine)
                               .order_by(EngineBaselineRow.id.desc())).all()
        usable = [r for r in rows if r.golden_sha256 == golden_sha256 and r.binding_sha256 == row.binding_sha256]
        if not usable:
            elsewhere = f" ({len(rows)} on another golden set or binding)" if rows else ""
            conditions.append(Condition(name, False, f"{label} has no {engine} engine baseline on golden set "
                                        f"{env.golden_set}{elsewhere}: run `specreg validate {label} --engine {engine}`"))
            continue
        latest = usable[0]
        stamp = f"{latest.engine} {latest.engine_version} ({latest.engine_build})"
        details = {"engine_baseline_id": latest.id, "engine_version": latest.engine_version,
                   "engine_build": latest.engine_build, "status": latest.status}
        if latest.status != "passed":
            conditions.append(Condition(name, False, f"engine baseline {latest.id} on {stamp} {latest.status}: "
                                        f"{(latest.report or {}).get('reason') or 'see the baseline'}", details))
            continue
        if env.max_validation_age_days is not None:
            age_days = (now - latest.created_at) / timedelta(days=1)
            if age_days > env.max_validation_age_days:
                conditions.append(Condition(name, False, f"engine baseline {latest.id} on {stamp} is {age_days:.1f} "
                                            f"days old (limit {env.max_validation_age_days:g})", details))
                continue
        conditions.append(Condition(name, True, f"engine baseline {latest.id} on {stamp} passed", details))
    return conditions
