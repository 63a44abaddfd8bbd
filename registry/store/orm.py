"""SQLAlchemy ORM classes: the only description of the schema. Alembic migrations in
``migrations/versions`` must produce exactly this metadata (a test compares them).
Rows become the plain entities of ``entities.py`` one way only: each row's ``to_entity()``
(given the pair's name and version where the row holds only the version's id)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (JSON, Boolean, DateTime, ForeignKey, Integer, String, Text,
                        UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from specreg.core.baselines import in_engine_terms
from specreg.core.suffix_settings import SuffixSettings
from specreg.core.types import CheckResult, ModelFingerprint, ModelRef
from specreg.registry.store.entities import (Approval, AuditEvent, EngineBaseline, EnrolledKey, EnvironmentPointer,
                                             Observation, PairState, PairVersion, PolicyDocument, SpecConfig,
                                             SpecMethod, ValidationRun)


class Base(DeclarativeBase):
    pass


class PairRow(Base):
    __tablename__ = "pairs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)

    versions: Mapped[list["PairVersionRow"]] = relationship(back_populates="pair", order_by="PairVersionRow.version")


class PairVersionRow(Base):
    __tablename__ = "pair_versions"
    __table_args__ = (
        UniqueConstraint("pair_id", "version", name="uq_pair_versions_pair_version"),
        UniqueConstraint("pair_id", "binding_sha256", name="uq_pair_versions_pair_binding"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("pairs.id", ondelete="RESTRICT"), nullable=False, index=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    binding_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    method: Mapped[str] = mapped_column(String(32), nullable=False)
    num_speculative_tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    prompt_lookup_min: Mapped[int | None] = mapped_column(Integer)
    prompt_lookup_max: Mapped[int | None] = mapped_column(Integer)
    max_batch_size_for_speculation: Mapped[int | None] = mapped_column(Integer)
    target: Mapped[dict] = mapped_column(JSON, nullable=False)  # ModelRef.to_dict()
    draft: Mapped[dict | None] = mapped_column(JSON)
    registered_by: Mapped[str] = mapped_column(String(255), nullable=False)
    registered_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    notes: Mapped[str | None] = mapped_column(Text)
    allow_pickle: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    tree: Mapped[list | None] = mapped_column(JSON)  # SpecConfig.tree as lists
    head: Mapped[dict | None] = mapped_column(JSON)  # SpecConfig.head
    suffix: Mapped[dict | None] = mapped_column(JSON)  # SpecConfig.suffix.to_dict()
    # Every file of each model directory at registration ({"target": [names], "draft": [names]}): an
    # export whose file set differs is refused, naming the files (engines read files the
    # fingerprint does not cover: hf_quant_config.json, params.json, a subfolder).
    model_files: Mapped[dict | None] = mapped_column(JSON)

    pair: Mapped[PairRow] = relationship(back_populates="versions")

    # Everything but the lifecycle state is bound at registration and never changes.
    IMMUTABLE_COLUMNS = ("pair_id", "version", "binding_sha256", "method", "num_speculative_tokens",
                         "prompt_lookup_min", "prompt_lookup_max", "max_batch_size_for_speculation",
                         "target", "draft", "registered_by", "registered_at", "notes", "allow_pickle", "tree",
                         "head", "suffix", "model_files")

    def to_entity(self, events: tuple[AuditEvent, ...] = ()) -> PairVersion:
        return PairVersion(
            id=self.id,
            name=self.pair.name,
            version=self.version,
            target=model_ref_from_dict(self.target),
            draft=model_ref_from_dict(self.draft) if self.draft else None,
            config=SpecConfig(
                method=SpecMethod(self.method),
                num_speculative_tokens=self.num_speculative_tokens,
                prompt_lookup_min=self.prompt_lookup_min,
                prompt_lookup_max=self.prompt_lookup_max,
                max_batch_size_for_speculation=self.max_batch_size_for_speculation,
                tree=tuple(tuple(path) for path in self.tree) if self.tree is not None else None,
                head=self.head,
                suffix=SuffixSettings.from_dict(self.suffix) if self.suffix is not None else None,
            ),
            binding_sha256=self.binding_sha256,
            state=PairState(self.state),
            registered_by=self.registered_by,
            registered_at=self.registered_at,
            notes=self.notes,
            allow_pickle=self.allow_pickle,
            events=events,
            model_files=self.model_files,
        )


class AuditEventRow(Base):
    """Append-only; ``event_hash`` = sha256(prev_hash + canonical content) chains the log."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_name: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    version: Mapped[int | None] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(32), nullable=False)
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str | None] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(255), nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    prev_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    event_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    # PostgreSQL: the database role that wrote the row (session_user), stamped by a trigger the
    # schema owner owns (migration 0005) whatever the writer sends, and covered by event_hash;
    # NULL on SQLite (no authentication) and for events written before 0005.
    session_role: Mapped[str | None] = mapped_column(String(255))

    def to_entity(self) -> AuditEvent:
        return AuditEvent(
            id=self.id, pair_name=self.pair_name, version=self.version, action=self.action,
            from_state=self.from_state, to_state=self.to_state, actor=self.actor, reason=self.reason,
            details=self.details or {}, created_at=self.created_at, prev_hash=self.prev_hash,
            event_hash=self.event_hash, session_role=self.session_role,
        )


