"""The whole path on the real runtime: validate (real decoding of the smoke golden set) ->
gate -> four-eyes approval -> promote -> gate --rerun, with the audit chain intact."""

from __future__ import annotations

import pytest

from pgroles import as_user
from policyrecord import record_policy
from specreg.api import Registry
from specreg.registry.store.entities import PairState

CHECKS = ["integrity", "tokenizer", "equivalence", "acceptance"]
# two short prompts keep two real validations on CPU within seconds
GOLDEN_YAML = """\
name: gov-e2e
version: 1
records:
  - {id: code-01, category: code, prompt: "def add(a, b):", max_new_tokens: 12}
  - {id: chat-01, category: support, messages: [{role: user, content: "how do i reset my password?"}], max_new_tokens: 12}
"""


def test_validate_approve_promote_and_rerun_gate(tmp_path, tiny_models, policy_file, approval_key):
    if not hasattr(Registry, "validate"):
        pytest.skip("Registry.validate is not in this build")
    golden = tmp_path / "gov-e2e.yaml"
    golden.write_text(GOLDEN_YAML)
    policy_file.write_text(policy_file.read_text().replace('golden_set = "smoke"', f'golden_set = "{golden}"'))
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    record_policy(db_url, policy_file, tmp_path)
    alice, bob = Registry(as_user(db_url, "alice"), user="alice"), Registry(as_user(db_url, "bob"), user="bob")
    ref = alice.register("e2e", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                         num_speculative_tokens=3).version.label
    outcome = alice.validate(ref, golden=str(golden), device="cpu", checks=CHECKS)
    assert outcome.passed, [(c.name, c.status, c.summary) for c in outcome.checks]

    staging = alice.gate(ref, "staging")
    assert staging.passed, staging.reasons
    assert [c.name for c in staging.conditions if c.name.startswith("check.")] == [f"check.{c}" for c in CHECKS]
    assert alice.gate(ref, "production").reasons == [
        "approval: production needs an approval by someone other than the registrant alice (no signed approval counts)"]
    bob.approve(ref, key=approval_key(db_url, "bob"))
    alice.promote(ref, "production")
    assert alice.get("e2e@production").state is PairState.PROMOTED

    # a fresh validation of the same binding on the same golden set passes the gate again,
    # compared against the first run's baseline; bob's approval still stands
    rerun = alice.gate("e2e@production", "production", rerun=True)
    assert rerun.passed, rerun.reasons
    assert rerun.validation_run_id != staging.validation_run_id
    acceptance = next(c for c in rerun.conditions if c.name == "acceptance")
    assert acceptance.passed and "of this version" in acceptance.reason
    assert alice.verify_audit()[1] is None
