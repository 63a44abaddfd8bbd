"""Promote and the other moves of a version: the lifecycle state, which version holds an
environment (promote, rollback, retire: registry/governance/pointer_moves.py) and the gate, which says
whether a version may hold an environment now under the policy of record."""

from __future__ import annotations

from specreg.errors import UsageError
from specreg.registry.store.entities import PairState, PairVersion
from specreg.usecases.inputs import check_name, check_text


def move(registry, ref, to_state: PairState, *, action: str, reason: str | None = None,
         details: dict | None = None) -> PairVersion:
    """Move a version's lifecycle state; illegal moves raise IllegalTransitionError."""
    check_text("reason", reason)
    version = registry.get(ref)
    return registry.store.transition(version.name, version.version, to_state, actor=registry.user,
                                     action=action, reason=reason, details=details)


def promote(registry, ref, environment: str, *, reason: str | None = None,
            expected_holder: int | None | str = "current", allow_slower: str | None = None, policy=None):
    """Make the version hold ``environment`` under the policy of record (see Registry.promote) ->
    pointer_moves.PointerMove. ``policy``: the policy of record as this command read it (default:
    read here); the environment's golden set is resolved once, here."""
    from specreg.registry.governance import pointer_moves
    from specreg.registry.governance.queries import golden_reference, holder_of

    check_text("reason", reason)
    check_text("allow-slower reason", allow_slower)
    if allow_slower is not None and not allow_slower.strip():
        raise UsageError("--allow-slower needs a reason: who decided it and why, for the audit log")
    version = registry.get(ref)
    policy = registry.policy() if policy is None else policy
    env = policy.environment(environment)  # unknown environment: fail before any work
    registry.mirror(version.label)  # an approval given in the MLflow UI counts for this promote
    if expected_holder == "current":
        expected_holder = holder_of(registry.store, version.name, environment)
    moved = pointer_moves.promote(registry.store, policy, version.name, version.version, environment,
                                  golden=golden_reference(env.golden_set), actor=registry.user,
                                  expected_holder=expected_holder, reason=reason, allow_slower=allow_slower)
    registry.mirror(version.label)
    return moved


def rollback(registry, name: str, environment: str, *, reason: str | None = None):
    """Point ``environment`` of pair ``name`` back at its previous holder -> pointer_moves.PointerMove."""
    from specreg.registry.governance import pointer_moves

    check_text("reason", reason)
    moved = pointer_moves.rollback(registry.store, registry.policy(), check_name(name), environment, actor=registry.user,
                           reason=reason)
    registry.mirror(name)
    return moved


def retire(registry, ref, reason: str | None = None, *, force: bool = False) -> PairVersion:
    """Retire a version; refused (PolicyViolation) while it holds an environment unless ``force``."""
    from specreg.registry.governance import pointer_moves

    check_text("reason", reason)
    version = registry.get(ref)
    retired = pointer_moves.retire(registry.store, version.name, version.version, actor=registry.user, reason=reason,
                           force=force)
    registry.mirror(version.label)
    return retired


def gate(registry, ref, environment: str, *, policy_path: str | None = None, rerun: bool = False, progress=None,
         policy=None):
    """Whether the version may hold ``environment`` now under the policy of record (see
    Registry.gate) -> decisions.GateResult, with the preview under the policy file ``policy_path``
    when given; ``rerun``: validate again first (``progress`` reports it); ``policy``: the policy
    of record as this command read it (default: read here). The environment's golden set is
    resolved once: the run a ``rerun`` records is judged on the very content it validated."""
    from dataclasses import replace

    from specreg.registry.governance import decisions
    from specreg.registry.governance.queries import golden_reference
    from specreg.usecases import validate

    policy = registry.policy() if policy is None else policy
    env = policy.environment(environment)
    preview = registry.policy(policy_path) if policy_path is not None else None
    if preview is not None:
        preview.environment(environment)
    version = registry.get(ref)
    if rerun:
        request = validate.validation_request(registry, version.label, golden=env.golden_set,
                                              acceptance_tolerance=env.acceptance_tolerance, policy=policy)
        validate.run_validation(registry, request, progress=progress)
        golden = request.golden.reference
    else:
        golden = golden_reference(env.golden_set)
    result = decisions.gate(registry.store, policy, version, environment, golden=golden)
    if preview is not None:
        named = preview.environment(environment).golden_set
        preview_golden = golden if named == env.golden_set else golden_reference(named)
        result = replace(result, preview=decisions.gate(registry.store, preview, version, environment,
                                                        golden=preview_golden).to_dict())
    return result
