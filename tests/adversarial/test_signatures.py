"""Approvals are signatures, checked again at pod start. Each test is an attack or a careless input as a review found it;
before the fix each passed the gate, `specreg verify` or an export, or ended in a traceback.
Real databases, real keys, real `specreg` processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pgroles import as_user
from policyrecord import record_policy
from specreg.api import Registry
from specreg.core.signing import create_key_pair, load_signer
from specreg.errors import PolicyViolation
from specreg.registry.deploy.lock import LOCK_FILE, sign_lock
from specreg.registry.governance.signatures import approval_predicate, sign_decision
from specreg.registry.store.orm import ApprovalRow
from specreg.registry.store.store import utcnow

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, policy_file, record_validation  # noqa: E402,F401

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)


def validated(db_url: str, tiny_models, name: str) -> Registry:
    alice = Registry(as_user(db_url, "alice"), user="alice")
    alice.register(name, target=str(tiny_models["target"]), draft=str(tiny_models["draft"]), num_speculative_tokens=2)
    record_validation(alice, f"{name}@1")
    return alice


def forge_row(alice: Registry, name: str, actor: str, signature: dict | None) -> int:
    """What alice can do with write access to the database: an approvals row naming ``actor``
    and a correctly chained audit event saying ``actor`` approved (HIGH-1)."""
    version = alice.get(f"{name}@1")
    with alice.store.session(write=True) as session:
        row = ApprovalRow(pair_version_id=version.id, decision="approved", actor=actor, note=None, source="cli",
                          created_at=utcnow(), signature=signature, key_id=None, scope="*")
        session.add(row)
        session.flush()
        event = alice.store.append_event(session, pair_name=name, version=1, action="approve", from_state="validated",
                                         to_state="validated", actor=actor, reason=None,
                                         details={"approval": row.id, "decision": "approved", "source": "cli"})
        row.event_hash = event.event_hash
        return row.id


# --- §1: an approval is a signature (HIGH-1) ------------------------------------------------------

def test_a_forged_row_with_a_chained_event_naming_bob_does_not_count(db_url, tiny_models, policy_file, approval_key):
    """HIGH-1: alice writes an approvals row naming bob and appends a correctly chained
    "approve by bob" event. `audit verify` passes (the chain links); before, the gate passed and
    alice promoted her own pair. Now the row has no signature by a key enrolled to bob."""
    alice = validated(db_url, tiny_models, "forge")
    approval_key(db_url, "bob")  # bob is a real enrolled approver: his name alone is not enough
    approval = forge_row(alice, "forge", "bob", None)
    assert alice.verify_audit()[1] is None
    # SQLite: nothing authenticates the writer, the signature is what is missing; PostgreSQL: the
    # server stamped the event with role alice too
    why = ("its audit event says bob but database role alice wrote it; no signature" if "postgresql" in db_url
           else "no signature")
    reasons = [c.reason for c in alice.gate("forge@1", "production").conditions if c.name == "approval"]
    assert reasons == [f"production needs an approval by someone other than the registrant alice (no signed approval "
                       f"counts); not counted: approval {approval} by bob: {why}"]
    with pytest.raises(PolicyViolation, match=f"approval {approval} by bob: {why}"):
        alice.promote("forge@1", "production")
    one_line(run("export", "forge@1", "--format", "vllm", "--db", db_url), 100, "not validated and approved")


def test_a_signature_by_alices_own_key_naming_bob_does_not_count(db_url, tiny_models, policy_file, approval_key):
    """alice signs a statement that says "bob approved" with her own enrolled key."""
    alice = validated(db_url, tiny_models, "ownkey")
    key = approval_key(db_url, "alice")
    version = alice.get("ownkey@1")
    predicate = approval_predicate(pair="ownkey", version=1, binding_sha256=version.binding_sha256,
                                   decision="approved", scope="*", policy_sha256="0" * 64, validation_run=1,
                                   approver="bob", signed_at=utcnow(), note=None)
    approval = forge_row(alice, "ownkey", "bob", sign_decision(load_signer(key), predicate))
    [reason] = [c.reason for c in alice.gate("ownkey@1", "production").conditions if c.name == "approval"]
    assert f"approval {approval} by bob: " in reason and "signed by alice's key but names 'bob' as approver" in reason


def test_a_signature_for_another_binding_does_not_count(db_url, tiny_models, policy_file, approval_key):
    """bob's genuine signature on version 1, copied onto version 2 of the same pair."""
    alice = validated(db_url, tiny_models, "copy")
    Registry(as_user(db_url, "bob"), user="bob").approve("copy@1", key=approval_key(db_url, "bob"))
    alice.register("copy", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]), num_speculative_tokens=3)
    record_validation(alice, "copy@2")
    from specreg.registry.governance.approvals import approvals

    signature = next(a.signature for a in approvals(alice.store, "copy", 1))
    with alice.store.session(write=True) as session:
        version = alice.store.version_row(session, "copy", 2)
        row = ApprovalRow(pair_version_id=version.id, decision="approved", actor="bob", note=None, source="cli",
                          created_at=utcnow(), signature=signature, scope="*")
        session.add(row)
        session.flush()
        row.event_hash = alice.store.append_event(
            session, pair_name="copy", version=2, action="approve", from_state="validated", to_state="validated",
            actor="bob", reason=None, details={"approval": row.id, "decision": "approved", "source": "cli"}).event_hash
    [reason] = [c.reason for c in alice.gate("copy@2", "production").conditions if c.name == "approval"]
    assert "the signature is about copy@1" in reason


