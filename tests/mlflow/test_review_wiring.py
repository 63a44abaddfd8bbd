"""The registry keeps MLflow in step: validate -> run + model version, an approval requested in
the MLflow UI -> "waiting for <user>'s signature" until that user signs, promote -> alias; MLflow down -> the registry
operation completes with a warning and `specreg sync` catches up. Real registry databases
(SQLite and PostgreSQL), a real MLflow server, read back through its REST API."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from mlflow_server import free_port
from pgroles import as_user
from specreg.api import Registry
from specreg.registry.store.entities import PairState

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, record_validation  # noqa: E402

from clirun import run as cli  # tests/ is on sys.path (tests/conftest.py); `run` names MLflow runs here


@pytest.fixture
def mirror_on(monkeypatch, tmp_path, request):
    """The MLflow mirror on, and a policy on the smoke set as the policy of record of the test's
    database (the default one under $SPECREG_HOME when the test names none)."""
    from policyrecord import record_policy
    from specreg.settings import default_db_url

    monkeypatch.setenv("SPECREG_MLFLOW", "on")
    policy = tmp_path / "specreg.toml"
    policy.write_text(POLICY_TOML)
    db = request.getfixturevalue("db_url") if "db_url" in request.fixturenames else default_db_url()
    record_policy(db, policy, tmp_path)


def model_versions(server, pair):
    return server.get("model-versions/search", filter=f"name='specreg.{pair}'")["model_versions"]


def runs_of(server, pair):
    experiment = server.get("experiments/get-by-name", experiment_name=f"specreg/{pair}")
    return server.post("runs/search", {"experiment_ids": [experiment["experiment"]["experiment_id"]]}).get("runs", [])


def test_sync_ui_approval_and_promotion_alias(db_url, tiny_models, mlflow_server, mirror_on, approval_key):
    pair = f"rv-{uuid.uuid4().hex[:8]}"
    alice = Registry(as_user(db_url, "alice"), user="alice", mlflow_uri=mlflow_server.url)
    alice.register(pair, target=str(tiny_models["target"]), draft=str(tiny_models["draft"]), num_speculative_tokens=3)
    run_id = record_validation(alice, f"{pair}@1", acceptance_rate=0.75)

    synced = cli("--mlflow-uri", mlflow_server.url, "sync", pair, "--db", db_url, "--json")
    assert synced.returncode == 0, synced.stderr
    [version] = model_versions(mlflow_server, pair)
    [run] = runs_of(mlflow_server, pair)
    assert version["source"] == f"runs:/{run['info']['run_id']}/pair"
    tags = {t["key"]: t["value"] for t in version["tags"]}
    assert tags["specreg.status"] == "validated" and tags["specreg.version"] == "1"
    assert tags["specreg.validation"] == f"{pair}@1/validation-{run_id}"
    assert json.loads(tags["specreg.baselines"])["overall"]["acceptance_rate"] == 0.75
    assert f"{pair}@1" in version["description"]
    artifacts = {f["path"] for f in mlflow_server.get("artifacts/list", run_id=run["info"]["run_id"], path="pair")["files"]}
    assert {"pair/report.html", "pair/summary.md", "pair/results.json", "pair/pair.yaml"} <= artifacts
    assert alice.validation_runs(f"{pair}@1")[-1].mlflow_run_id == run["info"]["run_id"]

    # A reviewer asks for bob's approval in the MLflow UI (the UI's own REST call): a request,
    # not a decision (MLflow records no author for a tag). Nothing is recorded.
    mlflow_server.post("model-versions/set-tag", {"name": f"specreg.{pair}", "version": "1",
                                                  "key": "specreg.approval", "value": "approved:bob"})
    picked = cli("--mlflow-uri", mlflow_server.url, "sync", pair, "--db", as_user(db_url, "carol"), "--user", "carol")
    assert picked.returncode == 0, picked.stderr
    assert f"approval of {pair}@1 requested in MLflow for bob: waiting for bob's signature" in picked.stderr
    assert alice.get(f"{pair}@1").state is PairState.VALIDATED
    assert [e for e in alice.history(pair) if e.action == "approve"] == []
    [version] = model_versions(mlflow_server, pair)
    assert "waiting for bob's signature" in version["description"]
    refused = cli("--mlflow-uri", mlflow_server.url, "promote", f"{pair}@1", "--to", "production",
                  "--db", as_user(db_url, "carol"), "--user", "carol")
    assert refused.returncode == 100 and "needs an approval by someone other than the registrant" in refused.stderr

    # bob signs; the tag then is the registry's record of his decision.
    confirmed = cli("--mlflow-uri", mlflow_server.url, "approve", f"{pair}@1", "--db", as_user(db_url, "bob"),
                    "--user", "bob", "--key", approval_key(db_url, "bob"))
    assert confirmed.returncode == 0, confirmed.stderr
    [version] = model_versions(mlflow_server, pair)
    assert {t["key"]: t["value"] for t in version["tags"]}["specreg.approval"] == "approved:bob"
    assert "waiting for" not in version["description"]
    promoted = cli("--mlflow-uri", mlflow_server.url, "promote", f"{pair}@1", "--to", "production",
                   "--db", as_user(db_url, "carol"), "--user", "carol")
    assert promoted.returncode == 0, promoted.stderr
    alias = mlflow_server.get("registered-models/alias", name=f"specreg.{pair}", alias="production")
    assert alias["model_version"]["version"] == "1"
    [version] = model_versions(mlflow_server, pair)
    assert {t["key"]: t["value"] for t in version["tags"]}["specreg.status"] == "promoted"

    # Twice more: nothing is created twice and no approval is recorded twice.
    for _ in range(2):
        assert cli("--mlflow-uri", mlflow_server.url, "sync", pair, "--db", db_url).returncode == 0
    assert len(runs_of(mlflow_server, pair)) == 1 and len(model_versions(mlflow_server, pair)) == 1
    assert len([e for e in alice.history(pair) if e.action == "approve"]) == 1


def test_mlflow_down_warns_and_sync_catches_up(db_url, tiny_models, mlflow_server, mirror_on, approval_key):
    pair = f"rv-{uuid.uuid4().hex[:8]}"
    down = f"http://127.0.0.1:{free_port()}"
    alice = Registry(as_user(db_url, "alice"), user="alice", mlflow_uri=down)
    alice.register(pair, target=str(tiny_models["target"]), draft=str(tiny_models["draft"]), num_speculative_tokens=2)
    record_validation(alice, f"{pair}@1")

    approved = cli("--mlflow-uri", down, "approve", f"{pair}@1", "--db", as_user(db_url, "bob"), "--user", "bob",
                   "--key", approval_key(db_url, "bob"))
    assert approved.returncode == 0, approved.stderr
    assert f"specreg: warning: MLflow ({down}) is behind" in approved.stderr
    assert "run `specreg sync`" in approved.stderr
    assert alice.get(f"{pair}@1").state is PairState.APPROVED  # the registry did not wait for MLflow

    unreachable = cli("--mlflow-uri", down, "sync", "--db", db_url)
    assert unreachable.returncode == 1 and unreachable.stderr.count("\n") == 1

    caught_up = cli("--mlflow-uri", mlflow_server.url, "sync", "--db", db_url, "--json")
    assert caught_up.returncode == 0, caught_up.stderr
    [version] = model_versions(mlflow_server, pair)
    tags = {t["key"]: t["value"] for t in version["tags"]}
    assert tags["specreg.approval"] == "approved:bob" and tags["specreg.status"] == "approved"
    assert json.loads(tags["specreg.approval_record"])["user"] == "bob"


def test_real_validation_lands_in_mlflow(tmp_path, tiny_models, mlflow_server, mirror_on):
    pair = f"rv-{uuid.uuid4().hex[:8]}"
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}", user="alice", mlflow_uri=mlflow_server.url)
    registry.register(pair, target=str(tiny_models["target"]), draft=str(tiny_models["target"]),
                      num_speculative_tokens=3)
    # drafts drawn from q: with the draft the target itself q = p, and every draft is accepted, the
    # sampled record's too (the engines' point-mass q accepts a sampled draft with p's mass on it only)
    outcome = registry.validate(f"{pair}@1", golden="smoke", device="cpu", checks="integrity,equivalence,acceptance",
                                draft_sampling="probabilistic")
    assert outcome.passed and registry.warnings == []
    [run] = runs_of(mlflow_server, pair)
    metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    # the draft is the target itself: every drafted token is accepted, tau = k + 1
    assert metrics["acceptance_rate"] == 1.0 and metrics["mean_acceptance_length"] == pytest.approx(4.0, abs=0.5)
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["golden_set"] == "smoke"
    assert {t["key"]: t["value"] for t in run["data"]["tags"]}["specreg.verdict"] in ("pass", "warn")


def test_a_production_exception_shows_in_the_model_version(tmp_path, tiny_models, mlflow_server, monkeypatch,
                                                           approval_key):
    """The version holding production at 0.41x by `--allow-slower`: its model version's
    description is the gate summary per environment (verdict, every condition) with the exception,
    its reason, who gave it and the measured speedup; the tags carry the same; a later validation
    the exception does not cover takes the exception tag away."""
    from policyrecord import record_policy

    monkeypatch.setenv("SPECREG_MLFLOW", "on")
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    policy = tmp_path / "specreg.toml"
    policy.write_text(POLICY_TOML + "min_speedup = 1.0\n")  # into [environments.production], the last table
    record_policy(db_url, policy, tmp_path)
    pair = f"slow-{uuid.uuid4().hex[:8]}"
    alice = Registry(db_url, user="alice", mlflow_uri=mlflow_server.url)
    alice.register(pair, target=str(tiny_models["target"]), draft=str(tiny_models["draft"]), num_speculative_tokens=3)
    record_validation(alice, f"{pair}@1", speedup=0.41, recommended_k=1)
    bob = Registry(db_url, user="bob", mlflow_uri=mlflow_server.url)
    bob.approve(f"{pair}@1", key=approval_key(db_url, "bob"))
    reason = "the launch needs the pair's acceptance figures | latency is not the goal"
    promoted = cli("--mlflow-uri", mlflow_server.url, "promote", f"{pair}@1", "--to", "production",
                   "--allow-slower", reason, "--db", db_url, "--user", "alice")
    assert promoted.returncode == 0, promoted.stderr

    [version] = model_versions(mlflow_server, pair)
    description, tags = version["description"], {t["key"]: t["value"] for t in version["tags"]}
    assert description.startswith("# Gate summary (policy ")
    rows = [line for line in description.splitlines() if line.startswith("| production |")]
    assert len(rows) == 1 and "PASS by exception" in rows[0] and "--allow-slower by alice at " in rows[0]
    assert "(0.41x < 1x min_speedup): the launch needs the pair's acceptance figures \\| latency" in rows[0]
    assert f"## specreg gate {pair}@1 → production: PASS" in description
    assert f"## specreg gate {pair}@1 → staging: PASS" in description
    assert "| PASS | `speedup` | EXCEPTION: 0.41x at k=3 < 1x, allowed by alice at " in description
    assert "**Exception in production:** --allow-slower by alice at " in description
    assert "## Latest validation" in description  # the validation summary follows the gate's
    assert tags["specreg.gate.production"] == "pass" and tags["specreg.gate.staging"] == "pass"
    assert tags["specreg.exception.production"].startswith("--allow-slower by alice at ")
    assert tags["specreg.exception.production"].endswith(f"(0.41x < 1x min_speedup): {reason}")
    assert "specreg.exception.staging" not in tags

    # a newer run measures 0.5x: the exception was for the earlier run; production is refused now
    record_validation(alice, f"{pair}@1", speedup=0.5, recommended_k=1)
    assert cli("--mlflow-uri", mlflow_server.url, "sync", pair, "--db", db_url).returncode == 0
    [version] = model_versions(mlflow_server, pair)
    tags = {t["key"]: t["value"] for t in version["tags"]}
    assert tags["specreg.gate.production"] == "refused" and "specreg.exception.production" not in tags
    assert "| production | REFUSED | - |" in version["description"]
