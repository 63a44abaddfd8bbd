"""Engine baselines: which one counts (passed, or accepted by an approver, on the version's current
binding and on the audit chain: registry/governance/engine_baseline_standing.py), an approver's
signed acceptance of one, and a version's baselines in one engine's terms, what exports, alert
rules and observe for that engine compare with."""

from __future__ import annotations

from specreg.registry.store.entities import PairVersion
from specreg.usecases.inputs import approval_key, check_text, pair_ref, record_number


def engine_baselines(registry, ref, engine: str | None = None) -> list:
    """Engine baselines (registry.store.engine_baselines.EngineBaseline) of a version, oldest first."""
    from specreg.registry.store.engine_baselines import EngineBaselineStore

    version = registry.get(ref)
    return EngineBaselineStore(registry.store).list(version.name, version.version, engine)


def standings(registry, ref) -> list:
    """Every engine baseline of a version, oldest first, with whether it counts and why
    (registry.governance.engine_baseline_standing.Standing)."""
    from specreg.registry.governance.engine_baseline_standing import standings as standings_of

    version = registry.get(ref)
    return standings_of(registry.store, registry.policy(), version.name, version.version)


def accept(registry, ref, baseline_id: int, *, key: str | None = None, note: str | None = None) -> dict:
    """Sign and record this user's acceptance of an unaccepted engine baseline (see
    Registry.accept_engine_baseline) -> the baseline's standing as a dict."""
    from specreg.registry.governance.engine_baseline_standing import accept as accept_baseline

    check_text("note", note)
    actor = registry.user  # who acts comes first, then the reference, then the key
    ref = pair_ref(ref)
    record_number("engine baseline id", baseline_id)
    key = approval_key(key, "an acceptance")
    version = registry.get(ref)
    return accept_baseline(registry.store, registry.policy(), version.name, version.version, baseline_id,
                           actor=actor, key=key, note=note).to_dict()


def counted(registry, version: PairVersion, engine: str, policy=None):
    """The newest baseline of ``engine`` for ``version`` that counts, or None (also for an engine
    that records no baselines); ``policy``: the policy of record as the command read it (default:
    read here)."""
    from specreg.registry.governance.engine_baseline_standing import newest_counted
    from specreg.registry.store.engine_baselines import ENGINES

    if engine not in ENGINES:
        return None
    return newest_counted(registry.store, registry.policy() if policy is None else policy, version.name,
                          version.version, engine)


def in_engine_terms(registry, version: PairVersion, engine: str | None, baselines: dict | None,
                    policy=None) -> dict | None:
    """``baselines`` (ours) with the acceptance figures of ``engine``'s counted baseline where one
    exists (registry.store.engine_baselines.with_engine_baseline); ``policy`` as for counted."""
    from specreg.registry.store.engine_baselines import with_engine_baseline

    found = counted(registry, version, engine, policy) if engine else None
    return with_engine_baseline(baselines, found) if baselines is not None else baselines
