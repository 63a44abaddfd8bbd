"""Reading the registry: versions, a version by reference (NAME, NAME@VERSION, NAME@ENV), a pair's
history, two versions side by side, which version holds each environment and held it when, the
audit chain's state and the rows it does not vouch for."""

from __future__ import annotations

from specreg.errors import NotFoundError
from specreg.registry.store.entities import PairVersion
from specreg.usecases.inputs import PairRef, check_name, pair_ref


def find_version(registry, ref: str | PairRef, *, with_events: bool = False) -> PairVersion:
    """The version named by ``NAME``, ``NAME@VERSION`` or ``NAME@ENV`` (the version of NAME that
    holds ENV now). NotFoundError when there is none."""
    from specreg.registry.governance.queries import holder_of

    ref = pair_ref(ref)
    if ref.environment is None:
        return registry.store.get_version(ref.name, ref.version, with_events=with_events)
    version = holder_of(registry.store, ref.name, ref.environment)
    if version is None:
        raise NotFoundError(f"{ref}: no version of {ref.name} holds environment {ref.environment}")
    return registry.store.get_version(ref.name, version, with_events=with_events)


def versions(registry, name: str | None = None) -> list[PairVersion]:
    """Every version (of ``name`` when given), by pair and version."""
    return registry.store.list_versions(check_name(name) if name else None)


def summaries(registry) -> list[dict]:
    """Light rows for `specreg list`: every version with its state and the environments it holds."""
    return registry.store.list_summaries()


def history(registry, name: str) -> list:
    """The audit events of every version of ``name``, oldest first (store.entities.AuditEvent)."""
    return registry.store.history(check_name(name))


def diff(registry, ref_a, ref_b) -> list[dict]:
    """Models, fingerprints, config and validation figures of two versions side by side."""
    from specreg.registry.governance import compare

    return compare.diff(registry.store, registry.get(ref_a), registry.get(ref_b))


def environments(registry, name: str | None = None) -> list[dict]:
    """Environment pointers: which version holds each environment, and which did before."""
    from specreg.registry.governance import pointer_moves

    return pointer_moves.environment_pointers(registry.store, check_name(name) if name else None)


def environment_history(registry, name: str, environment: str, *, at: str | None = None) -> list:
    """Which version of ``name`` held ``environment`` when, from the audit log: a list of
    registry.governance.environment_history.Tenure, oldest first. ``at`` (ISO 8601, UTC without an
    offset): only the span covering that time (empty: no version held it)."""
    from specreg.registry.governance.environment_history import environment_history as tenures_of
    from specreg.registry.governance.environment_history import holder_at, parse_time

    when = parse_time(at) if at is not None else None  # a bad time fails before the database
    tenures = tenures_of(registry.store, check_name(name), environment)
    if when is None:
        return tenures
    found = holder_at(tenures, when)
    return [found] if found is not None and found.version is not None else []


def verify_audit(registry) -> tuple[int, str | None]:
    """(events checked, the first broken link or None) of the whole audit chain."""
    return registry.store.verify_audit()


def audit_anchor(registry, expected_head: str | None) -> tuple[int | None, int, str | None, str]:
    """(the 1-based position of ``expected_head`` in the verified chain or None, events in that
    chain, the chain's problem or None, the head now)."""
    position, checked, problem = registry.store.anchor_position(expected_head or "")
    return position, checked, problem, registry.store.audit_head()


def not_counted(registry) -> list[str]:
    """One line per row that counts for nothing because no audit event covers it (validation runs,
    environment pointers) and per policy activation that does not count."""
    from specreg.registry.governance.policy_record import replay
    from specreg.registry.governance.queries import uncovered_pointers
    from specreg.registry.store.store import verified_chain
    from specreg.registry.store.validations import uncovered_runs

    with registry.store.session() as session:
        chain, _ = verified_chain(session)
        return (uncovered_runs(session, chain) + uncovered_pointers(session, chain)
                + list(replay(session, chain).problems))
