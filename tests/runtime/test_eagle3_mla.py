"""EAGLE-3 heads with DeepSeek (MLA) layers on the runtime: the head's forward over its cache
equals an independent reference built from transformers' DeepseekV3Attention / DeepseekV3DecoderLayer
with the head's weights copied (no cache: the whole sequence each step), for two draft steps; and
the head saved and loaded drafts exactly, batch as batch 1."""

from __future__ import annotations

import pytest
import torch

from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.generate import speculative_generate
from specreg.runtime.methods import load_pair

from helpers import hf_greedy  # tests/ is on sys.path (tests/conftest.py)

MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, intermediate_size=96)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}
CASES = {
    "q_lora_two_layers_norm_output": (dict(MLA, q_lora_rank=24), dict(num_layers=2, norm_output=True)),
    "no_q_lora_fc_norm": (dict(MLA, q_lora_rank=None), dict(fc_norm=True, norm_before_residual=True)),
    "yarn": (dict(MLA, q_lora_rank=24, rope_parameters=YARN, max_position_embeddings=64), {}),
}


def mla_head(target, name, seed=7):
    from specreg.runtime.methods.eagle3 import new_eagle3_head

    fields, flags = CASES[name]
    head = new_eagle3_head(target, range(1, int(target.config.vocab_size), 2), seed=seed, layer_kind="deepseek_v2",
                           layer_fields=fields, **flags)
    with torch.no_grad():  # norms away from 1, so a norm applied in the wrong place shows
        for key, parameter in head.named_parameters():
            if key.endswith("norm.weight") or "norm." in key:
                parameter.uniform_(0.5, 1.5)
    return head.eval()


def reference(head):
    """The head's math from transformers' DeepSeek-V3 modules (the runtime's is written from vLLM's
    deepseek_eagle3.py / MLA): -> forward(input_ids # [1, n], hidden # [1, n, H]) -> pre-norm # [1, n, H]."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3DecoderLayer,
        DeepseekV3MLP,
        DeepseekV3RMSNorm,
        DeepseekV3RotaryEmbedding,
    )

    fields = {key: value for key, value in head.config.to_dict().items()
              if key not in ("model_type", "architectures", "transformers_version", "head_dim", "qk_head_dim")}
    # MLA has no key/value head groups: transformers' attention repeats keys num_attention_heads //
    # num_key_value_heads times, vLLM never (the field is the target's, copied by new_eagle3_head)
    config = DeepseekV3Config(**{**fields, "first_k_dense_replace": 99, "rope_interleave": True,
                                 "num_key_value_heads": fields["num_attention_heads"]})
    config._attn_implementation = "eager"
    hidden = config.hidden_size
    attention = DeepseekV3Attention(config, 0)
    if config.q_lora_rank is not None:
        attention.q_a_proj = torch.nn.Linear(2 * hidden, config.q_lora_rank, bias=False)
    else:
        attention.q_proj = torch.nn.Linear(2 * hidden, attention.q_proj.out_features, bias=False)
    attention.kv_a_proj_with_mqa = torch.nn.Linear(2 * hidden, attention.kv_a_proj_with_mqa.out_features, bias=False)
    first = head.layers[0]
    attention.load_state_dict(first.self_attn.state_dict())
    mlp = DeepseekV3MLP(config)
    mlp.load_state_dict(first.mlp.state_dict())
    norms = {}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        norms[name] = DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        norms[name].load_state_dict(getattr(first, name).state_dict())
    later = []
    for index, layer in enumerate(head.layers[1:], start=1):
        later.append(DeepseekV3DecoderLayer(config, index))
        later[-1].load_state_dict(layer.state_dict())
    rotary = DeepseekV3RotaryEmbedding(config)

    def forward(input_ids, hidden_states):
        length = input_ids.shape[1]
        positions = torch.arange(length).view(1, -1)
        embeddings = rotary(hidden_states, positions)
        causal = torch.full((length, length), float("-inf")).triu(1).view(1, 1, length, length)
        # deepseek_eagle3.py:127-148 (layer 0), then the later layers over the hidden state alone
        residual = hidden_states
        normed = norms["hidden_norm"](hidden_states)
        if first.norm_before_residual:
            residual = normed
        attended, _ = attention(torch.cat([norms["input_layernorm"](head.embed_tokens(input_ids)), normed], dim=-1),
                                embeddings, causal)
        hidden_states = residual + attended
        hidden_states = hidden_states + mlp(norms["post_attention_layernorm"](hidden_states))
        for layer in later:
            hidden_states = layer(hidden_states, attention_mask=causal, position_ids=positions,
                                  position_embeddings=embeddings)
        return hidden_states

    return forward


@pytest.mark.parametrize("name", list(CASES))
def test_two_draft_steps_equal_transformers_deepseek_modules(target, name):
    from transformers import DynamicCache

    head = mla_head(target, name)
    forward = reference(head)
    generator = torch.Generator().manual_seed(1)
    vocab, n = int(target.config.vocab_size), 9
    input_ids = torch.randint(0, vocab, (1, n), generator=generator)
    aux = torch.randn(1, n, len(head.aux_layer_ids) * target.config.hidden_size, generator=generator)
    with torch.no_grad():
        hidden = head.project(aux)  # [1, n, H]
        cache = DynamicCache(config=head.config)
        first = head(input_ids, hidden, cache, 0)  # [1, n, H]
        first_logits = head.draft_logits(first[0, -1:])  # [1, V]
        drafted = first_logits.argmax(dim=-1).view(1, 1)
        second = head(drafted, head.recycle(first[:, -1:]), cache, n)
        second_logits = head.draft_logits(second[0, -1:])

        expected = forward(input_ids, hidden)
        expected_first = head.draft_logits(expected[0, -1:])
        longer = forward(torch.cat([input_ids, drafted], dim=1), torch.cat([hidden, head.recycle(expected[:, -1:])], 1))
        expected_second = head.draft_logits(longer[0, -1:])
    finite = torch.isfinite(expected_first)
    assert finite.sum() == len(range(1, vocab, 2)) and torch.equal(finite, torch.isfinite(first_logits))
    torch.testing.assert_close(first_logits[finite], expected_first[finite], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(second_logits[finite], expected_second[finite], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(first_logits[finite], second_logits[finite])  # the second step read its own entry


def test_the_yarn_rope_scales_the_softmax_and_the_rotation_as_vllm(target):
    """deepseek_v2.py:1130-1136 and deepseek_scaling_rope.py:52-55: the softmax scale takes
    yarn_get_mscale(factor, mscale_all_dim) ** 2; cos/sin take mscale / mscale_all_dim's ratio."""
    import math

    head = mla_head(target, "yarn")
    attention, rotary = head.layers[0].self_attn, head.rotary_emb
    mscale = lambda value: 0.1 * value * math.log(4.0) + 1.0  # noqa: E731 - yarn_get_mscale at factor 4
    assert attention.scaling == pytest.approx((8 + 8) ** -0.5 * mscale(0.8) ** 2)
    assert rotary.mscale == pytest.approx(mscale(1.0) / mscale(0.8))
    plain = mla_head(target, "no_q_lora_fc_norm")
    assert plain.layers[0].self_attn.scaling == (8 + 8) ** -0.5 and plain.rotary_emb.mscale == 1.0


