"""P-EAGLE heads in the runtime (runtime/methods/peagle.py): greedy output identical to target-only
decoding, token for token; every step's k drafts equal a reference forward written from vLLM 0.33's
parallel-drafting code over the whole verified sequence; acceptance counted per position as vLLM
counts it; each sampled slot drawn from that slot's distribution; a batch gives each row what it
gets alone; a saved head loads back and decodes the same."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specreg.errors import ModelReferenceError, RuntimeConfigError
from specreg.runtime import acceptance_rule
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.generate import speculative_generate
from specreg.runtime.forward import forward_logits
from specreg.runtime.methods import load_pair
from specreg.runtime.methods.peagle import new_peagle_head, save_peagle_head
from specreg.runtime.pair import ModelPair
from specreg.runtime.sampling import logits_to_probs

from helpers import hf_greedy  # tests/ is on sys.path (tests/conftest.py)

from .test_batch import assert_batch_equals_alone, row_configs


def trained_peagle(target, prompts, depths: int = 4, steps: int = 120, seed: int = 7):
    """A P-EAGLE head distilled from the tiny target in a few seconds, as speculators trains one
    (models/peagle/core.py: depth 0 reads the real token and the target's state, depth d >= 1 the mask
    token and mask_hidden at anchor + d, each depth labelled with the token there), on the target's
    own greedy continuations: its drafts past the first are accepted too."""
    from specreg.builders.demo_pair import OneCycleAdamW

    vocab = int(target.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    starts = [list(prompt) for prompt in prompts] + [torch.randint(4, vocab, (5,), generator=generator).tolist()
                                                     for _ in range(12)]
    sequences = [torch.tensor(start + hf_greedy(target, start, 40)) for start in starts]
    head = new_peagle_head(target, mask_token_id=vocab - 1, seed=seed)
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    trainable = [p for name, p in head.named_parameters() if not name.startswith("embed_tokens")]
    head.mask_hidden.requires_grad_(True)
    optimizer = OneCycleAdamW([*trainable, head.mask_hidden], steps, 1e-2)
    head.train()
    for _ in range(steps):
        rows = [sequences[i] for i in torch.randint(0, len(sequences), (8,), generator=generator).tolist()]
        anchor = int(torch.randint(2, min(len(row) for row in rows) - depths - 1, (1,), generator=generator))
        batch = torch.stack([row[:anchor + depths + 2] for row in rows])  # [8, anchor + depths + 2]
        with torch.no_grad():
            _, aux = forward_logits(target, batch[:, :anchor + 1], DynamicCache(config=target.config), 1,
                                    head.hidden_state_ids)
        masks = head.mask_hidden.expand(len(rows), depths - 1, -1)
        hidden = head.project(torch.cat([aux, masks], dim=1))
        ids = torch.cat([batch[:, 1:anchor + 2], torch.full((len(rows), depths - 1), head.mask_token_id)], dim=1)
        output = head(ids, hidden, None, 0, position_ids=torch.arange(ids.shape[1]).view(1, -1))
        logits = head.draft_logits(output.reshape(-1, output.shape[-1])).view(len(rows), ids.shape[1], -1)
        labels = batch[:, 2:]  # slot j (token x_{j+1}, or a mask at depth j - anchor) predicts x_{j+2}
        optimizer.step(torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels))
    for parameter in target.parameters():
        parameter.requires_grad_(True)  # as the other session fixtures expect it
    head.mask_hidden.requires_grad_(False)
    return head.eval()


def scaled_up(head, seed: int):
    """Random weights scaled up, so that the drafts vary with the context (a near-zero random head
    drafts one token everywhere)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if not name.startswith("embed_tokens"):
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return head.eval()


@pytest.fixture(scope="module")
def peagle_heads(target, prompts):
    vocab = int(target.config.vocab_size)
    return {
        "trained": trained_peagle(target, prompts),
        "random, odd-id draft vocabulary": scaled_up(new_peagle_head(target, mask_token_id=3, seed=8,
                                                                     draft_token_ids=range(1, vocab, 2)), 8),
        "two layers, norm_before_fc, aux (1, 3)": scaled_up(new_peagle_head(
            target, mask_token_id=vocab - 1, seed=9, num_layers=2, norm_before_fc=True, aux_layer_ids=(1, 3)), 9),
    }