def test_only_an_enroller_enrols_and_a_hand_written_key_row_does_not_count(db_url, tiny_models, policy_file,
                                                                           tmp_path):
    alice = validated(db_url, tiny_models, "enrol")
    _, public = create_key_pair(tmp_path / "mallory")
    refused = run("keys", "enrol", "bob", "--public-key", public, "--db", as_user(db_url, "alice"), "--user", "alice")
    one_line(refused, 100, "alice may not enrol keys", "[keyring] enrollers")
    # alice writes the keyring row herself: no enrolment event vouches for it
    from specreg.core.signing import key_id, public_key_pem
    from specreg.registry.store.orm import ApproverKeyRow

    pem = public_key_pem(public.read_text(), "key")
    with alice.store.session(write=True) as session:
        session.add(ApproverKeyRow(person="bob", key_id=key_id(pem), public_key=pem, enrolled_by="admin",
                                   enrolled_at=utcnow()))
    listed = run("keys", "list", "--db", db_url, "--json")
    assert [k["person"] for k in json.loads(listed.stdout)["keys"]] == ["policy_approver"]  # the policy's approver
    assert json.loads(listed.stdout)["not_counted"] == [
        f"key {key_id(pem)[:12]} of bob: no matching enrolment event in the verified audit chain"]
    signed_as_bob = run("approve", "enrol@1", "--db", as_user(db_url, "bob"), "--user", "bob",
                        "--key", tmp_path / "mallory" / "specreg-signing.key")
    one_line(signed_as_bob, 100, "is not enrolled (or its enrolment does not count), not to bob")


def test_a_key_the_registrant_enrolled_never_counts_for_her_pair(tmp_path, tiny_models):
    """alice is an enroller: she enrols a key she holds under bob's name. Its signatures are
    valid, but never for a pair alice registered (SQLite: identity advisory)."""
    policy = tmp_path / "p.toml"
    policy.write_text(POLICY_TOML + '\n[keyring]\nenrollers = ["alice", "admin"]\n')
    db = f"sqlite:///{tmp_path / 'r.db'}"
    record_policy(db, policy, tmp_path)
    alice = validated(db, tiny_models, "selfenrol")
    private, public = create_key_pair(tmp_path / "fake-bob")
    assert run("keys", "enrol", "bob", "--public-key", public, "--db", db, "--user", "alice").returncode == 0
    assert run("approve", "selfenrol@1", "--db", db, "--user", "bob", "--key", private).returncode == 0
    [reason] = alice.gate("selfenrol@1", "production").reasons
    assert reason == ("approval: approved by bob with a key the registrant alice enrolled (four-eyes: another "
                      "enroller must enrol it)")


