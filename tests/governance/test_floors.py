"""The policy's floors: min_acceptance_rate and min_speedup refuse a
version in production, `promote --allow-slower` is an explicit exception recorded in the audit
log that the gate honours, and the built-in policy has both. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from govstate import POLICY_TOML, record_validation, recorded_policy_file, register_versions

from clirun import run
from pgroles import as_user
from specreg.api import Registry
from specreg.errors import PolicyViolation, UsageError
from specreg.registry.governance.policy import load_policy, parse_policy

FLOORS = "min_acceptance_rate = 0.3\nmin_speedup = 1.0\n"


@pytest.fixture
def floors_policy(tmp_path, request):
    # the floors go into [environments.production], the last table
    return recorded_policy_file(tmp_path, request, POLICY_TOML + FLOORS)


def approved(db_url, tiny_models, name, approval_key, **validation):
    """NAME@1 registered by alice, validated with ``validation``'s figures, approved (signed) by bob."""
    alice, bob = Registry(as_user(db_url, "alice"), user="alice"), Registry(as_user(db_url, "bob"), user="bob")
    (ref,) = register_versions(alice, tiny_models, name, 1)
    record_validation(alice, ref, **validation)
    bob.approve(ref, key=approval_key(db_url, "bob"))
    return alice, ref


def failed(result) -> dict[str, str]:
    return {c.name: c.reason for c in result.conditions if not c.passed}


def test_a_random_draft_cannot_set_the_first_production_baseline(db_url, tiny_models, floors_policy, approval_key):
    # the pair of the issue: acceptance 0.037, 10x slower than its target, performance "warn"
    alice, ref = approved(db_url, tiny_models, "random", approval_key, acceptance_rate=0.037, speedup=0.10)
    gate = alice.gate(ref, "production")
    assert failed(gate) == {"min_acceptance": "acceptance rate 0.037 < 0.3 (min_acceptance_rate)",
                            "speedup": "0.10x at k=1 < 1x (min_speedup): slower than the target alone"}
    with pytest.raises(PolicyViolation) as refused:
        alice.promote(ref, "production")
    assert refused.value.reasons == list(failed(gate).items())  # (condition, reason), one a line in the CLI
    # an exception waives the speedup floor only: the acceptance floor still refuses
    with pytest.raises(PolicyViolation, match="min_acceptance: acceptance rate 0.037"):
        alice.promote(ref, "production", allow_slower="a demo")
    assert alice.get("random@1").state.value == "approved"
    assert alice.promote(ref, "staging").version == 1  # staging has no floors


def test_allow_slower_is_recorded_in_the_audit_and_honoured_by_the_gate(db_url, tiny_models, floors_policy, approval_key):
    alice, ref = approved(db_url, tiny_models, "slow", approval_key, acceptance_rate=0.6, speedup=0.8)
    assert set(failed(alice.gate(ref, "production"))) == {"speedup"}
    with pytest.raises(UsageError, match="--allow-slower needs a reason"):
        alice.promote(ref, "production", allow_slower="  ")
    move = alice.promote(ref, "production", reason="launch", allow_slower="latency is not the goal here")
    assert move.exception["reason"] == "latency is not the goal here" and move.exception["speedup"] == 0.8
    event = alice.history("slow")[-1]
    assert event.action == "promote" and event.details["exception"] == {
        "condition": "speedup", "reason": "latency is not the goal here", "speedup": 0.8, "floor": 1.0}
    speedup = {c.name: c for c in alice.gate(ref, "production").conditions}["speedup"]
    assert speedup.passed and speedup.reason.startswith("EXCEPTION: 0.80x at k=1 < 1x, allowed by alice at ")
    assert speedup.reason.endswith(": latency is not the goal here")
    assert alice.verify_audit()[1] is None

    # what a user inspects names the environment of the promote and the exception's reason
    alice.promote(ref, "staging")
    db = ["--db", as_user(db_url, "alice")]
    history = run("history", "slow", *db).stdout.splitlines()
    promotes = [line.split() for line in history if " promote " in line]
    assert [fields[3] for fields in promotes] == ["production", "staging"]
    assert history[[i for i, line in enumerate(history) if " promote " in line][0]].endswith(
        "launch; EXCEPTION --allow-slower (0.80x < 1x): latency is not the goal here")
    show = run("show", "slow@1", *db).stdout
    assert "holds: production, staging" in show and "env production  launch; EXCEPTION --allow-slower" in show
    listing = [line.split() for line in run("list", *db).stdout.splitlines()[2:]]
    assert listing[0][:4] == ["slow", "1", "promoted", "production,"] and listing[0][4] == "staging"


