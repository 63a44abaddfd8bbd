"""MLflow as the review surface of the registry (docs/design.md §5).

specreg's own database is the source of truth; this module copies what it knows into MLflow
and reads back the one thing reviewers write there: the approval tag (a request, never a decision:
mlflow_approvals.py). Every write is
idempotent (found by tag before it is created), so `specreg sync` can replay everything after
MLflow was down and create nothing twice.

What goes where:
- a validation      -> a run in experiment ``specreg/<pair>`` (params, metrics, tags, and
                       artifacts under ``pair/``)
- a pair version    -> a model version of registered model ``<prefix><pair>`` whose source is
                       ``runs:/<run_id>/pair``; description = Markdown gate summary; tags carry
                       ``specreg.version``, ``specreg.status``, fingerprints, baselines
- a promotion       -> an alias (``staging``, ``production`` ...) on the registered model
- an approval       -> model-version tag ``specreg.approval`` = ``approved:<user>`` or
                       ``rejected:<user>`` (+ ``specreg.approval_note``)

mlflow is imported inside functions: ``specreg --help`` must not pay for it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from specreg.errors import MlflowUnavailable, NotFoundError, UsageError
from specreg.registry.review.mlflow_approvals import ApprovalTags
from specreg.registry.review.mlflow_ui import local_artifact_root
from specreg.registry.review.mlflow_records import (GATE_TAG_PREFIXES, _check_statuses, stage_artifacts,
                                                   validation_metrics, validation_params)
from specreg.registry.store.entities import PairVersion
from specreg.settings import default_mlflow_uri

RESERVED_ALIASES = re.compile(r"^(latest|v\d+)$", re.IGNORECASE)

# An unreachable server must fail in seconds so the registry can warn "MLflow is behind" and
# carry on; MLflow's defaults (7 retries, 120 s timeout) would block for minutes.
FAST_FAIL_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
}

class MlflowSync(ApprovalTags):
    """Keeps MLflow in step with the registry. Every method raises MlflowUnavailable (fast)
    when MLflow cannot be reached, and is idempotent: call it again after a failure."""

    def __init__(self, tracking_uri: str | None = None, model_prefix: str = "specreg."):
        """``tracking_uri``: argument, else ``$MLFLOW_TRACKING_URI``, else the embedded store
        ``sqlite:///$SPECREG_HOME/mlflow/mlflow.db`` with artifacts in
        ``$SPECREG_HOME/mlflow/artifacts``. ``model_prefix`` starts every registered model name."""
        self.tracking_uri = tracking_uri or default_mlflow_uri()
        self.model_prefix = model_prefix
        self.artifact_root = local_artifact_root(self.tracking_uri)
        for name, value in FAST_FAIL_ENV.items():
            os.environ.setdefault(name, value)  # the user's own setting wins
        self._client = None

    # ------------------------------------------------------------------ plumbing

    @property
    def client(self):
        """The MlflowClient, created on first use (mlflow is a heavy import)."""
        if self._client is None:
            if self.artifact_root is not None:
                self.artifact_root.mkdir(parents=True, exist_ok=True)
            with self._translate_errors():
                from mlflow import MlflowClient

                self._client = MlflowClient(self.tracking_uri, registry_uri=self.tracking_uri)
        return self._client

    @contextlib.contextmanager
    def _translate_errors(self) -> Iterator[None]:
        """Turn "cannot reach / cannot use MLflow" into MlflowUnavailable; errors the server
        answers with on purpose (bad request, not found ...) stay as they are."""
        import requests
        from mlflow.exceptions import MlflowException, RestException

        from specreg.registry.store.database import operational_errors

        try:
            yield
        except RestException as error:
            if error.get_http_status_code() >= 500:
                raise MlflowUnavailable(
                    f"MLflow at {self.tracking_uri} failed: {str(error).splitlines()[0]}"
                ) from error
            raise
        except MlflowException as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            # Transport failures come as plain MlflowExceptions naming the request.
            if "API request" in message or error.error_code == "TEMPORARILY_UNAVAILABLE":
                raise MlflowUnavailable(
                    f"MLflow at {self.tracking_uri} is unreachable: {message[:300]}"
                ) from error
            raise
        # a local store's database locked or unreadable counts as unreachable
        except (requests.exceptions.RequestException, *operational_errors(), ConnectionError, TimeoutError) as error:
            raise MlflowUnavailable(
                f"MLflow at {self.tracking_uri} is unreachable: {str(error)[:300]}"
            ) from error

    def registered_model_name(self, pair_name: str) -> str:
        """``<prefix><pair>``, e.g. ``specreg.llama-tiny``."""
        return f"{self.model_prefix}{pair_name}"

    @staticmethod
    def experiment_name(pair_name: str) -> str:
        """``specreg/<pair>``: one experiment per pair, all its validations as runs."""
        return f"specreg/{pair_name}"

    def ping(self) -> None:
        """Raise MlflowUnavailable unless MLflow answers a cheap read."""
        with self._translate_errors():
            self.client.search_experiments(max_results=1)

    def _experiment_id(self, pair_name: str) -> str:
        """Id of ``specreg/<pair>``, created (or restored from deleted) when needed. On a local
        store its artifacts go under our artifact root, never MLflow's default ./mlruns."""
        name = self.experiment_name(pair_name)
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            location = None
            if self.artifact_root is not None:
                folder = re.sub(r"[^A-Za-z0-9._-]", "_", name)  # specreg/x -> specreg_x
                location = (self.artifact_root / folder).as_uri()
            return self.client.create_experiment(name, artifact_location=location)
        if experiment.lifecycle_stage == "deleted":
            self.client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id

    # ------------------------------------------------------------------ runs

    def find_validation_run(self, pair_name: str, validation_id: str):
        """The active MLflow run tagged ``specreg.validation_id`` = ``validation_id``, or None."""
        with self._translate_errors():
            experiment = self.client.get_experiment_by_name(self.experiment_name(pair_name))
            if experiment is None:
                return None
            runs = self.client.search_runs(
                [experiment.experiment_id],
                filter_string=f"tags.`specreg.validation_id` = '{_quote_value(validation_id)}'",
            )
        return runs[0] if runs else None

    def synced_run_id(self, pair_name: str, validation_id: str) -> str | None:
        """The run id of a completely written run for ``validation_id``, or None (absent or
        half-written): callers skip building artifacts for what MLflow already has."""
        existing = self.find_validation_run(pair_name, validation_id)
        if existing is not None and existing.data.tags.get("specreg.synced") == "true":
            return existing.info.run_id
        return None

    def log_validation(
        self,
        pair_version: PairVersion,
        validation: dict[str, Any],
        artifacts: dict[str, Path | str] | None = None,
    ) -> str:
        """Record one validation of ``pair_version`` as an MLflow run; returns its run id.

        ``validation`` (only ``id`` and ``verdict`` are required; other sections may be
        missing or partial)::

            {
              "id": "b3f1...",                       # validation id: the idempotency key
              "verdict": "pass" | "warn" | "fail",
              "settings": {"k": 4, "method": "draft_model", "dtype": "float32",
                           "device": "cpu", "temperature": 0.0, "seed": 0},   # -> params
              "golden_set": {"name": "smoke", "version": 1, "sha256": "...",
                             "prompts": 12},   # -> params golden_set, golden_set_<key>
              "runtime": {"torch": "2.13.0", "transformers": "5.24.0",
                          "specreg": "0.1.0"},              # -> params runtime.<package>
              "acceptance": {                                # -> metrics
                "acceptance_rate": 0.71, "mean_acceptance_length": 3.2,
                "per_position": [0.9, 0.8, 0.6, 0.5],        # acceptance_rate_pos_<i>, i from 0
                "per_category": {"code": {"acceptance_rate": 0.8,
                                          "mean_acceptance_length": 3.6}},
                                                   # acceptance_rate.code, mean_acceptance_length.code
                "drafted_tokens": 400, "accepted_tokens": 284,
                "longest_rejection_run": 3},                 # any other number: same name
              "performance": {                               # -> metrics
                "speedup": 1.8, "tokens_per_s": 120.0, "baseline_tokens_per_s": 66.0,
                "ttft_ms": 12.0,
                "latency_ms": {"p50": 7.0, "p95": 9.0, "p99": 11.0}},  # latency_ms_p50 ...
              "equivalence": {"prompts": 12, "exact": 11, "near_tie": 1,
                              "fail": 0},                    # equivalence_exact ...
              "checks": {"tokenizer": "pass", "equivalence": "warn"},
                        # or [{"name": ..., "status": ...}]  -> tags specreg.check.<name>
            }

        ``artifacts``: name -> content, logged under ``pair/<name>`` (names may hold
        folders, e.g. ``exports/vllm.sh``). A ``Path`` is a file or folder to copy; a ``str``
        is the text itself. Always logged too: ``pair/pair.yaml`` (``pair_version.to_dict()``)
        and ``pair/validation.json`` (the validation dict).

        Idempotent: a finished run with this validation id is returned as it is; a run left
        half-written by an earlier failure is deleted and written again.
        """
        validation_id = str(validation.get("id") or "")
        if not validation_id:
            raise UsageError("validation dict has no 'id': it is the key that keeps sync idempotent")
        verdict = str(validation.get("verdict") or "unknown")
        with tempfile.TemporaryDirectory(prefix="specreg-mlflow-") as staging:
            # Staged first: a missing file fails before anything is written to MLflow.
            stage_artifacts(Path(staging), pair_version, validation, artifacts or {})
            existing = self.find_validation_run(pair_version.name, validation_id)
            with self._translate_errors():
                if existing is not None:
                    if existing.data.tags.get("specreg.synced") == "true":
                        return existing.info.run_id
                    # Half-written (MLflow went away mid-way): params cannot be overwritten
                    # with other values, so start the run again rather than patch it.
                    self.client.delete_run(existing.info.run_id)
                run_id = self._write_validation_run(pair_version, validation, verdict, staging)
        return run_id

    def _write_validation_run(
        self, pair_version: PairVersion, validation: dict[str, Any], verdict: str, staging: str
    ) -> str:
        validation_id = str(validation["id"])
        tags = {
            "specreg.pair": pair_version.name,
            "specreg.version": str(pair_version.version),
            "specreg.verdict": verdict,
            "specreg.validation_id": validation_id,
        }
        for check_name, status in _check_statuses(validation.get("checks")).items():
            tags[f"specreg.check.{check_name}"] = status
        # The validation id goes in with the creation, so a retry always finds this run.
        run = self.client.create_run(
            self._experiment_id(pair_version.name),
            tags=tags,
            run_name=run_name(pair_version.label, verdict, validation_id),
        )
        run_id = run.info.run_id
        self._log_batches(
            run_id, validation_params(pair_version, validation), validation_metrics(validation)
        )
        self.client.log_artifacts(run_id, staging, artifact_path="pair")
        # Last: marks the run complete, so a retry knows it need not write it again.
        self.client.set_tag(run_id, "specreg.synced", "true")
        # set_terminated prints "View run ..." to stdout, which would corrupt `--json` output.
        with contextlib.redirect_stdout(io.StringIO()):
            self.client.set_terminated(run_id, "FINISHED")
        return run_id

    def _log_batches(self, run_id: str, params: dict[str, str], metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric, Param

        timestamp = int(datetime.now(timezone.utc).timestamp() * 1000)
        param_list = [Param(key, value) for key, value in params.items()]
        metric_list = [Metric(key, value, timestamp, 0) for key, value in metrics.items()]
        # MLflow takes at most 100 params and 1000 metrics per batch.
        for start in range(0, len(param_list), 100):
            self.client.log_batch(run_id, params=param_list[start:start + 100])
        for start in range(0, len(metric_list), 1000):
            self.client.log_batch(run_id, metrics=metric_list[start:start + 1000])

    # ------------------------------------------------------------------ model versions

    def find_model_version(self, pair_version: PairVersion):
        """The MLflow ModelVersion tagged ``specreg.version`` = this version, or None."""
        name = self.registered_model_name(pair_version.name)
        with self._translate_errors():
            versions = self.client.search_model_versions(f"name = '{_quote_value(name)}'")
        wanted = str(pair_version.version)
        matches = [mv for mv in versions if (mv.tags or {}).get("specreg.version") == wanted]
        return min(matches, key=lambda mv: int(mv.version)) if matches else None

    def _require_model_version(self, pair_version: PairVersion):
        model_version = self.find_model_version(pair_version)
        if model_version is None:
            raise NotFoundError(
                f"{pair_version.label} has no MLflow model version in "
                f"{self.registered_model_name(pair_version.name)} yet: run `specreg sync`"
            )
        return model_version

    def ensure_model_version(
        self,
        pair_version: PairVersion,
        run_id: str,
        description_markdown: str,
        tags: dict[str, str] | None = None,
        baselines: dict[str, Any] | None = None,
    ) -> int:
        """Make ``pair_version`` a model version of ``<prefix><pair>`` (created if missing)
        from ``runs:/<run_id>/pair``; returns the MLflow version number.

        Description: ``description_markdown`` (the gate summary). Tags: ``specreg.version``,
        ``specreg.status``, ``specreg.binding_sha256``, target/draft weights and tokenizer
        digests, ``specreg.run_id``, ``specreg.baselines`` (JSON of ``baselines``) and the
        caller's ``tags``. Idempotent: found by tag ``specreg.version``; when it exists its
        description and tags are brought up to date (its source run stays the first one:
        MLflow sources are immutable; ``specreg.run_id`` names the latest validation run)."""
        name = self.registered_model_name(pair_version.name)
        all_tags = {
            "specreg.pair": pair_version.name,
            "specreg.version": str(pair_version.version),
            "specreg.status": pair_version.state.value,
            "specreg.binding_sha256": pair_version.binding_sha256,
            "specreg.target_weights_sha256": pair_version.target.fingerprint.weights_sha256,
            "specreg.target_tokenizer_sha256": pair_version.target.fingerprint.tokenizer_sha256,
            "specreg.run_id": run_id,
        }
        if pair_version.draft is not None:
            all_tags["specreg.draft_weights_sha256"] = pair_version.draft.fingerprint.weights_sha256
            all_tags["specreg.draft_tokenizer_sha256"] = (
                pair_version.draft.fingerprint.tokenizer_sha256
            )
        if baselines is not None:
            all_tags["specreg.baselines"] = json.dumps(baselines, sort_keys=True)
        all_tags.update(tags or {})
        all_tags = {key: str(value) for key, value in all_tags.items() if value is not None}

        self._ensure_registered_model(name, pair_version.name)
        existing = self.find_model_version(pair_version)
        with self._translate_errors():
            if existing is None:
                # Tags go in with the creation itself: a crash after it still leaves the
                # version findable by specreg.version, so a retry never makes a second one.
                created = self.client.create_model_version(
                    name,
                    source=f"runs:/{run_id}/pair",
                    run_id=run_id,
                    tags=all_tags,
                    description=description_markdown,
                    await_creation_for=0,  # the OSS server creates it at once; no wait log line
                )
                return int(created.version)
            if (existing.description or "") != description_markdown:
                self.client.update_model_version(
                    name, existing.version, description=description_markdown
                )
            current = existing.tags or {}
            for key, value in all_tags.items():
                if current.get(key) != value:
                    self.client.set_model_version_tag(name, existing.version, key, value)
            for key in current.keys() - all_tags.keys():  # gate state that no longer holds
                if key.startswith(GATE_TAG_PREFIXES):
                    self.client.delete_model_version_tag(name, existing.version, key)
            return int(existing.version)

    def _ensure_registered_model(self, name: str, pair_name: str) -> None:
        from mlflow.exceptions import MlflowException

        with self._translate_errors():
            try:
                self.client.get_registered_model(name)
                return
            except MlflowException as error:
                if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
            try:
                self.client.create_registered_model(
                    name,
                    tags={"specreg.pair": pair_name},
                    description=f"Speculative-decoding pair `{pair_name}`, kept by specreg.",
                )
            except MlflowException as error:
                if error.error_code != "RESOURCE_ALREADY_EXISTS":  # a concurrent sync won
                    raise

    def mirror_state(self, pair_version: PairVersion) -> bool:
        """Copy the lifecycle state into tag ``specreg.status``. Returns False (and writes
        nothing) when the version has no model version yet (never validated)."""
        model_version = self.find_model_version(pair_version)
        if model_version is None:
            return False
        if (model_version.tags or {}).get("specreg.status") != pair_version.state.value:
            with self._translate_errors():
                self.client.set_model_version_tag(
                    model_version.name, model_version.version,
                    "specreg.status", pair_version.state.value,
                )
        return True

    # ------------------------------------------------------------------ aliases

    def set_alias(self, pair_name: str, alias: str, pair_version: PairVersion) -> int:
        """Point ``alias`` of ``<prefix><pair>`` at the model version of ``pair_version``
        (moving it from wherever it pointed); returns the MLflow version number."""
        if RESERVED_ALIASES.match(alias):
            raise UsageError(f"alias {alias!r} is reserved by MLflow (latest, v<N>)")
        if pair_version.name != pair_name:
            raise UsageError(f"alias on {pair_name} cannot point at {pair_version.label}")
        model_version = self._require_model_version(pair_version)
        with self._translate_errors():
            self.client.set_registered_model_alias(
                model_version.name, alias, model_version.version
            )
        return int(model_version.version)

    def delete_alias(self, pair_name: str, alias: str) -> None:
        """Remove ``alias`` from ``<prefix><pair>``; nothing happens if it is not set."""
        from mlflow.exceptions import MlflowException

        name = self.registered_model_name(pair_name)
        with self._translate_errors():
            try:
                self.client.delete_registered_model_alias(name, alias)
            except MlflowException as error:
                if error.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise

    def aliases(self, pair_name: str) -> dict[str, int]:
        """alias -> MLflow version number on ``<prefix><pair>`` ({} if the model is missing)."""
        from mlflow.exceptions import MlflowException

        with self._translate_errors():
            try:
                model = self.client.get_registered_model(self.registered_model_name(pair_name))
            except MlflowException as error:
                if error.error_code == "RESOURCE_DOES_NOT_EXIST":
                    return {}
                raise
        return {alias: int(version) for alias, version in (model.aliases or {}).items()}

def _quote_value(value: str) -> str:
    """Escape a value for an MLflow filter string literal in single quotes."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def run_name(label: str, verdict: str, validation_id: str) -> str:
    """An MLflow run's name: ``chat@1 warn validation-3``. The id of a validation run starts with
    its label (replay.validation_key), which the name says already: cut to 12 characters whole,
    it left ``chat@1/valid``. Any other id (a hash) keeps its first 12 characters."""
    if validation_id.startswith(f"{label}/"):
        return f"{label} {verdict} {validation_id.removeprefix(f'{label}/')}"
    return f"{label} {verdict} {validation_id[:12]}"
