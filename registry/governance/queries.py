"""What the gate, the approvals and the pointer moves all read: the Condition they report,
the facts gathered outside a transaction (fingerprints, golden-set hash) and which pointers and
validation runs the audit chain vouches for."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specreg.core.baselines import in_engine_terms
from specreg.core.fingerprint import compare_fingerprints, fingerprint_model
from specreg.errors import NotFoundError
from specreg.registry.store import pointers
from specreg.registry.store.entities import AuditEvent, EnvironmentPointer, PairVersion, ValidationRun
from specreg.registry.store.store import Session, Store, verified_chain
from specreg.registry.store.validations import counted_finished_runs

if TYPE_CHECKING:
    from specreg.golden_prompts.records import GoldenRef


@dataclass(frozen=True)
class Condition:
    """One named requirement of the gate / a promotion, with why it passed or failed."""

    name: str
    passed: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "reason": self.reason, "details": self.details}


def fingerprint_changes(version: PairVersion) -> list[str]:
    """Re-fingerprint both models from their recorded paths and list what changed since
    registration (empty: identical). A missing model raises ModelReferenceError: never passes."""
    changes: list[str] = []
    for role, model in (("target", version.target), ("draft", version.draft)):
        if model is None:
            continue
        current = fingerprint_model(Path(model.path), allow_pickle=version.allow_pickle,
                                    require_tokenizer=model.fingerprint.tokenizer_sha256 is not None)
        changes += [f"{role} {change}" for change in compare_fingerprints(model.fingerprint, current)]
    return changes


def golden_reference(name_or_path: str) -> GoldenRef:
    """A policy's golden set (a shipped set's name or a file's path) resolved as it is now: what a
    command that judges runs against it resolves once, where it starts, and passes down."""
    from specreg.golden_prompts.loader import load_golden_set

    return load_golden_set(name_or_path).reference


def chained_holder(pair_name: str, environment: str, chain: list[AuditEvent]) -> int | None:
    """The version that holds ``environment`` of ``pair_name`` by the verified audit chain: the
    newest promote, rollback or forced retire that moved that pointer (None: nobody)."""
    from specreg.registry.governance.environment_history import new_holder

    holder = None
    for event in chain:
        if event.pair_name == pair_name:
            moved, version = new_holder(event, environment)
            if moved:
                holder = version
    return holder


def pointer_problem(pointer: EnvironmentPointer, chain: list[AuditEvent]) -> str | None:
    """Why the pointer counts for nothing (its holder is not the one the audit chain's newest
    move of it names: a row written or edited outside specreg), or None."""
    chained = chained_holder(pointer.pair, pointer.environment, chain)
    if pointer.version == chained:
        return None
    said = f"{pointer.pair}@{chained}" if chained is not None else "no version"
    return (f"environment pointer {pointer.pair}@{pointer.environment} names "
            f"{f'version {pointer.version}' if pointer.version is not None else 'no version'}, but the audit chain's "
            f"newest move of it says {said}: it counts for nothing")


def holder_of(store: Store, name: str, environment: str) -> int | None:
    """The version number of ``name`` that holds ``environment`` now (None: nobody, or a pointer
    row that the audit chain does not vouch for)."""
    with store.session() as session:
        if not store.has_pair(session, name):
            raise NotFoundError(f"unknown pair {name}")
        pointer = pointers.pointer(session, name, environment)
        if pointer is None:
            return None
        chain, _ = verified_chain(session)
        return None if pointer_problem(pointer, chain) else pointer.version


def uncovered_pointers(session: Session, chain: list[AuditEvent]) -> list[str]:
    """One line per environment pointer row that the audit chain does not vouch for."""
    return [problem for pointer in pointers.pointers_in_written_order(session)
            if (problem := pointer_problem(pointer, chain))]


def finished_runs(session: Session, version: PairVersion, chain: list[AuditEvent] | None = None) -> list[ValidationRun]:
    """Validation runs that judged the version, newest first: only those whose content an audit
    event of the verified chain covers (a row written or edited outside `specreg validate`
    judged nothing)."""
    if chain is None:
        chain, _ = verified_chain(session)
    return counted_finished_runs(session, version, chain)


def overall_figures(run: ValidationRun | None) -> dict[str, float] | None:
    """``{"acceptance_rate", "mean_acceptance_length"}`` of a run's baselines (None: none recorded);
    without "mean_acceptance_length" when the run recorded tau before the engines' definition
    (specreg.core.baselines), so that it is never compared with an engine-counted tau."""
    overall = ((in_engine_terms(run.baselines) or {}).get("overall") or {}) if run is not None else {}
    figures = {key: overall.get(key) for key in ("acceptance_rate", "mean_acceptance_length")
               if isinstance(overall.get(key), (int, float)) and not isinstance(overall.get(key), bool)}
    if "acceptance_rate" not in figures:
        return None
    return {k: float(v) for k, v in figures.items()}
