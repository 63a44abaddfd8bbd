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
from specreg.registry.store.orm import EnvironmentPointerRow, PairRow, PairVersionRow, ValidationRunRow
from specreg.registry.store.store import Store

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


def holder_of(store: Store, name: str, environment: str) -> int | None:
    """The version number of ``name`` that holds ``environment`` now (None: nobody)."""
    with store.session() as session:
        pair_id = session.scalar(select(PairRow.id).where(PairRow.name == name))
        if pair_id is None:
            raise NotFoundError(f"unknown pair {name}")
        pointer = pointer_row(session, pair_id, environment)
        return version_number(session, pointer.pair_version_id) if pointer else None


def finished_runs(session: Session, pair_version_id: int) -> list[ValidationRunRow]:
    """Validation runs that judged the version, newest first."""
    return list(session.scalars(
        select(ValidationRunRow).where(ValidationRunRow.pair_version_id == pair_version_id,
                                       ValidationRunRow.status.in_(FINISHED_STATUSES))
        .order_by(ValidationRunRow.id.desc())))


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