class AuditHeadRow(Base):
    """One row holding the newest event hash: locking it serialises appends to the chain."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    last_event_id: Mapped[int | None] = mapped_column(Integer)


def model_ref_from_dict(data: dict) -> ModelRef:
    return ModelRef(
        reference=data["reference"],
        path=data["path"],
        revision=data.get("revision"),
        fingerprint=ModelFingerprint.from_dict(data["fingerprint"]),
    )


class ValidationRunRow(Base):
    """One `specreg validate` of a pair version: what was run, on what, and what it found."""

    __tablename__ = "validation_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_version_id: Mapped[int] = mapped_column(ForeignKey("pair_versions.id", ondelete="RESTRICT"), nullable=False, index=True)
    status: Mapped[str] = mapped_column(String(16), nullable=False)  # running|passed|failed|aborted|abandoned|error
    golden_set: Mapped[str] = mapped_column(String(255), nullable=False)
    golden_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    binding_sha256: Mapped[str] = mapped_column(String(64), nullable=False)  # the version's binding when run
    environment: Mapped[dict] = mapped_column(JSON, nullable=False)  # torch/transformers versions, device, dtype
    options: Mapped[dict] = mapped_column(JSON, nullable=False)  # checks asked for, tolerances
    summary: Mapped[dict | None] = mapped_column(JSON)  # headline figures
    baselines: Mapped[dict | None] = mapped_column(JSON)  # acceptance overall + per category, when passed
    actor: Mapped[str] = mapped_column(String(255), nullable=False)
    pid: Mapped[int | None] = mapped_column(Integer)  # the validating process, to find dead "running" rows
    started_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    error: Mapped[str | None] = mapped_column(Text)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))

    checks: Mapped[list["CheckResultRow"]] = relationship(back_populates="run", order_by="CheckResultRow.id")

    def to_entity(self, pair_name: str, version: int) -> ValidationRun:
        return ValidationRun(
            id=self.id, pair_name=pair_name, version=version, status=self.status, golden_set=self.golden_set,
            golden_sha256=self.golden_sha256, binding_sha256=self.binding_sha256,
            environment=self.environment or {}, options=self.options or {}, summary=self.summary,
            baselines=in_engine_terms(self.baselines), actor=self.actor, pid=self.pid, started_at=self.started_at,
            finished_at=self.finished_at, error=self.error, mlflow_run_id=self.mlflow_run_id,
            checks=tuple(CheckResult(c.name, c.status, c.summary, c.evidence, c.figures or {}) for c in self.checks),
        )


class CheckResultRow(Base):
    __tablename__ = "check_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    validation_run_id: Mapped[int] = mapped_column(ForeignKey("validation_runs.id", ondelete="CASCADE"), nullable=False, index=True)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[str] = mapped_column(String(8), nullable=False)  # pass|warn|fail|skip|error
    summary: Mapped[str] = mapped_column(Text, nullable=False)
    evidence: Mapped[dict | list | None] = mapped_column(JSON)
    figures: Mapped[dict | None] = mapped_column(JSON)

    run: Mapped[ValidationRunRow] = relationship(back_populates="checks")


class ApprovalRow(Base):
    """An approval or rejection of a pair version (from the CLI or read back from MLflow)."""

    __tablename__ = "approvals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_version_id: Mapped[int] = mapped_column(ForeignKey("pair_versions.id", ondelete="RESTRICT"), nullable=False, index=True)
    decision: Mapped[str] = mapped_column(String(16), nullable=False)  # approved|rejected
    actor: Mapped[str] = mapped_column(String(255), nullable=False)
    note: Mapped[str | None] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16), nullable=False)  # cli|mlflow|unattributed
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    # The hash of the audit event that recorded this decision: a decision counts only while that
    # event is in the verified chain and says the same (a row written straight into the table,
    # or one whose event was edited, counts for nothing). NULL: a row no event vouches for.
    event_hash: Mapped[str | None] = mapped_column(String(64))
    # The approver's DSSE signature (a Sigstore bundle) over the decision's in-toto statement
    # (governance/signatures.py), the key that made it and the environment it was given for
    # (``*``: any). A row without a valid signature by a key enrolled to ``actor`` counts for nothing.
    signature: Mapped[dict | None] = mapped_column(JSON)
    key_id: Mapped[str | None] = mapped_column(String(64))
    scope: Mapped[str | None] = mapped_column(String(32))
    session_role: Mapped[str | None] = mapped_column(String(255))  # stamped as audit_events.session_role

    def to_entity(self, pair_name: str, version: int) -> Approval:
        return Approval(self.id, pair_name, version, self.decision, self.actor, self.note, self.source,
                        self.created_at, self.scope or "*", self.key_id, self.signature, self.event_hash)


class ApproverKeyRow(Base):
    """The approvers' keyring: a person's public key, who enrolled it and when, and the hash of
    the audit event that recorded the enrolment (a key counts only while that event is in the
    verified chain and was written by an enroller the policy names)."""

    __tablename__ = "approver_keys"
    __table_args__ = (UniqueConstraint("key_id", name="uq_approver_keys_key_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    person: Mapped[str] = mapped_column(String(255), nullable=False)
    key_id: Mapped[str] = mapped_column(String(64), nullable=False)  # sha256 of the public key PEM
    public_key: Mapped[str] = mapped_column(Text, nullable=False)  # SubjectPublicKeyInfo PEM
    enrolled_by: Mapped[str] = mapped_column(String(255), nullable=False)
    enrolled_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    event_hash: Mapped[str | None] = mapped_column(String(64))
    session_role: Mapped[str | None] = mapped_column(String(255))  # stamped as audit_events.session_role

    def to_entity(self) -> EnrolledKey:
        return EnrolledKey(self.id, self.person, self.key_id, self.public_key, self.enrolled_by, self.enrolled_at,
                           self.event_hash)


class PolicyVersionRow(Base):
    """A version of the policy of record as proposed: the document's text, its hash and who
    proposed it. It governs only from the audited activation that the previous policy's
    four-eyes rule allowed (registry/governance/policy_record.py); a row alone decides nothing."""

    __tablename__ = "policy_versions"
    __table_args__ = (UniqueConstraint("version", name="uq_policy_versions_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    document: Mapped[str] = mapped_column(Text, nullable=False)  # the TOML or YAML text as proposed
    format: Mapped[str] = mapped_column(String(8), nullable=False)  # toml|yaml
    sha256: Mapped[str] = mapped_column(String(64), nullable=False)  # Policy.sha256 of what it says
    proposed_by: Mapped[str] = mapped_column(String(255), nullable=False)
    proposed_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    note: Mapped[str | None] = mapped_column(Text)
    event_hash: Mapped[str | None] = mapped_column(String(64))  # the policy-propose event

    def to_entity(self) -> PolicyDocument:
        return PolicyDocument(self.id, self.version, self.document, self.format, self.sha256, self.proposed_by,
                              self.proposed_at, self.note, self.event_hash)


class EnvironmentPointerRow(Base):
    """Which version of a pair holds an environment, and which held it before (for rollback)."""

    __tablename__ = "environment_pointers"
    __table_args__ = (UniqueConstraint("pair_id", "environment", name="uq_environment_pointers_pair_env"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("pairs.id", ondelete="RESTRICT"), nullable=False)
    environment: Mapped[str] = mapped_column(String(32), nullable=False)
    pair_version_id: Mapped[int | None] = mapped_column(ForeignKey("pair_versions.id", ondelete="RESTRICT"))
    previous_version_id: Mapped[int | None] = mapped_column(ForeignKey("pair_versions.id", ondelete="RESTRICT"))
    updated_by: Mapped[str] = mapped_column(String(255), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)

    pair: Mapped[PairRow] = relationship()
    holder: Mapped[PairVersionRow | None] = relationship(foreign_keys=[pair_version_id])
    previous: Mapped[PairVersionRow | None] = relationship(foreign_keys=[previous_version_id])

    def to_entity(self) -> EnvironmentPointer:
        return EnvironmentPointer(self.pair.name, self.environment, self.holder.version if self.holder else None,
                                  self.previous.version if self.previous else None, self.updated_by, self.updated_at)


class ObservationRow(Base):
    """Live acceptance scraped from a serving engine, compared with the recorded baseline."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_version_id: Mapped[int] = mapped_column(ForeignKey("pair_versions.id", ondelete="RESTRICT"), nullable=False, index=True)
    environment: Mapped[str | None] = mapped_column(String(32))
    engine: Mapped[str] = mapped_column(String(16), nullable=False)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    observed_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    figures: Mapped[dict] = mapped_column(JSON, nullable=False)
    verdict: Mapped[str] = mapped_column(String(16), nullable=False)  # ok|drift|no-data

    def to_entity(self, pair_name: str, version: int) -> Observation:
        return Observation(self.id, pair_name, version, self.environment, self.engine, self.url, self.observed_at,
                           self.figures, self.verdict)


