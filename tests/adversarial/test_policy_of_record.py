"""The policy of record under attack: a registrant's own policy file, a raw validation run, a
forged pointer, a signer's clock, a leaked key, an approval carried over to another policy.
Real databases (SQLite and PostgreSQL, each person their own role there), `specreg` as a user
runs it, exit codes and one-line errors."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from pgroles import as_user
from specreg.api import Registry
from specreg.errors import PolicyViolation
from specreg.registry.store.entities import PairState

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, record_validation, recorded_policy_file, validated_pair  # noqa: E402

from clirun import one_line, run  # noqa: E402
from policyrecord import record_policy  # noqa: E402

LOOSE_TOML = """\
golden_set = "smoke"
required_checks = []

[identity]
allow_claimed_user = true

[environments.production]
approval_required = false
"""


@pytest.fixture
def policy_file(tmp_path, request):
    return recorded_policy_file(tmp_path, request)


def test_a_file_the_caller_chooses_never_decides(db_url, tiny_models, policy_file, tmp_path):
    """P07: the registrant's own permissive file, by --policy or $SPECREG_POLICY, moves nothing."""
    alice = validated_pair(db_url, tiny_models, "own")
    loose = tmp_path / "loose.toml"
    loose.write_text(LOOSE_TOML)
    alice_db = as_user(db_url, "alice")
    by_option = run("promote", "own@1", "--to", "production", "--policy", loose, "--db", alice_db, "--user", "alice")
    assert by_option.returncode == 2 and "--policy only previews" in by_option.stderr
    by_env = run("promote", "own@1", "--to", "production", "--db", alice_db, "--user", "alice",
                 env={"SPECREG_POLICY": str(loose)})
    assert by_env.returncode == 100, by_env.stderr
    assert "$SPECREG_POLICY" in by_env.stderr and "is ignored" in by_env.stderr
    assert "approval" in by_env.stderr
    gate = run("gate", "own@1", "--env", "production", "--policy", loose, "--db", alice_db, "--json")
    verdict = json.loads(gate.stdout)
    assert gate.returncode == 100 and verdict["passed"] is False and verdict["policy_version"] == 1
    assert verdict["preview"]["passed"] is True  # what the file would say, shown and not acted on
    assert alice.get("own@1").state is PairState.VALIDATED
    assert alice.get("own@1").version == 1 and alice.environments() == []


def test_a_registrant_cannot_loosen_the_policy_alone(db_url, tiny_models, policy_file, tmp_path, approval_key):
    alice = validated_pair(db_url, tiny_models, "solo")
    loose = tmp_path / "loose.toml"
    loose.write_text(LOOSE_TOML)
    proposed = alice.propose_policy(str(loose), note="faster releases")
    assert proposed["version"] == 2 and proposed["replaces"] == 1
    with pytest.raises(PolicyViolation, match="four-eyes: alice proposed policy v2 and cannot approve it"):
        alice.approve_policy(2, key=approval_key(db_url, "alice"))
    assert alice.policy().version == 1  # still the team's policy
    with pytest.raises(PolicyViolation, match="approval"):
        alice.promote("solo@1", "production")
    history = {p["version"]: p for p in alice.policy_history()}
    assert history[1]["state"] == "in effect" and history[2]["state"] == "pending"
    bob = Registry(as_user(db_url, "bob"), user="bob")
    approved = bob.approve_policy(2, key=approval_key(db_url, "bob"))
    assert approved["active"] and alice.policy().version == 2
    move = alice.promote("solo@1", "production")  # the loosened policy governs once another person signed it
    event = alice.history("solo")[-1]
    assert (move.version, event.details["policy_version"], event.details["policy_sha256"]) == \
        (1, 2, alice.policy().sha256)
    # what a user inspects names the policy each decision was judged under
    history = run("history", "solo", "--db", db_url).stdout.splitlines()
    assert "POLICY" in history[0] and any(" promote " in l and " v2 " in l for l in history[1:])
    shown = run("show", "solo@1", "--db", db_url).stdout
    assert any("promote" in l and "(policy v2)" in l for l in shown.splitlines())


