"""SuffixDrafter's rules, derived by hand (tests/engines/test_suffix_proposer.py runs vLLM's own
proposer with Arctic Inference's C++ cache on these and many more requests), and suffix decoding
through the decode loop: greedy equals target-only, drafts are counted as the engines count them."""

from __future__ import annotations

import dataclasses

import pytest

from specreg.core.suffix_settings import SuffixSettings
from specreg.runtime.methods.suffix import SuffixDrafter, SuffixTree


def drafter_after(prompt: list[int], output: list[int], **settings) -> SuffixDrafter:
    """A drafter on the engines' schedule: the prefill's rollback fixes the prompt."""
    drafter = SuffixDrafter(16, SuffixSettings(**settings))
    drafter.rollback(len(prompt))
    drafter.feed(prompt + output)
    return drafter


def test_the_most_counted_continuation_of_the_best_scoring_match_is_drafted():
    # [1, 2, 3] ends the sequence and occurs twice before: p = 2/3 per token, 3 tokens (score 2.0);
    # longer matches continue one earlier occurrence only (p = 1/2), shorter ones allow fewer tokens
    sequence = [1, 2, 3, 1, 2, 3, 1, 2, 3]
    assert drafter_after(sequence[:-1], sequence[-1:]).draft(sequence, 5) == [1, 2, 3]
    # a match of length m drafts at most m * max_spec_factor tokens
    assert drafter_after(sequence[:-1], sequence[-1:], max_spec_factor=0.5).draft(sequence, 5) == [1, 2, 3]
    assert drafter_after(sequence[:-1], sequence[-1:], max_spec_factor=0.0).draft(sequence, 5) == []
    # every token below min_token_prob: nothing
    assert drafter_after(sequence[:-1], sequence[-1:], min_token_prob=0.7).draft(sequence, 5) == []


def test_children_of_equal_count_keep_the_cpp_sibling_order():
    """[5] is followed by 6 then 7 once each: a child created later joins at the tail, so 6 (first
    seen) is drafted (the context [0, 5] matches only its last token: match lengths stop one short
    of the context); once 7 is seen again it moves ahead."""
    tree = SuffixTree(8)
    for token in [5, 6, 0, 5, 7, 0, 5]:
        tree.append(token)
    assert tree.speculate([0, 5], 1, 1.0, 0.0, 0.0)[0] == [6]
    for token in [7, 0, 5]:
        tree.append(token)
    assert tree.speculate([0, 5], 1, 1.0, 0.0, 0.0)[0] == [7]


def test_the_global_tree_holds_the_output_only():
    """With max_cached_requests 0 vLLM keeps no global tree; otherwise the output is in both trees,
    and a match found only in the output scores there too (same draft, the prompt tree's on a tie)."""
    prompt, output = [9, 8, 7, 6], [1, 2, 1, 2, 1]
    with_global, without = drafter_after(prompt, output), drafter_after(prompt, output, max_cached_requests=0)
    assert with_global.cache.tree.root.count == len(output) and without.cache.tree.root.count == 0
    assert with_global.prompt_tree.root.count == len(prompt + output)
    assert with_global.draft(prompt + output, 4) == without.draft(prompt + output, 4) == [2, 1]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_suffix_decoding_keeps_the_target_output(target, tokenizer, prompts, sampled):
    """Greedy: token for token the target's own decoding; sampled: the same seed and rule as the
    point-mass n-gram drafts. Repetitive prompts make the drafter draft and the target accept."""
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate, target_only_generate
    from specreg.runtime.pair import make_pair

    pair = make_pair(target, tokenizer)
    config = DecodeConfig(method="suffix", k=4, max_new_tokens=40, eos_token_ids=(), prefill_alone=True,
                          temperature=0.8 if sampled else 0.0, seed=3)
    repetitive = [list(prompt) * 3 for prompt in prompts]
    for prompt in repetitive:
        ours = speculative_generate(pair, prompt, config)
        if not sampled:
            assert ours.token_ids == target_only_generate(pair, prompt, config).token_ids
        assert len(ours.token_ids) == 40
        assert ours.metrics.drafted > 0 and ours.metrics.draft_forwards == 0
    with pytest.raises(Exception, match="suffix_decoding_min_token_prob=2"):
        speculative_generate(pair, repetitive[0], dataclasses.replace(config, suffix=SuffixSettings(min_token_prob=2)))
