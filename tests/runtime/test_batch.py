"""Many prompts decoded at once (generate.generate_batch) give each prompt exactly what decoding it
alone gives: the same token ids and the same acceptance counts, for every method, chains and
trees, greedy and sampled (each row its own seed), with rows of different lengths that end early
(budget or EOS) and drafts rejected outright."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.generate import generate_batch, speculative_generate, target_only_generate
from specreg.runtime.methods.medusa import new_medusa_heads
from specreg.runtime.pair import ModelPair, make_pair

from .test_eagle3 import heads  # noqa: F401  (session fixture: EAGLE-3 heads for the tiny target)
from .test_mtp import mtp_dirs, mtp_pairs  # noqa: F401  (session fixtures: the tiny target with MTP layers)

TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
BUDGETS = (24, 5, 17, 30)  # per row: rows end at different steps
COUNTS = ("drafted", "accepted", "draft_steps", "accepted_per_position", "reached_per_position", "verify_steps",
          "generated_tokens", "stop_reason", "draft_forwards")


def row_configs(base: DecodeConfig, sampled: bool) -> list[DecodeConfig]:
    """One config per row: its own budget and, sampled, its own seed and warping."""
    configs = []
    for row, budget in enumerate(BUDGETS):
        config = dataclasses.replace(base, max_new_tokens=budget)
        if sampled:
            config = dataclasses.replace(config, temperature=(0.7, 1.0, 1.3, 0.9)[row], seed=11 + row,
                                         top_p=(None, 0.9, None, 0.95)[row], top_k=(None, None, 12, None)[row])
        configs.append(config)
    return configs


def assert_batch_equals_alone(pair, prompts, configs, speculate=True, max_rows=None):
    finished = []
    batch = generate_batch(pair, prompts, configs, speculate=speculate, max_rows=max_rows, finished=finished.append)
    alone = [(speculative_generate if speculate else target_only_generate)(pair, prompt, config)
             for prompt, config in zip(prompts, configs)]
    for row, (ours, reference) in enumerate(zip(batch, alone)):
        assert ours.token_ids == reference.token_ids, f"row {row}"
        for name in COUNTS:
            assert getattr(ours.metrics, name) == getattr(reference.metrics, name), f"row {row}: {name}"
        assert ours.metrics.batch_size == min(max_rows or len(prompts), len(prompts))
        assert reference.metrics.batch_size == 1
    assert sorted(finished) == list(range(len(prompts)))  # each row reported once, as it ended
    return batch


def pairs_under_test(target, tokenizer, drafts, heads, mtp_pairs):  # noqa: F811
    vocab = int(target.get_output_embeddings().weight.shape[0])
    medusa = new_medusa_heads(target, num_heads=3, num_layers=1, seed=5)
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for parameter in medusa.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5 * (parameter.std() + 0.01))
    return {
        "draft_model aligned": (make_pair(target, tokenizer, drafts["aligned"], tokenizer), DecodeConfig(k=3)),
        # a different random model: nearly every draft is rejected
        "draft_model random": (make_pair(target, tokenizer, drafts["random"], tokenizer), DecodeConfig(k=4)),
        "ngram": (make_pair(target, tokenizer), DecodeConfig(method="ngram", k=3)),
        "suffix": (make_pair(target, tokenizer), DecodeConfig(method="suffix", k=3)),
        "eagle3": (ModelPair(target, tokenizer, heads["trained"], vocab), DecodeConfig(method="eagle3", k=3)),
        "eagle3 tree": (ModelPair(target, tokenizer, heads["trained"], vocab),
                        DecodeConfig(method="eagle3", k=3, tree=TREE)),
        "medusa tree": (ModelPair(target, tokenizer, medusa.eval(), vocab), DecodeConfig(method="medusa", k=3, tree=TREE)),
        "mtp": (mtp_pairs["trained"], DecodeConfig(method="mtp", k=2)),
        "dflash": (ModelPair(target, tokenizer, block_head(target, seed=8), vocab), DecodeConfig(method="dflash", k=3)),
        "dspark": (ModelPair(target, tokenizer, block_head(target, seed=9, markov_rank=8, sample_from_anchor=True),
                             vocab), DecodeConfig(method="dspark", k=4)),
        "peagle": (ModelPair(target, tokenizer, peagle_head(target, heads["trained"]), vocab),
                   DecodeConfig(method="peagle", k=3)),
    }


def peagle_head(target, eagle3_head):
    """A P-EAGLE head carrying a trained EAGLE-3 head's weights, so that its first draft is often
    accepted, and a random mask_hidden."""
    from specreg.runtime.methods.peagle import new_peagle_head

    ids = (torch.arange(eagle3_head.d2t.shape[0]) + eagle3_head.d2t).tolist()
    head = new_peagle_head(target, mask_token_id=int(target.config.vocab_size) - 1, draft_token_ids=ids, seed=10)
    mask_hidden = head.mask_hidden.clone()
    head.load_state_dict(eagle3_head.state_dict(), strict=False)
    head.mask_hidden.copy_(mask_hidden)
    return head.eval()


def block_head(target, seed: int, **options):
    """A random DFlash / DSpark head (block 4) whose weights are scaled up so that its drafts vary
    with the context."""
    from specreg.runtime.methods.dflash import new_block_head

    vocab = int(target.get_output_embeddings().weight.shape[0])
    head = new_block_head(target, block_size=4, mask_token_id=vocab - 1, aux_layer_ids=(1, 2), seed=seed, **options)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if not name.startswith(("embed_tokens", "lm_head")):
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return head.eval()


@pytest.fixture(scope="module")
def pairs(target, tokenizer, drafts, heads, mtp_pairs):  # noqa: F811
    return pairs_under_test(target, tokenizer, drafts, heads, mtp_pairs)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["draft_model aligned", "draft_model random", "ngram", "suffix", "eagle3",
                                  "eagle3 tree", "medusa tree", "mtp", "dflash", "dspark", "peagle"])
def test_batch_equals_each_prompt_alone(pairs, prompts, name, sampled):
    pair, base = pairs[name]
    configs = row_configs(dataclasses.replace(base, eos_token_ids=()), sampled)
    batch = assert_batch_equals_alone(pair, prompts, configs)
    assert [len(generation.token_ids) for generation in batch] == list(BUDGETS)
    if name == "draft_model random" and not sampled:
        # rows that reject every draft: each step emits only the target's own token
        assert all(g.metrics.accepted == 0 < g.metrics.drafted for g in batch)
    if name == "draft_model aligned":
        assert max(g.metrics.accepted for g in batch) > 0


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["draft_model aligned", "draft_model random", "ngram", "suffix", "eagle3",
                                  "eagle3 tree", "medusa tree", "mtp", "dflash", "dspark", "peagle"])
def test_rows_joining_as_others_finish_decode_as_alone(pairs, prompts, name, sampled):
    """Eight prompts through a batch of three: rows join as rows end (each after its own first
    step, its cache columns and drafter state then merged into the batch's), and every row still
    decodes as it would alone."""
    pair, base = pairs[name]
    configs = row_configs(dataclasses.replace(base, eos_token_ids=()), sampled)
    configs = configs + [dataclasses.replace(c, max_new_tokens=c.max_new_tokens // 2 + 3, seed=c.seed + 100)
                         for c in configs]
    batch = assert_batch_equals_alone(pair, list(prompts) + list(prompts[::-1]), configs, max_rows=3)
    assert [len(generation.token_ids) for generation in batch] == [c.max_new_tokens for c in configs]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["draft_model aligned", "eagle3", "mtp", "dflash", "peagle"])
def test_rows_joining_on_the_engines_schedule_decode_as_alone(pairs, prompts, name, sampled):
    """On the engines' schedule (validate's) a joining row drafts nothing in its first step: the
    draft model is fed its prompt in a forward of its own before it joins, and every row still
    decodes as it would alone."""
    pair, base = pairs[name]
    configs = [dataclasses.replace(c, prefill_alone=True)
               for c in row_configs(dataclasses.replace(base, eos_token_ids=()), sampled)]
    configs = configs + [dataclasses.replace(c, max_new_tokens=c.max_new_tokens // 2 + 3, seed=c.seed + 100)
                         for c in configs]
    assert_batch_equals_alone(pair, list(prompts) + list(prompts[::-1]), configs, max_rows=3)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_target_only_batch_equals_each_prompt_alone(pairs, prompts, sampled):
    pair, base = pairs["draft_model aligned"]
    assert_batch_equals_alone(pair, prompts, row_configs(dataclasses.replace(base, eos_token_ids=()), sampled),
                              speculate=False)


def test_rows_ending_at_eos_leave_the_batch(pairs, prompts):
    """An EOS that one row emits early ends that row only; the others decode on as they would alone."""
    pair, base = pairs["draft_model aligned"]
    alone = target_only_generate(pair, prompts[1], dataclasses.replace(base, max_new_tokens=30, eos_token_ids=()))
    eos = alone.token_ids[3]  # the 4th token of row 1
    configs = [dataclasses.replace(base, max_new_tokens=30, eos_token_ids=(eos,)) for _ in prompts]
    batch = assert_batch_equals_alone(pair, prompts, configs)
    assert batch[1].metrics.stop_reason == "eos" and len(batch[1].token_ids) <= 4


def test_batch_prefill_alone_schedule(pairs, prompts):
    """The engines' schedule (the prefill emits the first token alone) batches the same way."""
    pair, base = pairs["draft_model aligned"]
    configs = [dataclasses.replace(c, prefill_alone=True) for c in row_configs(dataclasses.replace(base, eos_token_ids=()),
                                                                              False)]
    batch = assert_batch_equals_alone(pair, prompts, configs)
    assert all(g.metrics.ttft_tokens == 1 for g in batch)