def test_postgres_registrant_cannot_claim_an_enroller_with_her_own_policy(postgres_url, tiny_models, tmp_path):
    """P01: alice's file says allow_claimed_user = true; the policy of record does not."""
    team = tmp_path / "team.toml"
    team.write_text(POLICY_TOML)
    record_policy(postgres_url, team, tmp_path)
    validated_pair(postgres_url, tiny_models, "claim")
    loose = tmp_path / "loose.toml"
    loose.write_text(LOOSE_TOML)
    from specreg.core.signing import PUBLIC_KEY_FILE, create_key_pair

    create_key_pair(tmp_path / "forged-bob")
    alice_db = as_user(postgres_url, "alice")
    enrol = run("keys", "enrol", "bob", "--public-key", tmp_path / "forged-bob" / PUBLIC_KEY_FILE,
                "--db", alice_db, "--user", "admin", env={"SPECREG_POLICY": str(loose)})
    assert enrol.returncode == 100, enrol.stderr
    assert "connected to PostgreSQL as role alice" in enrol.stderr and "policy of record v1" in enrol.stderr
    keys = Registry(postgres_url).keyring()[0]
    assert all(k.person != "bob" for k in keys)


def test_a_validation_run_no_event_covers_counts_for_nothing(db_url, tiny_models, policy_file, approval_key):
    """P05: alice inserts a passed run and passing checks for her failed pair."""
    alice = validated_pair(db_url, tiny_models, "forged")
    record_validation(alice, "forged@1", status="failed")
    version = alice.get("forged@1")
    golden = alice.validation_runs("forged@1")[-1]
    with alice.store.engine.begin() as connection:
        run_id = connection.execute(text(
            "INSERT INTO validation_runs (pair_version_id, status, golden_set, golden_sha256, binding_sha256, "
            "environment, options, summary, baselines, actor, started_at, finished_at) VALUES (:v, 'passed', "
            "'smoke', :g, :b, '{}', '{}', '{}', :baselines, 'alice', :t, :t) RETURNING id"),
            {"v": version.id, "g": golden.golden_sha256, "b": version.binding_sha256, "t": datetime(2026, 12, 2),
             "baselines": json.dumps({"k": 2, "overall": {"acceptance_rate": 0.9, "mean_acceptance_length": 3.0}})}
        ).scalar()
        for check in ("integrity", "tokenizer", "equivalence", "acceptance"):
            connection.execute(text("INSERT INTO check_results (validation_run_id, name, status, summary) "
                                    "VALUES (:r, :n, 'pass', 'ok')"), {"r": run_id, "n": check})
    bob = Registry(as_user(db_url, "bob"), user="bob")
    with pytest.raises(PolicyViolation, match="has not passed validation"):
        bob.approve("forged@1", key=approval_key(db_url, "bob"))
    gate = alice.gate("forged@1", "production")
    assert not gate.passed and gate.validation_run_id != run_id
    named = run("audit", "verify", "--db", db_url)
    assert named.returncode == 0 and f"validation run {run_id} of forged@1 (passed): no audit event" in named.stdout


def test_a_pointer_row_without_its_promote_event_holds_nothing(db_url, tiny_models, policy_file, tmp_path):
    """P04: a raw INSERT into environment_pointers."""
    alice = validated_pair(db_url, tiny_models, "ptr")
    version = alice.get("ptr@1")
    with alice.store.engine.begin() as connection:
        connection.execute(text("INSERT INTO environment_pointers (pair_id, environment, pair_version_id, "
                                "updated_by, updated_at) SELECT pair_id, 'production', id, 'alice', :t "
                                "FROM pair_versions WHERE id = :v"), {"v": version.id, "t": datetime(2026, 12, 2)})
    listed = alice.environments("ptr")
    assert listed[0]["version"] is None and "counts for nothing" in listed[0]["not_counted"]
    shown = run("show", "ptr@production", "--db", db_url)
    assert shown.returncode != 0 and "no version of ptr holds environment production" in shown.stderr
    named = run("audit", "verify", "--db", db_url)
    assert "environment pointer ptr@production names version 1" in named.stdout


def test_a_decision_is_ordered_by_its_audit_event_not_the_signers_clock(db_url, tiny_models, policy_file,
                                                                          approval_key, monkeypatch):
    """K07: bob's clock says 2999; carol's later rejection and a later failed validation still win."""
    import specreg.registry.governance.approvals as approvals

    alice = validated_pair(db_url, tiny_models, "clock")
    bob = Registry(as_user(db_url, "bob"), user="bob")
    carol = Registry(as_user(db_url, "carol"), user="carol")
    bob_key, carol_key = approval_key(db_url, "bob"), approval_key(db_url, "carol")
    with monkeypatch.context() as patched:
        patched.setattr(approvals, "utcnow", lambda: datetime(2999, 1, 1))
        bob.approve("clock@1", key=bob_key)
    carol.reject("clock@1", key=carol_key, note="regresses code prompts")
    gate = alice.gate("clock@1", "production")
    assert not gate.passed and "rejected by carol" in {c.name: c.reason for c in gate.conditions}["approval"]

    validated_pair(db_url, tiny_models, "clock2")
    with monkeypatch.context() as patched:
        patched.setattr(approvals, "utcnow", lambda: datetime(2999, 1, 1))
        bob.approve("clock2@1", key=bob_key)
    record_validation(alice, "clock2@1", status="failed")
    record_validation(alice, "clock2@1")
    assert not alice.gate("clock2@1", "production").passed  # the 2999 approval predates the failure


