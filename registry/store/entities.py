"""Plain entities of the registry. The store converts its ORM rows to these; nothing else
knows about SQL. All are frozen: a registered pair version never changes what it binds."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specreg.core.methods import SpecConfig, SpecMethod  # noqa: F401 - a pair version's config, defined in core
from specreg.core.statuses import CheckStatus, EngineBaselineStatus, RunStatus
from specreg.core.types import CheckResult, ModelRef


class PairState(str, enum.Enum):
    REGISTERED = "registered"
    VALIDATED = "validated"
    FAILED = "failed"
    APPROVED = "approved"
    PROMOTED = "promoted"
    RETIRED = "retired"


@dataclass(frozen=True)
class AuditEvent:
    """One append-only entry of the audit log; ``event_hash`` chains it to ``prev_hash``."""

    id: int
    pair_name: str
    version: int | None
    action: str
    from_state: str | None
    to_state: str | None
    actor: str
    reason: str | None
    details: dict[str, Any]
    created_at: datetime
    prev_hash: str
    event_hash: str
    # PostgreSQL: the database role the server stamped on the row (covered by event_hash); None on
    # SQLite and before schema 0005
    session_role: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pair": self.pair_name,
            "version": self.version,
            "action": self.action,
            "from": self.from_state,
            "to": self.to_state,
            "actor": self.actor,
            "reason": self.reason,
            "details": self.details,
            "at": self.created_at.isoformat(),
            "prev_hash": self.prev_hash,
            "hash": self.event_hash,
        }


@dataclass(frozen=True)
class PairVersion:
    """Draft + target + speculative config as one immutable, versioned unit."""

    id: int
    name: str
    version: int
    target: ModelRef
    draft: ModelRef | None  # None for model-free drafting (ngram)
    config: SpecConfig
    binding_sha256: str  # digest of both fingerprints + config: the identity used for dedupe
    state: PairState
    registered_by: str
    registered_at: datetime
    notes: str | None = None
    allow_pickle: bool = False
    events: tuple[AuditEvent, ...] = field(default=())
    # every file of each model directory at registration ({"target": [...], "draft": [...]});
    # None: registered before file lists were recorded (schema 0005)
    model_files: dict[str, list[str]] | None = None

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"

    def to_dict(self, with_events: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "state": self.state.value,
            "binding_sha256": self.binding_sha256,
            "target": self.target.to_dict(),
            "draft": self.draft.to_dict() if self.draft else None,
            "config": self.config.to_dict(),
            "registered_by": self.registered_by,
            "registered_at": self.registered_at.isoformat(),
            "notes": self.notes,
            "allow_pickle": self.allow_pickle,
        }
        if with_events:
            data["events"] = [event.to_dict() for event in self.events]
        return data


@dataclass(frozen=True)
class ValidationRun:
    """One `specreg validate` of a pair version: what ran, where, and what each check found.

    status: running | passed | failed | aborted | abandoned | error. baselines (acceptance overall and per
    category) are set only on passed runs; they are what later versions and `observe` compare with.
    """

    id: int
    pair_name: str
    version: int
    status: RunStatus
    golden_set: str
    golden_sha256: str
    binding_sha256: str
    environment: dict[str, Any]
    options: dict[str, Any]
    summary: dict[str, Any] | None
    baselines: dict[str, Any] | None
    actor: str
    pid: int | None
    started_at: datetime
    finished_at: datetime | None
    error: str | None
    mlflow_run_id: str | None = None
    checks: tuple[CheckResult, ...] = field(default=())  # as each check returned it

    def __post_init__(self):
        object.__setattr__(self, "status", RunStatus(self.status))  # the database gives back the word

    @property
    def label(self) -> str:
        return f"{self.pair_name}@{self.version}"

    @property
    def failed_checks(self) -> list[str]:
        return [check.name for check in self.checks if check.status == CheckStatus.FAIL]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pair": self.pair_name,
            "version": self.version,
            "status": self.status.value,
            "golden_set": self.golden_set,
            "golden_sha256": self.golden_sha256,
            "binding_sha256": self.binding_sha256,
            "environment": self.environment,
            "options": self.options,
            "summary": self.summary,
            "baselines": self.baselines,
            "actor": self.actor,
            "pid": self.pid,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "error": self.error,
            "mlflow_run_id": self.mlflow_run_id,
            "checks": [check.to_dict() for check in self.checks],
        }


@dataclass(frozen=True)
class Approval:
    """An approval or rejection of one pair version, as recorded; whether it counts (its audit
    event, its signature) is registry/governance/approvals.py's to say."""

    id: int
    pair: str
    version: int
    decision: str  # approved | rejected
    actor: str
    note: str | None
    source: str  # cli
    created_at: datetime
    scope: str = "*"  # the environment it was given for; *: any
    key_id: str | None = None
    signature: dict | None = None
    event_hash: str | None = None  # the audit event that recorded it

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "pair": self.pair, "version": self.version, "decision": self.decision,
                "actor": self.actor, "note": self.note, "source": self.source, "scope": self.scope,
                "key_id": self.key_id, "at": self.created_at.isoformat()}


