"""Errors before any forward pass, fallbacks, sampling through models, metrics, choice of k."""

from __future__ import annotations

import math

import pytest

from specreg.errors import RuntimeConfigError
from specreg.runtime.choose_k import (choose_k, choose_tree_depth, expected_speedup, expected_tokens_per_step,
                                      head_draft_step_cost, measure_cost_ratio, median_ratio)
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.generate import speculative_generate, stream_generate, target_only_generate
from specreg.runtime.metrics import GenerationMetrics, aggregate
from specreg.runtime.methods import load_pair
from specreg.runtime.pair import make_pair
from steplog import StepLog  # tests/ is on sys.path (tests/conftest.py)


class CountingForwards:
    """Counts forwards of the real model through a forward pre-hook."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        self.calls += 1

    def remove(self):
        self.handle.remove()


def test_k_below_one_is_refused_before_any_forward(target, tokenizer, drafts, prompts):
    pair = make_pair(target, tokenizer, drafts["random"], tokenizer)
    counter = CountingForwards(target)
    try:
        with pytest.raises(RuntimeConfigError, match="k = 0"):
            speculative_generate(pair, prompts[0], DecodeConfig(k=0))
        with pytest.raises(RuntimeConfigError, match="max_position_embeddings 512"):
            speculative_generate(pair, list(prompts[0]) * 200, DecodeConfig(k=2))
    finally:
        counter.remove()
    assert counter.calls == 0


def test_draft_without_tokenizer_is_refused(tiny_dir):
    with pytest.raises(RuntimeConfigError, match="no tokenizer"):
        load_pair(tiny_dir / "target", tiny_dir / "draft_no_tokenizer")
    from specreg.runtime.loading import load_model, load_tokenizer

    target = load_model(tiny_dir / "target")
    draft = load_model(tiny_dir / "draft_no_tokenizer")
    with pytest.raises(RuntimeConfigError, match="no tokenizer"):
        make_pair(target, load_tokenizer(tiny_dir / "target"), draft, None)


def test_different_vocabularies_are_refused(tmp_path, target, tokenizer):
    from tinymodels import build_llama, build_tokenizer

    other_tokenizer = build_tokenizer(tmp_path / "other", vocab_size=280)  # the first 280 of the same corpus
    build_llama(tmp_path / "other_model", tokenizer=other_tokenizer, num_layers=1, hidden_size=32)
    with pytest.raises(RuntimeConfigError, match="vocabulary is a strict prefix of the target's .280 of 300"):
        load_pair(load_tokenizer_dir(target, tokenizer, tmp_path), tmp_path / "other_model")
    shifted = build_tokenizer(tmp_path / "shifted", vocab_size=300, extra_special=["<|tool|>"])
    build_llama(tmp_path / "shifted_model", tokenizer=shifted, num_layers=1, hidden_size=32)
    with pytest.raises(RuntimeConfigError, match="tokenizer differs"):
        load_pair(load_tokenizer_dir(target, tokenizer, tmp_path), tmp_path / "shifted_model")


def load_tokenizer_dir(target, tokenizer, tmp_path):
    directory = tmp_path / "target_copy"
    target.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_padded_draft_vocab_verifies_over_the_shared_ids(tiny_dir, prompts):
    pair = load_pair(tiny_dir / "target", tiny_dir / "draft_padded")
    assert pair.vocab_size == len(pair.tokenizer)
    config = DecodeConfig(k=3, max_new_tokens=20, eos_token_ids=())
    result = speculative_generate(pair, prompts[0], config)
    assert result.token_ids == target_only_generate(pair, prompts[0], config).token_ids
    assert max(result.token_ids) < len(pair.tokenizer)


def test_embedding_sizes_differing_beyond_padding_are_refused(target, tokenizer, drafts):
    import copy

    small = copy.deepcopy(drafts["random"])
    small.resize_token_embeddings(len(tokenizer) - 10)
    assert small.get_output_embeddings().weight.shape[0] == len(tokenizer) - 10
    with pytest.raises(RuntimeConfigError, match="vocab_size differs"):
        make_pair(target, tokenizer, small, tokenizer)


def test_sampling_with_draft_equal_to_target_accepts_all_and_repeats(target, tokenizer, drafts, prompts):
    pair = make_pair(target, tokenizer, target, tokenizer)
    # drawn from q = p, every draft is accepted (u x q < p); greedy drafting would accept p(argmax) of them
    config = DecodeConfig(k=3, max_new_tokens=17, temperature=0.8, top_k=50, top_p=0.95, seed=11, eos_token_ids=(),
                          draft_sampling="probabilistic")
    first = speculative_generate(pair, prompts[0], config)
    assert first.metrics.acceptance_rate == 1.0
    assert speculative_generate(pair, prompts[0], config).token_ids == first.token_ids
    aligned = make_pair(target, tokenizer, drafts["aligned"], tokenizer)
    sampled = speculative_generate(aligned, prompts[0], config)
    assert 0 < sampled.metrics.acceptance_rate < 1
    ngram = make_pair(target, tokenizer)
    result = speculative_generate(ngram, prompts[0] * 3, DecodeConfig(method="ngram", k=3, max_new_tokens=20,
                                                                        temperature=1.0, seed=3, eos_token_ids=()))
    assert len(result.token_ids) == 20


def test_batch_size_fallback(target, tokenizer, drafts, prompts):
    pair = make_pair(target, tokenizer, drafts["aligned"], tokenizer)
    config = DecodeConfig(k=3, max_new_tokens=12, disable_above_batch_size=4, eos_token_ids=())
    busy = speculative_generate(pair, prompts[0], config, batch_size=8)
    assert busy.metrics.drafted == 0 and busy.metrics.draft_forwards == 0
    assert [f["reason"] for f in busy.metrics.fallbacks] == ["batch_size"]
    quiet = speculative_generate(pair, prompts[0], config, batch_size=2)
    assert quiet.metrics.drafted > 0 and not quiet.metrics.fallbacks
    assert busy.token_ids == quiet.token_ids


def test_low_memory_fallback_with_an_injected_probe(target, tokenizer, drafts, prompts):
    pair = make_pair(target, tokenizer, drafts["aligned"], tokenizer)
    free_bytes = iter([10_000, 10_000, 10])  # memory runs out at the third step
    config = DecodeConfig(k=2, max_new_tokens=20, min_free_memory_bytes=1000, eos_token_ids=())
    result = speculative_generate(pair, prompts[1], config, memory_probe=lambda: next(free_bytes, 10))
    fallbacks = result.metrics.fallbacks
    assert [f["reason"] for f in fallbacks] == ["low_memory"] and fallbacks[0]["detail"] == 10
    assert result.metrics.drafted <= 2 * 2  # drafting stopped after two steps
    assert result.token_ids == target_only_generate(pair, prompts[1], config).token_ids


def test_low_acceptance_length_fallback(target, tokenizer, drafts, prompts):
    pair = make_pair(target, tokenizer, drafts["random"], tokenizer)
    config = DecodeConfig(k=4, max_new_tokens=40, acceptance_length_threshold=2.0, acceptance_window=4,
                          eos_token_ids=())
    result = speculative_generate(pair, prompts[1], config)
    assert [f["reason"] for f in result.metrics.fallbacks] == ["low_acceptance_length"]
    assert result.metrics.drafted == 4 * 4  # exactly one window of steps was drafted
    assert result.token_ids == target_only_generate(pair, prompts[1], config).token_ids


def test_metrics_summary_and_aggregate(target, tokenizer, drafts, prompts):
    pair = make_pair(target, tokenizer, drafts["aligned"], tokenizer)
    config = DecodeConfig(k=3, max_new_tokens=20, eos_token_ids=())
    runs = [speculative_generate(pair, prompt, config).metrics for prompt in prompts[:2]]
    for metrics in runs:
        summary = metrics.summary()
        assert summary["generated_tokens"] == 20
        # every target forward is a verification (the first over prompt + drafts); a draft model drafts
        # in each but one whose budget leaves no room for a draft (one token left): not a draft step
        assert summary["target_forwards"] - 1 <= summary["draft_steps"] <= summary["target_forwards"]
        assert summary["tokens_per_target_forward"] == pytest.approx(20 / summary["target_forwards"])
        assert summary["mean_acceptance_length"] == pytest.approx(1 + metrics.accepted / summary["draft_steps"])
        assert summary["draft_forwards"] == summary["drafted"]
        assert summary["latency_p50_s"] <= summary["latency_p95_s"] <= summary["latency_p99_s"]
        assert summary["ttft_s"] > 0 and summary["tokens_per_s"] > 0
        assert summary["draft_time_s"] > 0 and summary["verify_time_s"] > 0
    pooled = aggregate(runs)
    assert pooled["drafted"] == sum(m.drafted for m in runs)
    assert pooled["acceptance_rate"] == pytest.approx(sum(m.accepted for m in runs) / sum(m.drafted for m in runs))
    assert pooled["generations"] == 2


def test_decode_phase_leaves_out_the_first_step(target, tokenizer, drafts, prompts):
    pair = make_pair(target, tokenizer, drafts["self"], tokenizer)
    config = DecodeConfig(k=3, max_new_tokens=20, eos_token_ids=())
    speculative = speculative_generate(pair, prompts[0], config).metrics
    plain = target_only_generate(pair, prompts[0], config).metrics
    # draft = target: the first step (prefill + 3 drafts) emits k+1 tokens; target-only emits one
    assert (speculative.ttft_tokens, plain.ttft_tokens) == (4, 1)
    for metrics in (speculative, plain):
        expected = (20 - metrics.ttft_tokens) / (metrics.total_time_s - metrics.ttft_s)
        assert metrics.summary()["decode_tokens_per_s"] == pytest.approx(expected)
    pooled = aggregate([speculative, plain])
    assert pooled["decode_tokens_per_s"] == pytest.approx(
        (40 - 5) / (speculative.total_time_s - speculative.ttft_s + plain.total_time_s - plain.ttft_s))
    # a generation that ends in its first step has no decode phase
    one_step = speculative_generate(pair, prompts[0], DecodeConfig(k=3, max_new_tokens=4, eos_token_ids=())).metrics
    assert one_step.ttft_tokens == one_step.generated_tokens == 4
    assert one_step.decode_tokens_per_s is None


def test_the_engines_schedule_emits_the_first_token_from_the_prefill_alone(target, tokenizer, drafts, prompts):
    """DecodeConfig.prefill_alone (validate --engine's runtime pass): the first step drafts nothing and
    emits one token, then the loop drafts from it as llama-server does; the output is the same."""
    pair = make_pair(target, tokenizer, drafts["self"], tokenizer)
    ours, engines = StepLog(), StepLog()
    config = DecodeConfig(k=3, max_new_tokens=20, eos_token_ids=())
    list(stream_generate(pair, prompts[0], config, metrics=ours))
    tokens = list(stream_generate(pair, prompts[0], DecodeConfig(k=3, max_new_tokens=20, eos_token_ids=(),
                                                                 prefill_alone=True), metrics=engines))
    assert tokens == target_only_generate(pair, prompts[0], config).token_ids
    # draft = target: ours 4+4+4+4+4 tokens in 5 steps; the engine's schedule 1, then 4+4+4+4, then 3
    # (the budget leaves room for 2 drafts and the bonus token)
    assert ours.steps == [(3, 3)] * 5
    assert engines.steps == [(0, 0), (3, 3), (3, 3), (3, 3), (3, 3), (2, 2)]
    assert engines.ttft_tokens == 1 and engines.draft_steps == 5 and engines.mean_acceptance_length == pytest.approx(
        1 + 14 / 5)


def test_vllms_schedule_drafts_k_past_the_budget_and_counts_what_the_target_agrees_with(target, tokenizer, drafts,
                                                                                        prompts):
    """DecodeConfig.draft_past_budget (vLLM's scheduler: k at every step, a step capped only at
    max_model_len; every agreed draft counted): the last step drafts k where llama.cpp's schedule
    drafts what the budget has left; the output still ends at the budget."""
    pair = make_pair(target, tokenizer, drafts["self"], tokenizer)
    llamacpp, vllm = StepLog(), StepLog()
    config = DecodeConfig(k=3, max_new_tokens=20, eos_token_ids=(), prefill_alone=True)
    tokens = list(stream_generate(pair, prompts[0], config, metrics=llamacpp))
    past = list(stream_generate(pair, prompts[0], DecodeConfig(k=3, max_new_tokens=20, eos_token_ids=(),
                                                               prefill_alone=True, draft_past_budget=True),
                                metrics=vllm))
    assert past == tokens and len(past) == 20
    # 1 from the prefill, then 4+4+4+4 = 17; 3 left: llama.cpp's schedule drafts 2, vLLM's 3 (all
    # agreed, 4 tokens sampled, 3 emitted)
    assert llamacpp.steps[-1] == (2, 2)
    assert vllm.steps == [(0, 0), (3, 3), (3, 3), (3, 3), (3, 3), (3, 3)]
    assert (vllm.drafted, vllm.accepted, vllm.draft_steps) == (15, 15, 5)
    assert (llamacpp.drafted, llamacpp.accepted) == (14, 14)


def test_per_position_acceptance_and_rejection_runs():
    metrics = GenerationMetrics()
    metrics.record_step(0, 0, 1)  # a step that drafted nothing (an n-gram miss): not a draft step
    for accepted in (3, 1, 0, 0, 0, 2):
        metrics.record_step(3, accepted, accepted + 1)
    assert (metrics.draft_steps, metrics.verify_steps) == (6, 7)
    # vLLM's per-position rate: accepted at position i / draft steps (positions 0, 1, 2 accepted 3, 2, 1 times)
    assert metrics.per_position_acceptance == [3 / 6, 2 / 6, 1 / 6]
    # ours, conditional: position 0 reached 6 times, accepted 3; position 1 reached 3 times, accepted 2; ...
    assert metrics.per_position_acceptance_conditional == [3 / 6, 2 / 3, 1 / 2]
    assert metrics.longest_rejection_run == 3
    assert metrics.acceptance_rate == 6 / 18
    # tau as the engines count it leaves the step without drafts out; ours counts every forward
    assert metrics.mean_acceptance_length == 1 + 6 / 6
    assert metrics.tokens_per_target_forward == 13 / 7
    summary = metrics.summary()
    assert (summary["draft_steps"], summary["mean_acceptance_length"], summary["tokens_per_target_forward"]) == (
        6, 2.0, 13 / 7)
    pooled = aggregate([metrics, metrics])
    assert (pooled["draft_steps"], pooled["mean_acceptance_length"]) == (12, 2.0)
    assert pooled["per_position_acceptance"] == [3 / 6, 2 / 6, 1 / 6]
    assert pooled["per_position_acceptance_conditional"] == [3 / 6, 2 / 3, 1 / 2]
    nothing = GenerationMetrics()
    nothing.record_step(0, 0, 1)
    assert (nothing.mean_acceptance_length, nothing.per_position_acceptance, nothing.tokens_per_target_forward) == (
        None, [], 1.0)




def test_ngram_tau_counts_only_steps_with_drafts(target, tokenizer, prompts):
    """An n-gram pair on a prompt that matches only now and then: steps without a match are verified
    (one target forward, one token) but are not draft steps, as vLLM counts num_drafts."""
    from specreg.runtime.generate import stream_generate

    metrics = StepLog()
    config = DecodeConfig(method="ngram", k=3, max_new_tokens=40, eos_token_ids=(), prompt_lookup_max=3)
    list(stream_generate(make_pair(target, tokenizer), prompts[0] * 2, config, metrics=metrics))
    with_drafts = [(d, a) for d, a in metrics.steps if d > 0]
    assert 0 < len(with_drafts) < len(metrics.steps)  # both kinds of step happened
    assert metrics.draft_steps == len(with_drafts)
    accepted = sum(a for _, a in with_drafts)
    assert metrics.mean_acceptance_length == pytest.approx(1 + accepted / len(with_drafts))
    assert metrics.tokens_per_target_forward == pytest.approx(metrics.verify_emitted / len(metrics.steps))
    assert metrics.mean_acceptance_length > metrics.tokens_per_target_forward
    assert metrics.per_position_acceptance[0] == pytest.approx(sum(a > 0 for _, a in with_drafts) / len(with_drafts))


def test_expected_speedup_formulas_and_choice_of_k():
    alpha, c = 0.8, 0.1
    for k in (1, 3, 6):
        assert expected_tokens_per_step(alpha, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))
        assert expected_speedup(alpha, k, c) == pytest.approx((1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1)))
    best_k, best = choose_k(alpha, c, k_max=12)
    brute = max(range(1, 13), key=lambda k: expected_speedup(alpha, k, c))
    assert best_k == brute and best == pytest.approx(expected_speedup(alpha, brute, c))
    assert choose_k(0.2, 0.5, 8)[0] == 1  # a poor draft: shallow
    assert choose_k(0.95, 0.02, 16)[0] > choose_k(0.6, 0.02, 16)[0]  # a better draft: deeper
    # per-position lists: acceptance that collapses after position 2 caps k
    assert choose_k([0.9, 0.9, 0.0, 0.0], 0.05, 8)[0] == 2
    assert math.isclose(expected_tokens_per_step([0.5, 0.5], 2), 1.75)


def test_tree_depth_choice_and_head_drafting_cost():
    # per-depth acceptance 0.9, 0.5, 0.1: tokens per step 1.9, 2.35, 2.395 at depths 1, 2, 3
    per_depth = [0.9, 0.5, 0.1]
    verify = {1: 1.05, 2: 1.10, 3: 1.40}
    depth, speedup = choose_tree_depth(per_depth, 0.2, verify)
    assert depth == 2 and speedup == pytest.approx(2.35 / 1.30)
    # verification free at every depth: the deepest cut wins
    assert choose_tree_depth(per_depth, 0.2, {1: 1.0, 2: 1.0, 3: 1.0})[0] == 3
    # a chain priced as DESIGN §2 prices it is expected_speedup
    assert choose_tree_depth(0.8, 3 * 0.1, {3: 1.0})[1] == pytest.approx(expected_speedup(0.8, 3, 0.1))
    # drafting seconds over the steps that drafted (each generation's prefill drafts nothing)
    summary = {"target_forwards": 12, "generations": 2, "draft_steps": 10, "draft_time_s": 0.05}
    assert head_draft_step_cost(summary, 0.01) == pytest.approx(0.5)
    assert head_draft_step_cost({"target_forwards": 2, "generations": 2, "draft_steps": 0, "draft_time_s": 0.0},
                                0.01) == 0.0


def test_median_ratio_stops_early_only_when_three_repeats_agree():
    def timed(values):
        values = iter(values)
        calls = []

        def numerator():
            calls.append(1)
            return next(values)
        return numerator, calls

    # 1.00, 1.02, 1.04 agree within 5% of their median: two more repeats could not move it outside them
    numerator, calls = timed([1.00, 1.04, 1.02, 9.0, 9.0])
    assert median_ratio(numerator, lambda: 2.0, 5) == 0.51 and len(calls) == 3
    # 1.0, 1.2, 1.1 do not: all five are timed and the burst (9.0) is outvoted
    numerator, calls = timed([1.0, 1.2, 9.0, 1.1, 1.05])
    assert median_ratio(numerator, lambda: 1.0, 5) == 1.1 and len(calls) == 5
    # three asked for: three timed
    numerator, calls = timed([3.0, 1.0, 2.0])
    assert median_ratio(numerator, lambda: 1.0, 3) == 2.0 and len(calls) == 3


def test_cost_ratio_is_measured(target, drafts, prompts):
    ratio = measure_cost_ratio(target, drafts["random"], prompts[0], steps=4, repeats=1)
    assert 0 < ratio < 2
