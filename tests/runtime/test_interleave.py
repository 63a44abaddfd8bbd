"""Decode passes side by side (generate.generate_interleaved, validate's target-only and speculative
batched passes): each pass gives exactly what it gives alone, for every method; the passes take
turns; and a pass's times count only its own work, never what its reader or the other pass did
between its tokens."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.generate import Pass, generate_batch, generate_interleaved, stream_generate
from specreg.runtime.metrics import GenerationMetrics

from .test_batch import COUNTS, pairs_under_test, row_configs
from .test_eagle3 import heads  # noqa: F401  (session fixture: EAGLE-3 heads for the tiny target)
from .test_mtp import mtp_dirs, mtp_pairs  # noqa: F401  (session fixtures: the tiny target with MTP layers)

METHODS = ["draft_model aligned", "draft_model random", "ngram", "suffix", "eagle3", "eagle3 tree", "medusa tree",
           "mtp", "dflash", "dspark", "peagle"]


@pytest.fixture(scope="module")
def pairs(target, tokenizer, drafts, heads, mtp_pairs):  # noqa: F811
    return pairs_under_test(target, tokenizer, drafts, heads, mtp_pairs)


def validate_like_passes(base: DecodeConfig, prompts) -> list[Pass]:
    """validate's two batched passes: target-only greedy rows with short budgets, and speculative
    greedy rows followed by sampled ones that join as rows end (3 rows at a time), so the
    target-only pass ends while the speculative one still decodes."""
    base = dataclasses.replace(base, eos_token_ids=(), prefill_alone=True)
    greedy = [dataclasses.replace(c, max_new_tokens=c.max_new_tokens // 2 + 1) for c in row_configs(base, False)]
    sampled = row_configs(base, True)
    return [Pass(list(prompts), greedy, False, {"max_rows": 3}),
            Pass(list(prompts) * 2, greedy + sampled, True, {"max_rows": 3})]


@pytest.mark.parametrize("name", METHODS)
def test_passes_side_by_side_decode_as_each_alone(pairs, prompts, name):
    pair, base = pairs[name]
    passes = validate_like_passes(base, prompts)
    together = generate_interleaved(pair, passes)
    assert not torch.is_inference_mode_enabled()
    for number, (one, ours) in enumerate(zip(passes, together)):
        alone = generate_batch(pair, one.prompts, one.configs, speculate=one.speculate, **one.hooks)
        for row, (mine, reference) in enumerate(zip(ours, alone)):
            assert mine.token_ids == reference.token_ids, f"pass {number} row {row}"
            for count in COUNTS:
                assert getattr(mine.metrics, count) == getattr(reference.metrics, count), f"pass {number} row {row}"
            assert mine.metrics.batch_size == reference.metrics.batch_size == 3
    assert [len(g.token_ids) for g in together[0]] == [c.max_new_tokens for c in passes[0].configs]


def test_the_passes_take_turns(pairs, prompts):
    """Rows of both passes end in turn, the first pass's last row after the second pass's first:
    run one after the other, every row of the first would end before any of the second."""
    pair, base = pairs["draft_model aligned"]
    passes = validate_like_passes(base, prompts)
    ended = []
    for number, one in enumerate(passes):
        one.hooks["finished"] = lambda row, number=number: ended.append(number)
    generate_interleaved(pair, passes)
    assert sorted(ended) == [0] * len(passes[0].prompts) + [1] * len(passes[1].prompts)
    assert ended.index(1) < len(ended) - 1 - ended[::-1].index(0)


def test_a_readers_time_between_tokens_counts_in_no_figure(pairs, prompts):
    """A stream's reader that takes 50 ms per token: the decode's own times stay what the decode
    took (the tiny models decode 10 tokens in a few ms), not the reader's 0.5 s."""
    pair, base = pairs["draft_model aligned"]
    config = dataclasses.replace(base, max_new_tokens=10, eos_token_ids=())
    metrics, start = GenerationMetrics(), time.perf_counter()
    for _ in stream_generate(pair, prompts[0], config, metrics=metrics):
        time.sleep(0.05)
    assert time.perf_counter() - start >= 0.5
    assert metrics.generated_tokens == 10
    assert 0 < metrics.total_time_s < 0.5 and 0 < metrics.batch_time_s <= metrics.total_time_s
    assert metrics.ttft_s < 0.5 and sum(metrics.token_latencies_s) < 0.5