def test_a_policy_may_ask_for_two_signatures(tmp_path, tiny_models, db_url, approval_key, monkeypatch):
    policy = tmp_path / "two.toml"
    policy.write_text(POLICY_TOML.replace("approvers = []", "approvers = []\napprovals_required = 2"))
    record_policy(db_url, policy, tmp_path)
    alice = validated(db_url, tiny_models, "two")
    Registry(as_user(db_url, "bob"), user="bob").approve("two@1", key=approval_key(db_url, "bob"))
    Registry(as_user(db_url, "bob"), user="bob").approve("two@1", key=approval_key(db_url, "bob"))  # same person
    assert alice.gate("two@1", "production").reasons == [
        "approval: production needs approvals by 2 people by someone other than the registrant alice "
        "(signed by bob only)"]
    Registry(as_user(db_url, "carol"), user="carol").approve("two@1", key=approval_key(db_url, "carol"))
    assert alice.gate("two@1", "production").passed


# --- §2: the signatures travel in the lock and are checked at pod start ---------------------------

@pytest.fixture
def shipped(tmp_path, tiny_models, monkeypatch, approval_key):
    """ship@1 on SQLite from copies of the tiny models, approved by bob, exported (vllm, signed)."""
    policy = tmp_path / "specreg.toml"
    policy.write_text(POLICY_TOML)
    models = {role: shutil.copytree(tiny_models[role], tmp_path / "models" / role) for role in ("target", "draft")}
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    record_policy(db, policy, tmp_path)
    alice = Registry(db, user="alice")
    alice.register("ship", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    record_validation(alice, "ship@1")
    Registry(db, user="bob").approve("ship@1", key=approval_key(db, "bob"))
    private, public = create_key_pair(tmp_path / "release")
    out = tmp_path / "out"
    assert run("export", "ship@1", "--format", "vllm", "-o", out, "--db", db, "--signing-key", private).returncode == 0
    keyring = tmp_path / "approvers.json"
    assert run("keys", "export", "--out", keyring, "--db", db).returncode == 0
    return {"db": db, "out": out, "lock": out / LOCK_FILE, "private": private, "public": public,
            "keyring": keyring, "tmp": tmp_path, "approval_key": approval_key, **models}


def verify(shipped, *extra, lock=None, keyring=None):
    return run("verify", "--lock", lock or shipped["lock"], "--public-key", shipped["public"],
               "--keyring", keyring or shipped["keyring"], "--target", shipped["target"],
               "--draft", shipped["draft"], *extra)


def test_verify_checks_the_approvers_signatures_against_the_mounted_keyring(shipped):
    assert verify(shipped).returncode == 0
    # the exporter (who holds the release key) strips the approvals and re-signs the lock
    lock = json.loads(shipped["lock"].read_text())
    stripped = shipped["tmp"] / "stripped.json"
    stripped.write_text(json.dumps(sign_lock({**lock, "approvals": [], "signature": None}, shipped["private"])))
    result = verify(shipped, lock=stripped)
    assert result.returncode == 100 and "approvals: ship@1 needs an approval by someone other than the registrant " \
        "alice (no signed approval counts)" in result.stdout
    # ... or names the registrant as the approver with a signature by a key the platform never trusted
    # a keyring without bob: his signature verifies with no key the platform mounted
    empty = shipped["tmp"] / "empty.json"
    empty.write_text(json.dumps({"keyring_format": "specreg.keyring/v1", "keys": []}))
    result = verify(shipped, keyring=empty)
    assert result.returncode == 100 and "which the keyring does not enrol" in result.stdout
    # the platform's keyring asks for two signatures
    two = shipped["tmp"] / "two.json"
    two.write_text(json.dumps({**json.loads(shipped["keyring"].read_text()), "approvals_required": 2}))
    result = verify(shipped, keyring=two)
    assert result.returncode == 100 and "needs approvals by 2 people" in result.stdout
    missing = run("verify", "--lock", shipped["lock"], "--public-key", shipped["public"], "--target",
                  shipped["target"], "--draft", shipped["draft"])
    one_line(missing, 2, "pass --keyring FILE")


def test_verify_registry_refuses_an_approval_withdrawn_by_a_later_signed_reject(shipped):
    """MED-2: before, `verify --registry` passed a version carol had rejected after the export."""
    assert verify(shipped, "--registry", shipped["db"]).returncode == 0
    Registry(shipped["db"], user="carol").reject("ship@1", key=shipped["approval_key"](shipped["db"], "carol"),
                                                 note="leaks the system prompt")
    result = verify(shipped, "--registry", shipped["db"])
    assert result.returncode == 100
    assert "ship@1: its approval was withdrawn by a signed rejection by carol after the export" in result.stderr


def test_verify_registry_never_creates_a_missing_database(shipped):
    """LOW-1: `verify --registry sqlite:///missing.db` created the file."""
    missing = shipped["tmp"] / "typo" / "registry.db"
    one_line(verify(shipped, "--registry", f"sqlite:///{missing}"), 1, "no such database file")
    assert not missing.exists() and not missing.parent.exists()


# --- §5: verify against files that change under it (HIGH-4) and file sets (MED-1) ------------------

def test_a_file_replaced_after_it_was_hashed_while_verify_runs_is_refused(shipped, monkeypatch):
    """HIGH-4: the weight file is swapped (same bytes, a new inode) after verify hashed it and
    before verify ends. Before: exit 0. The swap happens at a real point of verify's run:
    when it hashes the next file."""
    import specreg.registry.deploy.verify as verify_module
    from specreg.registry.deploy.verify import verify_lock

    real_sha256 = verify_module.sha256_file
    weights = shipped["target"] / "model.safetensors"

    def swap_after_weights(path):
        digest = real_sha256(path)
        if Path(path).name == "tokenizer_config.json" and Path(path).parent == shipped["target"]:
            copy = weights.with_name("model.safetensors.new")
            shutil.copyfile(weights, copy)
            os.replace(copy, weights)  # what an attacker with write access to the volume does
        return digest

    monkeypatch.setattr(verify_module, "sha256_file", swap_after_weights)
    report = verify_lock(shipped["lock"], public_key=shipped["public"], keyring=shipped["keyring"],
                         target=shipped["target"], draft=shipped["draft"])
    assert not report.passed
    assert report.failure == {"name": "unchanged", "passed": False, "file": "target/model.safetensors",
                              "detail": "target/model.safetensors was replaced or changed after it was hashed, "
                                        "while verify ran: refusing"}


def test_a_file_written_while_it_is_hashed_is_refused(shipped, monkeypatch):
    import specreg.registry.deploy.verify as verify_module
    from specreg.registry.deploy.verify import verify_lock

    real_sha256 = verify_module.sha256_file

    def write_during(path):
        digest = real_sha256(path)
        if Path(path).name == "config.json" and Path(path).parent == shipped["draft"]:
            os.utime(path, ns=(1, 1))  # the file was touched while it was read
        return digest

    monkeypatch.setattr(verify_module, "sha256_file", write_during)
    report = verify_lock(shipped["lock"], public_key=shipped["public"], keyring=shipped["keyring"],
                         target=shipped["target"], draft=shipped["draft"])
    assert report.failure["detail"] == "draft file config.json changed while it was verified (inode, size or " \
                                       "mtime): refusing"


def test_an_export_whose_file_set_changed_since_registration_is_refused(shipped):
    """MED-1: files engines read but the fingerprint does not cover, added after registration,
    were hashed into a lock signed as approved."""
    (shipped["target"] / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "FP8"}}')
    (shipped["draft"] / "extra").mkdir()
    (shipped["draft"] / "extra" / "params.json").write_text("{}")
    (shipped["draft"] / "generation_config.json").unlink()
    result = run("export", "ship@1", "--format", "vllm", "-o", shipped["tmp"] / "again", "--db", shipped["db"])
    one_line(result, 100, "target file hf_quant_config.json was added", "draft file extra/params.json was added",
             "draft file generation_config.json is missing")
    assert not (shipped["tmp"] / "again").exists()


