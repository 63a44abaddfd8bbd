"""Approval, promotion, rollback, retirement and the gate over real database state, on SQLite
and PostgreSQL."""

from __future__ import annotations

import shutil
from datetime import timedelta

import pytest
from govstate import record_validation, register_versions, utcnow

from pgroles import as_user
from policyrecord import record_policy
from specreg.api import Registry
from specreg.errors import (ConcurrentUpdateError, IllegalTransitionError, NotFoundError, PolicyViolation,
                            ModelReferenceError)
from specreg.registry.store.entities import PairState


def failed(result) -> dict[str, str]:
    return {c.name: c.reason for c in result.conditions if not c.passed}


def test_four_eyes_approval_and_promotion_to_production(db_url, tiny_models, policy_file, approval_key):
    alice, bob = Registry(as_user(db_url, "alice"), user="alice"), Registry(as_user(db_url, "bob"), user="bob")
    (ref,) = register_versions(alice, tiny_models, "chat", 1)

    with pytest.raises(PolicyViolation, match="not passed validation .*never validated"):
        bob.approve(ref, key=approval_key(db_url, "bob"))
    gate = bob.gate(ref, "production")
    assert not gate.passed and "chat@1 is not validated on golden set smoke" in failed(gate)["validation"]

    record_validation(alice, ref)
    with pytest.raises(PolicyViolation, match="four-eyes: alice registered chat@1 and cannot approve it"):
        alice.approve(ref, key=approval_key(db_url, "alice"))
    with pytest.raises(PolicyViolation, match=r"approval: production needs an approval by someone other than the registrant alice"):
        alice.promote(ref, "production")
    assert set(failed(alice.gate(ref, "production"))) == {"approval"}

    approval = bob.approve(ref, key=approval_key(db_url, "bob"), note="looks good")
    assert (approval.decision, approval.actor) == ("approved", "bob")
    assert alice.get(ref).state is PairState.APPROVED
    assert alice.gate(ref, "production").passed

    move = alice.promote(ref, "production", reason="launch")
    assert (move.version, move.previous_version) == (1, None)
    holder = alice.get("chat@production")
    assert holder.version == 1 and holder.state is PairState.PROMOTED
    events = alice.history("chat")
    assert [(e.action, e.actor) for e in events] == [
        ("register", "alice"), ("validate", "validator"), ("approve", "bob"), ("promote", "alice")]
    assert events[-1].details["environment"] == "production" and events[-1].details["approval"] == approval.id
    # + the policy of record (proposal, approver's key, approval, activation) and alice's and bob's keys
    assert alice.verify_audit() == (10, None)
    # a pipeline's re-run of the done promotion (was: IllegalTransitionError, exit 1): a no-op
    again = alice.promote(ref, "production", reason="re-run")
    assert (again.version, again.previous_version, again.action) == (1, 1, "unchanged")
    assert alice.verify_audit() == (10, None) and len(alice.history("chat")) == len(events)
    assert alice.get("chat@production").version == 1


def test_staging_needs_no_approval_but_unknown_environment_is_an_error(db_url, tiny_models, policy_file):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(registry, tiny_models, "st", 1)
    record_validation(registry, ref)
    with pytest.raises(NotFoundError, match="unknown environment 'prod'.*defines production, staging"):
        registry.promote(ref, "prod")
    with pytest.raises(NotFoundError, match="unknown environment 'prod'"):
        registry.gate(ref, "prod")
    registry.promote(ref, "staging")
    assert registry.get(ref).state is PairState.PROMOTED
    with pytest.raises(NotFoundError, match="st@production: no version of st holds environment production"):
        registry.get("st@production")


