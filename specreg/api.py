"""``specreg.Registry``: the Python API, a thin facade; the CLI is a thin layer over it.

    from specreg import Registry
    registry = Registry("sqlite:///registry.db", user="alice")
    result = registry.register("chat-pair", target="models/target", draft="models/draft", num_speculative_tokens=4)
    registry.get("chat-pair@1")

Each method is one line naming its use case in specreg/usecases/, where the work is done.
"""

from __future__ import annotations

from specreg import settings
from specreg.registry.store.entities import AuditEvent, Observation, PairState, PairVersion
from specreg.registry.store.store import Store
from specreg.usecases import (acting_user, approve, engine_baselines, export, mirror, observe, policy, promote, reading,
                              register, validate, validate_engine)
from specreg.usecases.inputs import PairRef
from specreg.usecases.register import RegisterResult

Ref = str | PairRef


class Registry:
    """The registry of speculative-decoding pairs over one database.

    ``db_url``: any SQLAlchemy URL (default ``$SPECREG_DB`` or ``$SPECREG_HOME/registry.db``);
    ``user``: who acts (default ``$SPECREG_USER`` or the OS user); ``mlflow_uri``: the MLflow
    review surface (default ``$MLFLOW_TRACKING_URI`` or the embedded store under
    ``$SPECREG_HOME/mlflow``; ``SPECREG_MLFLOW=off`` turns the mirror off).

    After a validation, approval or promotion, MLflow is brought up to date; when it cannot be
    reached the registry operation still completes and ``warnings`` says MLflow is behind.
    """

    def __init__(self, db_url: str | None = None, user: str | None = None, mlflow_uri: str | None = None):
        self.db_url = db_url or settings.default_db_url()
        self.store = Store(self.db_url)
        self._claimed_user = user
        self._user: str | None = None
        self.mlflow_uri = mlflow_uri
        self.warnings: list[str] = []
        self._review = None

    @property
    def user(self) -> str:
        """Who acts (usecases/acting_user.py); resolved on first use: reading needs no identity."""
        if self._user is None:
            self._user = self.resolve_user()
        return self._user

    def resolve_user(self) -> str:
        return acting_user.resolve_user(self, self._claimed_user)

    # --- registration and reading -------------------------------------------------------

    def register(self, name: str, *, target: str, draft: str | None = None, num_speculative_tokens: int | None = None,
                 method: str = "draft_model", prompt_lookup_min: int | None = None,
                 prompt_lookup_max: int | None = None, max_batch_size_for_speculation: int | None = None,
                 notes: str | None = None, allow_pickle: bool = False, tree=None,
                 allow_verifier_mismatch: bool = False, suffix: dict | None = None) -> RegisterResult:
        """Fingerprint both models and record version N+1 of ``name`` (or return the version that
        already binds the same fingerprints and config). method eagle3 / medusa: ``draft`` is the
        head directory, which must fit the target; mtp: the target's own layers; ``tree``: a
        Medusa / EAGLE candidate tree; ``suffix``: vLLM's suffix_decoding_* settings of method suffix,
        without the prefix."""
        return register.register(
            self, name, target=target, draft=draft, num_speculative_tokens=num_speculative_tokens, method=method,
            prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max,
            max_batch_size_for_speculation=max_batch_size_for_speculation, notes=notes, allow_pickle=allow_pickle,
            tree=tree, allow_verifier_mismatch=allow_verifier_mismatch, suffix=suffix)

    def get(self, ref: Ref, *, with_events: bool = False) -> PairVersion:
        """The version named by ``NAME``, ``NAME@VERSION`` or ``NAME@ENV``."""
        return reading.find_version(self, ref, with_events=with_events)

    def list(self, name: str | None = None) -> list[PairVersion]:
        return reading.versions(self, name)

    def list_summaries(self) -> list[dict]:
        return reading.summaries(self)

    def history(self, name: str) -> list[AuditEvent]:
        return reading.history(self, name)

    def diff(self, ref_a: Ref, ref_b: Ref) -> list[dict]:
        return reading.diff(self, ref_a, ref_b)

    def environments(self, name: str | None = None) -> list[dict]:
        return reading.environments(self, name)

    def environment_history(self, name: str, environment: str, *, at: str | None = None) -> list:
        return reading.environment_history(self, name, environment, at=at)

    # --- lifecycle and governance -------------------------------------------------------

    def move(self, ref: Ref, to_state: PairState, *, action: str, reason: str | None = None,
             details: dict | None = None) -> PairVersion:
        return promote.move(self, ref, to_state, action=action, reason=reason, details=details)

    def retire(self, ref: Ref, reason: str | None = None, *, force: bool = False) -> PairVersion:
        return promote.retire(self, ref, reason, force=force)

    def policy(self, path: str | None = None):
        """The policy of record (with ``path``: the policy in that file, to preview only)."""
        return policy.policy(self, path)

    def policy_record(self):
        return policy.record(self)

    def propose_policy(self, path: str, note: str | None = None) -> dict:
        return policy.propose(self, path, note)

    def approve_policy(self, version: int, *, key: str | None = None, note: str | None = None) -> dict:
        return policy.approve(self, version, key=key, note=note)

    def policy_history(self) -> list[dict]:
        return policy.history(self)

    def policy_document(self, version: int) -> str:
        return policy.document(self, version)

    def approve(self, ref: Ref, note: str | None = None, *, key: str | None = None, environment: str | None = None):
        """Sign and record this user's approval (``key`` or $SPECREG_APPROVAL_KEY; for ``environment`` only)."""
        return approve.decide(self, ref, "approved", note, key, environment)

    def reject(self, ref: Ref, note: str | None = None, *, key: str | None = None, environment: str | None = None):
        """Sign and record this user's rejection (withdraws the approvals signed before it)."""
        return approve.decide(self, ref, "rejected", note, key, environment)

    def enrol_key(self, person: str, public_key: str):
        return approve.enrol_key(self, person, public_key)

    def keyring(self, policy=None):
        return approve.keyring(self, policy)

    def revoke_key(self, key: str, reason: str):
        return approve.revoke_key(self, key, reason)

    def promote(self, ref: Ref, environment: str, **options):
        """Make the version hold ``environment`` under the policy of record -> pointer_moves.PointerMove.
        Options: ``reason``; ``expected_holder``: the version you saw holding it (None: none; default: read
        now), else ConcurrentUpdateError; ``allow_slower``: why a version below min_speedup may hold it;
        ``policy``: the policy of record as the command read it (default: read now)."""
        return promote.promote(self, ref, environment, **options)

    def rollback(self, name: str, environment: str, *, reason: str | None = None):
        return promote.rollback(self, name, environment, reason=reason)

    def gate(self, ref: Ref, environment: str, **options):
        """Whether the version may hold ``environment`` now -> decisions.GateResult (usecases.promote.gate)."""
        return promote.gate(self, ref, environment, **options)

    # --- validation ---------------------------------------------------------------------

    def validation_request(self, ref: Ref, **settings):  # what the CLI builds, then runs (run_validation)
        return validate.validation_request(self, ref, **settings)

    def validate(self, ref: Ref, **options):
        """Validate on a golden set, record the run; validated or failed -> ValidationOutcome (usecases.validate)."""
        return validate.validate(self, ref, **options)

    def run_validation(self, request, *, progress=None, hooks: dict | None = None):
        return validate.run_validation(self, request, progress=progress, hooks=hooks)

    def validate_engine(self, ref: Ref, request, *, golden: str | None = None, progress=None):
        """Validate a version as ``request`` (EngineValidationRequest) asks, record its engine baseline."""
        return validate_engine.validate_engine(self, ref, request, golden=golden, progress=progress)

    def build_llama_server(self, log=None, progress=None):
        return validate_engine.build_llama_server(self, log=log, progress=progress)

    def install_vllm(self, log=None, cached: bool = False) -> dict:
        return validate_engine.install_vllm(self, log=log, cached=cached)

    def validation_runs(self, ref: Ref) -> list:
        return validate.validation_runs(self, ref)

    def baselines(self, ref: Ref) -> dict | None:
        return validate.baselines(self, ref)

    def engine_baselines(self, ref: Ref, engine: str | None = None) -> list:
        return engine_baselines.engine_baselines(self, ref, engine)

    def engine_baseline_standings(self, ref: Ref) -> list:
        return engine_baselines.standings(self, ref)

    def accept_engine_baseline(self, ref: Ref, baseline_id: int, *, key: str | None = None,
                               note: str | None = None) -> dict:
        return engine_baselines.accept(self, ref, baseline_id, key=key, note=note)

    def engine_baseline(self, version: PairVersion, engine: str):
        return engine_baselines.counted(self, version, engine)

    def baselines_for_engine(self, version: PairVersion, engine: str | None, baselines: dict | None) -> dict | None:
        return engine_baselines.in_engine_terms(self, version, engine, baselines)

    # --- deployment ---------------------------------------------------------------------

    def export(self, ref: Ref, fmt: str, *, out_dir: str | None = None, force: bool = False, overwrite: bool = False,
               template: str | None = None, options: dict | None = None, signing_key: str | None = None):
        """Deployment files of format ``fmt`` for a validated + approved version (``force``: any,
        marked UNAPPROVED), with the pair lock signed by ``signing_key`` -> [(file name, text)],
        written under ``out_dir`` when given (an existing file only with ``overwrite``)."""
        return export.export(self, ref, fmt, out_dir=out_dir, force=force, overwrite=overwrite, template=template,
                             options=options, signing_key=signing_key)

    def pair_lock(self, version: PairVersion, *, engine: dict | None, baselines: dict | None,
                  signing_key: str | None, approved: bool, environment=None, draft_layout: tuple | None = None,
                  engine_layouts=None) -> dict:
        return export.lock_for(self, version, engine=engine, baselines=baselines, approved=approved,
                               environment=environment, draft_layout=draft_layout, engine_layouts=engine_layouts,
                               signing_key=signing_key)

    def observe(self, ref: Ref, metrics_url: str, **options) -> dict:
        """Scrape the engine's metrics, compare them with the baselines, store the observation."""
        return observe.observe(self, ref, metrics_url, **options)

    def observations(self, ref: Ref, limit: int = 5) -> list[Observation]:
        return observe.observations(self, ref, limit)

    # --- MLflow review surface and the database ------------------------------------------

    @property
    def review(self):
        """The MLflow mirror (registry.review.Review), opened on first use; None when off."""
        if self._review is None:
            self._review = self.open_review()
        return self._review

    def open_review(self):
        return mirror.open_review(self)

    def mirror(self, ref: Ref) -> None:
        mirror.mirror(self, ref)

    def sync(self, name: str | None = None) -> list[dict]:
        return mirror.sync(self, name)

    def verify_audit(self) -> tuple[int, str | None]:
        """(events checked, the first broken link or None) of the whole audit chain."""
        return reading.verify_audit(self)

    def audit_anchor(self, expected_head: str | None) -> tuple[int | None, int, str | None, str]:
        """Where an audit head recorded earlier sits in the verified chain now -> (its 1-based
        position or None, events in the verified chain, the chain's problem or None, the head now)."""
        return reading.audit_anchor(self, expected_head)

    def not_counted(self) -> list[str]:
        return reading.not_counted(self)
