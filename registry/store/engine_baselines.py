"""Engine baselines: a pair version's acceptance, equivalence and throughput as a serving engine
measured them on a golden set (``specreg validate --engine``), stamped with the engine's name,
version and build, and kept beside our runtime's baseline (the validation run they were compared
with). Recording one appends an ``engine_validate`` audit event carrying the row's content hash;
it never moves the pair's state. Which baselines count (passed or accepted, on the chain) is
registry/governance/engine_acceptance.py's to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from specreg.core.fingerprint import canonical_json, sha256_hex
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.orm import EngineBaselineRow, PairRow, PairVersionRow
from specreg.registry.store.store import Store, utcnow

ENGINES = ("llamacpp", "vllm", "sglang")
# unaccepted: every check held but the engine's acceptance differs from our runtime's beyond the
# parity tolerance; it is not a baseline until an approver accepts it
PASSED, FAILED, UNACCEPTED = "passed", "failed", "unaccepted"


@dataclass(frozen=True)
class EngineBaseline:
    """One engine validation of a pair version.

    baselines: the engine's acceptance in the validation baselines' shape ({"k", "overall",
    "per_category"} with acceptance_rate, mean_acceptance_length, per_position_acceptance ...);
    report: parity with our runtime, equivalence in the engine, throughput tiers, settings."""

    id: int
    pair_name: str
    version: int
    engine: str
    engine_version: str
    engine_build: str
    source: str
    status: str
    golden_set: str
    golden_sha256: str
    binding_sha256: str
    validation_run_id: int | None
    baselines: dict[str, Any]
    report: dict[str, Any]
    actor: str
    created_at: datetime

    @property
    def label(self) -> str:
        return f"{self.pair_name}@{self.version}"

    @property
    def stamp(self) -> str:
        """``engine version (build)``: what the figures were measured on."""
        return f"{self.engine} {self.engine_version} ({self.engine_build})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "pair": self.pair_name, "version": self.version, "engine": self.engine,
            "engine_version": self.engine_version, "engine_build": self.engine_build, "source": self.source,
            "status": self.status, "golden_set": self.golden_set, "golden_sha256": self.golden_sha256,
            "binding_sha256": self.binding_sha256, "validation_run_id": self.validation_run_id,
            "baselines": self.baselines, "report": self.report, "actor": self.actor,
            "created_at": self.created_at.isoformat(timespec="seconds"),
        }


def content_sha256(row: EngineBaselineRow) -> str:
    """The hash an engine baseline's audit event and an acceptance of it carry: everything that
    says what was measured, on what, by whom and what came out (the report is evidence beside it)."""
    return sha256_hex(canonical_json({
        "pair_version_id": row.pair_version_id, "engine": row.engine, "engine_version": row.engine_version,
        "engine_build": row.engine_build, "source": row.source, "status": row.status, "golden_set": row.golden_set,
        "golden_sha256": row.golden_sha256, "binding_sha256": row.binding_sha256,
        "validation_run_id": row.validation_run_id, "baselines": row.baselines, "actor": row.actor}))


def to_entity(row: EngineBaselineRow, name: str, version: int) -> EngineBaseline:
    return EngineBaseline(
        id=row.id, pair_name=name, version=version, engine=row.engine, engine_version=row.engine_version,
        engine_build=row.engine_build, source=row.source, status=row.status, golden_set=row.golden_set,
        golden_sha256=row.golden_sha256, binding_sha256=row.binding_sha256,
        validation_run_id=row.validation_run_id, baselines=row.baselines, report=row.report, actor=row.actor,
        created_at=row.created_at)


class EngineBaselineStore:
    """Engine baselines of the pair versions in one registry database."""

    def __init__(self, store: Store):
        self.store = store

    def record(self, version: PairVersion, *, engine: str, engine_version: str, engine_build: str, source: str,
               golden_set: str, golden_sha256: str, validation_run_id: int | None, baselines: dict[str, Any],
               report: dict[str, Any], actor: str, passed: bool = True, status: str | None = None) -> EngineBaseline:
        """Insert one engine baseline and its audit event in one transaction -> the baseline.
        ``status``: passed, failed or unaccepted (default: by ``passed``)."""
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}")
        status = status or (PASSED if passed else FAILED)
        if status not in (PASSED, FAILED, UNACCEPTED):
            raise ValueError(f"unknown engine baseline status {status!r}")
        with self.store.session(write=True) as session:
            version_row = self.store.version_row(session, version.name, version.version)
            row = EngineBaselineRow(
                pair_version_id=version_row.id, engine=engine, engine_version=engine_version[:64],
                engine_build=engine_build[:255], source=source, status=status,
                golden_set=golden_set, golden_sha256=golden_sha256, binding_sha256=version_row.binding_sha256,
                validation_run_id=validation_run_id, baselines=baselines, report=report, actor=actor,
                created_at=utcnow())
            session.add(row)
            session.flush()
            overall = baselines.get("overall") or {}
            self.store.append_event(
                session, pair_name=version.name, version=version.version, action="engine_validate",
                from_state=version_row.state, to_state=version_row.state, actor=actor,
                reason=f"{engine} {engine_version} ({engine_build}): engine validation {row.status}",
                details={"engine_baseline_id": row.id, "status": row.status, "content_sha256": content_sha256(row),
                         "engine": engine, "engine_version": row.engine_version,
                         "engine_build": row.engine_build, "source": source, "golden_set": golden_set,
                         "golden_sha256": golden_sha256, "validation_run_id": validation_run_id,
                         "acceptance_rate": overall.get("acceptance_rate"),
                         "mean_acceptance_length": overall.get("mean_acceptance_length")})
            return to_entity(row, version.name, version.version)

    def _query(self):
        return (select(EngineBaselineRow, PairRow.name, PairVersionRow.version)
                .join(PairVersionRow, EngineBaselineRow.pair_version_id == PairVersionRow.id)
                .join(PairRow, PairVersionRow.pair_id == PairRow.id))

    def list(self, name: str, version: int, engine: str | None = None) -> list[EngineBaseline]:
        """Engine baselines of one version (of one engine when given), oldest first."""
        query = self._query().where(PairRow.name == name, PairVersionRow.version == version)
        if engine is not None:
            query = query.where(EngineBaselineRow.engine == engine)
        with self.store.session() as session:
            return [to_entity(*found) for found in session.execute(query.order_by(EngineBaselineRow.id)).all()]

    def latest(self, name: str, version: int, engine: str, *, passed_only: bool = True) -> EngineBaseline | None:
        """The newest (passed, unless ``passed_only`` is false) baseline of ``engine`` for one version
        whose binding is still the version's: what exports and alert rules for that engine use."""
        query = (self._query().where(PairRow.name == name, PairVersionRow.version == version,
                                     EngineBaselineRow.engine == engine,
                                     EngineBaselineRow.binding_sha256 == PairVersionRow.binding_sha256)
                 .order_by(EngineBaselineRow.id.desc()).limit(1))
        if passed_only:
            query = query.where(EngineBaselineRow.status == PASSED)
        with self.store.session() as session:
            found = session.execute(query).first()
            return to_entity(*found) if found else None


def with_engine_baseline(baselines: dict[str, Any] | None, found: EngineBaseline | None) -> dict[str, Any] | None:
    """Our runtime's baselines (as exports and observe read them) with the acceptance figures
    replaced by the engine's where an engine baseline exists; ours stay beside them, named
    (``runtime``), and ``engine_baseline`` says which engine build measured the figures."""
    if found is None:
        return baselines
    engine = found.baselines
    merged = dict(baselines or {})
    if baselines is not None:
        merged["runtime"] = {key: baselines.get(key) for key in ("k", "overall", "per_category")}
    merged.update({"k": engine.get("k"), "overall": engine.get("overall"), "per_category": engine.get("per_category"),
                   "golden_set": found.golden_set, "golden_sha256": found.golden_sha256,
                   "engine_baseline": {"id": found.id, "engine": found.engine, "engine_version": found.engine_version,
                                       "engine_build": found.engine_build,
                                       "measured_at": found.created_at.isoformat(timespec="seconds") + "Z"}})
    return merged
