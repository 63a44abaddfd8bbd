"""The signed pair lock and `specreg verify`, as a platform engineer runs them: real key files,
a real export of a validated and approved pair, real model files that get tampered with, real
processes and exit codes."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specreg.api import Registry
from specreg.core.digests import canonical_json
from specreg.registry.deploy.lock import LOCK_FILE, lock_body
from specreg.registry.deploy.verify import verify_lock

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import record_validation  # noqa: E402

from clirun import run  # tests/ is on sys.path (tests/conftest.py)
from policyrecord import record_policy


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(deployed, *extra, lock=None, public_key=None, target=None, draft=None):
    keyring = ("--keyring", deployed["keyring"]) if "keyring" in deployed else ()
    return run("verify", "--lock", lock or deployed["lock"], "--public-key", public_key or deployed["public"],
               *keyring, "--target", target or deployed["target"], "--draft", draft or deployed["draft"], *extra)


def refused(result, reason: str):
    """Exit 100 with the reason on the last stderr line."""
    assert result.returncode == 100, (result.returncode, result.stdout, result.stderr)
    assert reason in result.stderr.splitlines()[-1], result.stderr


# --- keys ---------------------------------------------------------------------------------------

def test_keys_create_private_key_0600_and_never_overwrites(tmp_path, keys):
    private, public = keys
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    before = private.read_bytes()
    again = run("keys", "create", "--out", private.parent)
    assert again.returncode == 1 and again.stderr.count("\n") == 1
    assert f"{private} exists; refusing to overwrite a signing key" in again.stderr
    assert private.read_bytes() == before


# --- what the lock holds ------------------------------------------------------------------------

def test_lock_binds_files_config_engine_baselines_approvals_and_audit_head(deployed):
    lock = json.loads(deployed["lock"].read_text())
    registry = Registry(deployed["db"])
    version = registry.get("lock@1")
    assert lock["pair"]["label"] == "lock@1" and lock["pair"]["binding_sha256"] == version.binding_sha256
    assert lock["approved"] is True and lock["signed"] is True
    for role in ("target", "draft"):
        directory = deployed[role]
        expected = {p.name: sha256(p) for p in sorted(directory.iterdir())}
        assert lock["models"][role]["files"] == expected
        assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja"} <= expected.keys()
        assert lock["models"][role]["weights_sha256"] == getattr(version, role).fingerprint.weights_sha256
    assert lock["speculative_config"] == version.config.to_dict()
    assert lock["engine"] == {"name": "vllm", "version": "0.33", "format": "vllm"}
    run_row = registry.validation_runs("lock@1")[-1]
    assert lock["baselines"]["golden_sha256"] == run_row.golden_sha256
    assert lock["baselines"]["overall"]["acceptance_rate"] == 0.8
    # served in the dtype the run measured in (its environment row), not the engine's auto
    assert run_row.environment["dtype"] == lock["baselines"]["dtype"] == "float32"
    assert "--dtype float32" in (deployed["out"] / "vllm-serve.sh").read_text()
    assert [(a["actor"], a["decision"], a["note"]) for a in lock["approvals"]] == [("bob", "approved", "checked")]
    events = registry.history("lock")
    assert lock["audit_head"] == {"hash": events[-1].event_hash} and registry.store.audit_head() == events[-1].event_hash

    # the signature: a Sigstore bundle holding a DSSE envelope with model-signing's in-toto statement
    bundle = lock["signature"]
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://model_signing/signature/v1.0"
    resources = {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    assert resources[LOCK_FILE] == hashlib.sha256(canonical_json(lock_body(lock))).hexdigest()
    assert resources["target/model.safetensors"] == sha256(deployed["target"] / "model.safetensors")
    assert len(resources) == 1 + len(lock["models"]["target"]["files"]) + len(lock["models"]["draft"]["files"])


def test_model_signing_own_verifier_accepts_the_lock_signature(deployed):
    """Interoperability: model-signing's public verifier, over a directory laid out as the
    statement names it, accepts the signature, and refuses it once a file changes."""
    import model_signing

    lock = json.loads(deployed["lock"].read_text())
    view = deployed["tmp"] / "view"
    shutil.copytree(deployed["target"], view / "target")
    shutil.copytree(deployed["draft"], view / "draft")
    (view / LOCK_FILE).write_bytes(canonical_json(lock_body(lock)))
    signature = deployed["tmp"] / "lock.sig"
    signature.write_text(json.dumps(lock["signature"]))
    config = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=deployed["public"])
    config.verify(view, signature)
    (view / "draft" / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="draft/tokenizer.json"):
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=deployed["public"]).verify(view, signature)


# --- verify: match and each refusal -------------------------------------------------------------

def test_verify_matching_files_exit_0(deployed):
    result = verify(deployed, "--registry", deployed["db"], "--env", "staging")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"ok  signature: signed statement verified with {deployed['public']}",
        f"ok  approvals: approved by bob: 1 valid signature(s), 1 needed (keyring {deployed['keyring']})",
        "ok  registry: lock@1 is promoted and holds staging",
        f"ok  target_files: 6 file(s) in {deployed['target']} match the lock",
        f"ok  draft_files: 6 file(s) in {deployed['draft']} match the lock",
        "ok  unchanged: 12 file(s) unchanged since they were hashed",
        "verified lock@1: signed lock, files match",
    ]


def test_an_approval_by_a_revoked_key_is_refused_at_pod_start(deployed):
    """bob's key is revoked after the export: the keyring exported again carries the revocation,
    and verify refuses the lock's approval by that key (the files still match)."""
    registry = Registry(deployed["db"], user="admin")
    [bob] = [k for k in registry.keyring()[0] if k.person == "bob"]
    registry.revoke_key(bob.key_id, "laptop stolen")
    assert run("keys", "export", "--out", deployed["keyring"], "--db", deployed["db"]).returncode == 0
    result = verify(deployed)
    refused(result, "approvals")
    assert f"signed with key {bob.key_id[:12]}, which the keyring does not enrol" in result.stdout