def test_greedy_and_sampled_rows_in_one_batch_decode_as_alone(pairs, prompts, monkeypatch):
    """validate's speculative pass holds greedy and sampled rows together (engines' schedule, rows
    joining): each still decodes as alone; the wall time of each step, and of each join (the draft
    model fed the newcomers' prompts), is shared among its rows, so the rows' shares add up to the
    decode's wall time and each kind of row gets its own throughput."""
    import time

    from specreg.runtime.methods.draft_model import DraftModelDrafter

    pair, base = pairs["draft_model aligned"]
    greedy = [dataclasses.replace(c, prefill_alone=True)
              for c in row_configs(dataclasses.replace(base, eos_token_ids=()), False)]
    sampled = [dataclasses.replace(c, prefill_alone=True, seed=c.seed + 50)
               for c in row_configs(dataclasses.replace(base, eos_token_ids=()), True)]
    assert_batch_equals_alone(pair, list(prompts) * 2, greedy + sampled, max_rows=3)
    joins, prefill = [], DraftModelDrafter.prefill

    def slow_prefill(self, requests):  # a join that costs a known time
        joins.append(len(requests))
        time.sleep(0.05)
        return prefill(self, requests)

    monkeypatch.setattr(DraftModelDrafter, "prefill", slow_prefill)
    start = time.perf_counter()
    batch = generate_batch(pair, list(prompts) * 2, greedy + sampled, max_rows=3)
    wall = time.perf_counter() - start
    shares = [generation.metrics.batch_time_s for generation in batch]
    # steps and joins are disjoint parts of the decode: their shares never add up to more than its
    # wall time, and the joins' time is in them
    assert joins and all(share > 0 for share in shares)
    assert max(0.5 * wall, 0.05 * len(joins)) < sum(shares) <= wall


