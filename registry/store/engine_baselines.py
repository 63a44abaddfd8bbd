"""Engine baselines: a pair version's acceptance, equivalence and throughput as a serving engine
measured them on a golden set (``specreg validate --engine``), stamped with the engine's name,
version and build, and kept beside our runtime's baseline (the validation run they were compared
with). Recording one appends an ``engine_validate`` audit event carrying the row's content hash;
it never moves the pair's state. Which baselines count (passed or accepted, on the chain) is
registry/governance/engine_baseline_standing.py's to say.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.core.digests import canonical_json, sha256_hex
from specreg.core.statuses import EngineBaselineStatus
from specreg.registry.store.entities import EngineBaseline, PairVersion
from specreg.registry.store.orm import EngineBaselineRow, PairRow, PairVersionRow
from specreg.registry.store.store import Store, utcnow

ENGINES = ("llamacpp", "vllm", "sglang")
# the names this store's callers write; they are the EngineBaselineStatus members themselves
PASSED, FAILED, UNACCEPTED = EngineBaselineStatus.PASSED, EngineBaselineStatus.FAILED, EngineBaselineStatus.UNACCEPTED


def content_sha256(row: EngineBaselineRow | EngineBaseline) -> str:
    """The hash an engine baseline's audit event and an acceptance of it carry: everything that
    says what was measured, on what, by whom and what came out (the report is evidence beside it)."""
    return sha256_hex(canonical_json({
        "pair_version_id": row.pair_version_id, "engine": row.engine, "engine_version": row.engine_version,
        "engine_build": row.engine_build, "source": row.source, "status": row.status, "golden_set": row.golden_set,
        "golden_sha256": row.golden_sha256, "binding_sha256": row.binding_sha256,
        "validation_run_id": row.validation_run_id, "baselines": row.baselines, "actor": row.actor}))


class EngineBaselineStore:
    """Engine baselines of the pair versions in one registry database."""

    def __init__(self, store: Store):
        self.store = store

    def record(self, version: PairVersion, *, engine: str, engine_version: str, engine_build: str, source: str,
               golden_set: str, golden_sha256: str, validation_run_id: int | None, baselines: dict[str, Any],
               report: dict[str, Any], actor: str, passed: bool = True,
               status: EngineBaselineStatus | None = None) -> EngineBaseline:
        """Insert one engine baseline and its audit event in one transaction -> the baseline.
        ``status``: passed, failed or unaccepted (default: by ``passed``)."""
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}")
        status = status or (PASSED if passed else FAILED)
        if status not in tuple(EngineBaselineStatus):
            raise ValueError(f"unknown engine baseline status {status!r}")
        status = EngineBaselineStatus(status)
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
            return row.to_entity(version.name, version.version)

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
            return [row.to_entity(name, number) for row, name, number in session.execute(query.order_by(EngineBaselineRow.id)).all()]

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
            return found[0].to_entity(*found[1:]) if found else None


def baselines_of(session: Session, version: PairVersion, engine: str | None = None, *,
                 newest_first: bool = False) -> list[EngineBaseline]:
    """Every engine baseline of ``version`` (of one engine when given), inside the caller's transaction."""
    query = select(EngineBaselineRow).where(EngineBaselineRow.pair_version_id == version.id)
    if engine is not None:
        query = query.where(EngineBaselineRow.engine == engine)
    order = EngineBaselineRow.id.desc() if newest_first else EngineBaselineRow.id
    return [row.to_entity(version.name, version.version) for row in session.scalars(query.order_by(order))]


def baseline_of(session: Session, version: PairVersion, baseline_id: int) -> EngineBaseline | None:
    """Engine baseline ``baseline_id`` when it is one of ``version``'s, else None."""
    row = session.get(EngineBaselineRow, baseline_id)
    return row.to_entity(version.name, version.version) if row is not None and row.pair_version_id == version.id \
        else None


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
                   # the figures' dtype: the engine served in it (a local vLLM, --dtype) or was compared at it
                   "dtype": ((found.report or {}).get("options") or {}).get("dtype") or merged.get("dtype"),
                   "engine_baseline": {"id": found.id, "engine": found.engine, "engine_version": found.engine_version,
                                       "engine_build": found.engine_build,
                                       "measured_at": found.created_at.isoformat(timespec="seconds") + "Z",
                                       # the tiers and the schedule they support (exports derive
                                       # their per-batch schedule from it)
                                       "throughput": (found.report or {}).get("throughput"),
                                       "speculation_schedule": (found.report or {}).get("speculation_schedule")}})
    return merged
