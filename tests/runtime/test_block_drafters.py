"""DFlash and DSpark block drafters in the runtime (runtime/methods/dflash.py, dspark.py): greedy
output identical to target-only decoding, token for token; every step's drafts equal a reference
forward written from speculators' model code over the whole verified sequence (so the cached
context keys and values, the batching and the rollback change nothing); a batch gives each row
what it gets alone, greedy and sampled; a saved head loads back and drafts the same."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from specreg.errors import RuntimeConfigError
from specreg.runtime import acceptance_rule
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.forward import forward_logits
from specreg.runtime.generate import speculative_generate, target_only_generate
from specreg.runtime.methods import load_pair
from specreg.runtime.methods.dflash import new_block_head, save_block_head
from specreg.runtime.pair import ModelPair

from helpers import hf_greedy  # tests/ is on sys.path (tests/conftest.py)

from .test_batch import assert_batch_equals_alone, row_configs

HEADS = {  # name -> (method, new_block_head options)
    "dflash": ("dflash", dict(block_size=4, aux_layer_ids=(1, 2))),
    "dflash causal, one target layer": ("dflash", dict(block_size=3, aux_layer_ids=(2,), causal=True, num_layers=2)),
    "dspark": ("dspark", dict(block_size=4, aux_layer_ids=(1, 2), markov_rank=8, sample_from_anchor=True)),
    "dspark bonus anchor": ("dspark", dict(block_size=5, aux_layer_ids=(0, 2), markov_rank=8)),
}


@pytest.fixture(scope="session")
def block_heads(target):
    """name -> (method, head): random heads whose weights are scaled up so that their drafts vary
    with the context (a near-zero random head drafts one token everywhere)."""
    vocab = int(target.get_output_embeddings().weight.shape[0])
    heads = {}
    for seed, (name, (method, options)) in enumerate(HEADS.items()):
        head = new_block_head(target, mask_token_id=vocab - 1, seed=seed, **options).eval()
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for key, parameter in head.named_parameters():
                if not key.startswith(("embed_tokens", "lm_head")):
                    parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
        heads[name] = (method, head)
    return heads


@pytest.fixture(scope="session")
def trained_block_head(target, tokenizer):
    """A DFlash head distilled from the tiny target for a few seconds (builders/demo_dflash.py's
    training), so that drafts are accepted and steps keep more than one token."""
    from tinymodels import CORPUS

    from specreg.builders.demo_dflash import train_block_head

    stream = torch.tensor(tokenizer("".join(CORPUS * 3), add_special_tokens=False)["input_ids"])
    vocab = int(target.get_output_embeddings().weight.shape[0])
    head = new_block_head(target, block_size=4, mask_token_id=vocab - 1, aux_layer_ids=(1, 2), seed=5)
    train_block_head(head, target, stream, steps=40, batch_size=4, anchors=8, seed=5, max_lr=1e-2)
    for parameter in target.parameters():
        parameter.requires_grad_(True)  # as the other session fixtures expect it
    return head


def test_a_trained_head_is_accepted_and_still_exact(target, tokenizer, prompts, trained_block_head):
    pair = pair_of(target, tokenizer, trained_block_head)
    config = DecodeConfig(method="dflash", k=3, max_new_tokens=32, eos_token_ids=())
    accepted = 0
    for prompt in prompts:
        result = speculative_generate(pair, prompt, config)
        assert result.token_ids == hf_greedy(target, prompt, 32, eos_token_id=None)
        accepted += result.metrics.accepted
        # per position as vLLM counts it: accepted at i / draft steps, never rising with i
        assert result.metrics.accepted_per_position == sorted(result.metrics.accepted_per_position, reverse=True)
    assert accepted > 0


def pair_of(target, tokenizer, head) -> ModelPair:
    return ModelPair(target, tokenizer, head, int(target.get_output_embeddings().weight.shape[0]))


@pytest.mark.parametrize("name", sorted(HEADS))
def test_greedy_output_is_target_only_token_for_token(target, tokenizer, prompts, block_heads, name):
    method, head = block_heads[name]
    pair = pair_of(target, tokenizer, head)
    for k in sorted({1, head.draft_length}):
        config = DecodeConfig(method=method, k=k, max_new_tokens=24, eos_token_ids=())
        for prompt in prompts[:2]:
            reference = hf_greedy(target, prompt, 24, eos_token_id=None)
            result = speculative_generate(pair, prompt, config)
            assert result.token_ids == reference
            # one block forward a draft step, none on the prefill (no target states before it)
            assert result.metrics.draft_forwards == result.metrics.draft_steps >= result.metrics.verify_steps - 2
            assert result.metrics.drafted <= k * result.metrics.draft_steps
            assert len(result.metrics.accepted_per_position) == k


def reference_drafts(head, target, sequence, k: int) -> list[int]:
    """Greedy drafts for the anchor sequence[-1], written from speculators' DFlash code
    (models/dflash/core.py _backbone_forward, model_definitions.py Qwen3DFlashAttention: keys and
    values of [fc(target states); block] in one attention, k_norm, then RoPE over the positions of
    both; eager softmax), and vLLM's DSpark Markov loop."""
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    with torch.inference_mode():
        _, hidden = forward_logits(target, sequence[:, :-1], DynamicCache(config=target.config), 1, head.aux_layer_ids)
        context = head.hidden_norm(head.fc(hidden))  # [1, C, H]
        C, B = context.shape[1], head.block_size
        block_ids = torch.full((1, B), head.block["mask_token_id"], dtype=torch.long)
        block_ids[0, 0] = sequence[0, -1]
        noise = head.embed_tokens(block_ids)
        cos, sin = head.rotary_emb(noise, torch.arange(C + B).view(1, -1))
        allowed = torch.ones(B, C + B, dtype=torch.bool)
        if head.block.get("causal"):
            allowed[:, C:] = torch.ones(B, B, dtype=torch.bool).tril()
        for layer in head.layers:
            attn, heads, kv, d = layer.self_attn, layer.heads, layer.kv_heads, layer.head_dim
            residual, h = noise, layer.input_layernorm(noise)
            q = attn.q_norm(attn.q_proj(h).view(1, B, heads, d)).transpose(1, 2)
            keys = attn.k_norm(torch.cat([attn.k_proj(context), attn.k_proj(h)], 1).view(1, C + B, kv, d)).transpose(1, 2)
            values = torch.cat([attn.v_proj(context), attn.v_proj(h)], 1).view(1, C + B, kv, d).transpose(1, 2)
            q, _ = apply_rotary_pos_emb(q, q, cos[:, C:], sin[:, C:])
            keys, _ = apply_rotary_pos_emb(keys, keys, cos, sin)
            keys, values = keys.repeat_interleave(heads // kv, 1), values.repeat_interleave(heads // kv, 1)
            scores = (q @ keys.transpose(2, 3)) * d ** -0.5
            weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
            noise = residual + attn.o_proj((weights @ values).transpose(1, 2).reshape(1, B, -1))
            noise = noise + layer.mlp(layer.post_attention_layernorm(noise))
        start = 0 if head.block["sample_from_anchor"] else 1
        logits = head.lm_head(head.norm(noise))[0, start:start + k]  # [k, V]
        drafts, previous = [], int(sequence[0, -1])
        for row in logits:
            if head.markov is not None:
                row = row + head.markov.markov_w2(head.markov.markov_w1(torch.tensor([previous])))[0]
            previous = int(row.argmax())
            drafts.append(previous)
        return drafts


@pytest.mark.parametrize("name", [*sorted(HEADS), "trained"])
def test_every_steps_drafts_equal_the_reference_forward_over_the_whole_sequence(target, tokenizer, prompts,
                                                                               block_heads, trained_block_head, name):
    method, head = block_heads[name] if name in block_heads else ("dflash", trained_block_head)
    pair = pair_of(target, tokenizer, head)
    k, grew = head.draft_length, False
    for prompt in (prompts if name == "trained" else prompts[1:2]):
        steps, generated = [], []

        def recording_rule(draft_token_ids, target_token_ids):
            num_accepted, emitted = acceptance_rule.greedy_accept(draft_token_ids, target_token_ids)
            steps.append((list(generated), draft_token_ids.tolist()))
            generated.extend(emitted.tolist())
            return num_accepted, emitted

        config = DecodeConfig(method=method, k=k, max_new_tokens=30, eos_token_ids=())
        result = speculative_generate(pair, prompt, config, greedy_rule=recording_rule)
        first = result.token_ids[:1]  # the prefill's token, which the rule does not see
        assert len(steps) >= 5
        # steps that kept several drafts: the context grew by more than one position at once
        grew |= any(len(after) - len(before) > 1 for (before, _), (after, _) in zip(steps, steps[1:]))
        for index, (before, drafts) in enumerate(steps):
            sequence = torch.tensor([list(prompt) + first + before])
            assert reference_drafts(head, target, sequence, len(drafts)) == drafts, f"step {index}"
    assert grew or name != "trained"


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_batch_equals_each_prompt_alone_with_drafts_accepted(target, tokenizer, prompts, trained_block_head, sampled):
    # random heads go through tests/runtime/test_batch.py and test_interleave.py with the other methods
    base = DecodeConfig(method="dflash", k=trained_block_head.draft_length, eos_token_ids=())
    batch = assert_batch_equals_alone(pair_of(target, tokenizer, trained_block_head), prompts,
                                      row_configs(base, sampled))
    assert sum(generation.metrics.accepted for generation in batch) > 0


@pytest.mark.parametrize("name", ["dflash", "dspark bonus anchor"])
def test_a_saved_head_loads_back_and_decodes_the_same(tmp_path, tiny_dir, target, tokenizer, prompts, block_heads,
                                                      name):
    method, head = block_heads[name]
    directory = save_block_head(head, tmp_path / "head", method, str(tiny_dir / "target"), ["LlamaForCausalLM"])
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as saved:
        # the identity over the whole vocabulary is left out: vLLM's loaders have no parameter for it
        # (engines/vllm.py BLOCK_D2T_REFUSAL)
        assert "d2t" not in saved.keys() and not head.d2t.any()
    loaded = load_pair(tiny_dir / "target", directory, method=method)
    config = DecodeConfig(method=method, k=head.draft_length, max_new_tokens=20, eos_token_ids=(),
                          temperature=0.9, seed=3)
    ours = speculative_generate(pair_of(target, tokenizer, head), prompts[0], config)
    theirs = speculative_generate(loaded, prompts[0], config)
    assert theirs.token_ids == ours.token_ids
    assert dataclasses.asdict(theirs.metrics)["accepted_per_position"] == ours.metrics.accepted_per_position


def test_a_k_longer_than_the_block_is_refused(target, tokenizer, block_heads):
    method, head = block_heads["dflash"]
    config = DecodeConfig(method=method, k=head.draft_length + 1, max_new_tokens=4, eos_token_ids=())
    with pytest.raises(RuntimeConfigError, match=r"k 4 exceeds the head's 3 drafts a block"):
        speculative_generate(pair_of(target, tokenizer, head), [1, 2, 3], config)


@pytest.mark.slow
def test_demo_head_build_then_reuse_the_cache(tiny_dir, prompts, tmp_path, monkeypatch):
    # the real budget takes minutes; the same code path with two steps, on the tiny target
    from specreg.builders import demo_dflash
    from specreg.core.heads import read_head

    monkeypatch.setattr(demo_dflash, "DFLASH_TRAINING", (2, 2))
    head_dir = demo_dflash.build_demo_dflash(tmp_path / "dflash", tiny_dir / "target")
    spec = read_head(head_dir, method="dflash")
    assert (spec.layout, spec.block["block_size"], spec.block["draft_length"], spec.aux_layer_ids) == \
        ("speculators", demo_dflash.DFLASH_BLOCK_SIZE, demo_dflash.DFLASH_BLOCK_SIZE - 1, (1, 2))
    pair = load_pair(tiny_dir / "target", head_dir, method="dflash")
    config = DecodeConfig(method="dflash", k=spec.block["draft_length"], max_new_tokens=12, eos_token_ids=())
    assert speculative_generate(pair, prompts[0], config).token_ids == target_only_generate(pair, prompts[0],
                                                                                            config).token_ids
    built_at = (head_dir / "model.safetensors").stat().st_mtime_ns
    assert demo_dflash.build_demo_dflash(tmp_path / "dflash", tiny_dir / "target") == head_dir
    assert (head_dir / "model.safetensors").stat().st_mtime_ns == built_at  # reused, not retrained
    # the same head in the engine-native layout beside it drafts the same tokens
    native = demo_dflash.native_dir(head_dir)
    assert read_head(native, method="dflash").layout == "dflash"  # z-lab's DFlashDraftModel + dflash_config
    native_pair = load_pair(tiny_dir / "target", native, method="dflash")
    ours, native_run = (speculative_generate(p, prompts[0], config) for p in (pair, native_pair))
    assert native_run.token_ids == ours.token_ids
    assert native_run.metrics.summary()["per_position_acceptance"] == ours.metrics.summary()["per_position_acceptance"]