@pytest.mark.parametrize("name", list(CASES))
def test_a_saved_deepseek_head_drafts_exactly_batch_as_batch_one(tiny_dir, target, prompts, tmp_path, name):
    from specreg.runtime.generate import generate_batch
    from specreg.runtime.methods.eagle3 import read_eagle3_config, save_eagle3_head

    directory = save_eagle3_head(mla_head(target, name), tmp_path / name, str(tiny_dir / "target"),
                                 ["LlamaForCausalLM"])
    spec = read_eagle3_config(directory)
    assert (spec.layer_kind, type(spec.layer_config).__name__) == ("deepseek_v2", "DeepseekV2Config")
    pair = load_pair(tiny_dir / "target", directory, method="eagle3")
    config = DecodeConfig(method="eagle3", k=3, max_new_tokens=12, eos_token_ids=())
    alone = [speculative_generate(pair, prompt, config) for prompt in prompts[:3]]
    for prompt, result in zip(prompts, alone):
        assert result.token_ids == hf_greedy(target, prompt, 12, eos_token_id=None)
        assert result.metrics.drafted > 0
    together = generate_batch(pair, prompts[:3], [config] * 3)
    assert [(r.token_ids, r.metrics.accepted) for r in together] == [(r.token_ids, r.metrics.accepted) for r in alone]


def test_compacting_a_head_cache_keeps_keys_and_values_of_different_widths(target):
    """An MLA layer caches keys of qk_nope + qk_rope and values of v_head_dim: the row cache gathers
    each row's valid columns of both (row_cache.RowCache.compact)."""
    from specreg.runtime.row_cache import RowCache

    head = mla_head(target, "no_q_lora_fc_norm")
    cache = RowCache(head.config, 2, torch.device("cpu"))
    keys, values = torch.randn(2, 4, 5, 16), torch.randn(2, 4, 5, 12)  # [b, heads, columns, width]
    cache.cache.update(keys, values, 0)
    cache.valid = torch.tensor([[True, False, True, True, False], [False, True, True, False, True]])
    cache.lengths = cache.valid.sum(dim=1)
    cache.compact()
    layer = cache.cache.layers[0]
    assert torch.equal(layer.keys[0], keys[0][:, [0, 2, 3]]) and torch.equal(layer.values[1], values[1][:, [1, 2, 4]])