def pair_of(target, tokenizer, head) -> ModelPair:
    return ModelPair(target, tokenizer, head, int(target.get_output_embeddings().weight.shape[0]))


def reference_logits(head, target, sequence, k: int):
    """The head's logits at the k drafting slots for the verified `sequence` # [1, n], written from
    vLLM 0.33's parallel drafting (v1/spec_decode/utils.py copy_and_expand_eagle_inputs_kernel,
    llm_base_proposer.py set_inputs_first_pass; model_executor/models/llama_eagle3.py): one forward
    over all n - 1 verified entries (token x_{j+1} at position j with the target's state at j,
    fc-projected), then k - 1 slots of mask_token_id at the next positions with fc(mask_hidden),
    causal attention, no cache; the slots sampled are the last verified one and the k - 1 after it."""
    with torch.inference_mode():
        _, aux = forward_logits(target, sequence[:, :-1], DynamicCache(config=target.config), 1,
                                head.hidden_state_ids)  # [1, n-1, A*H]
        mask_hidden = head.mask_hidden.view(1, 1, -1).expand(1, k - 1, -1)
        hidden = head.project(torch.cat([aux, mask_hidden], dim=1))  # combine_hidden_states
        ids = torch.cat([sequence[:, 1:], torch.full((1, k - 1), head.mask_token_id)], dim=1)
        length = ids.shape[1]
        positions = torch.arange(length).view(1, -1)  # start_pos + j, the prompt starting at 0
        cos, sin = head.rotary_emb(hidden, positions)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        residual = None
        for index, layer in enumerate(head.layers):
            if index == 0:  # LlamaDecoderLayer.forward, layer_idx 0
                normed = layer.hidden_norm(hidden)
                residual = normed if layer.norm_before_residual else hidden
                x = torch.cat([layer.input_layernorm(head.embed_tokens(ids)), normed], dim=-1)
            else:
                residual = hidden
                x = layer.input_layernorm(hidden)
            attn = layer.self_attn
            heads_, kv, d = head.config.num_attention_heads, head.config.num_key_value_heads, head.config.head_dim
            q = attn.q_proj(x).view(1, length, heads_, d).transpose(1, 2)
            keys = attn.k_proj(x).view(1, length, kv, d).transpose(1, 2)
            values = attn.v_proj(x).view(1, length, kv, d).transpose(1, 2)
            q, keys = apply_rotary_pos_emb(q, keys, cos, sin)
            keys, values = keys.repeat_interleave(heads_ // kv, 1), values.repeat_interleave(heads_ // kv, 1)
            scores = (q @ keys.transpose(2, 3)) * d ** -0.5
            weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            hidden = residual + attn.o_proj((weights @ values).transpose(1, 2).reshape(1, length, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        slots = hidden[0, length - k:]  # [k, H]
        return head.draft_logits(slots)[:, : int(target.get_output_embeddings().weight.shape[0])]  # [k, V]


def recording(steps: list, generated: list):
    """A greedy rule that records, per step, the tokens emitted before it, its drafts and how many
    of them the target accepted."""
    def rule(draft_token_ids, target_token_ids):
        num_accepted, emitted = acceptance_rule.greedy_accept(draft_token_ids, target_token_ids)
        steps.append((list(generated), draft_token_ids.tolist(), int(num_accepted)))
        generated.extend(emitted.tolist())
        return num_accepted, emitted
    return rule


HEADS = ["trained", "random, odd-id draft vocabulary", "two layers, norm_before_fc, aux (1, 3)"]


@pytest.mark.parametrize("name", HEADS)
def test_greedy_output_is_target_only_and_each_steps_drafts_are_the_reference(target, tokenizer, prompts,
                                                                              peagle_heads, name):
    head = peagle_heads[name]
    pair = pair_of(target, tokenizer, head)
    for k, prompt in ((1, prompts[0]), (3, prompts[1]), (5, prompts[2])):
        steps: list = []
        config = DecodeConfig(method="peagle", k=k, max_new_tokens=24, eos_token_ids=())
        result = speculative_generate(pair, prompt, config, greedy_rule=recording(steps, []))
        assert result.token_ids == hf_greedy(target, prompt, 24, eos_token_id=None)
        # one head forward a draft step, whatever k; none on the prefill (no target states before it)
        assert result.metrics.draft_forwards == result.metrics.draft_steps == len(steps)
        first = result.token_ids[:1]  # the prefill's token, which the rule does not see
        for index, (before, drafts, _) in enumerate(steps):
            sequence = torch.tensor([list(prompt) + first + before])
            reference = reference_logits(head, target, sequence, len(drafts)).argmax(-1).tolist()
            assert reference == drafts, f"k {k}, step {index}"


def test_acceptance_is_counted_per_position_as_vllm_counts_it(target, tokenizer, prompts, peagle_heads):
    pair = pair_of(target, tokenizer, peagle_heads["trained"])
    k, accepted, grew = 4, [0] * 4, False
    config = DecodeConfig(method="peagle", k=k, max_new_tokens=40, eos_token_ids=())
    for prompt in prompts:
        steps: list = []
        metrics = speculative_generate(pair, prompt, config, greedy_rule=recording(steps, [])).metrics
        counts = [num for _, drafts, num in steps if drafts]
        # vLLM's per-position counter: position i counts the steps whose first i + 1 drafts were accepted
        assert metrics.accepted_per_position == [sum(num > i for num in counts) for i in range(k)]
        assert metrics.accepted == sum(counts) and metrics.draft_steps == len(counts)
        accepted = [a + b for a, b in zip(accepted, metrics.accepted_per_position)]
        grew |= any(num > 1 for num in counts)
    assert accepted[0] > 0 and grew  # steps kept several tokens: the head's cache grew by several at once


def test_each_sampled_draft_is_drawn_from_its_slots_distribution(target, tokenizer, prompts, peagle_heads):
    head = peagle_heads["random, odd-id draft vocabulary"]
    steps, generated = [], []

    def rule(draft_probs, target_probs, draft_token_ids, uniforms, generator=None):
        num_accepted, emitted = acceptance_rule.rejection_sample(draft_probs, target_probs, draft_token_ids, uniforms,
                                                                 generator)
        steps.append((list(generated), draft_token_ids.tolist(), draft_probs.clone()))
        generated.extend(emitted.tolist())
        return num_accepted, emitted

    config = DecodeConfig(method="peagle", k=3, max_new_tokens=20, eos_token_ids=(), temperature=0.8, top_k=40,
                          seed=5, draft_sampling="probabilistic")
    result = speculative_generate(pair_of(target, tokenizer, head), prompts[0], config, acceptance_rule=rule)
    first = result.token_ids[:1]
    assert len(steps) >= 5
    for before, drafts, draft_probs in steps:
        sequence = torch.tensor([list(prompts[0]) + first + before])
        expected = logits_to_probs(reference_logits(head, target, sequence, len(drafts)), 0.8, 40)  # [k, V]
        torch.testing.assert_close(draft_probs, expected, atol=1e-5, rtol=1e-4)
        assert all(expected[slot, token] > 0 for slot, token in enumerate(drafts))
        assert all(token % 2 == 1 for token in drafts)  # the draft vocabulary's ids only (d2t)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_batch_equals_each_prompt_alone_with_drafts_accepted(target, tokenizer, prompts, peagle_heads, sampled):
    # sampled rows draw their drafts from q: the random-looking target accepts few argmax drafts
    base = DecodeConfig(method="peagle", k=3, eos_token_ids=(), draft_sampling="probabilistic")
    batch = assert_batch_equals_alone(pair_of(target, tokenizer, peagle_heads["trained"]), prompts,
                                      row_configs(base, sampled))
    assert sum(generation.metrics.accepted for generation in batch) > 0


def test_a_saved_head_loads_back_and_decodes_the_same(tmp_path, tiny_dir, target, tokenizer, prompts, peagle_heads):
    head = peagle_heads["two layers, norm_before_fc, aux (1, 3)"]
    directory = save_peagle_head(head, tmp_path / "head", str(tiny_dir / "target"), ["LlamaForCausalLM"])
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as saved:
        assert list(saved.get_tensor("mask_hidden").shape) == [1, 1, 2 * 64]  # speculators' shape
    loaded = load_pair(tiny_dir / "target", directory, method="peagle")
    assert loaded.draft.mask_token_id == head.mask_token_id
    config = DecodeConfig(method="peagle", k=4, max_new_tokens=20, eos_token_ids=(), temperature=0.9, seed=3)
    ours = speculative_generate(pair_of(target, tokenizer, head), prompts[0], config)
    theirs = speculative_generate(loaded, prompts[0], config)
    assert theirs.token_ids == ours.token_ids
    assert dataclasses.asdict(theirs.metrics)["accepted_per_position"] == ours.metrics.accepted_per_position
    with pytest.raises(ModelReferenceError, match="holds peagle head"):
        load_pair(tiny_dir / "target", directory, method="eagle3")


def test_a_tree_is_refused(target, tokenizer, prompts, peagle_heads):
    # the descriptor says tree "never": vLLM's parallel drafting proposes one chain
    config = DecodeConfig(method="peagle", k=2, max_new_tokens=4, tree=((0,), (1,), (0, 0)))
    with pytest.raises(RuntimeConfigError, match="a candidate tree applies to .*not 'peagle'"):
        speculative_generate(pair_of(target, tokenizer, peagle_heads["trained"]), prompts[0], config)


def test_the_demo_builders_training_forward_lays_each_anchor_out_as_vllm_drafts(target, prompts, peagle_heads):
    # builders/demo_peagle.py trains many anchors in one forward: each anchor's slots must see what
    # vLLM's drafting step over the sequence up to that anchor sees (reference_logits)
    from specreg.builders.demo_peagle import parallel_forward

    head, depths, anchors = peagle_heads["random, odd-id draft vocabulary"], 4, [0, 3, 8]
    sequence = torch.tensor([list(prompts[1]) + hf_greedy(target, prompts[1], 14 - len(prompts[1]))])  # [1, 14]
    length = sequence.shape[1] - 1
    with torch.inference_mode():
        _, aux = forward_logits(target, sequence, DynamicCache(config=target.config), 1, head.hidden_state_ids)
        states, label_at = parallel_forward(head, sequence, aux, anchors, depths)  # [1, Q, H], [Q]
        vocab = int(target.get_output_embeddings().weight.shape[0])
        for index, anchor in enumerate(anchors):
            slots = [anchor, *range(length + index * (depths - 1), length + (index + 1) * (depths - 1))]
            logits = head.draft_logits(states[0, slots])[:, :vocab]  # [depths, V]
            expected = reference_logits(head, target, sequence[:, :anchor + 2], depths)
            torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
            # slot d predicts the token after position anchor + d + 1: x_{anchor + d + 2}
            assert label_at[slots].tolist() == [anchor + 1 + d for d in range(depths)]
    assert label_at[:length].tolist() == list(range(1, length + 1))


@pytest.mark.slow
def test_demo_head_build_then_reuse_the_cache(tiny_dir, prompts, tmp_path, monkeypatch):
    # the real budget takes a CPU-minute; the same code path with two steps, on the tiny target
    from specreg.builders import demo_peagle
    from specreg.core.heads import read_head
    from specreg.runtime.generate import target_only_generate

    monkeypatch.setattr(demo_peagle, "PEAGLE_TRAINING", (2, 2))
    head_dir = demo_peagle.build_demo_peagle(tmp_path / "peagle", tiny_dir / "target")
    spec = read_head(head_dir, method="peagle")
    pair = load_pair(tiny_dir / "target", head_dir, method="peagle")
    assert spec.method == "peagle" and spec.parallel == {"mask_token_id": pair.draft.mask_token_id}
    config = DecodeConfig(method="peagle", k=demo_peagle.PEAGLE_K, max_new_tokens=12, eos_token_ids=())
    assert speculative_generate(pair, prompts[0], config).token_ids == target_only_generate(pair, prompts[0],
                                                                                            config).token_ids
    built_at = (head_dir / "model.safetensors").stat().st_mtime_ns
    assert demo_peagle.build_demo_peagle(tmp_path / "peagle", tiny_dir / "target") == head_dir
    assert (head_dir / "model.safetensors").stat().st_mtime_ns == built_at  # reused, not retrained
