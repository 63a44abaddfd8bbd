"""The llamacpp export format rendered and run by a real shell (the GGUF conversion, the lock over
the GGUF files and llama-server itself run in tests/engines/test_llamacpp.py)."""

from __future__ import annotations

import pytest
from exportcase import check_command, make_pair

from specreg.errors import EngineRefusal, UsageError
from specreg.registry.deploy.exports import engine_schema, render_export
from specreg.registry.store.entities import SpecMethod


def test_llama_server_command_for_a_draft_pair(draft_pair, baselines, run_script):
    files = dict(render_export(draft_pair, baselines, "llamacpp", approved=True,
                               options={"parallel": 4, "threads": 2, "port": 8088}))
    argv = run_script(files["llama-server.sh"])
    flags = check_command(argv, engine_schema("llamacpp"))
    assert flags == {
        "--model": "gguf/target/model-f32.gguf", "--spec-draft-model": "gguf/draft/model-f32.gguf",
        "--spec-type": "draft-simple", "--spec-draft-n-max": "4", "--spec-draft-n-min": "0",
        "--spec-draft-p-min": "0", "--parallel": "4", "--threads": "2", "--metrics": "", "--alias": "chat-pair",
        "--host": "0.0.0.0", "--port": "8088"}
    script = files["llama-server.sh"]
    assert "max_batch_size_for_speculation=16 is not expressed here" in script
    assert "--target gguf/target --draft gguf/draft" in script  # the verify line names the GGUF folders


def test_bf16_gguf_and_bad_options(draft_pair, baselines, run_script):
    files = dict(render_export(draft_pair, baselines, "llamacpp", approved=True, options={"gguf_type": "bf16"}))
    flags = check_command(run_script(files["llama-server.sh"]), engine_schema("llamacpp"))
    assert flags["--model"] == "gguf/target/model-bf16.gguf" and "--threads" not in flags
    with pytest.raises(UsageError, match="gguf_type='q4_0' must be one of f32, bf16, f16"):
        render_export(draft_pair, baselines, "llamacpp", approved=True, options={"gguf_type": "q4_0"})
    with pytest.raises(UsageError, match="parallel and threads must be >= 1"):
        render_export(draft_pair, baselines, "llamacpp", approved=True, options={"parallel": 0})


def test_other_methods_are_refused(baselines):
    # EAGLE-3 and DFlash heads are exported (tests/engines/test_llamacpp_heads.py, test_llamacpp_dflash.py),
    # n-gram drafting is not
    with pytest.raises(EngineRefusal) as refused:
        render_export(make_pair(SpecMethod.NGRAM), baselines, "llamacpp", approved=True)
    assert str(refused.value) == (
        "chat-pair@3 is an ngram pair and cannot be exported to llamacpp: this export writes llama-server's separate "
        "draft model (--spec-type draft-simple), EAGLE-3 heads (draft-eagle3) and DFlash heads (draft-dflash) only; "
        "its ngram drafting (ngram-*) reads other files and options that were not checked against our runtime")


def with_measured_tiers(baselines: dict, speedups: dict[int, float]) -> dict:
    """``baselines`` with an engine baseline whose throughput tiers measured ``speedups``
    ({concurrency: with / without}), as validate --engine records them."""
    from specreg.registry.deploy.engines.common import measured_schedule

    tiers = [{"concurrency": c, "with_draft_tokens_per_s": 100.0 * s, "without_draft_tokens_per_s": 100.0}
             for c, s in speedups.items()]
    return {**baselines, "engine_baseline": {"id": 1, "engine": "llamacpp", "engine_version": "llama.cpp 0c1e57098bba",
                                             "engine_build": "b1", "measured_at": "2026-12-02T04:00:00Z",
                                             "throughput": tiers, "speculation_schedule": measured_schedule(tiers, 4)}}


def test_the_measured_schedule_turns_speculation_off_where_a_tier_was_slower():
    from specreg.registry.deploy.engines.common import measured_schedule, schedule_depth

    def tiers(speedups):
        return [{"concurrency": c, "with_draft_tokens_per_s": s, "without_draft_tokens_per_s": 1.0}
                for c, s in speedups.items()]

    assert measured_schedule(tiers({1: 1.8, 2: 1.2, 4: 0.9}), 4) == [[1, 2, 4], [3, 4, 0]]
    assert measured_schedule(tiers({4: 0.7, 1: 1.5}), 3) == [[1, 1, 3], [2, 4, 0]]
    assert measured_schedule(tiers({1: 1.5, 4: 1.0}), 3) == [[1, 4, 3]]
    assert measured_schedule([{"concurrency": 1, "with_draft_tokens_per_s": 5.0, "without_draft_tokens_per_s": None}],
                             3) is None
    schedule = [[1, 2, 4], [3, 4, 0]]
    assert [schedule_depth(schedule, b) for b in (1, 2, 3, 4, 64)] == [4, 4, 0, 0, 0]