def test_diff_shows_speedup_and_tokens_per_second(tmp_path, tiny_models, floors_policy):
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    alice = Registry(db_url, user="alice")
    v1, v2 = register_versions(alice, tiny_models, "fast", 2)
    record_validation(alice, v1, speedup=1.7)
    record_validation(alice, v2, speedup=0.8)
    rows = {(r["section"], r["field"]): (r["a"], r["b"]) for r in alice.diff(v1, v2)}
    assert rows[("validation", "speedup")] == (1.7, 0.8)
    assert rows[("validation", "tokens_per_s")] == (170.0, 80.0)
    shown = run("diff", v1, v2, "--db", db_url).stdout
    assert any(line.split()[1:5] == ["validation", "speedup", "1.7000", "0.8000"] for line in shown.splitlines())
    assert "tokens_per_s" in shown and "baseline_tokens_per_s" not in shown  # the same target-only figure


def test_a_speedup_not_measured_cannot_be_waived(db_url, tiny_models, floors_policy, approval_key):
    alice, ref = approved(db_url, tiny_models, "unmeasured", approval_key, acceptance_rate=0.6)
    reason = failed(alice.gate(ref, "production"))["speedup"]
    assert reason.startswith("run ") and "measured no speedup (the performance check did not run" in reason
    with pytest.raises(PolicyViolation, match="speedup: run .* measured no speedup"):
        alice.promote(ref, "production", allow_slower="trust me")


def test_a_pair_over_both_floors_passes(db_url, tiny_models, floors_policy, approval_key):
    alice, ref = approved(db_url, tiny_models, "good", approval_key, acceptance_rate=0.8, speedup=1.7)
    gate = alice.gate(ref, "production")
    reasons = {c.name: c.reason for c in gate.conditions}
    assert gate.passed and reasons["speedup"] == "1.70x at k=1 >= 1x (min_speedup)"
    assert reasons["min_acceptance"] == "acceptance rate 0.800 >= 0.3 (min_acceptance_rate)"
    assert alice.promote(ref, "production").exception is None


def test_the_built_in_policy_has_both_floors_in_production_only():
    policy = load_policy(None)
    production, staging = policy.environment("production"), policy.environment("staging")
    assert (production.min_acceptance_rate, production.min_speedup) == (0.3, 1.0)
    assert (staging.min_acceptance_rate, staging.min_speedup) == (None, None)
    text = " ".join(production.floors_text())
    assert "baseline later versions are compared with" in text and "--allow-slower REASON" in text


@pytest.mark.parametrize("line, message", [
    ("min_speedup = 0", "min_speedup = 0 must be in (0, 100]"),
    ("min_acceptance_rate = 1.5", "min_acceptance_rate = 1.5 must be in [0, 1]"),
    ("min_acceptance_rate = true", "min_acceptance_rate = True has the wrong type"),
])
def test_bad_floor_values_are_one_line_errors(line, message):
    import tomllib

    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_policy(tomllib.loads(f"{line}\n[environments.production]\n"), "p.toml")


def test_validate_warns_when_a_baseline_is_below_a_floor():
    from specreg.registry.governance.floors import low_baseline_warnings
    from specreg.registry.store.entities import ValidationRun

    policy = load_policy(None)

    def run(rate: float, status: str = "passed") -> ValidationRun:
        blank = {name: None for name in ValidationRun.__dataclass_fields__ if name != "checks"}
        return ValidationRun(**blank | {"pair_name": "p", "version": 1, "status": status,
                                        "summary": {"acceptance": {"acceptance_rate": rate}}})

    [warning] = low_baseline_warnings(run(0.05), policy)
    assert warning.startswith("p@1: acceptance rate 0.050 is below production's min_acceptance_rate 0.3")
    assert low_baseline_warnings(run(0.5), policy) == [] and low_baseline_warnings(run(0.05, "failed"), policy) == []