# --- the engine's arguments under the signature -----------------------------------

def test_an_edited_serve_script_or_deployment_is_refused(shipped, tmp_path):
    lock = json.loads(shipped["lock"].read_text())
    assert set(lock["exported"]) == {"vllm-serve.sh", "vllm-speculative-config.json"}
    script = shipped["out"] / "vllm-serve.sh"
    config = shipped["out"] / "vllm-speculative-config.json"
    assert verify(shipped, "--config", script, "--config", config).returncode == 0
    script.write_text(script.read_text().replace('"num_speculative_tokens": 3', '"num_speculative_tokens": 7'))
    result = verify(shipped, "--config", script)
    assert result.returncode == 100 and "vllm-serve.sh differs from what was signed at export (sha256)" in result.stderr

    k8s = tmp_path / "k8s"
    assert run("export", "ship@1", "--format", "k8s-vllm", "-o", k8s, "--db", shipped["db"], "--signing-key",
               shipped["private"], "--option", f"model_volume=hostPath:{shipped['target'].parent}").returncode == 0
    manifest = k8s / "k8s-vllm.yaml"
    k8s_verify = ("verify", "--lock", k8s / LOCK_FILE, "--public-key", shipped["public"], "--keyring",
                  shipped["keyring"], "--target", shipped["target"], "--draft", shipped["draft"], "--config", manifest)
    assert run(*k8s_verify).returncode == 0
    assert set(json.loads((k8s / LOCK_FILE).read_text())["exported"]) == {"k8s-vllm.yaml", "vllm-config.yaml"}
    text = manifest.read_text()
    # k in the engine ConfigMap's file, as the manifest carries it (a double-quoted YAML string)
    in_configmap = "num_speculative_tokens: 3\\n"
    assert text.count(in_configmap) == 1
    manifest.write_text(text.replace(in_configmap, in_configmap.replace("3", "7")))
    result = run(*k8s_verify)
    assert result.returncode == 100 and "k8s-vllm.yaml differs from what was signed at export (ConfigMap file(s) " \
        "ship-v1-engine/vllm-config.yaml)" in result.stderr
    # the Deployment's engine args overriding the file (vLLM: command line > --config file)
    engine_args = '- "--config"\n            - "/etc/specreg/engine/vllm-config.yaml"\n          env:'
    assert text.count(engine_args) == 1
    manifest.write_text(text.replace(engine_args, engine_args.replace(
        "\n          env:", '\n            - "--speculative-config"\n            - "{}"\n          env:')))
    result = run(*k8s_verify)
    assert result.returncode == 100 and "k8s-vllm.yaml differs from what was signed at export (container(s) vllm)" \
        in result.stderr
    manifest.write_text(text)
    assert run(*k8s_verify).returncode == 0