def test_llama_server_drafts_only_where_the_measured_tiers_say_so(draft_pair, baselines, run_script):
    measured = with_measured_tiers(baselines, {1: 1.6, 4: 0.8})
    one = dict(render_export(draft_pair, measured, "llamacpp", approved=True, options={"parallel": 1}))
    flags = check_command(run_script(one["llama-server.sh"]), engine_schema("llamacpp"))
    assert flags["--spec-type"] == "draft-simple" and "batch sizes, k): 1-1: 4, 2-4: 0" in one["llama-server.sh"]
    four = dict(render_export(draft_pair, measured, "llamacpp", approved=True, options={"parallel": 4}))
    flags = check_command(run_script(four["llama-server.sh"]), engine_schema("llamacpp"))
    assert "--spec-draft-model" not in flags and "--spec-type" not in flags
    assert "Speculation is OFF: the draft slowed llama-server down at 4 slots" in four["llama-server.sh"]


def test_vllm_per_batch_schedule_comes_from_the_measured_tiers(draft_pair, baselines):
    import json

    from exportcase import make_pair

    measured = with_measured_tiers(baselines, {1: 1.6, 2: 1.1, 4: 0.8})
    speculative = json.loads(dict(render_export(make_pair(SpecMethod.DRAFT_MODEL, max_batch=None), measured, "vllm",
                                                approved=True))["vllm-speculative-config.json"])
    assert speculative["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 4, 0]]
    # with the registered cutoff (16) too: the measured ranges below it, off above it
    speculative = json.loads(dict(render_export(draft_pair, with_measured_tiers(baselines, {1: 1.6, 4: 1.2}), "vllm",
                                                approved=True))["vllm-speculative-config.json"])
    assert speculative["num_speculative_tokens_per_batch_size"] == [[1, 16, 4], [17, 17, 0]]
    speculative = json.loads(dict(render_export(draft_pair, measured, "vllm",
                                                approved=True))["vllm-speculative-config.json"])
    assert speculative["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 16, 0], [17, 17, 0]]


def test_a_suffix_pairs_measured_schedule_is_refused_where_vllm_would_drop_it(baselines):
    """vLLM runs suffix decoding on its V1 runner, which drops num_speculative_tokens_per_batch_size
    for it: tiers that turn speculation off are refused with that reason, tiers that keep k write
    the static k alone. The refusal is vLLM's own (its module's check), so it holds for k8s-vllm too,
    and alert rules on the vLLM baseline are written whatever vLLM would do with the schedule."""
    import dataclasses
    import json

    from exportcase import make_pair

    from specreg.core.suffix_settings import SuffixSettings

    pair = make_pair(SpecMethod.NGRAM, max_batch=None)
    pair = dataclasses.replace(pair, config=dataclasses.replace(pair.config, method=SpecMethod.SUFFIX, prompt_lookup_min=None,
                                                                prompt_lookup_max=None, suffix=SuffixSettings()))
    slower = with_measured_tiers(baselines, {1: 1.6, 2: 1.1, 4: 0.8})
    for fmt in ("vllm", "k8s-vllm"):
        with pytest.raises(EngineRefusal) as refused:
            render_export(pair, slower, fmt, approved=True,
                          options={"model_volume": "pvc:m"} if fmt == "k8s-vllm" else None)
        assert str(refused.value).startswith("chat-pair@3 is a suffix pair: the engine baseline's concurrency tiers "
                                             "turn speculation off at batch sizes 3-4 (the draft slowed them down)")
        assert "(vllm/config/vllm.py:1088-1108 _maybe_disable_dynamic_sd_for_v1)" in str(refused.value)
    rules = dict(render_export(pair, slower, "prometheus-rules", approved=True, options={"rules_engine": "vllm"}))
    assert "SpecDecodeAcceptanceRateBelowBaseline" in rules["prometheus-rules.yaml"]
    # served at 2 sequences at most, the slower tier is never reached
    speculative = json.loads(dict(render_export(pair, slower, "vllm", approved=True,
                                                options={"max_num_seqs": 2}))["vllm-speculative-config.json"])
    assert "num_speculative_tokens_per_batch_size" not in speculative and speculative["num_speculative_tokens"] == 4
    speculative = json.loads(dict(render_export(pair, with_measured_tiers(baselines, {1: 1.6, 4: 1.2}), "vllm",
                                                approved=True))["vllm-speculative-config.json"])
    assert "num_speculative_tokens_per_batch_size" not in speculative and speculative["method"] == "suffix"
