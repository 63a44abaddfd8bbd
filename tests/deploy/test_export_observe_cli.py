"""`specreg export` and `specreg observe` as a user runs them: real processes, real database rows,
real files on disk, a real metrics endpoint on 127.0.0.1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from metrics_server import FakeVllm, MetricsServer
from pgroles import as_user
from policyrecord import record_policy
from specreg.api import Registry

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, record_validation  # noqa: E402

from clirun import run  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture
def approved_pair(db_url, tiny_models, tmp_path, monkeypatch, approval_key):
    """deploy@1 validated (recorded rows), approved by bob and promoted to staging; deploy@2 only registered."""
    policy = tmp_path / "specreg.toml"
    policy.write_text(POLICY_TOML)
    record_policy(db_url, policy, tmp_path)
    alice = Registry(as_user(db_url, "alice"), user="alice")
    for k in (4, 3):
        alice.register("deploy", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                       num_speculative_tokens=k, max_batch_size_for_speculation=8)
    record_validation(alice, "deploy@1", acceptance_rate=0.8, mean_acceptance_length=3.0)
    Registry(as_user(db_url, "bob"), user="bob").approve("deploy@1", key=approval_key(db_url, "bob"), note="looks right")
    alice.promote("deploy@1", "staging", reason="first rollout")
    return db_url


def test_export_writes_engine_configs_with_identity(approved_pair, tmp_path, tiny_models):
    out = tmp_path / "out"
    result = run("export", "deploy@staging", "--format", "vllm", "-o", out, "--db", approved_pair)
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in out.iterdir())
    assert written == ["specreg.lock.json", "vllm-serve.sh", "vllm-speculative-config.json"]
    # no --signing-key: the lock says it is unsigned, and so does one warning line
    lock = json.loads((out / "specreg.lock.json").read_text())
    assert lock["signed"] is False and lock["signature"] is None
    assert result.stderr == ("specreg: warning: specreg.lock.json is unsigned (no --signing-key / "
                             "SPECREG_SIGNING_KEY): `specreg verify` refuses it unless --allow-unsigned\n")
    config = json.loads((out / "vllm-speculative-config.json").read_text())
    assert config["method"] == "draft_model" and config["num_speculative_tokens"] == 4
    assert config["model"] == str(tiny_models["draft"])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 9, 0]]  # k = 0 above 8
    script = (out / "vllm-serve.sh").read_text()
    version = Registry(approved_pair).get("deploy@1")
    assert "deploy@1" in script and version.target.fingerprint.weights_sha256 in script
    validation = Registry(approved_pair).validation_runs("deploy@1")[-1]
    assert f"golden set smoke (sha256 {validation.golden_sha256})" in script
    assert "category code: acceptance_rate=0.8500" in script
    assert "UNAPPROVED" not in script

    k8s = run("export", "deploy@1", "--format", "k8s-vllm", "--option", "model_volume=pvc:models",
              "--db", approved_pair, "--json")
    documents = list(yaml.safe_load_all(json.loads(k8s.stdout)[0]["text"]))
    kinds = [d["kind"] for d in documents if d]
    # the ConfigMaps hold the pair lock and the engine's arguments
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Service"]
    pod = documents[2]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "models"
    assert [v["name"] for v in pod["volumes"]] == ["models", "specreg-engine", "specreg-lock",
                                                   "specreg-approvers"]  # one list
    # the initContainer checks the very paths the engine loads, on the same mount
    assert pod["initContainers"][0]["volumeMounts"][0] == pod["containers"][0]["volumeMounts"][0]
    no_volume = run("export", "deploy@1", "--format", "k8s-vllm", "--db", approved_pair)
    assert no_volume.returncode == 2 and "model_volume=pvc:CLAIM_NAME" in no_volume.stderr

    again = run("export", "deploy@1", "--format", "vllm", "-o", out, "--db", approved_pair)
    assert again.returncode == 1 and "exists" in again.stderr and again.stderr.count("\n") == 1


def test_alert_rules_are_written_without_a_lock(approved_pair, tmp_path):
    """The rules load no model (engines/prometheus.py WRITES_LOCK): no lock, so no unsigned-lock warning."""
    rules = run("export", "deploy@staging", "--format", "prometheus-rules", "-o", tmp_path / "rules", "--db",
                approved_pair)
    assert rules.returncode == 0 and rules.stderr == "", rules.stderr
    assert sorted(p.name for p in (tmp_path / "rules").iterdir()) == ["prometheus-rules.yaml"]


def test_unapproved_export_refused_unless_forced(approved_pair, tmp_path):
    refused = run("export", "deploy@2", "--format", "sglang", "--db", approved_pair)
    assert refused.returncode == 100 and refused.stderr.count("\n") == 1
    assert "deploy@2 is not validated and approved" in refused.stderr
    forced = run("export", "deploy@2", "--format", "sglang", "-o", tmp_path / "forced", "--force", "--db", approved_pair)
    assert forced.returncode == 0, forced.stderr
    assert "UNAPPROVED" in (tmp_path / "forced" / "sglang-launch.sh").read_text()
    tgi = run("export", "deploy@1", "--format", "tgi", "--db", approved_pair)
    assert tgi.returncode == 1 and tgi.stderr.count("\n") == 1 and "TGI 3.3 has no separate-draft mode" in tgi.stderr


@pytest.mark.parametrize("accepted_per_pos,verdict,code", [
    ([90, 80, 75, 75], "ok", 0),        # alpha 0.8, tau 4.2 against baseline 0.8 / 3.0
    ([60, 30, 10, 0], "drift", 100),    # alpha 0.25 falls below 0.72
])
def test_observe_compares_live_acceptance_with_baseline(approved_pair, accepted_per_pos, verdict, code):
    engine = FakeVllm()
    server = MetricsServer()

    def body():
        # every scrape sees 100 more drafts of 4 tokens: the interval always holds one step
        engine.step("deploy", 100, 4, accepted_per_pos)
        return engine.body()

    server.body = body
    try:
        result = run("observe", "deploy@staging", "--metrics-url", server.url, "--interval", "0.2",
                     "--model-name", "deploy", "--db", approved_pair, "--json")
    finally:
        server.close()
    assert result.returncode == code, result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"] == verdict and data["environment"] == "staging"
    assert data["live"]["drafts"] == 100
    assert data["live"]["acceptance_rate"] == pytest.approx(sum(accepted_per_pos) / 400)
    shown = json.loads(run("show", "deploy@1", "--db", approved_pair, "--json").stdout)
    assert [(o["verdict"], o["engine"], o["url"]) for o in shown["observations"]] == [(verdict, "vllm", server.url)]
    [observed] = shown["observations"]
    assert {key: data[key] for key in observed} == observed  # observe printed the observation show lists
    [entity] = Registry(approved_pair).observations("deploy@1")
    assert (entity.label, entity.id, entity.verdict, entity.figures) == ("deploy@1", observed["id"], verdict,
                                                                          observed["figures"])
    human = run("show", "deploy@1", "--db", approved_pair).stdout
    assert "observations (newest first):" in human and verdict in human


def test_observe_unreachable_endpoint_is_one_line_error(approved_pair):
    result = run("observe", "deploy@staging", "--metrics-url", "http://127.0.0.1:9/metrics", "--interval", "0.1",
                 "--db", approved_pair)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "127.0.0.1:9" in result.stderr