class EngineBaselineRow(Base):
    """The pair's acceptance, equivalence and throughput as a serving engine measured them on a
    golden set (`specreg validate --engine`), beside our runtime's baseline (validation_run_id)."""

    __tablename__ = "engine_baselines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_version_id: Mapped[int] = mapped_column(ForeignKey("pair_versions.id", ondelete="RESTRICT"), nullable=False, index=True)
    engine: Mapped[str] = mapped_column(String(16), nullable=False)  # llamacpp|vllm|sglang
    engine_version: Mapped[str] = mapped_column(String(64), nullable=False)
    engine_build: Mapped[str] = mapped_column(String(255), nullable=False)  # build id / binary digest
    source: Mapped[str] = mapped_column(Text, nullable=False)  # "local" (specreg started it) or the URL
    status: Mapped[str] = mapped_column(String(16), nullable=False)  # passed|failed
    golden_set: Mapped[str] = mapped_column(String(255), nullable=False)
    golden_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    binding_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    validation_run_id: Mapped[int | None] = mapped_column(ForeignKey("validation_runs.id", ondelete="RESTRICT"))
    baselines: Mapped[dict] = mapped_column(JSON, nullable=False)  # the engine's acceptance, as validation baselines
    report: Mapped[dict] = mapped_column(JSON, nullable=False)  # parity, equivalence, throughput, settings
    actor: Mapped[str] = mapped_column(String(255), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)

    def to_entity(self, pair_name: str, version: int) -> EngineBaseline:
        return EngineBaseline(
            id=self.id, pair_name=pair_name, version=version, engine=self.engine, engine_version=self.engine_version,
            engine_build=self.engine_build, source=self.source, status=self.status, golden_set=self.golden_set,
            golden_sha256=self.golden_sha256, binding_sha256=self.binding_sha256,
            validation_run_id=self.validation_run_id, baselines=self.baselines, report=self.report, actor=self.actor,
            created_at=self.created_at, pair_version_id=self.pair_version_id)