def test_promote_over_holder_rollback_and_retire(db_url, tiny_models, policy_file, approval_key):
    alice, bob = Registry(as_user(db_url, "alice"), user="alice"), Registry(as_user(db_url, "bob"), user="bob")
    v1, v2 = register_versions(alice, tiny_models, "pair", 2)
    for ref in (v1, v2):
        record_validation(alice, ref)
        bob.approve(ref, key=approval_key(db_url, "bob"))
    alice.promote(v1, "production")
    alice.promote(v1, "staging")
    move = alice.promote(v2, "production", reason="better k")
    assert (move.version, move.previous_version) == (2, 1)
    # v1 still holds staging, so it stays promoted
    assert alice.get(v1).state is PairState.PROMOTED
    pointers = {(p["environment"]): (p["version"], p["previous_version"]) for p in alice.environments("pair")}
    assert pointers == {"production": (2, 1), "staging": (1, None)}

    with pytest.raises(PolicyViolation, match="pair@2 holds production: roll back"):
        alice.retire(v2)
    back = alice.rollback("pair", "production", reason="regression")
    assert (back.version, back.previous_version) == (1, 2)
    assert alice.get("pair@production").version == 1
    assert alice.get(v2).state is PairState.APPROVED  # released, keeps its approval
    with pytest.raises(IllegalTransitionError, match="no previous holder recorded"):
        alice.rollback("pair", "production")

    # forced retirement empties the environment; rollback cannot return to a retired version
    alice.promote(v2, "production")
    retired = alice.retire(v2, reason="broken", force=True)
    assert retired.state is PairState.RETIRED
    with pytest.raises(NotFoundError, match="no version of pair holds environment production"):
        alice.get("pair@production")
    assert alice.rollback("pair", "production").version == 1
    gate = alice.gate(v2, "production")
    assert failed(gate)["not_retired"] == "pair@2 is retired"
    actions = [e.action for e in alice.history("pair")]
    assert actions.count("promote") == 4 and actions.count("rollback") == 2 and actions[-1] == "rollback"
    assert alice.verify_audit()[1] is None


def test_released_version_without_approval_returns_to_validated(db_url, tiny_models, policy_file):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    v1, v2 = register_versions(registry, tiny_models, "stg", 2)
    record_validation(registry, v1)
    record_validation(registry, v2)
    registry.promote(v1, "staging")
    registry.promote(v2, "staging")
    assert registry.get(v1).state is PairState.VALIDATED
    release = registry.history("stg")[-1]
    assert (release.action, release.version, release.details) == ("release", 1, {"environment": "staging", "replaced_by": 2})


def test_gate_conditions_fail_with_named_reasons(db_url, tiny_models, policy_file, approval_key):
    alice, bob = Registry(as_user(db_url, "alice"), user="alice"), Registry(as_user(db_url, "bob"), user="bob")
    v1, v2, v3, v4, v5 = register_versions(alice, tiny_models, "g", 5)

    record_validation(alice, v1, acceptance_rate=0.80, mean_acceptance_length=3.0)
    bob.approve(v1, key=approval_key(db_url, "bob"))
    alice.promote(v1, "production")

    # acceptance below the production holder's baseline by more than 10%
    record_validation(alice, v2, acceptance_rate=0.70, mean_acceptance_length=2.9)
    bob.approve(v2, key=approval_key(db_url, "bob"))
    reasons = failed(alice.gate(v2, "production"))
    assert list(reasons) == ["acceptance"]
    assert "acceptance_rate 0.700 < 0.720 (production holder g@1 0.800 - 10%)" in reasons["acceptance"]
    with pytest.raises(PolicyViolation, match="acceptance: acceptance_rate 0.700 < 0.720"):
        alice.promote(v2, "production")
    assert alice.get("g@production").version == 1  # a refusal changes nothing

    # a golden set changed since validation, a warn on a required check, a stale run
    record_validation(alice, v3, golden_sha256="f" * 64)
    assert "golden set smoke changed since run" in failed(alice.gate(v3, "staging"))["golden_set"]
    record_validation(alice, v4, checks={"integrity": "pass", "tokenizer": "pass", "equivalence": "warn"})
    reasons = failed(alice.gate(v4, "staging"))
    assert reasons["check.equivalence"] == "warn: equivalence warn"
    assert reasons["check.acceptance"] == "run 4 did not run check acceptance"
    record_validation(alice, v5, finished_at=utcnow() - timedelta(days=40))
    assert "days old (limit 30)" in failed(alice.gate(v5, "staging"))["validation_age"]