# --- MED-7, LOW-2: hostile lock files ----------------------------------------------------------------

@pytest.mark.parametrize("text, reason", [
    ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ('{"lock_format": "specreg.lock/v1", "pair": {"version": ' + "9" * 5000 + "}}", "an integer of 5000 digits"),
])
def test_a_hostile_lock_is_one_line(shipped, text, reason):
    hostile = shipped["tmp"] / "hostile.json"
    hostile.write_text(text)
    one_line(verify(shipped, lock=hostile), 1, "not readable JSON", reason)


def test_a_gigabyte_lock_is_refused_without_reading_it(shipped):
    """LOW-2: a 1 GiB lock was read whole (2 GB RSS)."""
    huge = shipped["tmp"] / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(1024 ** 3)
    argv = [sys.executable, "-m", "specreg.cli", "verify", "--lock", str(huge), "--public-key",
            str(shipped["public"]), "--target", str(shipped["target"]), "--draft", str(shipped["draft"])]
    # a fresh interpreter runs verify and reports its child's peak RSS (this process's children include others)
    probe = ("import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(json.dumps([r.returncode, r.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    code, stderr, rss_kib = json.loads(done.stdout)
    one_line(subprocess.CompletedProcess(argv, code, "", stderr), 1, "bytes, over the limit of 67108864")
    assert rss_kib < 300 * 1024, rss_kib  # the 1 GiB file is never read: about the interpreter's own size


# --- §4: on PostgreSQL the server stamps who wrote each row ------------------------------------------

def test_role_alice_cannot_write_an_event_whose_stamped_role_is_bob(postgres_url, tiny_models, policy_file,
                                                                     tmp_path):
    """With the least-privilege grants of docs/governance.md (tests/pgroles.py), alice inserts an audit event
    and a keyring row claiming bob and admin: the server stamps alice on both, the event hash
    no longer matches, and the key does not count. She can neither edit nor delete events."""
    import psycopg
    from sqlalchemy import text

    alice = validated(postgres_url, tiny_models, "stamp")
    alice_url = as_user(postgres_url, "alice")
    engine = Registry(alice_url, user="alice").store.engine
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO audit_events (pair_name, version, action, actor, details, created_at, prev_hash, event_hash, "
            "session_role) VALUES ('stamp', 1, 'approve', 'bob', '{}', now(), 'x', 'forged', 'bob')"))
        stamped = connection.execute(text("SELECT session_role FROM audit_events WHERE event_hash = 'forged'")).scalar()
    assert stamped == "alice"
    for statement in ("UPDATE audit_events SET session_role = 'bob'", "DELETE FROM audit_events",
                      "UPDATE approvals SET actor = 'bob'", "DROP TRIGGER specreg_stamp_session_role ON audit_events"):
        with pytest.raises(Exception) as refused, engine.begin() as connection:
            connection.execute(text(statement))
        assert isinstance(refused.value.orig, psycopg.errors.InsufficientPrivilege), statement
    engine.dispose()
    assert "event" in (alice.verify_audit()[1] or "")  # the forged row breaks the chain where it sits


