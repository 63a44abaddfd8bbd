"""Keeps MLflow, the review surface, in step with the registry, which stays the source of truth.

``Review.sync_version`` replays everything the registry knows about one pair version into
MLflow (validation runs with reports, the model version with its gate summary, the state tag,
approvals, environment aliases) and reads back the one thing reviewers write there: an
approval tag set in the MLflow UI, which becomes a registry approval with its audit event.
Every step is idempotent (MlflowSync finds what exists by tag), so a sync after MLflow was
down creates only what is missing, and running it twice creates nothing twice.
"""

from __future__ import annotations

import json
import os

from specreg.errors import MlflowUnavailable, SpecregError
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.store import Store

FINISHED = ("passed", "failed")
CONFIRMING_PERMISSIONS = ("EDIT", "MANAGE")  # MLflow permissions that may change a model version


def mlflow_enabled() -> bool:
    """``SPECREG_MLFLOW=off`` turns the MLflow mirror off (the registry works without it)."""
    return os.environ.get("SPECREG_MLFLOW", "on").strip().lower() not in ("off", "0", "false", "no")


def validation_key(run) -> str:
    """The idempotency key of a validation run in MLflow."""
    return f"{run.pair_name}@{run.version}/validation-{run.id}"


class Review:
    """The registry's side of the MLflow sync: what to write for a version, from the store."""

    def __init__(self, store: Store, tracking_uri: str | None = None, actor: str = "specreg"):
        from specreg.registry.review.mlflow_sync import MlflowSync

        # MLflow logs its store set-up at INFO on the CLI's stderr (it reads this when imported,
        # later); the registry reports what it did itself. The user's own setting wins.
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        self.store = store
        self.actor = actor
        self.mlflow = MlflowSync(tracking_uri, model_prefix=os.environ.get("SPECREG_MLFLOW_PREFIX", "specreg."))
        self.notes: list[str] = []  # approvals read back or skipped, for the CLI to print

    @property
    def tracking_uri(self) -> str:
        return self.mlflow.tracking_uri

    def sync_version(self, version: PairVersion) -> dict:
        """Bring MLflow up to date for one version; returns what was done (for --json)."""
        from specreg.registry.review.reports import render_html, render_markdown
        from specreg.registry.store.validations import ValidationStore

        validations = ValidationStore(self.store)
        runs = [run for run in validations.list_runs(version.name, version.version) if run.status in FINISHED]
        done: dict = {"pair": version.label, "runs": [], "model_version": None, "approval": None, "aliases": {}}
        latest_passed = None
        for run in runs:
            mlflow_run_id = self.mlflow.synced_run_id(version.name, validation_key(run))
            if mlflow_run_id is None:  # render the reports only for runs MLflow does not have yet
                summary = dict(run.summary or {})
                record = {**summary, "id": validation_key(run),
                          "verdict": summary.get("verdict") or ("pass" if run.status == "passed" else "fail"),
                          "runtime": {k: v for k, v in (run.environment or {}).items() if isinstance(v, str)}}
                artifacts = {"report.html": render_html(run, version), "summary.md": render_markdown(run, version),
                             "results.json": json.dumps(run.to_dict(), indent=2, default=str)}
                mlflow_run_id = self.mlflow.log_validation(version, record, artifacts)
            if run.mlflow_run_id != mlflow_run_id:
                validations.set_mlflow_run_id(run.id, mlflow_run_id)
            done["runs"].append(mlflow_run_id)
            if run.status == "passed":
                latest_passed = (run, mlflow_run_id)
        if runs:
            latest, latest_run_id = runs[-1], done["runs"][-1]
            baselines = latest_passed[0].baselines if latest_passed else None
            done["model_version"] = self.mlflow.ensure_model_version(
                version, latest_run_id, render_markdown(latest, version),
                tags={"specreg.validation": validation_key(latest),
                      # the registry's audit head, anchored outside its database
                      "specreg.audit_head": self.store.audit_head()}, baselines=baselines)
            self.mlflow.mirror_state(version)
            done["approval"] = self.sync_approval(version)
        done["aliases"] = self.sync_aliases(version.name)
        return done

    def sync_approval(self, version: PairVersion) -> str | None:
        """Registry decisions go to MLflow (tag ``<status>:<approver>``); a decision made in the
        MLflow UI comes back as a registry decision with its audit event (recorded by whoever
        runs the sync, the approver in its details).

        Attribution: a tag ``approved:<user>`` counts as ``user``'s approval only where the
        server's auth app confirms ``user`` may edit the registered model (EDIT or MANAGE);
        otherwise (a bare ``approved``, no auth app, a user without that permission) it is
        recorded as unattributed and does not satisfy four-eyes until a named approver
        confirms it with `specreg approve`. A malformed tag (``LGTM``) is warned about and
        ignored."""
        from specreg.registry.governance import approvals as decisions

        from specreg.registry.store.store import verified_chain

        with self.store.session() as session:
            row = self.store.version_row(session, version.name, version.version)
            # only decisions the audit chain vouches for reach MLflow (a forged row does not)
            approvals = decisions.chained_approvals(session, row, verified_chain(session)[0])
        latest = approvals[-1].decision if approvals else None
        attributed = [a for a in approvals if a.source != decisions.UNATTRIBUTED]
        from_ui = [a for a in approvals if a.source in ("mlflow", decisions.UNATTRIBUTED)]
        in_mlflow = self.mlflow.read_approval(version)
        if in_mlflow is not None and in_mlflow["status"] is None:
            self.notes.append(in_mlflow["problem"])
            in_mlflow = None if attributed else in_mlflow  # the registry's own decision replaces it
        if in_mlflow is not None and in_mlflow["status"] is not None and in_mlflow["user"] is None:
            decided = self.attribute(version, in_mlflow)
            last_ui = from_ui[-1] if from_ui else None
            if last_ui is None or (last_ui.decision, last_ui.actor, last_ui.source) != decided[:3]:
                return self.record_ui_decision(version, in_mlflow, *decided)
            if not attributed or attributed[-1].id < last_ui.id:
                return latest  # recorded by an earlier sync, and nothing newer to write back
            in_mlflow = None  # a registry decision newer than the UI's: it goes to the tag
        if attributed:
            newest = attributed[-1]
            if in_mlflow is None or in_mlflow["status"] != newest.decision or in_mlflow.get("user") != newest.actor:
                self.mlflow.set_approval(version, newest.decision, newest.note, newest.actor)
        return latest

    def attribute(self, version: PairVersion, in_mlflow: dict) -> tuple[str, str, str, str | None, str | None]:
        """(decision, approver, source, why unattributed or None, permission) of a UI tag."""
        from specreg.registry.governance import approvals as decisions

        status, named = in_mlflow["status"], in_mlflow["named"]
        permission = self.mlflow.model_permission(version.name, named) if named else None
        if named is None:
            why = f"the tag names no approver (use {status}:<user>)"
        elif permission is None:
            why = f"the MLflow server has no auth app to confirm that {named} set it"
        elif permission in CONFIRMING_PERMISSIONS:
            why = None
        else:
            why = f"{named} holds {permission} on {self.mlflow.registered_model_name(version.name)}, not EDIT or MANAGE"
        if why:
            return status, decisions.UNATTRIBUTED_ACTOR, decisions.UNATTRIBUTED, why, permission
        return status, named, "mlflow", None, permission

    def record_ui_decision(self, version: PairVersion, in_mlflow: dict, status: str, actor: str, source: str,
                           why: str | None, permission: str | None) -> str | None:
        """Record a decision set in the MLflow UI (not written by specreg); see sync_approval."""
        from specreg.registry.governance import approvals as decisions

        named = in_mlflow["named"]
        details = {"mlflow_tag": in_mlflow["raw"], "named_user": named, "permission": permission}
        if why:
            details["unattributed_because"] = why
        try:
            decisions.decide(self.store, version.name, version.version, actor=actor, decision=status,
                             note=in_mlflow.get("note"), source=source, recorded_by=self.actor, details=details)
        except SpecregError as exc:
            self.notes.append(f"MLflow {status} of {version.label} not recorded: {exc}")
            return None
        if why:
            self.notes.append(f"recorded {status} of {version.label} from MLflow as unattributed ({why}); "
                              + ("a named approver must confirm it with `specreg approve`" if status == "approved"
                                 else "it withdraws the approval"))
            return status
        self.notes.append(f"recorded {status} of {version.label} from MLflow by {named} "
                          f"({permission} on the model, confirmed by the MLflow auth app; synced by {self.actor})")
        # write it back as specreg's record so the tag and the registry agree from now on
        self.mlflow.set_approval(version, status, in_mlflow.get("note"), named)
        return status

    def sync_aliases(self, pair_name: str) -> dict[str, int | None]:
        """MLflow aliases follow the registry's environment pointers."""
        from specreg.registry.governance import moves

        pointers = moves.environment_pointers(self.store, pair_name)
        current = self.mlflow.aliases(pair_name) if pointers else {}
        result: dict[str, int | None] = {}
        for pointer in pointers:
            environment, holder = pointer["environment"], pointer.get("version")
            if holder is None:
                if environment in current:
                    self.mlflow.delete_alias(pair_name, environment)
                result[environment] = None
                continue
            holder_version = self.store.get_version(pair_name, holder)
            if self.mlflow.find_model_version(holder_version) is None:
                continue  # never validated into MLflow: nothing to point at yet
            result[environment] = self.mlflow.set_alias(pair_name, environment, holder_version)
        return result


def behind_warning(uri: str, exc: MlflowUnavailable) -> str:
    return f"MLflow ({uri}) is behind: {exc}; the registry is up to date, run `specreg sync` once MLflow is reachable"
