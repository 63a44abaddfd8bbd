"""Engine baselines in the store (SQLite and PostgreSQL), the policy key that requires one, its
gate condition, `policy show`, and the lookup exports use."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from policyrecord import record_policy

sys.path.insert(0, str(Path(__file__).parents[1] / "governance"))

from govstate import POLICY_TOML, record_validation  # noqa: E402

from specreg.api import Registry  # noqa: E402
from specreg.errors import UsageError  # noqa: E402
from specreg.golden_prompts.loader import load_golden_set  # noqa: E402
from specreg.registry.governance.policy import load_policy  # noqa: E402
from specreg.registry.store.engine_baselines import EngineBaselineStore  # noqa: E402

ENGINE_POLICY = POLICY_TOML.replace("[environments.production]",
                                    "[environments.production]\nrequired_engine_baselines = [\"llamacpp\"]")


def record(registry, ref, *, passed=True, golden="smoke", engine="llamacpp", alpha=0.61):
    version = registry.get(ref)
    golden_set = load_golden_set(golden)
    baselines = {"k": 2, "overall": {"acceptance_rate": alpha, "mean_acceptance_length": 2.2}, "per_category": {}}
    return EngineBaselineStore(registry.store).record(
        version, engine=engine, engine_version="llama.cpp vendored in llama-cpp-python 0.3.36",
        engine_build="b0-unknown; llama-server sha256 0123456789abcdef", source="local", passed=passed,
        golden_set=golden_set.name, golden_sha256=golden_set.content_sha256, validation_run_id=None,
        baselines=baselines, report={"reason": None if passed else "engine_parity failed"}, actor="tester")


def test_policy_key_parses_and_refuses_an_unknown_engine(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(ENGINE_POLICY)
    policy = load_policy(path)
    assert policy.environment("production").required_engine_baselines == ("llamacpp",)
    assert policy.environment("staging").required_engine_baselines == ()
    assert policy.to_dict()["environments"]["production"]["required_engine_baselines"] == ["llamacpp"]
    path.write_text(POLICY_TOML + "\n[environments.x]\nrequired_engine_baselines = [\"tgi\"]\n")
    with pytest.raises(UsageError, match=r"environments\.x\.required_engine_baselines: unknown engine 'tgi' "
                                         r"\(known: llamacpp, vllm, sglang\)"):
        load_policy(path)


def test_gate_requires_a_passed_engine_baseline_on_the_golden_set(db_url, tiny_models, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text(ENGINE_POLICY.replace("approval_required = true", "approval_required = false"))
    record_policy(db_url, policy, tmp_path)
    registry = Registry(db_url)
    ref = registry.register("pair", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                            num_speculative_tokens=2).version.label
    record_validation(registry, ref)

    def condition():
        result = registry.gate(ref, "production")
        return result, next(c for c in result.conditions if c.name == "engine_baseline.llamacpp")

    result, found = condition()
    assert not result.passed and not found.passed
    assert found.reason == (f"{ref} has no llamacpp engine baseline on golden set smoke: "
                            f"run `specreg validate {ref} --engine llamacpp`")
    assert not any(c.name.startswith("engine_baseline") for c in registry.gate(ref, "staging").conditions)
    record(registry, ref, golden="default")
    assert "(1 on another golden set or binding)" in condition()[1].reason
    failed = record(registry, ref, passed=False)
    result, found = condition()
    assert not found.passed and found.reason.startswith(f"engine baseline {failed.id} on llamacpp llama.cpp")
    assert "failed: engine_parity failed" in found.reason
    passed = record(registry, ref)
    result, found = condition()
    assert found.passed and result.passed, result.reasons
    assert found.details["engine_baseline_id"] == passed.id
    # what exports for llama.cpp use: the newest passed one, none for an engine never run
    assert registry.engine_baseline(registry.get(ref), "llamacpp").id == passed.id
    assert registry.engine_baseline(registry.get(ref), "vllm") is None
    listed = registry.engine_baselines(ref)
    assert [b.status for b in listed] == ["passed", "failed", "passed"]
    events = [e for e in registry.store.history("pair") if e.action == "engine_validate"]
    assert len(events) == 3 and events[-1].details["engine_baseline_id"] == passed.id
    assert events[-1].from_state == events[-1].to_state == "validated"
    assert registry.verify_audit()[1] is None


def test_policy_show_explains_the_key(tmp_path):
    from clirun import run_specreg

    path = tmp_path / "p.toml"
    path.write_text(ENGINE_POLICY)
    shown = run_specreg(["policy", "show", "--policy", str(path)])
    assert shown.returncode == 0, shown.stderr
    assert ("# production: a version needs a passed engine baseline from llamacpp (`specreg validate NAME@V "
            "--engine ENGINE` on golden set smoke) before it is promoted") in shown.stdout
    default = run_specreg(["policy", "show"])
    assert "# required_engine_baselines = [\"llamacpp\"]" in default.stdout


def test_exports_and_observe_for_an_engine_use_its_baseline(db_url, tiny_models):
    registry = Registry(db_url)
    ref = registry.register("pair", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                            num_speculative_tokens=2).version.label
    record_validation(registry, ref, acceptance_rate=0.8)
    version = registry.get(ref)
    before = dict(registry.export(ref, "vllm", force=True))["vllm-serve.sh"]
    assert "overall: acceptance_rate=0.8000" in before and "measured in" not in before
    found = EngineBaselineStore(registry.store).record(
        version, engine="vllm", engine_version="0.33.0", engine_build="vllm 0.33.0", source="http://staging:8000",
        passed=True, golden_set="smoke", golden_sha256=load_golden_set("smoke").content_sha256,
        validation_run_id=None, report={},
        baselines={"k": 2, "overall": {"acceptance_rate": 0.7123, "mean_acceptance_length": 2.3},
                   "per_category": {}}, actor="tester")
    after = dict(registry.export(ref, "vllm", force=True))["vllm-serve.sh"]
    assert "overall: acceptance_rate=0.7123 mean_acceptance_length=2.3000" in after
    assert (f"measured in vllm 0.33.0 (vllm 0.33.0), engine baseline {found.id} at" in after
            and "our runtime: acceptance_rate=0.8000" in after)
    # an engine without a baseline keeps ours; SGLang's export too
    assert "overall: acceptance_rate=0.8000" in dict(registry.export(ref, "sglang", force=True))["sglang-launch.sh"]
    merged = registry.baselines_for_engine(version, "vllm", registry.baselines(ref))
    assert merged["overall"]["acceptance_rate"] == 0.7123 and merged["runtime"]["overall"]["acceptance_rate"] == 0.8
    assert registry.baselines_for_engine(version, "sglang", registry.baselines(ref))["overall"]["acceptance_rate"] == 0.8