def test_a_keyring_row_and_enrolment_event_forged_by_alice_do_not_count(postgres_url, tiny_models, policy_file,
                                                                        tmp_path):
    """HIGH-1 on PostgreSQL, one step further: alice writes a keyring row giving bob a key she
    holds, with a correctly chained "admin enrolled it" event, then signs as bob."""
    from specreg.core.signing import key_id, public_key_pem
    from specreg.registry.store.orm import ApproverKeyRow

    validated(postgres_url, tiny_models, "keyforge")
    alice = Registry(as_user(postgres_url, "alice"), user="alice")
    private, public = create_key_pair(tmp_path / "alice-as-bob")
    pem = public_key_pem(public.read_text(), "key")
    with alice.store.session(write=True) as session:
        row = ApproverKeyRow(person="bob", key_id=key_id(pem), public_key=pem, enrolled_by="admin",
                             enrolled_at=utcnow())
        session.add(row)
        session.flush()
        row.event_hash = alice.store.append_event(
            session, pair_name="-", version=None, action="enrol-key", from_state=None, to_state=None, actor="admin",
            reason=None, details={"person": "bob", "key_id": key_id(pem), "key_row": row.id}).event_hash
    assert alice.verify_audit()[1] is None  # the chain links: alice hashed her own (stamped) role
    listed = json.loads(run("keys", "list", "--db", postgres_url, "--json").stdout)
    assert listed["not_counted"] == [f"key {key_id(pem)[:12]} of bob: its enrolment event says admin but database "
                                     f"role alice wrote it"]
    signed = run("approve", "keyforge@1", "--db", as_user(postgres_url, "bob"), "--key", private,
                 env={"SPECREG_USER": "bob"})
    one_line(signed, 100, "is not enrolled (or its enrolment does not count), not to bob")


def test_db_grants_prints_the_least_privilege_grants():
    printed = run("db", "grants", "alice")
    assert printed.returncode == 0
    assert "GRANT SELECT ON ALL TABLES IN SCHEMA public TO alice;" in printed.stdout
    assert "GRANT UPDATE (state) ON pair_versions TO alice;" in printed.stdout
    assert "DELETE" not in printed.stdout and "audit_events TO" not in printed.stdout.replace("INSERT ON", "")
    one_line(run("db", "grants", "Robert'); DROP TABLE pairs;--"), 2, "plain lower-case PostgreSQL role name")