def test_an_approval_counts_under_the_policy_it_signed(db_url, tiny_models, policy_file, tmp_path, approval_key):
    """K06: approved under v1; once v2 governs, bob signs again."""
    alice = validated_pair(db_url, tiny_models, "moved")
    bob = Registry(as_user(db_url, "bob"), user="bob")
    bob.approve("moved@1", key=approval_key(db_url, "bob"))
    assert alice.gate("moved@1", "production").passed
    stricter = tmp_path / "stricter.toml"
    stricter.write_text(POLICY_TOML.replace("acceptance_tolerance = 0.10", "acceptance_tolerance = 0.05"))
    record_policy(db_url, stricter, tmp_path)
    gate = alice.gate("moved@1", "production")
    reason = {c.name: c.reason for c in gate.conditions}["approval"]
    assert not gate.passed and "signed under another policy than policy of record v2" in reason
    bob.approve("moved@1", key=approval_key(db_url, "bob"))
    assert alice.gate("moved@1", "production").passed


def test_a_revoked_key_stops_counting_here_and_at_pod_start(db_url, tiny_models, policy_file, tmp_path, approval_key):
    """K03: bob's key leaked; admin revokes it; what it signed no longer counts anywhere."""
    alice = validated_pair(db_url, tiny_models, "leak")
    bob = Registry(as_user(db_url, "bob"), user="bob")
    bob_key = approval_key(db_url, "bob")
    bob.approve("leak@1", key=bob_key)
    assert alice.gate("leak@1", "production").passed
    keyring_before = tmp_path / "before.json"
    assert run("keys", "export", "--out", keyring_before, "--db", db_url).returncode == 0
    kid = next(k.key_id for k in alice.keyring()[0] if k.person == "bob")

    refused = run("keys", "revoke", kid[:12], "--reason", "laptop stolen", "--db", as_user(db_url, "alice"),
                  "--user", "alice")
    assert refused.returncode == 100 and "alice may not revoke keys" in refused.stderr
    revoked = run("keys", "revoke", kid[:12], "--reason", "laptop stolen", "--db", as_user(db_url, "admin"),
                  "--user", "admin")
    assert revoked.returncode == 0, revoked.stderr
    gate = alice.gate("leak@1", "production")
    assert not gate.passed
    listed = json.loads(run("keys", "list", "--db", db_url, "--json").stdout)
    assert any("revoked by admin" in line for line in listed["not_counted"])
    assert [r["key_id"] for r in listed["revoked"]] == [kid]

    keyring_after = tmp_path / "after.json"
    assert run("keys", "export", "--out", keyring_after, "--db", db_url).returncode == 0
    from specreg.registry.governance.signatures import read_keyring_file

    assert kid in read_keyring_file(keyring_before)[0]
    assert kid not in read_keyring_file(keyring_after)[0]
    # a copy that still lists the key beside the revocation refuses it too
    document = json.loads(keyring_after.read_text())
    document["keys"] = json.loads(keyring_before.read_text())["keys"]
    keyring_after.write_text(json.dumps(document))
    assert kid not in read_keyring_file(keyring_after)[0]


def test_a_forged_activation_or_an_edited_document_governs_nothing(db_url, tiny_models, policy_file, tmp_path):
    alice = validated_pair(db_url, tiny_models, "forge")
    loose = tmp_path / "loose.toml"
    loose.write_text(LOOSE_TOML)
    alice.propose_policy(str(loose))
    # an activation event appended by a modified client, with no approval behind it
    with alice.store.session(write=True) as session:
        alice.store.append_event(session, pair_name="-", version=None, action="policy-activate", from_state=None,
                                 to_state=None, actor="alice", reason=None,
                                 details={"policy_version": 2, "sha256": alice.policy_history()[1]["sha256"]})
    record = alice.policy_record()
    assert record.version == 1 and any("policy v2: activation does not count" in p for p in record.problems)
    # the document of the policy in effect edited in place (by the schema owner: a person's role may
    # not update it): it stops governing
    with Registry(db_url).store.engine.begin() as connection:
        connection.execute(text("UPDATE policy_versions SET document = :d WHERE version = 1"), {"d": LOOSE_TOML})
    record = alice.policy_record()
    assert record.version == 0 and any("policy v1" in p for p in record.problems)
    shown = run("policy", "show", "--db", db_url)
    assert shown.returncode == 0 and "NOT COUNTED" in shown.stdout and "built-in default" in shown.stdout


