"""Exports and rollback against the approval decisions, and export paths.

Real `specreg` processes on real database rows (SQLite and PostgreSQL); validations are the
recorded rows of tests/governance/govstate.py, so no speculative runtime runs here.
"""

from __future__ import annotations

import json

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from specreg.api import Registry

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, record_validation  # noqa: E402
from pgroles import as_user
from policyrecord import record_policy

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture
def pair(db_url, tiny_models, tmp_path, monkeypatch):
    """Copies of the tiny models (so a test may change them) and a policy on the smoke set;
    returns (db_url, {"target": dir, "draft": dir})."""
    policy = tmp_path / "specreg.toml"
    policy.write_text(POLICY_TOML)
    record_policy(db_url, policy, tmp_path)
    models = {role: shutil.copytree(tiny_models[role], tmp_path / "models" / role) for role in ("target", "draft")}
    return db_url, models


def register(db_url, models, k: int) -> str:
    return Registry(as_user(db_url, "alice"), user="alice").register(
        "ship", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=k).version.label


def approved_in_production(db_url, models, k: int, approval_key) -> str:
    """ship@N registered by alice, validated, approved by bob, promoted to production."""
    label = register(db_url, models, k)
    alice = Registry(as_user(db_url, "alice"), user="alice")
    record_validation(alice, label)
    Registry(as_user(db_url, "bob"), user="bob").approve(label, key=approval_key(db_url, "bob"))
    alice.promote(label, "production")
    return label


def k8s_approval(stdout: str) -> str:
    """The specreg.io/approval annotation of the exported Deployment (``--json`` output)."""
    manifest = next(f["text"] for f in json.loads(stdout) if f["file"] == "k8s-vllm.yaml")
    documents = [d for d in yaml.safe_load_all(manifest) if d]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    return deployment["metadata"]["annotations"]["specreg.io/approval"]


# --- item 6: export reads the decisions --------------------------------------------------------

def test_export_of_never_approved_version_is_refused_and_forced_marked_unapproved(pair, tmp_path):
    db_url, models = pair
    label = register(db_url, models, 4)
    alice = Registry(as_user(db_url, "alice"), user="alice")
    record_validation(alice, label)
    alice.promote(label, "staging")  # staging needs no approval: state promoted, no decision
    assert alice.get(label).state.value == "promoted"

    refused = run("export", label, "--format", "k8s-vllm", "--option", "model_volume=pvc:models", "--db", db_url)
    one_line(refused, 100, "ship@1", "not validated and approved", "needs an approval")
    forced = run("export", label, "--format", "k8s-vllm", "--option", "model_volume=pvc:models", "--force", "--json", "--db", db_url)
    assert forced.returncode == 0, forced.stderr
    assert k8s_approval(forced.stdout) == "UNAPPROVED"
    assert "UNAPPROVED: exported with --force" in forced.stdout


def test_export_of_rejected_version_is_unapproved(pair, approval_key):
    db_url, models = pair
    label = approved_in_production(db_url, models, 4, approval_key)
    Registry(as_user(db_url, "carol"), user="carol").reject(label, key=approval_key(db_url, "carol"), note="acceptance regressed on code prompts")
    assert Registry(db_url).get(label).state.value == "promoted"  # a rejection keeps a promoted state

    refused = run("export", label, "--format", "vllm", "--db", db_url)
    one_line(refused, 100, "rejected by carol")
    forced = run("export", label, "--format", "vllm", "--force", "--db", db_url)
    assert forced.returncode == 0, forced.stderr
    assert "UNAPPROVED" in forced.stdout


def test_export_of_approved_version_after_rejection_and_reapproval(pair, approval_key):
    db_url, models = pair
    label = approved_in_production(db_url, models, 4, approval_key)
    Registry(as_user(db_url, "carol"), user="carol").reject(label, key=approval_key(db_url, "carol"))
    Registry(as_user(db_url, "dave"), user="dave").approve(label, key=approval_key(db_url, "dave"), note="re-checked")  # latest decision wins
    result = run("export", label, "--format", "k8s-vllm", "--option", "model_volume=pvc:models", "--json",
                 "--db", db_url)
    assert result.returncode == 0, result.stderr
    assert k8s_approval(result.stdout) == "approved" and "UNAPPROVED" not in result.stdout