def test_gate_compares_tau_only_with_engine_tau_and_on_its_accepted_part(db_url, tiny_models, policy_file):
    alice = Registry(as_user(db_url, "alice"), user="alice")
    one, two = register_versions(alice, tiny_models, "t", 2)
    # tau 3.0 at validation, 2.75 now: 8% lower, but its accepted part (tau - 1) fell 12.5%, past 10%
    record_validation(alice, one, acceptance_rate=0.80, mean_acceptance_length=3.0)
    record_validation(alice, one, acceptance_rate=0.80, mean_acceptance_length=2.75)
    reasons = failed(alice.gate(one, "staging"))
    assert list(reasons) == ["acceptance"]
    assert "mean_acceptance_length 2.750 < 2.800 (run 1 of this version 3.000 - 10%)" in reasons["acceptance"]
    # an earlier run recorded before the engines' tau (tokens per target forward, 1.45 for an n-gram
    # pair whose engine tau is 2.1): alpha is compared, tau is not, and the gate says so
    record_validation(alice, two, acceptance_rate=0.80, mean_acceptance_length=1.45, tau_definition=None)
    record_validation(alice, two, acceptance_rate=0.79, mean_acceptance_length=2.1)
    gate = alice.gate(two, "staging")
    assert gate.passed, failed(gate)
    acceptance = next(c for c in gate.conditions if c.name == "acceptance")
    assert [row["figure"] for row in acceptance.details["compared"]] == ["acceptance_rate"]
    assert "tau not compared with run 3 of this version: recorded before the engines' definition" in acceptance.reason


def test_approval_rules_rejection_and_stale_approval(db_url, tiny_models, policy_file, tmp_path, approval_key):
    alice, bob, carol = (Registry(as_user(db_url, u), user=u) for u in ("alice", "bob", "carol"))
    (ref,) = register_versions(alice, tiny_models, "ap", 1)
    record_validation(alice, ref)
    bob.approve(ref, key=approval_key(db_url, "bob"))
    carol.reject(ref, key=approval_key(db_url, "carol"), note="latency regression")
    assert alice.get(ref).state is PairState.VALIDATED
    assert failed(alice.gate(ref, "production"))["approval"] == "rejected by carol: latency regression"
    bob.approve(ref, key=approval_key(db_url, "bob"))
    assert alice.gate(ref, "production").passed
    # a passing re-validation keeps the approval; a failed one withdraws it
    record_validation(alice, ref)
    assert alice.gate(ref, "production").passed
    record_validation(alice, ref, status="failed", checks={"equivalence": "fail"})
    record_validation(alice, ref)
    assert failed(alice.gate(ref, "production")) == {
        "approval": "approval by bob predates failed validation run 3: approve again"}
    bob.approve(ref, key=approval_key(db_url, "bob"))

    restricted = tmp_path / "restricted.yaml"
    restricted.write_text("golden_set: smoke\nrequired_checks: [equivalence]\nenvironments:\n"
                          "  production: {approval_required: true, approvers: [carol, dave]}\n")
    record_policy(db_url, restricted, tmp_path)
    bob.approve(ref, key=approval_key(db_url, "bob"))  # under the policy now in effect
    reasons = failed(alice.gate(ref, "production"))
    assert reasons["approval"].startswith("approved by bob, who may not approve for production from one of carol, "
                                          "dave; not counted: approval 1 by bob: signed under another policy than "
                                          "policy of record v2 (approve again under it)")
    carol.approve(ref, key=approval_key(db_url, "carol"))
    assert alice.gate(ref, "production").passed


def test_failed_validation_refuses_approval_and_promotion(db_url, tiny_models, policy_file, approval_key):
    alice, bob = Registry(as_user(db_url, "alice"), user="alice"), Registry(as_user(db_url, "bob"), user="bob")
    (ref,) = register_versions(alice, tiny_models, "bad", 1)
    record_validation(alice, ref, status="failed", checks={"equivalence": "fail"})
    with pytest.raises(PolicyViolation, match=r"not passed validation \(run 1 failed\)"):
        bob.approve(ref, key=approval_key(db_url, "bob"))
    with pytest.raises(PolicyViolation, match="validation: the latest validation of bad@1 on smoke \\(run 1\\) failed"):
        alice.promote(ref, "staging")


