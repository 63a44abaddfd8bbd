"""An EAGLE-3 head's logit_scale, run as vLLM 0.33 runs it: compute_logits multiplies the draft
logits by it (LogitsProcessor(scale=logit_scale), llama_eagle3.py:328-336) before the proposer
divides by the temperature and takes the softmax (llm_base_proposer.py:1824-1855). A head saved by
the runtime's own saver with logit_scale 0.5, against the same head saved without it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from specreg.errors import ModelReferenceError
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.generate import speculative_generate
from specreg.runtime.methods import load_pair

from helpers import hf_greedy  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture(scope="module")
def scaled(tiny_dir, target, tmp_path_factory):
    """(pair with the head saved at logit_scale 0.5, pair with the same head saved without it)."""
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head

    root = tmp_path_factory.mktemp("logit_scale")
    head = new_eagle3_head(target, range(1, int(target.config.vocab_size), 2), seed=11, logit_scale=0.5)
    half = save_eagle3_head(head, root / "half", "tiny-target", ["LlamaForCausalLM"])
    config = json.loads((half / "config.json").read_text())
    assert config["transformer_layer_config"]["logit_scale"] == 0.5  # where vLLM reads it (speculators/base.py:59)
    plain = root / "plain"
    plain.mkdir()
    (plain / "model.safetensors").write_bytes((half / "model.safetensors").read_bytes())
    del config["transformer_layer_config"]["logit_scale"]
    (plain / "config.json").write_text(json.dumps(config))
    return (load_pair(tiny_dir / "target", half, method="eagle3"),
            load_pair(tiny_dir / "target", plain, method="eagle3"))


def test_the_draft_logits_are_the_unscaled_ones_times_the_scale(scaled):
    half, plain = scaled
    assert (half.draft.logit_scale, plain.draft.logit_scale) == (0.5, 1.0)
    hidden = torch.randn(4, half.draft.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        scaled_logits, logits = half.draft.draft_logits(hidden), plain.draft.draft_logits(hidden)
    drafted = torch.isfinite(logits)
    assert torch.equal(drafted, torch.isfinite(scaled_logits))  # -inf off the draft vocabulary in both
    assert int(drafted[0].sum()) == half.draft.lm_head.weight.shape[0]
    assert torch.equal(scaled_logits[drafted], 0.5 * logits[drafted])


def test_greedy_decoding_still_equals_the_target_alone(scaled, target, prompts):
    half, plain = scaled
    config = DecodeConfig(method="eagle3", k=3, max_new_tokens=20, eos_token_ids=())
    for prompt in prompts[:2]:
        result = speculative_generate(half, prompt, config)
        assert result.token_ids == hf_greedy(target, prompt, 20, eos_token_id=None)
        # a positive scale keeps each argmax: the same drafts, the same acceptance
        assert result.metrics.accepted == speculative_generate(plain, prompt, config).metrics.accepted


def test_sampled_drafts_follow_the_scaled_logits_before_the_temperature(scaled, prompts):
    from specreg.runtime.sampling import logits_to_probs
    from specreg.validators.distribution import drafter_proposal

    half, plain = scaled
    prefix = list(prompts[0])

    def drafted_probs(pair, temperature):  # [vocab]: what the pair's drafter samples its first draft from
        record = SimpleNamespace(temperature=temperature, top_k=None, top_p=None)
        return drafter_proposal(pair, "eagle3", prefix, record, draft_sampling="probabilistic")[1]

    # softmax(0.5 * logits / 0.8) = softmax(logits / 1.6): scale first, then the temperature
    assert torch.allclose(drafted_probs(half, 0.8), drafted_probs(plain, 1.6), atol=1e-6)
    assert not torch.allclose(drafted_probs(half, 0.8), drafted_probs(plain, 0.8), atol=1e-3)
    # and those are the probabilities of the head's own (scaled) draft logits at that temperature
    from transformers import DynamicCache

    from specreg.runtime.forward import forward_logits

    tokens = torch.tensor([prefix])
    with torch.no_grad():
        _, hidden = forward_logits(half.target, tokens[:, :-1], DynamicCache(config=half.target.config), 1,
                                   half.draft.hidden_state_ids)
        # the entry of token x_j at position j (the drafter's seed: x_2 .. x_n at 1 .. n - 1)
        output = half.draft(tokens[:, 1:], half.draft.seed_input(hidden), DynamicCache(config=half.draft.config), 1)
        logits = half.draft.draft_logits(output[:, -1])[:, : half.vocab_size]
    assert torch.allclose(drafted_probs(half, 0.8), logits_to_probs(logits, 0.8, None, None)[0], atol=1e-6)


def test_a_logit_scale_vllm_cannot_multiply_by_is_refused_naming_the_field(scaled, tmp_path):
    from specreg.runtime.methods.eagle3 import read_eagle3_config, save_eagle3_head

    half_dir = tmp_path / "bad"
    save_eagle3_head(scaled[0].draft, half_dir, "tiny-target", ["LlamaForCausalLM"])
    config = json.loads((half_dir / "config.json").read_text())
    config["transformer_layer_config"]["logit_scale"] = "0.5"
    (half_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelReferenceError, match=r"transformer_layer_config.logit_scale must be a finite number "
                                                  r"\(vLLM multiplies the draft logits by it\), got '0.5'"):
        read_eagle3_config(half_dir)
