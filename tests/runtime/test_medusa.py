"""Medusa heads on tiny models, decoded by the one decode loop (runtime/decode.py, tree mode):
the head directory round trip, greedy tree decoding equal to target-only and HF generate for
several trees, seeded sampling, typed errors before any forward."""

from __future__ import annotations

import pytest
import torch

from specreg.errors import RuntimeConfigError
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.generate import speculative_generate, target_only_generate
from specreg.runtime.methods.medusa import build_medusa_heads, load_medusa_heads, new_medusa_heads
from specreg.runtime.pair import ModelPair, make_pair

from helpers import hf_greedy  # tests/ is on sys.path (tests/conftest.py)

TREES = {
    "chain": [(0,), (0, 0), (0, 0, 0)],
    "medusa": [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)],
    "wide": [(i,) for i in range(6)] + [(0, i) for i in range(3)],
}


def tree_generate(target, heads, paths, prompt_ids, max_new_tokens, *, eos_token_ids=(), **sampling):
    """Medusa speculative decoding through runtime/decode.py -> Generation."""
    pair = ModelPair(target=target, tokenizer=None, draft=heads, vocab_size=target.config.vocab_size)
    paths = tuple(tuple(path) for path in paths)
    config = DecodeConfig(method="medusa", tree=paths, k=max(len(path) for path in paths),
                          max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos_token_ids), **sampling)
    return speculative_generate(pair, prompt_ids, config)


@pytest.fixture(scope="module")
def random_heads(target):
    """Medusa's initialisation, then perturbed so the heads disagree with the target."""
    heads = new_medusa_heads(target, num_heads=3, num_layers=1, seed=5)
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5 * (parameter.std() + 0.01))
    return heads.eval()


@pytest.fixture(scope="module")
def oracle_heads(target, prompts):
    """Heads fitted to the target's own greedy continuations of the test prompts: head i at
    position t learns the target's token at t + 2 + i, so on these prompts they are nearly oracles."""
    states, labels = [], []
    for prompt in prompts:
        sequence = prompt + hf_greedy(target, prompt, 30)
        with torch.inference_mode():
            hidden = target.model(input_ids=torch.tensor([sequence])).last_hidden_state[0]  # [n, H]
        for t in range(len(prompt) - 1, len(sequence) - 4):
            states.append(hidden[t])
            labels.append(sequence[t + 2:t + 5])
    states, labels = torch.stack(states).clone(), torch.tensor(labels)  # [m, H], [m, 3]
    heads = new_medusa_heads(target, num_heads=3, num_layers=1, seed=7)
    optimizer = torch.optim.Adam(heads.parameters(), lr=3e-2)
    for _ in range(150):
        logits = heads(states)  # [3, m, vocab]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.T.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval()


@pytest.fixture(scope="module")
def references(target, tokenizer, prompts):
    """Per prompt: HF generate's greedy 20 tokens, checked once against our target-only loop."""
    plain_pair = make_pair(target, tokenizer)
    expected = []
    for prompt in prompts[:3]:
        reference = hf_greedy(target, prompt, 20)
        assert target_only_generate(plain_pair, prompt, DecodeConfig(max_new_tokens=20, eos_token_ids=())).token_ids \
            == reference
        expected.append(reference)
    return expected


@pytest.mark.parametrize("tree_name", list(TREES))
@pytest.mark.parametrize("heads_name", ["random", "oracle"])
def test_greedy_tree_decoding_equals_target_only_and_hf(target, prompts, references, random_heads, oracle_heads,
                                                        tree_name, heads_name):
    heads = random_heads if heads_name == "random" else oracle_heads
    for prompt, reference in zip(prompts, references):
        ours = tree_generate(target, heads, TREES[tree_name], prompt, 20)
        assert ours.token_ids == reference
        assert ours.metrics.stop_reason == "max_new_tokens"
        assert ours.metrics.target_forwards <= 20


def test_oracle_heads_are_accepted_and_metrics_count_by_depth(target, prompts, oracle_heads):
    result = tree_generate(target, oracle_heads, TREES["medusa"], prompts[0], 24)
    summary = result.metrics.summary()
    assert len(summary["per_position_acceptance"]) == 3  # position = depth
    assert summary["acceptance_rate"] > 0.7
    assert summary["mean_acceptance_length"] > 2.5
    assert summary["target_forwards"] < 12
    # drafted: the depth of each tree verified (every step after the prefill, pruned near the end)
    assert result.metrics.drafted <= 3 * (result.metrics.verify_steps - 1)
    assert result.metrics.generated_tokens == 24 == len(result.token_ids)
    random = tree_generate(target, new_medusa_heads(target, 3, seed=1), TREES["medusa"], prompts[0], 24)
    assert random.metrics.acceptance_rate < summary["acceptance_rate"]


def test_eos_inside_an_accepted_path_stops_there(target, prompts, oracle_heads):
    free_run = hf_greedy(target, prompts[0], 24)
    eos = free_run[9]
    expected = free_run[:free_run.index(eos) + 1]
    result = tree_generate(target, oracle_heads, TREES["medusa"], prompts[0], 24, eos_token_ids=(eos,))
    assert result.token_ids == expected and result.metrics.stop_reason == "eos"


def test_sampling_is_reproducible_with_a_seed(target, prompts, random_heads):
    runs = [tree_generate(target, random_heads, TREES["medusa"], prompts[1], 16, temperature=0.9, seed=seed,
                          top_k=50).token_ids for seed in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert len(runs[0]) == 16


def test_head_directory_round_trip(tmp_path, tiny_dir, target, random_heads):
    from specreg.core.heads import read_head
    from specreg.runtime.methods.medusa import save_medusa_heads

    save_medusa_heads(random_heads, tmp_path / "heads", base_model_name_or_path=str(tiny_dir / "target"))
    spec = read_head(tmp_path / "heads", method="medusa")  # the registration reader accepts it
    assert (spec.num_heads, spec.num_layers, spec.hidden_size) == (3, 1, target.config.hidden_size)
    loaded = load_medusa_heads(tmp_path / "heads", target)
    for (name, ours), (_, theirs) in zip(random_heads.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(ours, theirs), name
    built = build_medusa_heads(target, tmp_path / "fresh", 2, 2)
    assert read_head(built).num_layers == 2 and load_medusa_heads(built, target).num_heads == 2


def test_typed_errors_before_any_forward(tmp_path, tiny_dir, target, prompts, random_heads):
    from specreg.runtime.loading import load_model

    calls = []
    hook = target.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(RuntimeConfigError, match="tree depth 4 exceeds the 3 Medusa heads"):
            tree_generate(target, random_heads, [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)], prompts[0], 8)
        with pytest.raises(RuntimeConfigError, match="parent"):
            tree_generate(target, random_heads, [(0,), (1, 0)], prompts[0], 8)
        with pytest.raises(RuntimeConfigError, match="empty prompt"):
            tree_generate(target, random_heads, [(0,)], [], 8)
    finally:
        hook.remove()
    assert calls == []
    other = load_model(tiny_dir / "draft_random")  # hidden size 32, the target's is 64
    build_medusa_heads(other, tmp_path / "other", 2)
    with pytest.raises(RuntimeConfigError, match="hidden size 32"):
        load_medusa_heads(tmp_path / "other", target)
