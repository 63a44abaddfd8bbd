"""A suffix decoding pair (vLLM `method: suffix`) end to end on the tiny models: registered with
vLLM's suffix_decoding_* settings, validated by the runtime's suffix drafter (runtime/methods/
suffix.py, exact against vLLM's proposer: tests/engines/test_suffix_proposer.py), exported to vLLM
with exactly those keys, refused by the engines that have no suffix method, naming their source."""

from __future__ import annotations

import json

import pytest

from specreg.errors import EngineRefusal, UsageError
from specreg.registry.store.entities import PairState, SpecMethod

SETTINGS = {"max_tree_depth": 16, "max_cached_requests": 0, "max_spec_factor": 2.0, "min_token_prob": 0.05}


def test_suffix_pair_registers_validates_and_exports_to_vllm(registry, models, golden_path, tmp_path):
    result = registry.register("suffix", target=str(models["target"]), method="suffix", num_speculative_tokens=4,
                               suffix=SETTINGS)
    config = result.version.config
    assert result.version.draft is None and config.method is SpecMethod.SUFFIX
    assert config.suffix.to_dict() == SETTINGS
    assert registry.get("suffix@1").config.suffix == config.suffix  # read back from its row
    outcome = registry.validate("suffix@1", golden=str(golden_path), device="cpu", gpu_memory="1GiB",
                                checks="integrity,tokenizer,chat_template,memory,equivalence,acceptance")
    found = {check.name: check.status for check in outcome.checks}
    assert found == {"integrity": "pass", "tokenizer": "skip", "chat_template": "skip", "memory": "pass",
                     "equivalence": "pass", "acceptance": "pass"}
    assert outcome.passed and outcome.version.state is PairState.VALIDATED
    overall = registry.baselines("suffix@1")["overall"]
    assert overall["draft_steps"] > 0 and overall["drafted"] > 0  # the golden answers repeat themselves

    files = dict(registry.export("suffix@1", "vllm", force=True))
    speculative = json.loads(files["vllm-speculative-config.json"])
    assert speculative == {"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 16,
                           "suffix_decoding_max_cached_requests": 0, "suffix_decoding_max_spec_factor": 2.0,
                           "suffix_decoding_min_token_prob": 0.05}
    assert json.loads(files["vllm-serve.sh"].split("--speculative-config '")[1].split("'")[0]) == speculative

    for fmt, source in (("sglang", "sglang/srt/speculative/spec_info.py:39-47"),
                        ("trtllm", "tensorrt_llm/llmapi/llm_args.py"), ("tgi", "launcher/src/main.rs:622-627"),
                        ("llamacpp", "common/speculative.cpp:33-45")):
        with pytest.raises(EngineRefusal, match="suffix pair and cannot be exported to " + fmt) as refused:
            registry.export("suffix@1", fmt, force=True, out_dir=str(tmp_path / fmt))  # llamacpp writes files
        assert source in str(refused.value)


def test_a_batch_cutoff_is_refused_for_vllm(registry, models):
    """vLLM 0.33 drops the per-batch-size ranges of a suffix pair (test_engine_exports.py shows it)."""
    registry.register("cutoff", target=str(models["target"]), method="suffix", num_speculative_tokens=3,
                      max_batch_size_for_speculation=8)
    with pytest.raises(EngineRefusal, match="config/vllm.py:1088-1108 _maybe_disable_dynamic_sd_for_v1"):
        registry.export("cutoff@1", "vllm", force=True)


def test_suffix_settings_take_vllms_defaults_and_rules(registry, models):
    version = registry.register("defaults", target=str(models["target"]), method="suffix",
                                num_speculative_tokens=3).version
    assert version.config.suffix.vllm_keys() == {
        "suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}
    target = str(models["target"])
    for kwargs, message in (
            ({"draft": str(models["draft"])}, "method suffix drafts from the prompt: do not pass --draft"),
            ({"suffix": {"max_tree_depth": 0}}, "invalid suffix_decoding_max_tree_depth=0 must be >= 1"),
            ({"suffix": {"min_token_prob": 1.5}}, r"invalid suffix_decoding_min_token_prob=1.5 must be in \[0, 1\]"),
            ({"suffix": {"max_cached_requests": -1}}, "invalid suffix_decoding_max_cached_requests=-1 must be >= 0")):
        with pytest.raises(UsageError, match=message):
            registry.register("bad", target=target, method="suffix", num_speculative_tokens=3, **kwargs)
    with pytest.raises(UsageError, match="suffix_decoding_max_tree_depth: apply only to method suffix"):
        registry.register("bad", target=target, method="ngram", num_speculative_tokens=3, suffix={"max_tree_depth": 8})


def test_cli_registers_and_shows_a_suffix_pair(registry, models):
    from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)

    db = ["--db", registry.db_url]
    target = str(models["target"])
    registered = run("register", "cli-suffix", "--target", target, "--method", "suffix", "-k", "5",
                     "--suffix-max-tree-depth", "32", "--suffix-min-token-prob", "0.2", "--json", *db)
    assert registered.returncode == 0, registered.stderr
    assert json.loads(registered.stdout)["config"]["suffix"] == {
        "max_tree_depth": 32, "max_cached_requests": 10000, "max_spec_factor": 1.0, "min_token_prob": 0.2}
    shown = run("show", "cli-suffix@1", *db)
    assert "method suffix, k 5, suffix_decoding_max_tree_depth 32" in shown.stdout
    one_line(run("register", "bad", "--target", target, "--method", "suffix", "-k", "5",
                 "--suffix-max-spec-factor", "-1", *db), 2, "suffix_decoding_max_spec_factor=-1.0 must be >= 0")