def test_tampered_weight_file_refused(deployed):
    weights = deployed["target"] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of the last tensor
    weights.write_bytes(bytes(data))
    result = verify(deployed, "--json")
    assert result.returncode == 100
    report = json.loads(result.stdout)
    assert report["verdict"] == "mismatch" and report["file"] == "target/model.safetensors"
    assert report["reason"] == "target file model.safetensors differs from the lock (sha256)"
    refused(verify(deployed), "target file model.safetensors differs from the lock (sha256)")


def test_swapped_tokenizer_file_refused(deployed):
    tokenizer = deployed["draft"] / "tokenizer.json"
    data = json.loads(tokenizer.read_text())
    vocab = data["model"]["vocab"]
    first, second = list(vocab)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two ids swapped: another tokenizer
    tokenizer.write_text(json.dumps(data))
    refused(verify(deployed), "lock@1: draft file tokenizer.json differs from the lock (sha256)")


def test_missing_and_extra_files_named(deployed):
    (deployed["target"] / "generation_config.json").unlink()
    refused(verify(deployed), f"target file generation_config.json is missing from {deployed['target']}")
    shutil.copy(deployed["draft"] / "config.json", deployed["target"] / "generation_config.json")
    refused(verify(deployed), "target file generation_config.json differs from the lock")
    not_mounted = verify(deployed, target=deployed["tmp"] / "not-mounted")
    assert not_mounted.returncode == 1 and "not-mounted: not a directory" in not_mounted.stderr


def test_extra_file_is_refused(deployed):
    (deployed["draft"] / "modeling_evil.py").write_text("print('runs with trust_remote_code')\n")
    refused(verify(deployed), f"draft file modeling_evil.py in {deployed['draft']} is not in the lock")


def test_edited_lock_refused(deployed):
    lock = json.loads(deployed["lock"].read_text())
    lock["baselines"]["overall"]["acceptance_rate"] = 0.5
    edited = deployed["tmp"] / "edited.lock.json"
    edited.write_text(json.dumps(lock))
    refused(verify(deployed, lock=edited), "the lock was changed after it was signed")

    # the lock and the files changed together: the signature still says no
    lock = json.loads(deployed["lock"].read_text())
    (deployed["target"] / "chat_template.jinja").write_text("{{ messages }}")
    lock["models"]["target"]["files"]["chat_template.jinja"] = sha256(deployed["target"] / "chat_template.jinja")
    edited.write_text(json.dumps(lock))
    refused(verify(deployed, lock=edited), "the lock was changed after it was signed")