# --- item 6: rollback re-checks ---------------------------------------------------------------

def two_holders(db_url, models, approval_key) -> tuple[str, str]:
    first = approved_in_production(db_url, models, 4, approval_key)
    second = approved_in_production(db_url, models, 3, approval_key)
    return first, second


def test_rollback_refuses_a_rejected_version(pair, approval_key):
    db_url, models = pair
    first, second = two_holders(db_url, models, approval_key)
    Registry(as_user(db_url, "carol"), user="carol").reject(first, key=approval_key(db_url, "carol"), note="leaks the system prompt")
    refused = run("rollback", "ship", "--env", "production", "--db", as_user(db_url, "alice"), "--user", "alice")
    one_line(refused, 100, "ship@1", "rejected by carol")
    assert Registry(db_url).get("ship@production").label == second  # nothing moved


def test_rollback_refuses_a_failed_version(pair, approval_key):
    db_url, models = pair
    first, second = two_holders(db_url, models, approval_key)
    record_validation(Registry(as_user(db_url, "alice"), user="alice"), first, status="failed")
    refused = run("rollback", "ship", "--env", "production", "--db", as_user(db_url, "alice"), "--user", "alice")
    one_line(refused, 100, "ship@1", "failed")
    assert Registry(db_url).get("ship@production").label == second