def test_stop_draft_counts_are_llamacpps_count_at_a_stop_token(target, tokenizer, drafts, prompts):
    """One decode gives both counts: stop_draft_counts of a greedy decode equals the counts of the
    decode under llama.cpp's rule (greedy_accept_stopping_at) when an accepted draft before the
    step's last one is the stop token, and the tokens are the same."""
    from specreg.runtime.acceptance_rule import greedy_accept_stopping_at
    from specreg.runtime.metrics import stop_draft_counts

    pair = make_pair(target, tokenizer, drafts["self"], tokenizer)  # every draft accepted
    plain = target_only_generate(pair, prompts[0], DecodeConfig(max_new_tokens=20, eos_token_ids=()))
    # the engines' schedule: 1 token, then steps of k + 1 = 4; the 3rd token is the second draft of step 2
    eos = plain.token_ids[2]
    assert eos not in plain.token_ids[:2]
    config = DecodeConfig(k=3, max_new_tokens=20, eos_token_ids=(eos,), prefill_alone=True)
    ours = speculative_generate(pair, prompts[0], config)
    llamacpp = speculative_generate(pair, prompts[0], config, greedy_rule=greedy_accept_stopping_at({eos}))
    assert ours.token_ids == llamacpp.token_ids == plain.token_ids[:3]
    assert ours.metrics.stop_draft == (1, 3) and ours.metrics.accepted == 3 and llamacpp.metrics.accepted == 1
    counted = stop_draft_counts(ours.metrics)
    for key in ("drafted", "accepted", "draft_steps", "accepted_per_position", "generated_tokens"):
        assert counted[key] == stop_draft_counts(llamacpp.metrics)[key] == getattr(llamacpp.metrics, key), key