def test_changed_or_missing_model_never_passes(db_url, tiny_models, policy_file, tmp_path):
    target, draft = tmp_path / "target", tmp_path / "draft"
    shutil.copytree(tiny_models["target"], target)
    shutil.copytree(tiny_models["draft"], draft)
    registry = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(registry, tiny_models, "fp", 1, target=target, draft=draft)
    record_validation(registry, ref)
    assert registry.gate(ref, "staging").passed

    (draft / "tokenizer_config.json").write_text((draft / "tokenizer_config.json").read_text().replace("}", ', "x": 1}', 1))
    weights = next(target.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    reasons = failed(registry.gate(ref, "staging"))
    assert reasons["fingerprints"].startswith("models changed since registration: target weight file")
    with pytest.raises(PolicyViolation, match="fingerprints: models changed"):
        registry.promote(ref, "staging")

    shutil.rmtree(draft)
    with pytest.raises(ModelReferenceError, match="no config.json"):
        registry.gate(ref, "staging")


def test_stale_expected_holder_is_a_conflict(db_url, tiny_models, policy_file):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    v1, v2 = register_versions(registry, tiny_models, "cas", 2)
    record_validation(registry, v1)
    record_validation(registry, v2)
    registry.promote(v1, "staging", expected_holder=None)
    with pytest.raises(ConcurrentUpdateError, match="cas@staging is now held by version 1 .*not no version"):
        registry.promote(v2, "staging", expected_holder=None)
    assert registry.get("cas@staging").version == 1
    registry.promote(v2, "staging", expected_holder=1)
    assert registry.get("cas@staging").version == 2


def test_diff_side_by_side(db_url, tiny_models, policy_file):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    registry.register("d", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]), num_speculative_tokens=4)
    registry.register("d", target=str(tiny_models["target"]), draft=str(tiny_models["draft2"]), num_speculative_tokens=5)
    record_validation(registry, "d@1", acceptance_rate=0.8)
    record_validation(registry, "d@2", acceptance_rate=0.6)
    rows = {(r["section"], r["field"]): r for r in registry.diff("d@1", "d@2")}
    assert not rows[("draft", "weights_sha256")]["same"]
    assert rows[("draft", "tokenizer_sha256")]["same"] and rows[("target", "weights_sha256")]["same"]
    assert (rows[("config", "num_speculative_tokens")]["a"], rows[("config", "num_speculative_tokens")]["b"]) == (4, 5)
    assert (rows[("validation", "acceptance_rate")]["a"], rows[("validation", "acceptance_rate")]["b"]) == (0.8, 0.6)
    assert rows[("validation", "acceptance_rate.code")]["b"] == pytest.approx(0.65)
    assert rows[("checks", "equivalence")]["same"]


def test_imported_approval_by_the_registrant_does_not_count(db_url, tiny_models, policy_file):
    """An approval arriving from outside the CLI (e.g. an MLflow tag read back), even with its
    audit event, counts for nothing without a signature, and the gate names it."""
    from specreg.registry.store.orm import ApprovalRow

    registry = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(registry, tiny_models, "imp", 1)
    record_validation(registry, ref)
    with registry.store.session(write=True) as session:
        # recorded with its audit event, as any import must be to count at all (a bare row never does)
        approval = ApprovalRow(pair_version_id=registry.get(ref).id, decision="approved", actor="alice",
                               note=None, source="mlflow", created_at=utcnow())
        session.add(approval)
        session.flush()
        event = registry.store.append_event(
            session, pair_name="imp", version=1, action="approve", from_state="validated", to_state="validated",
            actor="alice", reason=None, details={"approval": approval.id, "decision": "approved", "source": "mlflow"})
        approval.event_hash = event.event_hash
    reasons = failed(registry.gate(ref, "production"))
    assert reasons["approval"] == ("production needs an approval by someone other than the registrant alice "
                                   "(no signed approval counts); not counted: approval 1 by alice: no signature")


def test_a_skipped_check_counts_only_where_the_policy_exempts_the_pair_kind(db_url, tiny_models, tmp_path,
                                                                            monkeypatch):
    """An ngram pair's validation skips chat_template (no draft model): the gate accepts that only
    through required_checks_by_method; a draft-model pair with the same skip is still refused."""
    policy = tmp_path / "kinds.toml"
    policy.write_text('golden_set = "smoke"\nrequired_checks = ["integrity", "chat_template", "equivalence"]\n'
                      '[required_checks_by_method]\nngram = ["integrity", "equivalence"]\n'
                      '[environments.staging]\n')
    record_policy(db_url, policy, tmp_path)
    registry = Registry(as_user(db_url, "alice"), user="alice")
    lookup = registry.register("lookup", target=str(tiny_models["target"]), method="ngram",
                               num_speculative_tokens=3).version.label
    (paired,) = register_versions(registry, tiny_models, "paired", 1)
    checks = {"integrity": "pass", "chat_template": "skip", "equivalence": "pass", "acceptance": "pass"}
    record_validation(registry, lookup, checks=checks)
    record_validation(registry, paired, checks=checks)
    assert registry.gate(lookup, "staging").passed
    refused = registry.gate(paired, "staging")
    assert not refused.passed and failed(refused) == {"check.chat_template": "skip: chat_template skip"}
