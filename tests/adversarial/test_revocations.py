"""Key revocations under attack: a revocation appended by someone who may not revoke, a rejection
whose signer's key is revoked afterwards, and a revocation that would unseat the policy of
record. Real databases (SQLite and PostgreSQL, each person their own role there), `specreg` as
a user runs it, exit codes and the gate's reasons."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pgroles import as_user
from specreg.api import Registry

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, policy_file, validated_pair  # noqa: E402,F401

from clirun import run  # noqa: E402
from policyrecord import APPROVER, record_policy  # noqa: E402


def rejected_by_bob(db_url, tiny_models, approval_key, name: str) -> tuple[Registry, str]:
    """NAME@1 registered by alice, approved by carol, then rejected by bob -> (alice's registry,
    bob's key id)."""
    alice = validated_pair(db_url, tiny_models, name)
    Registry(as_user(db_url, "carol"), user="carol").approve(f"{name}@1", key=approval_key(db_url, "carol"))
    bob_key = approval_key(db_url, "bob")
    Registry(as_user(db_url, "bob"), user="bob").reject(f"{name}@1", "regresses code prompts", key=bob_key)
    gate = alice.gate(f"{name}@1", "production")
    assert not gate.passed and "rejected by bob" in {c.name: c.reason for c in gate.conditions}["approval"]
    return alice, next(k.key_id for k in alice.keyring()[0] if k.person == "bob")


def key_row(registry: Registry, kid: str) -> int:
    from specreg.registry.store import approver_keys

    with registry.store.session() as session:
        return approver_keys.key_with_id(session, kid).id


def reject_anyway(registry: Registry, name: str, key: str) -> None:
    """What `specreg reject NAME@1 --key KEY` records, written by a modified client that skips
    the keyring check: the signed row, its audit event, the row naming the event."""
    from specreg.core.signing import load_signer, signer_key_id
    from specreg.registry.governance.signatures import ANY_SCOPE, REJECTED, approval_predicate, sign_decision
    from specreg.registry.store import approval_records
    from specreg.registry.store.store import utcnow

    store, actor, policy_sha256 = registry.store, registry.user, registry.policy().sha256
    signer = load_signer(key)
    with store.session(write=True) as session:
        row = store.pair_version(session, name, 1)
        now = utcnow()
        predicate = approval_predicate(pair=name, version=1, binding_sha256=row.binding_sha256, decision=REJECTED,
                                       scope=ANY_SCOPE, policy_sha256=policy_sha256, validation_run=None,
                                       approver=actor, signed_at=now, note=None)
        approval = approval_records.add_approval(session, row, decision=REJECTED, actor=actor, note=None,
                                                 created_at=now, signature=sign_decision(signer, predicate),
                                                 key_id=signer_key_id(signer), scope=ANY_SCOPE)
        store.append_event(session, pair_name=name, version=1, action="reject", from_state=row.state.value,
                           to_state=row.state.value, actor=actor, reason=None,
                           details={"approval": approval, "decision": REJECTED, "source": "cli", "scope": ANY_SCOPE})
        approval_records.mark_recorded(session, row, approval, store.head_hash(session))


def promote_as_alice(db_url, name: str):
    return run("promote", f"{name}@1", "--to", "production", "--db", as_user(db_url, "alice"), "--user", "alice")


def test_a_revocation_by_someone_who_may_not_revoke_counts_for_nothing(db_url, tiny_models, policy_file,
                                                                        approval_key):
    """The registrant may not revoke keys; the `revoke-key` event `keys revoke` would append,
    written with her own grants by a modified client, revokes nothing: bob's rejection stands."""
    alice, kid = rejected_by_bob(db_url, tiny_models, approval_key, "erase")
    refused = run("keys", "revoke", kid[:12], "--reason", "stolen", "--db", as_user(db_url, "alice"),
                  "--user", "alice")
    assert refused.returncode == 100 and "alice may not revoke keys" in refused.stderr
    with alice.store.session(write=True) as session:
        alice.store.append_event(session, pair_name="-", version=None, action="revoke-key", from_state=None,
                                 to_state=None, actor="alice", reason="stolen",
                                 details={"person": "bob", "key_id": kid, "key_row": key_row(alice, kid)})
    assert alice.verify_audit()[1] is None  # the event is on the chain: it is who wrote it that fails
    promoted = promote_as_alice(db_url, "erase")
    assert promoted.returncode == 100 and "rejected by bob" in promoted.stderr, promoted.stderr
    listed = json.loads(run("keys", "list", "--db", db_url, "--json").stdout)
    assert kid in [k["key_id"] for k in listed["keys"]] and listed["revoked"] == []
    assert any(f"revocation of key {kid[:12]} by alice" in line and "not an enroller" in line
               for line in listed["not_counted"]), listed["not_counted"]
    named = run("audit", "verify", "--db", db_url)
    assert named.returncode == 0 and f"revocation of key {kid[:12]} by alice" in named.stdout, named.stdout
    # an enroller's own revocation still counts, and bob's key stops counting from then on
    revoked = run("keys", "revoke", kid[:12], "--reason", "stolen", "--db", as_user(db_url, "admin"),
                  "--user", "admin")
    assert revoked.returncode == 0, revoked.stderr
    listed = json.loads(run("keys", "list", "--db", db_url, "--json").stdout)
    assert [r["key_id"] for r in listed["revoked"]] == [kid] and kid not in [k["key_id"] for k in listed["keys"]]


def test_revoking_a_rejecters_key_does_not_revive_the_version(db_url, tiny_models, policy_file, approval_key):
    """Revoking bob's key after his rejection leaves the rejection standing (carol's older
    approval stays withdrawn); an approval signed after the rejection counts as ever."""
    alice, kid = rejected_by_bob(db_url, tiny_models, approval_key, "revive")
    revoked = run("keys", "revoke", kid[:12], "--reason", "left the team", "--db", as_user(db_url, "admin"),
                  "--user", "admin")
    assert revoked.returncode == 0, revoked.stderr
    gate = alice.gate("revive@1", "production")
    assert not gate.passed and "rejected by bob" in {c.name: c.reason for c in gate.conditions}["approval"]
    promoted = promote_as_alice(db_url, "revive")
    assert promoted.returncode == 100 and "rejected by bob" in promoted.stderr, promoted.stderr
    Registry(as_user(db_url, "carol"), user="carol").approve("revive@1", key=approval_key(db_url, "carol"))
    assert alice.gate("revive@1", "production").passed
    assert promote_as_alice(db_url, "revive").returncode == 0


def test_a_rejection_signed_with_an_already_revoked_key_counts_for_nothing(db_url, tiny_models, policy_file,
                                                                             approval_key):
    """What stands is what the keyring said when the decision was recorded: a key revoked before
    bob signs rejects nothing."""
    alice = validated_pair(db_url, tiny_models, "late")
    bob_key = approval_key(db_url, "bob")
    kid = next(k.key_id for k in alice.keyring()[0] if k.person == "bob")
    Registry(as_user(db_url, "carol"), user="carol").approve("late@1", key=approval_key(db_url, "carol"))
    Registry(as_user(db_url, "admin"), user="admin").revoke_key(kid, "laptop stolen")
    refused = run("reject", "late@1", "--key", bob_key, "--db", as_user(db_url, "bob"), "--user", "bob")
    assert refused.returncode == 100 and "not enrolled" in refused.stderr, refused.stderr
    reject_anyway(Registry(as_user(db_url, "bob"), user="bob"), "late", bob_key)
    gate = alice.gate("late@1", "production")
    approval = {c.name: c for c in gate.conditions}["approval"]
    assert gate.passed, approval.reason
    assert any("rejection" in line and "does not enrol" in line for line in approval.details["not_counted"])


REQUIRES_TWO = POLICY_TOML.replace("approvers = []", "approvers = []\napprovals_required = 2")


def test_a_revocation_never_unseats_the_policy_of_record(db_url, tiny_models, policy_file, tmp_path, approval_key):
    """v2 needs two approvals for production; the enroller alone revokes the key that approved
    v1 and v2. What governs stays v2: a policy changes only by a four-eyes policy change."""
    stricter = tmp_path / "stricter.toml"
    stricter.write_text(REQUIRES_TWO)
    assert record_policy(db_url, stricter, tmp_path) == 2
    admin = Registry(as_user(db_url, "admin"), user="admin")
    kid = next(k.key_id for k in admin.keyring()[0] if k.person == APPROVER)
    admin.revoke_key(kid, "laptop stolen")
    record = admin.policy_record()
    assert (record.version, record.problems) == (2, ()), record.problems
    assert record.policy.environment("production").approvals_required == 2
    shown = run("policy", "show", "--db", db_url, "--json")
    assert json.loads(shown.stdout)["version"] == 2, shown.stdout
    alice = validated_pair(db_url, tiny_models, "two")
    Registry(as_user(db_url, "bob"), user="bob").approve("two@1", key=approval_key(db_url, "bob"))
    gate = alice.gate("two@1", "production")
    assert not gate.passed and "approvals by 2 people" in {c.name: c.reason for c in gate.conditions}["approval"]
    # the revoked key approves nothing from then on: not the next change either
    looser = tmp_path / "looser.toml"
    looser.write_text(POLICY_TOML.replace("acceptance_tolerance = 0.10", "acceptance_tolerance = 0.20"))
    proposed = Registry(as_user(db_url, "alice"), user="alice").propose_policy(str(looser))
    refused = run("policy", "approve", proposed["version"], "--key", approval_key(db_url, APPROVER),
                  "--db", as_user(db_url, APPROVER), "--user", APPROVER)
    assert refused.returncode == 100 and "not enrolled" in refused.stderr, refused.stderr
