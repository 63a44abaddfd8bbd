"""MlflowSync against a real MLflow server, read back through MLflow's REST API."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
from pathlib import Path

import pytest
import yaml

from specreg.errors import NotFoundError, UsageError
from specreg.registry.store.entities import PairState
from specreg.registry.review.mlflow_ui import model_version_url
from specreg.registry.review.mlflow_sync import MlflowSync

GATE_SUMMARY = "## specreg gate summary\n\n| check | result |\n|---|---|\n| acceptance | pass 0.71 |\n"


def _params(run: dict) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


def _metrics(run: dict) -> dict[str, float]:
    return {m["key"]: m["value"] for m in run["data"].get("metrics", [])}


def _tags(entity: dict) -> dict[str, str]:
    tags = entity["data"].get("tags", []) if "data" in entity else entity.get("tags", [])
    return {t["key"]: t["value"] for t in tags}


def _artifact_paths(server, run_id: str, path: str) -> set[str]:
    listing = server.get("artifacts/list", run_id=run_id, path=path)
    found = set()
    for entry in listing.get("files", []):
        if entry.get("is_dir"):
            found |= _artifact_paths(server, run_id, entry["path"])
        else:
            found.add(entry["path"])
    return found


def test_validation_run_params_metrics_tags_artifacts(
    mlflow_server, pair_name, make_pair_version, make_validation, tmp_path
):
    pair_version = make_pair_version(pair_name)
    validation = make_validation("warn")
    export = tmp_path / "vllm.sh"
    export.write_text("vllm serve models/target --speculative-config '{}'\n")
    sync = MlflowSync(mlflow_server.url)

    run_id = sync.log_validation(
        pair_version,
        validation,
        {"report.html": "<html><body>report</body></html>", "summary.md": GATE_SUMMARY,
         "exports/vllm.sh": export},
    )

    run = mlflow_server.get("runs/get", run_id=run_id)["run"]
    experiment = mlflow_server.get("experiments/get", experiment_id=run["info"]["experiment_id"])
    assert experiment["experiment"]["name"] == f"specreg/{pair_name}"
    assert run["info"]["status"] == "FINISHED"

    params = _params(run)
    assert params["target.reference"] == "models/target"
    assert params["target.weights_sha256"] == pair_version.target.fingerprint.weights_sha256
    assert params["draft.weights_sha256"] == pair_version.draft.fingerprint.weights_sha256
    assert params["draft.revision"] == "main"
    assert params["method"] == "draft_model"
    assert params["k"] == "4"
    assert params["dtype"] == "float32" and params["device"] == "cpu"
    assert params["golden_set"] == "smoke"
    assert params["golden_set_sha256"] == validation["golden_set"]["sha256"]
    assert params["golden_set_version"] == "2" and params["golden_set_prompts"] == "12"
    assert params["runtime.torch"] == "2.13.0" and params["runtime.transformers"] == "5.24.0"
    assert "target.revision" not in params  # None values are left out, not logged as "None"

    metrics = _metrics(run)
    assert metrics["acceptance_rate"] == pytest.approx(0.71)
    assert metrics["mean_acceptance_length"] == pytest.approx(3.2)
    assert [metrics[f"acceptance_rate_pos_{i}"] for i in range(4)] == pytest.approx([0.9, 0.8, 0.6, 0.5])
    assert metrics["acceptance_rate.code"] == pytest.approx(0.8)
    assert metrics["mean_acceptance_length.code"] == pytest.approx(3.6)
    assert metrics["acceptance_rate.chat/qa"] == pytest.approx(0.6)
    assert metrics["speedup"] == pytest.approx(1.8)
    assert metrics["latency_ms_p95"] == pytest.approx(9.0)
    assert metrics["equivalence_exact"] == 11 and metrics["equivalence_near_tie"] == 1

    tags = _tags(run)
    assert tags["specreg.pair"] == pair_name
    assert tags["specreg.version"] == "1"
    assert tags["specreg.verdict"] == "warn"
    assert tags["specreg.validation_id"] == validation["id"]
    assert tags["specreg.check.tokenizer"] == "pass"
    assert tags["specreg.check.equivalence"] == "warn"

    assert _artifact_paths(mlflow_server, run_id, "pair") == {
        "pair/pair.yaml", "pair/validation.json", "pair/report.html", "pair/summary.md",
        "pair/exports/vllm.sh",
    }
    manifest = yaml.safe_load(mlflow_server.artifact_text(run_id, "pair/pair.yaml"))
    assert manifest["binding_sha256"] == pair_version.binding_sha256
    assert manifest["target"]["fingerprint"]["weights_sha256"] == pair_version.target.fingerprint.weights_sha256
    assert json.loads(mlflow_server.artifact_text(run_id, "pair/validation.json"))["id"] == validation["id"]
    assert mlflow_server.artifact_text(run_id, "pair/exports/vllm.sh") == export.read_text()


def test_model_version_source_description_tags_alias(
    mlflow_server, pair_name, make_pair_version, make_validation
):
    sync = MlflowSync(mlflow_server.url)
    v1 = make_pair_version(pair_name, 1)
    v2 = make_pair_version(pair_name, 2)
    run1 = sync.log_validation(v1, make_validation())
    run2 = sync.log_validation(v2, make_validation())
    baselines = {"acceptance_rate": 0.71, "mean_acceptance_length": 3.2}

    number1 = sync.ensure_model_version(v1, run1, GATE_SUMMARY, {"specreg.verdict": "pass"},
                                        baselines=baselines)
    number2 = sync.ensure_model_version(v2, run2, "v2 summary", {})
    assert number1 != number2

    name = sync.registered_model_name(pair_name)
    assert name == f"specreg.{pair_name}"
    model_version = mlflow_server.get("model-versions/get", name=name, version=number1)["model_version"]
    assert model_version["source"] == f"runs:/{run1}/pair"
    assert model_version["run_id"] == run1
    assert model_version["description"] == GATE_SUMMARY
    tags = _tags(model_version)
    assert tags["specreg.version"] == "1"
    assert tags["specreg.status"] == "validated"
    assert tags["specreg.verdict"] == "pass"
    assert tags["specreg.target_weights_sha256"] == v1.target.fingerprint.weights_sha256
    assert tags["specreg.draft_weights_sha256"] == v1.draft.fingerprint.weights_sha256
    assert json.loads(tags["specreg.baselines"]) == baselines

    # The lifecycle state is mirrored into the tag.
    assert sync.mirror_state(dataclasses.replace(v1, state=PairState.APPROVED))
    tags = _tags(mlflow_server.get("model-versions/get", name=name, version=number1)["model_version"])
    assert tags["specreg.status"] == "approved"

    # Promotion: an alias is set, then moved to another version, then removed.
    sync.set_alias(pair_name, "production", v1)
    alias = mlflow_server.get("registered-models/alias", name=name, alias="production")
    assert alias["model_version"]["version"] == str(number1)
    sync.set_alias(pair_name, "production", v2)
    alias = mlflow_server.get("registered-models/alias", name=name, alias="production")
    assert alias["model_version"]["version"] == str(number2)
    assert sync.aliases(pair_name) == {"production": number2}
    sync.delete_alias(pair_name, "production")
    sync.delete_alias(pair_name, "production")  # already gone: nothing to do
    with pytest.raises(urllib.error.HTTPError):
        mlflow_server.get("registered-models/alias", name=name, alias="production")

    with pytest.raises(UsageError, match="reserved"):
        sync.set_alias(pair_name, "latest", v1)
    never_validated = make_pair_version(pair_name, 3, state=PairState.REGISTERED)
    assert sync.mirror_state(never_validated) is False
    with pytest.raises(NotFoundError, match="specreg sync"):
        sync.set_alias(pair_name, "staging", never_validated)

    url = model_version_url(mlflow_server.url, name, number1)
    assert url == f"{mlflow_server.url}/#/models/{name}/versions/{number1}"


def test_sync_twice_creates_nothing_twice(mlflow_server, pair_name, make_pair_version, make_validation):
    sync = MlflowSync(mlflow_server.url)
    pair_version = make_pair_version(pair_name)
    validation = make_validation()

    first = [sync.log_validation(pair_version, validation, {"summary.md": GATE_SUMMARY})]
    first.append(sync.ensure_model_version(pair_version, first[0], GATE_SUMMARY, {}))
    # A second sync (e.g. `specreg sync` run twice), with a fresh client as a new process has.
    again = MlflowSync(mlflow_server.url)
    second = [again.log_validation(pair_version, validation, {"summary.md": GATE_SUMMARY})]
    second.append(again.ensure_model_version(pair_version, second[0], GATE_SUMMARY, {}))
    assert first == second

    experiment = mlflow_server.get("experiments/get-by-name", experiment_name=f"specreg/{pair_name}")
    runs = mlflow_server.post(
        "runs/search", {"experiment_ids": [experiment["experiment"]["experiment_id"]]}
    ).get("runs", [])
    assert len(runs) == 1
    history = mlflow_server.get("metrics/get-history", run_id=first[0], metric_key="acceptance_rate")
    assert len(history["metrics"]) == 1
    versions = mlflow_server.get(
        "model-versions/search", filter=f"name='specreg.{pair_name}'"
    )["model_versions"]
    assert len(versions) == 1

    # A later update of the same pair version changes the description, not the count.
    sync.ensure_model_version(pair_version, first[0], GATE_SUMMARY + "\nre-checked\n", {})
    versions = mlflow_server.get(
        "model-versions/search", filter=f"name='specreg.{pair_name}'"
    )["model_versions"]
    assert len(versions) == 1 and versions[0]["description"].endswith("re-checked\n")


def test_half_written_run_is_replaced(mlflow_server, pair_name, make_pair_version, make_validation):
    """A run that MLflow lost mid-way (created, never marked synced) is not trusted."""
    sync = MlflowSync(mlflow_server.url)
    pair_version = make_pair_version(pair_name)
    validation = make_validation()
    validation["checks"] = [{"name": "tokenizer", "status": "fail", "message": "merges differ"}]
    experiment_id = mlflow_server.post(
        "experiments/create", {"name": f"specreg/{pair_name}"}
    )["experiment_id"]
    stale = mlflow_server.post("runs/create", {
        "experiment_id": experiment_id,
        "tags": [{"key": "specreg.validation_id", "value": validation["id"]}],
    })["run"]["info"]["run_id"]

    run_id = sync.log_validation(pair_version, validation)

    assert run_id != stale
    assert mlflow_server.get("runs/get", run_id=stale)["run"]["info"]["lifecycle_stage"] == "deleted"
    tags = _tags(mlflow_server.get("runs/get", run_id=run_id)["run"])
    assert tags["specreg.synced"] == "true"
    assert tags["specreg.check.tokenizer"] == "fail"  # checks given as a list work too
    assert sync.log_validation(pair_version, validation) == run_id


def test_approval_from_the_ui_and_from_the_cli(
    mlflow_server, pair_name, make_pair_version, make_validation
):
    sync = MlflowSync(mlflow_server.url)
    pair_version = make_pair_version(pair_name)
    run_id = sync.log_validation(pair_version, make_validation())
    number = sync.ensure_model_version(pair_version, run_id, GATE_SUMMARY, {})
    name = sync.registered_model_name(pair_name)
    assert sync.read_approval(pair_version) is None

    # A reviewer sets the tags in the MLflow UI: the same REST calls the UI makes.
    for key, value in (("specreg.approval", "Approved"), ("specreg.approval_note", "looks good")):
        mlflow_server.post("model-versions/set-tag",
                           {"name": name, "version": str(number), "key": key, "value": value})
    approval = sync.read_approval(pair_version)
    assert approval == {"status": "approved", "named": None, "note": "looks good", "user": None, "time": None,
                        "raw": "Approved", "problem": None}

    # From the CLI: the tag names the approver; who and when are recorded with it.
    sync.set_approval(pair_version, "rejected", "acceptance too low on code", "alice")
    tags = {t["key"]: t["value"] for t in mlflow_server.get("model-versions/get", name=name, version=str(number))
            ["model_version"]["tags"]}
    assert tags["specreg.approval"] == "rejected:alice"
    approval = sync.read_approval(pair_version)
    assert approval["status"] == "rejected" and approval["user"] == "alice" and approval["named"] == "alice"
    assert approval["note"] == "acceptance too low on code"
    assert approval["time"] is not None and approval["time"].tzinfo is not None

    # The reviewer overrides it in the UI: alice's record no longer describes the tags.
    mlflow_server.post("model-versions/set-tag", {
        "name": name, "version": str(number), "key": "specreg.approval", "value": "approved:Carol"})
    approval = sync.read_approval(pair_version)
    assert approval["status"] == "approved" and approval["user"] is None and approval["named"] == "carol"

    # A value that is no decision is reported, never raised.
    mlflow_server.post("model-versions/set-tag", {
        "name": name, "version": str(number), "key": "specreg.approval", "value": "yes please"})
    approval = sync.read_approval(pair_version)
    assert approval["status"] is None and "'yes please' is not approved:<user> or rejected:<user>" in approval["problem"]
    with pytest.raises(UsageError):
        sync.set_approval(pair_version, "maybe", None, "alice")


def test_artifact_must_exist_and_stay_inside_pair(mlflow_server, pair_name, make_pair_version,
                                                  make_validation, tmp_path):
    sync = MlflowSync(mlflow_server.url)
    pair_version = make_pair_version(pair_name)
    with pytest.raises(NotFoundError, match="missing.html"):
        sync.log_validation(pair_version, make_validation(), {"r.html": tmp_path / "missing.html"})
    with pytest.raises(UsageError, match="relative"):
        sync.log_validation(pair_version, make_validation(), {"../escape.txt": "x"})
    with pytest.raises(UsageError, match="'id'"):
        sync.log_validation(pair_version, {"verdict": "pass"})
