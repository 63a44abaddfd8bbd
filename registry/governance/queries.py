"""What the gate, the approvals and the pointer moves all read: the Condition they report,
the facts gathered outside a transaction (fingerprints, golden-set hash) and the row queries
shared by governance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.core.baselines import in_engine_terms
from specreg.core.fingerprint import compare_fingerprints, fingerprint_model
from specreg.errors import NotFoundError
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.orm import AuditEventRow, EnvironmentPointerRow, PairRow, PairVersionRow, ValidationRunRow
from specreg.registry.store.store import Store, verified_chain

FINISHED_STATUSES = ("passed", "failed")  # running/aborted/error runs judged nothing


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


def golden_set_sha256(name_or_path: str) -> str:
    """The content hash of the policy's golden set as it is now."""
    from specreg.golden_prompts.loader import load_golden_set

    return load_golden_set(name_or_path).content_sha256


def lock_pair(session: Session, name: str) -> PairRow:
    pair = session.scalar(select(PairRow).where(PairRow.name == name).with_for_update())
    if pair is None:
        raise NotFoundError(f"unknown pair {name}")
    return pair


def pointer_row(session: Session, pair_id: int, environment: str, *, lock: bool = False) -> EnvironmentPointerRow | None:
    query = select(EnvironmentPointerRow).where(EnvironmentPointerRow.pair_id == pair_id,
                                                EnvironmentPointerRow.environment == environment)
    return session.scalar(query.with_for_update() if lock else query)


def version_number(session: Session, pair_version_id: int | None) -> int | None:
    if pair_version_id is None:
        return None
    return session.scalar(select(PairVersionRow.version).where(PairVersionRow.id == pair_version_id))


def chained_holder(pair_name: str, environment: str, chain: list[AuditEventRow]) -> int | None:
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


def pointer_problem(session: Session, pointer: EnvironmentPointerRow, pair_name: str,
                    chain: list[AuditEventRow]) -> str | None:
    """Why the pointer row counts for nothing (its holder is not the one the audit chain's
    newest move of it names: a row written or edited outside specreg), or None."""
    row_holder = version_number(session, pointer.pair_version_id)
    chained = chained_holder(pair_name, pointer.environment, chain)
    if row_holder == chained:
        return None
    said = f"{pair_name}@{chained}" if chained is not None else "no version"
    return (f"environment pointer {pair_name}@{pointer.environment} names "
            f"{f'version {row_holder}' if row_holder is not None else 'no version'}, but the audit chain's newest "
            f"move of it says {said}: it counts for nothing")


def holder_of(store: Store, name: str, environment: str) -> int | None:
    """The version number of ``name`` that holds ``environment`` now (None: nobody, or a pointer
    row that the audit chain does not vouch for)."""
    with store.session() as session:
        pair_id = session.scalar(select(PairRow.id).where(PairRow.name == name))
        if pair_id is None:
            raise NotFoundError(f"unknown pair {name}")
        pointer = pointer_row(session, pair_id, environment)
        if pointer is None:
            return None
        chain, _ = verified_chain(session)
        return None if pointer_problem(session, pointer, name, chain) else version_number(session, pointer.pair_version_id)


def uncovered_pointers(session: Session, chain: list[AuditEventRow]) -> list[str]:
    """One line per environment pointer row that the audit chain does not vouch for."""
    rows = session.execute(select(EnvironmentPointerRow, PairRow.name)
                           .join(PairRow, PairRow.id == EnvironmentPointerRow.pair_id)
                           .order_by(EnvironmentPointerRow.id)).all()
    return [problem for pointer, name in rows if (problem := pointer_problem(session, pointer, name, chain))]


def finished_runs(session: Session, pair_version_id: int,
                  chain: list[AuditEventRow] | None = None) -> list[ValidationRunRow]:
    """Validation runs that judged the version, newest first: only those whose content an audit
    event of the verified chain covers (a row written or edited outside `specreg validate`
    judged nothing)."""
    from specreg.registry.store.validations import chained_run_ids

    if chain is None:
        chain, _ = verified_chain(session)
    counted = chained_run_ids(session, chain)
    return [run for run in session.scalars(
        select(ValidationRunRow).where(ValidationRunRow.pair_version_id == pair_version_id,
                                       ValidationRunRow.status.in_(FINISHED_STATUSES))
        .order_by(ValidationRunRow.id.desc())) if run.id in counted]


def overall_figures(run: ValidationRunRow | None) -> dict[str, float] | None:
    """``{"acceptance_rate", "mean_acceptance_length"}`` of a run's baselines (None: none recorded);
    without "mean_acceptance_length" when the run recorded tau before the engines' definition
    (specreg.core.baselines), so that it is never compared with an engine-counted tau."""
    overall = ((in_engine_terms(run.baselines) or {}).get("overall") or {}) if run is not None else {}
    figures = {key: overall.get(key) for key in ("acceptance_rate", "mean_acceptance_length")
               if isinstance(overall.get(key), (int, float)) and not isinstance(overall.get(key), bool)}
    if "acceptance_rate" not in figures:
        return None
    return {k: float(v) for k, v in figures.items()}