def test_rollback_refuses_changed_fingerprints(pair, approval_key):
    db_url, models = pair
    first, second = two_holders(db_url, models, approval_key)
    weights = next(models["draft"].glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the last tensor's data
    weights.write_bytes(bytes(data))
    refused = run("rollback", "ship", "--env", "production", "--db", as_user(db_url, "alice"), "--user", "alice")
    one_line(refused, 100, "ship@1", "draft weight file")
    assert Registry(db_url).get("ship@production").label == second


def test_rollback_to_an_intact_approved_version_still_works(pair, approval_key):
    db_url, models = pair
    first, second = two_holders(db_url, models, approval_key)
    result = run("rollback", "ship", "--env", "production", "--db", as_user(db_url, "alice"), "--user", "alice")
    assert result.returncode == 0, result.stderr
    assert Registry(db_url).get("ship@production").label == first


# --- item 6 / 14: --force is not --overwrite; paths are checked first and written atomically ----

def test_force_does_not_overwrite_and_overwrite_exists(pair, tmp_path, approval_key):
    db_url, models = pair
    label = approved_in_production(db_url, models, 4, approval_key)
    out = tmp_path / "out"
    assert run("export", label, "--format", "vllm", "-o", out, "--db", db_url).returncode == 0
    script = out / "vllm-serve.sh"
    script.write_text("# edited by hand\n")
    forced = run("export", label, "--format", "vllm", "-o", out, "--force", "--db", db_url)
    one_line(forced, 1, "exists", "--overwrite")
    assert script.read_text() == "# edited by hand\n"
    overwritten = run("export", label, "--format", "vllm", "-o", out, "--overwrite", "--db", db_url)
    assert overwritten.returncode == 0, overwritten.stderr
    assert "ship@1" in script.read_text() and "UNAPPROVED" not in script.read_text()


def test_export_onto_a_directory_name_writes_nothing(pair, tmp_path, approval_key):
    db_url, models = pair
    label = approved_in_production(db_url, models, 4, approval_key)
    out = tmp_path / "out"
    (out / "vllm-speculative-config.json").mkdir(parents=True)  # the second file's name is a folder
    result = run("export", label, "--format", "vllm", "-o", out, "--overwrite", "--db", db_url)
    one_line(result, 1, "vllm-speculative-config.json", "directory")
    assert sorted(p.name for p in out.iterdir()) == ["vllm-speculative-config.json"]  # no half set


def test_export_to_a_file_or_below_a_file(pair, tmp_path, approval_key):
    db_url, models = pair
    label = approved_in_production(db_url, models, 4, approval_key)
    plain = tmp_path / "plain.txt"
    plain.write_text("keep me\n")
    for out in (plain, plain / "sub"):
        result = run("export", label, "--format", "vllm", "-o", out, "--db", db_url)
        one_line(result, 1, str(plain), "not a directory")
    assert plain.read_text() == "keep me\n"


def test_export_leaves_no_temporary_files(pair, tmp_path, approval_key):
    db_url, models = pair
    label = approved_in_production(db_url, models, 4, approval_key)
    out = tmp_path / "out"
    for extra in ([], ["--overwrite"]):
        result = run("export", label, "--format", "trtllm", "-o", out, "--db", db_url, *extra)
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["specreg.lock.json", "trtllm-config.yaml", "trtllm-serve.sh"]


@pytest.mark.parametrize("value", ["a: b: c", "[unclosed", "x\n---\ny", "pvc:claim\n---\nkind: Pod", "{a: 1", "tab\there"])
def test_export_option_values_that_are_not_yaml_or_hold_a_line_break(pair, tmp_path, value):
    """MED-5: an --option value that is no valid YAML is a string like any other, and one
    holding a control character (a newline and `---` would start a second YAML document in the k8s
    manifest, or a second line of the serve script) is refused in one line; nothing is written."""
    db_url, models = pair
    label = register(db_url, models, 2)
    out = tmp_path / "out"
    result = run("export", label, "--format", "k8s-vllm", "--force", "-o", str(out), "--db", db_url,
                 "--option", f"model_volume={value}")
    if any(ord(ch) < 32 for ch in value):
        one_line(result, 2, "export option model_volume=", "control character")
        assert not out.exists()
    else:  # not YAML: taken as the text it is, then judged by the option's own rule
        assert result.returncode in (0, 2), result.stderr
        if result.returncode == 2:
            assert result.stderr.count("\n") == 1 and "model_volume" in result.stderr, result.stderr
            assert not out.exists()


def test_export_option_text_that_is_not_yaml_reaches_the_export_as_text(pair, tmp_path):
    db_url, models = pair
    label = register(db_url, models, 2)
    result = run("export", label, "--format", "k8s-vllm", "--force", "-o", str(tmp_path / "out"), "--db", db_url,
                 "--option", "model_volume=pvc:claim", "--option", "image=registry.local/vllm:{a: 1")
    assert result.returncode == 0, result.stderr
    manifest = list(yaml.safe_load_all((tmp_path / "out" / "k8s-vllm.yaml").read_text()))
    images = [c["image"] for doc in manifest if doc and doc.get("kind") == "Deployment"
              for c in doc["spec"]["template"]["spec"]["containers"]]
    assert images == ["registry.local/vllm:{a: 1"]


@pytest.mark.parametrize("fmt, options", [
    ("prometheus-rules", {"for": "10m\n"}), ("prometheus-rules", {"rate_window": "5m\n"}),
    ("argo-analysis", {"canary_label": "rollouts_pod_template_hash\n"}), ("argo-analysis", {"interval": "5m\n"}),
    ("argo-analysis", {"prometheus_address": "http://prometheus:9090\n"}),
    ("k8s-vllm", {"model_volume": "pvc:models", "model_mount_path": "/models\n---\nkind: Pod"}),
])
def test_python_api_options_with_a_trailing_newline_are_refused(pair, tmp_path, fmt, options):
    """Was: from the Python API (no CLI check in between) `options={"for": "10m\\n"}` or a
    canary_label ending in a newline passed the checks, whose `$` matches before a final
    newline, and the export wrote invalid YAML. Nothing is written."""
    from specreg.api import Registry
    from specreg.errors import UsageError

    db_url, models = pair
    label = register(db_url, models, 2)
    out = tmp_path / "out"
    (key, value), = [(k, v) for k, v in options.items() if "\n" in v]
    with pytest.raises(UsageError, match=f"export option {key}="):
        Registry(db_url).export(label, fmt, out_dir=str(out), force=True, options=options)
    assert not out.exists()