def propose_anyway(registry: Registry, text: str) -> int:
    """What `specreg policy propose` records for ``text``, written by a modified client that
    skips its checks -> the proposed version."""
    from specreg.core.digests import sha256_hex
    from specreg.registry.governance.policy import parse_policy_text
    from specreg.registry.store import policy_versions
    from specreg.registry.store.store import utcnow

    store, sha256 = registry.store, parse_policy_text(text, "toml", "stuck.toml").sha256
    with store.session(write=True) as session:
        row = policy_versions.add_policy_document(session, document=text, format="toml", sha256=sha256,
                                                  proposed_by=registry.user, proposed_at=utcnow(), note=None)
        store.append_event(session, pair_name="-", version=None, action="policy-propose", from_state=None,
                           to_state=None, actor=registry.user, reason=None,
                           details={"policy_version": row.version, "sha256": sha256,
                                    "document_sha256": sha256_hex(text.encode("utf-8")), "file": "stuck.toml",
                                    "replaces": 1})
        policy_versions.mark_recorded(session, row.id, store.head_hash(session))
        return row.version


@pytest.mark.parametrize("text, field", [
    (POLICY_TOML + "\n[keyring]\nenrollers = []\n", "keyring.enrollers = []: nobody could enrol"),
    (POLICY_TOML.replace("approvers = []", 'approvers = ["bob"]\napprovals_required = 2'),
     "environments.production names 1 approver(s) but approvals_required = 2"),
])
def test_a_policy_that_could_never_be_changed_again_is_refused(db_url, policy_file, tmp_path, approval_key,
                                                                 text, field):
    """Once in effect, a policy with no enrollers (no key would count) or fewer approvers than
    its change needs could never be changed again: refused when proposed, one line naming the
    field, nothing written; one proposed anyway is refused when approved."""
    stuck = tmp_path / "stuck.toml"
    stuck.write_text(text)
    alice = Registry(as_user(db_url, "alice"), user="alice")
    proposed = run("policy", "propose", stuck, "--db", as_user(db_url, "alice"), "--user", "alice")
    one_line(proposed, 2, f"policy file {stuck}: {field}")
    assert [p["version"] for p in alice.policy_history()] == [1]
    version = propose_anyway(alice, text)
    approved = run("policy", "approve", version, "--key", approval_key(db_url, "bob"), "--db", as_user(db_url, "bob"),
                   "--user", "bob")
    one_line(approved, 100, f"policy v{version} could never be changed again once in effect: {field}")
    assert alice.policy().version == 1 and alice.policy_history()[-1]["approved_by"] == []


@pytest.mark.parametrize("number", [18446744073709551616, 2**31, 0, -1, pytest.param(10**5000, id="5001-digits")])
def test_a_number_no_row_can_have_is_one_line(db_url, tiny_models, policy_file, approval_key, number):
    """Integer arguments that reach the database: past 32 bits (past 64 the SQLite driver
    overflows) or below 1, exit 2 with one line naming the argument, from the CLI and the API."""
    from specreg.errors import UsageError

    alice = validated_pair(db_url, tiny_models, "num")
    bob_db, key = as_user(db_url, "bob"), approval_key(db_url, "bob")
    shown = number if abs(number) <= 2**64 else "a number that long"
    if number < 10**4000:  # click itself refuses to read more digits than Python converts
        one_line(run("policy", "approve", "--key", key, "--db", bob_db, "--user", "bob", "--", number), 2,
                 f"invalid policy version {shown}: use 1 to 2147483647")
        one_line(run("engine-baselines", "accept", "num@1", "--key", key, "--db", bob_db, "--user", "bob", "--",
                     number), 2, f"invalid engine baseline id {shown}")
    bob = Registry(bob_db, user="bob")
    for call, what in ((lambda: bob.approve_policy(number, key=key), "policy version"),
                       (lambda: bob.policy_document(number), "policy version"),
                       (lambda: bob.accept_engine_baseline("num@1", number, key=key), "engine baseline id"),
                       (lambda: bob.observations("num@1", limit=number), "limit")):
        with pytest.raises(UsageError, match=f"invalid {what} {shown}"):
            call()
    assert alice.policy().version == 1
