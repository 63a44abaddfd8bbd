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

from specreg.core.statuses import FINISHED_RUNS, CheckStatus, RunStatus
from specreg.errors import MlflowUnavailable, SpecregError
from specreg.registry.review.mlflow_records import gate_description, gate_tags
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.store import Store

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
        runs = [run for run in validations.list_runs(version.name, version.version) if run.status in FINISHED_RUNS]
        done: dict = {"pair": version.label, "runs": [], "model_version": None, "approval": None, "aliases": {}}
        latest_passed = None
        for run in runs:
            mlflow_run_id = self.mlflow.synced_run_id(version.name, validation_key(run))
            if mlflow_run_id is None:  # render the reports only for runs MLflow does not have yet
                summary = dict(run.summary or {})
                record = {**summary, "id": validation_key(run),
                          "verdict": summary.get("verdict") or (CheckStatus.PASS if run.status == RunStatus.PASSED else CheckStatus.FAIL),
                          "runtime": {k: v for k, v in (run.environment or {}).items() if isinstance(v, str)}}
                artifacts = {"report.html": render_html(run, version), "summary.md": render_markdown(run, version),
                             "results.json": json.dumps(run.to_dict(), indent=2, default=str)}
                mlflow_run_id = self.mlflow.log_validation(version, record, artifacts)
            if run.mlflow_run_id != mlflow_run_id:
                validations.set_mlflow_run_id(run.id, mlflow_run_id)
            done["runs"].append(mlflow_run_id)
            if run.status == RunStatus.PASSED:
                latest_passed = (run, mlflow_run_id)
        if runs:
            latest, latest_run_id = runs[-1], done["runs"][-1]
            baselines = latest_passed[0].baselines if latest_passed else None
            gates = self.gates(version)
            summary = gate_description(gates) + "\n## Latest validation\n\n" + render_markdown(latest, version)
            request = self.approval_request(version) if self.mlflow.find_model_version(version) else None
            if request is not None:  # shown in the UI where the reviewer set the tag
                summary += f"\n\n**Approval:** {request}\n"
            done["model_version"] = self.mlflow.ensure_model_version(
                version, latest_run_id, summary,
                tags={"specreg.validation": validation_key(latest),
                      # the registry's audit head, anchored outside its database
                      "specreg.audit_head": self.store.audit_head(), **gate_tags(gates)}, baselines=baselines)
            self.mlflow.mirror_state(version)
            done["approval"] = self.sync_approval(version)
        done["aliases"] = self.sync_aliases(version.name)
        return done

    def gates(self, version: PairVersion) -> list:
        """The gate of ``version`` for each environment of the policy of record, as the model
        version's description and tags show it (the model files are not re-hashed on each sync)."""
        from specreg.registry.governance.decisions import gate
        from specreg.registry.governance.policy_record import policy_of_record
        from specreg.registry.governance.queries import golden_reference

        policy = policy_of_record(self.store).policy
        results, golden = [], {}  # environments naming one golden set resolve it once
        for environment, env in policy.environments.items():
            try:
                if env.golden_set not in golden:
                    golden[env.golden_set] = golden_reference(env.golden_set)
                results.append(gate(self.store, policy, version, environment, golden=golden[env.golden_set],
                                    rehash=False))
            except SpecregError:  # e.g. a golden set this machine lacks: `specreg gate` says why
                continue
        return results

    def sync_approval(self, version: PairVersion) -> str | None:
        """Registry decisions go to MLflow (tag ``<status>:<approver>``); returns the newest
        decision that counts (None: none).

        A tag set in the MLflow UI (``approved:bob``) is a request naming the approver, never a
        decision: MLflow OSS records no author for a tag, so whoever can edit the model can
        write any name there. It counts once bob has signed that decision with his own key
        (`specreg approve` by bob); until then the model version's description says
        "waiting for bob's signature" and the tag is left as the reviewer set it. A malformed
        tag (``LGTM``) is warned about and ignored."""
        request = self.approval_request(version)
        counted = self.counted(version)
        if request is not None:
            self.notes.append(request)
            return counted[-1].decision if counted else None
        if counted:
            newest = counted[-1]
            in_mlflow = self.mlflow.read_approval(version)
            if in_mlflow is None or in_mlflow["status"] != newest.decision or in_mlflow.get("user") != newest.actor:
                self.mlflow.set_approval(version, newest.decision, newest.note, newest.actor)
        return counted[-1].decision if counted else None

    def counted(self, version: PairVersion) -> list:
        """The decisions of ``version`` whose signatures count now, oldest first."""
        from specreg.registry.governance.approvals import counted_approvals
        from specreg.registry.governance.policy_record import policy_of_record

        return counted_approvals(self.store, policy_of_record(self.store).policy, version.name, version.version)

    def approval_request(self, version: PairVersion) -> str | None:
        """The line for a tag set in the MLflow UI that no signature answers yet (None: no
        such tag, or it is answered): ``waiting for bob's signature``."""
        from specreg.core.user_names import same_user

        in_mlflow = self.mlflow.read_approval(version)
        if in_mlflow is None:
            return None
        if in_mlflow["status"] is None:
            self.notes.append(in_mlflow["problem"])
            return None
        if in_mlflow["user"] is not None:
            return None  # specreg wrote it from a signed decision
        status, named = in_mlflow["status"], in_mlflow["named"]
        verb = "approve" if status == "approved" else "reject"
        if named is None:
            return (f"MLflow tag {in_mlflow['raw']!r} on {version.label} names no approver: a request is "
                    f"{status}:<user>, and counts once that user signs (`specreg {verb} {version.label} --key KEY`)")
        if any(a.decision == status and same_user(a.actor, named) for a in self.counted(version)):
            return None
        what = "approval" if status == "approved" else "rejection"
        return (f"{what} of {version.label} requested in MLflow for {named}: waiting for {named}'s signature "
                f"(`specreg {verb} {version.label} --key KEY` by {named}); a tag alone never counts, MLflow records "
                f"no author for a tag")

    def sync_aliases(self, pair_name: str) -> dict[str, int | None]:
        """MLflow aliases follow the registry's environment pointers."""
        from specreg.registry.governance import pointer_moves

        pointers = pointer_moves.environment_pointers(self.store, pair_name)
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