@dataclass(frozen=True)
class EnrolledKey:
    """A row of the approvers' keyring: a person's public key, who enrolled it, when, and the
    audit event that recorded the enrolment."""

    id: int
    person: str
    key_id: str
    public_key: str  # SubjectPublicKeyInfo PEM
    enrolled_by: str
    enrolled_at: datetime
    event_hash: str | None


@dataclass(frozen=True)
class PolicyDocument:
    """A proposed version of the policy of record: its text as proposed, and the proposal event."""

    id: int
    version: int
    document: str
    format: str  # toml | yaml
    sha256: str
    proposed_by: str
    proposed_at: datetime
    note: str | None
    event_hash: str | None


@dataclass(frozen=True)
class EnvironmentPointer:
    """Which version of a pair holds an environment, and which held it before (None: nobody)."""

    pair: str
    environment: str
    version: int | None
    previous_version: int | None
    updated_by: str
    updated_at: datetime


@dataclass(frozen=True)
class Observation:
    """One live reading of a pair version served by an engine (`specreg observe`): its figures
    between two scrapes of the engine's metrics, compared with the version's baselines."""

    id: int
    pair: str
    version: int
    environment: str | None  # the environment observed through (NAME@ENV), else None
    engine: str
    url: str  # the metrics endpoint scraped
    observed_at: datetime
    figures: dict[str, Any]  # the live figures with the comparison (checks, reasons, floors)
    verdict: str  # ok | drift | no-data

    @property
    def label(self) -> str:
        return f"{self.pair}@{self.version}"

    def to_dict(self) -> dict[str, Any]:
        """As `observe --json` and `show --json` print it, under the version it belongs to."""
        return {"id": self.id, "environment": self.environment, "engine": self.engine, "url": self.url,
                "observed_at": self.observed_at.isoformat(timespec="seconds"), "verdict": self.verdict,
                "figures": self.figures}


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
    status: EngineBaselineStatus
    golden_set: str
    golden_sha256: str
    binding_sha256: str
    validation_run_id: int | None
    baselines: dict[str, Any]
    report: dict[str, Any]
    actor: str
    created_at: datetime
    pair_version_id: int = 0  # the version's row: part of what the baseline's content hash covers

    def __post_init__(self):
        object.__setattr__(self, "status", EngineBaselineStatus(self.status))  # the database gives back the word

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
            "status": self.status.value, "golden_set": self.golden_set, "golden_sha256": self.golden_sha256,
            "binding_sha256": self.binding_sha256, "validation_run_id": self.validation_run_id,
            "baselines": self.baselines, "report": self.report, "actor": self.actor,
            "created_at": self.created_at.isoformat(timespec="seconds"),
        }