def test_compacted_cache_decodes_as_the_plain_one(pairs, prompts, monkeypatch):
    """Holes left by tree nodes off the accepted path are gathered away (RowCache.compact) once
    they outnumber the kept columns; here at every step: greedy tree decoding, batched and alone,
    still emits exactly the target's own greedy tokens."""
    from specreg.runtime import row_cache

    compactions = []
    original = row_cache.RowCache.compact

    def counted(self):
        compactions.append(self.valid.shape)
        original(self)

    monkeypatch.setattr(row_cache.RowCache, "compact", counted)
    monkeypatch.setattr(row_cache, "COMPACT_SLACK", -10**6)
    pair, base = pairs["eagle3 tree"]  # a trained head: nodes accepted beside rejected siblings
    configs = row_configs(dataclasses.replace(base, eos_token_ids=()), False)
    batch = assert_batch_equals_alone(pair, prompts, configs)
    assert any(columns > 0 for _, columns in compactions)
    for generation, prompt, config in zip(batch, prompts, configs):
        assert generation.token_ids == target_only_generate(pair, prompt, config).token_ids


def test_compaction_keeps_every_rows_valid_columns_past_127_columns(pairs, monkeypatch):
    """A cache wider than a small integer type counts (the real pair's default set reached 135
    columns at batch 8): compaction gathers each row's valid columns, keys unchanged, none lost."""
    from specreg.runtime import row_cache

    pair, _ = pairs["ngram"]  # the target alone is what the cache holds
    generator = torch.Generator().manual_seed(3)
    cache = row_cache.RowCache(pair.target.config, 2, pair.target.device)
    monkeypatch.setattr(row_cache, "COMPACT_SLACK", 10**6)  # no compaction until asked below
    for width, kept_last in ((30, (30, 30)), (110, (1, 2))):  # 30 kept, then 110 new with 1 and 2 kept at the end
        input_ids = torch.randint(0, pair.vocab_size, (2, width), generator=generator)
        valid = torch.ones(2, width, dtype=torch.bool)
        cache.forward(pair.target, input_ids, valid, torch.arange(width).expand(2, -1).contiguous(), logits_to_keep=1)
        cache.keep(torch.stack([torch.arange(width) >= width - n for n in kept_last]))
    assert cache.valid.shape[1] == 140 and cache.lengths.tolist() == [31, 32]
    before = [cache.cache.layers[0].keys[r][:, cache.valid[r]].clone() for r in range(2)]
    cache.compact()
    assert cache.valid.sum(dim=1).tolist() == [31, 32] and cache.valid.shape[1] == 32
    for r in range(2):
        assert torch.equal(cache.cache.layers[0].keys[r][:, cache.valid[r]], before[r])