def test_wrong_key_refused(deployed, tmp_path):
    assert run("keys", "create", "--out", tmp_path / "other").returncode == 0
    other_public, other_private = tmp_path / "other" / "specreg-signing.pub", tmp_path / "other" / "specreg-signing.key"
    refused(verify(deployed, public_key=other_public), f"signature does not verify with {other_public}: Key mismatch")

    # re-signed by someone else's key after editing: refused with the team's key
    from specreg.registry.deploy.lock import sign_lock

    lock = json.loads(deployed["lock"].read_text())
    lock["models"]["target"]["files"]["model.safetensors"] = "0" * 64
    forged = deployed["tmp"] / "forged.lock.json"
    forged.write_text(json.dumps(sign_lock({**lock, "signature": None}, other_private)))
    refused(verify(deployed, lock=forged), f"signature does not verify with {deployed['public']}")


def test_signature_bytes_tampered_refused(deployed):
    lock = json.loads(deployed["lock"].read_text())
    sig = bytearray(base64.b64decode(lock["signature"]["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[-1] ^= 0x01
    lock["signature"]["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    edited = deployed["tmp"] / "badsig.lock.json"
    edited.write_text(json.dumps(lock))
    refused(verify(deployed, lock=edited), f"signature does not verify with {deployed['public']}")


def test_retired_or_replaced_version_refused_with_registry(deployed, tiny_models):
    registry = Registry(deployed["db"], user="alice")
    registry.register("lock", target=str(deployed["target"]), draft=str(deployed["draft"]), num_speculative_tokens=2)
    record_validation(registry, "lock@2")
    registry.promote("lock@2", "staging", reason="k=2")
    refused(verify(deployed, "--registry", deployed["db"], "--env", "staging"),
            "lock@1 no longer holds staging (lock@2 does)")
    assert verify(deployed, "--registry", deployed["db"]).returncode == 0  # not retired: still a valid lock

    registry.retire("lock@1", reason="superseded")
    refused(verify(deployed, "--registry", deployed["db"]), "lock@1 is retired in the registry")
    assert verify(deployed).returncode == 0  # without --registry only the files and signature count


def test_unsigned_lock_refused_unless_allowed(deployed):
    out = deployed["tmp"] / "unsigned"
    result = run("export", "lock@1", "--format", "sglang", "-o", out, "--db", deployed["db"])
    assert result.returncode == 0
    assert "specreg: warning: specreg.lock.json is unsigned" in result.stderr
    lock = json.loads((out / LOCK_FILE).read_text())
    assert lock["signed"] is False and lock["signature"] is None
    assert lock["engine"] == {"name": "sglang", "version": "0.5.23", "format": "sglang"}
    unsigned = ["verify", "--lock", out / LOCK_FILE, "--target", deployed["target"], "--draft", deployed["draft"]]
    refused(run(*unsigned), "lock is unsigned; refusing it")
    allowed = run(*unsigned, "--allow-unsigned")
    assert allowed.returncode == 0 and "verified lock@1: UNSIGNED lock, files match" in allowed.stdout
    (deployed["draft"] / "config.json").write_text("{}")
    refused(run(*unsigned, "--allow-unsigned"), "draft file config.json differs from the lock")


def test_forced_export_lock_says_unapproved(deployed, keys):
    registry = Registry(deployed["db"], user="alice")
    registry.register("lock", target=str(deployed["target"]), draft=str(deployed["draft"]), num_speculative_tokens=5)
    out = deployed["tmp"] / "forced"
    result = run("export", "lock@2", "--format", "vllm", "-o", out, "--force", "--db", deployed["db"],
                 "--signing-key", keys[0])
    assert result.returncode == 0, result.stderr
    forced = ["--lock", out / LOCK_FILE]
    refused(verify(deployed, *forced), "lock records an UNAPPROVED export (--force)")
    assert verify(deployed, *forced, "--allow-unapproved").returncode == 0


def test_usage_and_errors(deployed):
    no_draft = run("verify", "--lock", deployed["lock"], "--public-key", deployed["public"], "--target", deployed["target"])
    assert no_draft.returncode == 2 and "the lock binds a draft model" in no_draft.stderr
    no_key = run("verify", "--lock", deployed["lock"], "--target", deployed["target"], "--draft", deployed["draft"])
    assert no_key.returncode == 2 and "the lock is signed: pass --public-key KEY" in no_key.stderr
    env_only = verify(deployed, "--env", "staging")
    assert env_only.returncode == 2 and "--env needs --registry URL" in env_only.stderr
    missing = verify(deployed, lock=deployed["tmp"] / "nope.json")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "no such file" in missing.stderr
    not_json = deployed["tmp"] / "bad.json"
    not_json.write_text("{")
    assert verify(deployed, lock=not_json).returncode == 1
    lock = json.loads(deployed["lock"].read_text())
    lock["models"]["draft"]["files"]["config.json"] = "not-a-digest"
    not_json.write_text(json.dumps(lock))
    malformed = verify(deployed, lock=not_json)
    assert malformed.returncode == 1 and "draft file config.json: 'not-a-digest' is not a sha256" in malformed.stderr
    bad_key = verify(deployed, public_key=deployed["lock"])
    assert bad_key.returncode == 1 and "not an ECDSA P-256/384/521 public key" in bad_key.stderr
    bad_registry = verify(deployed, "--registry", f"sqlite:///{deployed['tmp'] / 'empty.db'}")
    # a deploy check never creates or migrates a database
    assert bad_registry.returncode == 1 and "no such database file (verify never creates one)" in bad_registry.stderr
    assert not (deployed["tmp"] / "empty.db").exists()
    (deployed["tmp"] / "empty.db").touch()
    not_migrated = verify(deployed, "--registry", f"sqlite:///{deployed['tmp'] / 'empty.db'}")
    assert not_migrated.returncode == 1 and "is at schema revision none" in not_migrated.stderr


def test_export_refuses_to_lock_changed_models(deployed):
    (deployed["target"] / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    result = run("export", "lock@1", "--format", "vllm", "--db", deployed["db"])
    assert result.returncode == 100 and result.stderr.count("\n") == 1
    assert "lock@1: the models changed since registration (target config.json changed)" in result.stderr


def test_verify_imports_no_heavy_library(deployed):
    probe = (
        "import sys\n"
        "from specreg.cli import main\n"
        f"sys.argv = ['specreg', 'verify', '--lock', {str(deployed['lock'])!r}, '--public-key', "
        f"{str(deployed['public'])!r}, '--keyring', {str(deployed['keyring'])!r}, '--target', {str(deployed['target'])!r}, "
        f"'--draft', {str(deployed['draft'])!r}, "
        f"'--registry', {deployed['db']!r}, '--env', 'staging']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert exit.code in (0, None), exit.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'mlflow') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
        # the keyless Sigstore client and the certificate signer are never needed to check a key signature
        "print('UNUSED', sorted(m for m in ('sigstore', 'tuf', 'OpenSSL') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "verified lock@1" in result.stdout and "HEAVY []" in result.stdout and "UNUSED []" in result.stdout


def test_verify_lock_api_reports_every_check(deployed):
    report = verify_lock(deployed["lock"], public_key=deployed["public"], keyring=deployed["keyring"],
                         target=deployed["target"],
                         draft=deployed["draft"])
    assert report.passed and [c["name"] for c in report.checks] == ["signature", "approvals", "target_files",
                                                                      "draft_files", "unchanged"]


def test_k8s_init_container_verifies_before_the_engine_starts(deployed):
    """The k8s export ships the lock in a ConfigMap and runs `specreg verify` as an
    initContainer on the paths the engine container is given; run here with the ConfigMap and
    the public key ConfigMap mounted as folders, it passes on the exported files and refuses
    drifted ones, so the pod would not start."""
    out = deployed["tmp"] / "k8s"
    models = deployed["target"].parent  # mounted where it lies here, so in-container paths are these paths
    result = run("export", "lock@staging", "--format", "k8s-vllm", "-o", out, "--db", deployed["db"],
                 "--signing-key", deployed["private"], "--option", "verify_image=registry.local/specreg-verify:0.1.0",
                 "--option", f"model_volume=hostPath:{models}", "--option", f"model_mount_path={models}")
    assert result.returncode == 0, result.stderr
    documents = [d for d in yaml.safe_load_all((out / "k8s-vllm.yaml").read_text()) if d]
    config_map, engine_map, deployment = documents[0], documents[1], documents[2]
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == "lock-v1-lock"
    assert config_map["data"][LOCK_FILE] == (out / LOCK_FILE).read_text()
    # the engine's arguments: a ConfigMap file, the same bytes as the vllm-config.yaml the lock binds
    assert engine_map["kind"] == "ConfigMap" and engine_map["metadata"]["name"] == "lock-v1-engine"
    engine_text = engine_map["data"]["vllm-config.yaml"]
    assert engine_text == (out / "vllm-config.yaml").read_text()
    lock = json.loads((out / LOCK_FILE).read_text())
    assert lock["exported"]["vllm-config.yaml"] == hashlib.sha256(engine_text.encode()).hexdigest()
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["image"] == "registry.local/specreg-verify:0.1.0" and init["command"] == ["specreg", "verify"]
    # the engine container only points at that file; the initContainer verifies the same path
    engine = pod["containers"][0]
    assert engine["command"] + engine["args"] == ["vllm", "serve", "--config", "/etc/specreg/engine/vllm-config.yaml"]
    assert init["args"][init["args"].index("--config") + 1] == "/etc/specreg/engine/vllm-config.yaml"
    arguments = yaml.safe_load(engine_text)
    # the initContainer checks exactly the directories the engine loads
    assert init["args"][init["args"].index("--target") + 1] == arguments["model"] == str(deployed["target"])
    assert init["args"][init["args"].index("--draft") + 1] == arguments["speculative-config"]["model"] == \
        str(deployed["draft"])
    volumes = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert volumes == {"specreg-lock": "lock-v1-lock", "specreg-public-key": "specreg-signing-key",
                       "specreg-approvers": "specreg-approvers", "specreg-engine": "lock-v1-engine"}
    # the models and the engine's arguments are mounted in the initContainer exactly as in the engine container
    assert init["volumeMounts"][:2] == engine["volumeMounts"] == [
        {"name": "models", "mountPath": str(models), "readOnly": True},
        {"name": "specreg-engine", "mountPath": "/etc/specreg/engine", "readOnly": True}]
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"] if m["name"] != "models"}

    # mount the ConfigMaps as folders and run the initContainer's command line
    folders = {}
    for mount_path, name in mounts.items():
        folder = deployed["tmp"] / "mounts" / name
        folder.mkdir(parents=True)
        if name == "specreg-lock":
            (folder / LOCK_FILE).write_text(config_map["data"][LOCK_FILE])
        elif name == "specreg-engine":
            (folder / "vllm-config.yaml").write_text(engine_text)
        else:
            shutil.copy(deployed["keyring"] if name == "specreg-approvers" else deployed["public"],
                        folder / ("approvers.json" if name == "specreg-approvers" else "specreg-signing.pub"))
        folders[mount_path] = str(folder)

    def init_argv():
        argv = list(init["args"])
        for i, word in enumerate(argv):
            for mount_path, folder in folders.items():
                if word.startswith(mount_path + "/"):
                    argv[i] = folder + word[len(mount_path):]
        return argv

    assert run("verify", *init_argv()).returncode == 0
    # k edited in the ConfigMap after export (kubectl edit configmap): the pod does not start
    mounted = Path(folders["/etc/specreg/engine"]) / "vllm-config.yaml"
    assert engine_text.count("num_speculative_tokens: 3\n") == 1
    mounted.write_text(engine_text.replace("num_speculative_tokens: 3\n", "num_speculative_tokens: 7\n"))
    refused(run("verify", *init_argv()), "vllm-config.yaml differs from what was signed at export (sha256)")
    mounted.write_text(engine_text)
    assert run("verify", *init_argv()).returncode == 0
    (deployed["target"] / "tokenizer_config.json").write_text("{}")
    refused(run("verify", *init_argv()), "target file tokenizer_config.json differs from the lock")


def test_head_pair_lock_binds_the_head_and_the_init_container_checks_it(tmp_path, monkeypatch, keys):
    """An EAGLE-3 pair: the head directory (`--draft` at registration) is locked like a draft, and
    the k8s initContainer verifies it even though the export does not name it as a draft model."""
    from headfiles import write_eagle3, write_target

    monkeypatch.chdir(tmp_path)
    target = write_target(tmp_path / "models" / "target")
    head = write_eagle3(tmp_path / "eagle3-head")
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    Registry(db, user="alice").register("heads", target="models/target", draft=str(head), method="eagle3",
                                        num_speculative_tokens=3)
    out = tmp_path / "k8s"
    result = run("export", "heads@1", "--format", "k8s-vllm", "-o", out, "--force", "--db", db,
                 "--signing-key", keys[0], "--option", f"model_volume=hostPath:{tmp_path}",
                 "--option", f"model_mount_path={tmp_path}", "--option", "target_subpath=models/target",
                 "--option", "draft_subpath=eagle3-head")
    assert result.returncode == 0, result.stderr
    lock = json.loads((out / LOCK_FILE).read_text())
    assert lock["models"]["draft"]["files"] == {p.name: sha256(p) for p in sorted(head.iterdir())}
    assert lock["approved"] is False  # --force
    documents = [d for d in yaml.safe_load_all((out / "k8s-vllm.yaml").read_text()) if d]
    (init,) = documents[2]["spec"]["template"]["spec"]["initContainers"]
    assert init["args"][init["args"].index("--draft") + 1] == str(head.resolve())
    assert init["args"][init["args"].index("--target") + 1] == str(target.resolve())
    assert "--allow-unapproved" in init["args"]
    assert verify({"public": keys[1]}, "--allow-unapproved", lock=out / LOCK_FILE, target=target,
                  draft=head).returncode == 0
    (head / "config.json").write_text("{}")
    refused(verify({"public": keys[1]}, "--allow-unapproved", lock=out / LOCK_FILE, target=target, draft=head),
            "draft file config.json differs from the lock")


def test_sglang_eagle3_lock_binds_the_layout_sglang_loads(tmp_path, monkeypatch, keys):
    """`specreg export --format sglang` of an EAGLE-3 pair writes the head as SGLang loads it
    (sglang-eagle3-head/) and signs that folder's files: verify passes on it, and refuses the
    registered head directory, whose config.json SGLang cannot read."""
    from headfiles import write_eagle3, write_target

    monkeypatch.chdir(tmp_path)
    target = write_target(tmp_path / "models" / "target")
    head = write_eagle3(tmp_path / "eagle3-head", aux=(1, 3, 4), verifier="models/target")
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    Registry(db, user="alice").register("heads", target="models/target", draft=str(head), method="eagle3",
                                        num_speculative_tokens=3)
    out = tmp_path / "sglang"
    result = run("export", "heads@1", "--format", "sglang", "-o", out, "--force", "--db", db, "--signing-key", keys[0])
    assert result.returncode == 0, result.stderr
    assert f"sglang-eagle3-head/model.safetensors -> {head / 'model.safetensors'}" in result.stdout
    layout = out / "sglang-eagle3-head"
    lock = json.loads((out / LOCK_FILE).read_text())
    assert lock["models"]["draft"]["layout"] == "sglang-eagle3-head"
    assert lock["models"]["draft"]["files"] == {p.name: sha256(p) for p in sorted(layout.iterdir())}
    assert json.loads((layout / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == \
        [0, 2, 3]
    assert verify({"public": keys[1]}, "--allow-unapproved", lock=out / LOCK_FILE, target=target,
                  draft=layout).returncode == 0
    refused(verify({"public": keys[1]}, "--allow-unapproved", lock=out / LOCK_FILE, target=target, draft=head),
            "draft file config.json differs from the lock")


def test_keys_create_hints_by_use(tmp_path):
    approval = run("keys", "create", "--out", tmp_path / "bob", "--use", "approval").stdout
    assert "approve --key" in approval and f"keys enrol PERSON --public-key {tmp_path}/bob/specreg-signing.pub" \
        in approval
    assert "--signing-key" not in approval and "verify --public-key" not in approval  # not a lock key
    lock = run("keys", "create", "--out", tmp_path / "team", "--use", "lock").stdout
    assert "export --signing-key" in lock and "verify --public-key" in lock and "approve --key" not in lock
    either = run("keys", "create", "--out", tmp_path / "any").stdout
    assert "for approvals: approve --key" in either and "for pair locks: export --signing-key" in either
