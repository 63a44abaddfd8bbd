"""MTP layers inside the target on the runtime: exact greedy equivalence (speculative == target-only
== HF generate), the module's formula read from the file's tensors, re-seeding after rollback,
the first layer drafting every step (as vLLM 0.33), sampling, the saved directory still loading as
the plain target, and targets refused in one line before any forward pass."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specreg.errors import ModelReferenceError, RuntimeConfigError
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.forward import forward_logits
from specreg.runtime.generate import speculative_generate, target_only_generate
from specreg.runtime.methods import load_pair

from headrollback import assert_drafts_equal_a_fresh_drafter  # tests/ is on sys.path (tests/conftest.py)

from helpers import hf_greedy  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture(scope="session")
def mtp_dirs(tiny_dir, target, tokenizer, tmp_path_factory):
    """name -> a copy of the tiny target with one MTP layer: random, and trained for a few seconds
    on the target's own states over the tokenizer's corpus (the random target's outputs are
    near-uniform, so acceptance stays modest: the demo is where high acceptance is shown)."""
    from tinymodels import CORPUS

    from specreg.builders.demo_medusa import target_states
    from specreg.builders.demo_mtp import train_mtp_head
    from specreg.runtime.methods.mtp import new_mtp_head, save_target_with_mtp

    root = tmp_path_factory.mktemp("mtp")
    stream = torch.tensor(tokenizer("".join(CORPUS * 3), add_special_tokens=False)["input_ids"])
    windows, hidden, probs = target_states(target, stream, 24, 48, seed=5)  # [24, 48], ...
    trained = new_mtp_head(target, seed=5)
    train_mtp_head(trained, windows, hidden.clone(), probs.clone(), steps=60, batch=4, seed=5, max_lr=1e-2,
                   ttt_steps=2)
    for parameter in target.parameters():
        parameter.requires_grad_(True)  # as the other session fixtures expect it
    return {"random": save_target_with_mtp(new_mtp_head(target, seed=4), tiny_dir / "target", root / "random"),
            "trained": save_target_with_mtp(trained, tiny_dir / "target", root / "trained")}


@pytest.fixture(scope="session")
def mtp_pairs(mtp_dirs):
    return {name: load_pair(path, method="mtp") for name, path in mtp_dirs.items()}


@pytest.mark.parametrize("name", ["random", "trained"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_mtp_equals_target_only_and_hf(target, mtp_pairs, prompts, name, k):
    pair = mtp_pairs[name]
    config = DecodeConfig(method="mtp", k=k, max_new_tokens=24, eos_token_ids=())
    for prompt in prompts[:3]:
        reference = hf_greedy(target, prompt, 24, eos_token_id=None)  # the plain target, HF generate
        assert target_only_generate(pair, prompt, config).token_ids == reference
        result = speculative_generate(pair, prompt, config)
        assert result.token_ids == reference
        # the prefill step drafts nothing (no target states yet); one MTP forward per draft after it
        assert result.metrics.draft_forwards == result.metrics.drafted
        assert 0 < result.metrics.drafted <= k * (result.metrics.verify_steps - 1)


def test_trained_mtp_is_accepted_more_than_random(mtp_pairs, prompts):
    config = DecodeConfig(method="mtp", k=3, max_new_tokens=40, eos_token_ids=())
    rates = {name: [speculative_generate(pair, prompt, config).metrics for prompt in prompts]
             for name, pair in mtp_pairs.items()}
    accepted = {name: sum(m.accepted for m in runs) / sum(m.drafted for m in runs) for name, runs in rates.items()}
    assert accepted["trained"] > accepted["random"] and accepted["trained"] > 0, accepted
    summary = rates["trained"][0].summary()
    assert len(summary["per_position_acceptance"]) == 3
    # tau as the engines count it: the prefill step drafts nothing (no target states yet) and is left out
    first = rates["trained"][0]
    assert first.draft_steps == first.verify_steps - 1
    assert summary["mean_acceptance_length"] == pytest.approx(1 + first.accepted / (first.verify_steps - 1))
    assert summary["tokens_per_target_forward"] == pytest.approx(1 + first.accepted / first.verify_steps)


def test_first_draft_follows_the_deepseek_formula_from_the_files_tensors(mtp_dirs, mtp_pairs, target, prompts):
    """The first draft, recomputed from the tensors as stored (model.layers.{N}.*): embedding zeroed at
    position 0, eh_proj(cat[enorm(embed(t_{i+1})), hnorm(h_i)]), the decoder layer, then the target's
    lm_head over shared_head.norm (vLLM 0.33 shares it)."""
    from safetensors.torch import load_file
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    from specreg.runtime.head_drafter import HeadDrafter
    from specreg.runtime.methods.base import DraftRequest

    layers = target.config.num_hidden_layers
    stored = {name[len(f"model.layers.{layers}."):]: value
              for name, value in load_file(mtp_dirs["trained"] / "model.safetensors").items()
              if name.startswith(f"model.layers.{layers}.")}
    assert {"eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight"} <= set(stored)
    block = LlamaDecoderLayer(target.config, layer_idx=0)
    block.load_state_dict({name: value for name, value in stored.items()
                           if not name.startswith(("eh_proj", "enorm", "hnorm", "shared_head"))})
    eps = target.config.rms_norm_eps

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    tokens = torch.tensor([prompts[0]])  # [1, n]
    with torch.inference_mode():
        states = target(input_ids=tokens, output_hidden_states=True).hidden_states[layers]  # [1, n, H] normed
        embeds = target.get_input_embeddings()(tokens[:, 1:])  # [1, n-1, H] t_1 .. t_{n-1}
        embeds[:, 0] = 0  # position 0
        projected = torch.cat([rms(embeds, stored["enorm.weight"]), rms(states[:, :-1], stored["hnorm.weight"])],
                              dim=-1) @ stored["eh_proj.weight"].T  # [1, n-1, H]
        positions = torch.arange(tokens.shape[1] - 1).view(1, -1)
        length = positions.shape[1]
        mask = torch.ones(length, length, dtype=torch.bool).tril().view(1, 1, length, length)
        out = block(projected, attention_mask=mask,
                    position_embeddings=LlamaRotaryEmbedding(target.config)(projected, positions))
        expected = target.lm_head(rms(out[:, -1], stored["shared_head.norm.weight"])).argmax(-1)  # [1]

        drafter = HeadDrafter(mtp_pairs["trained"].draft, mtp_pairs["trained"].vocab_size, [(0.0, None, None, None)])
        _, hidden = forward_logits(target, tokens[:, :-1], DynamicCache(config=target.config), 1,
                                   drafter.hidden_state_ids)
        drafter.rollback([tokens.shape[1] - 1], [hidden])
        request = DraftRequest(tokens, tokens[0].tolist(), 1)
        assert drafter.propose([request])[0].draft_token_ids.tolist() == expected.tolist()


def test_drafts_after_rollback_equal_a_drafter_seeded_from_scratch(mtp_pairs, prompts):
    """Every step's drafts equal those of a fresh drafter fed the whole verified sequence's target
    states at once: nothing of a rejected (or own-state) entry survives in the MTP cache."""
    assert_drafts_equal_a_fresh_drafter(mtp_pairs["trained"], "mtp", prompts[1])


def test_every_draft_step_runs_the_first_mtp_layer(mtp_dirs, prompts, tmp_path):
    """num_nextn_predict_layers = 2: both layers are loaded and checked, drafting runs layer N at
    every step (vLLM 0.33's proposer passes no spec_step_idx): the drafts equal the one-layer target's."""
    from safetensors.torch import load_file, save_file

    two = shutil.copytree(mtp_dirs["trained"], tmp_path / "two")
    config = json.loads((two / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config["num_nextn_predict_layers"] = 2
    (two / "config.json").write_text(json.dumps(config))
    weights = load_file(two / "model.safetensors")
    for name in [n for n in weights if n.startswith(f"model.layers.{layers}.")]:
        weights[name.replace(f"model.layers.{layers}.", f"model.layers.{layers + 1}.")] = torch.randn_like(
            weights[name])
    save_file(weights, str(two / "model.safetensors"), metadata={"format": "pt"})
    pair_two = load_pair(two, method="mtp")
    assert len(pair_two.draft.layers) == 2
    decode = DecodeConfig(method="mtp", k=3, max_new_tokens=24, eos_token_ids=())
    one = speculative_generate(load_pair(mtp_dirs["trained"], method="mtp"), prompts[0], decode).metrics
    both = speculative_generate(pair_two, prompts[0], decode).metrics
    assert (both.accepted, both.drafted, both.accepted_per_position) == \
        (one.accepted, one.drafted, one.accepted_per_position)


def test_sampling_runs_reproducibly_within_the_vocabulary(mtp_pairs, tokenizer, prompts):
    # drafts drawn from q: the tiny target's near-uniform p accepts few argmax drafts
    config = DecodeConfig(method="mtp", k=3, max_new_tokens=30, temperature=0.8, top_k=50, seed=7,
                          eos_token_ids=(), draft_sampling="probabilistic")
    first = speculative_generate(mtp_pairs["trained"], prompts[2], config)
    assert len(first.token_ids) == 30 and max(first.token_ids) < len(tokenizer)
    assert first.metrics.drafted > 0 and 0 < first.metrics.acceptance_rate <= 1
    assert speculative_generate(mtp_pairs["trained"], prompts[2], config).token_ids == first.token_ids


def test_the_directory_still_loads_as_the_plain_target(mtp_dirs, tiny_dir, prompts):
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_dir / "target", use_safetensors=True)
    with_mtp = AutoModelForCausalLM.from_pretrained(mtp_dirs["trained"], use_safetensors=True)
    assert with_mtp.config.num_nextn_predict_layers == 1
    tokens = torch.tensor([prompts[3]])
    with torch.inference_mode():
        assert torch.equal(plain(input_ids=tokens).logits, with_mtp(input_ids=tokens).logits)


def one_line_message(exc) -> str:
    """The message of a raised error (pytest.raises' ExceptionInfo), asserted to be one line."""
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_targets_the_runtime_cannot_run_are_refused_in_one_line(mtp_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    from headfiles import HIDDEN, LAYERS, write_target

    # num_nextn_predict_layers but no tensor of the layer (a checkpoint saved without it)
    bare = shutil.copytree(mtp_dirs["trained"], tmp_path / "bare")
    weights = load_file(bare / "model.safetensors")
    layers = json.loads((bare / "config.json").read_text())["num_hidden_layers"]
    save_file({n: v for n, v in weights.items() if not n.startswith(f"model.layers.{layers}.")},
              str(bare / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelReferenceError) as exc:
        load_pair(bare, method="mtp")
    assert f"no tensor under model.layers.{layers}." in one_line_message(exc)

    # its projection missing: refused where the layers are read (specreg.core.heads.mtp_checkpoint,
    # as at registration)
    no_projection = shutil.copytree(mtp_dirs["trained"], tmp_path / "no-projection")
    save_file({n: v for n, v in weights.items() if not n.endswith("eh_proj.weight")},
              str(no_projection / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelReferenceError) as exc:
        load_pair(no_projection, method="mtp")
    assert f"has no model.layers.{layers}.eh_proj.weight: vLLM 0.33 builds it" in one_line_message(exc)

    # some of its decoder layer's tensors missing
    partial = shutil.copytree(mtp_dirs["trained"], tmp_path / "partial")
    save_file({n: v for n, v in weights.items() if not n.endswith(f"{layers}.mlp.up_proj.weight")},
              str(partial / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RuntimeConfigError) as exc:
        load_pair(partial, method="mtp")
    assert f"model.layers.{layers}.mlp.up_proj.weight" in one_line_message(exc) and "lacks" in one_line_message(exc)

    # a tensor of the wrong shape
    wide = shutil.copytree(mtp_dirs["trained"], tmp_path / "wide")
    bad = dict(weights)
    bad[f"model.layers.{layers}.enorm.weight"] = torch.zeros(3)
    save_file(bad, str(wide / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RuntimeConfigError, match=r"enorm.weight has shape \[3\]") as exc:
        load_pair(wide, method="mtp")
    one_line_message(exc)

    # families whose MTP block is not a Llama layer: refused from config.json, before any weight loads
    for model_type, layout in (("deepseek_v3", "mtp:deepseek"), ("qwen3_next", "mtp:qwen3_next")):
        extra = {f"model.layers.{LAYERS}.{name}": np.zeros((HIDDEN, 2 * HIDDEN) if name == "eh_proj.weight" else 4,
                                                            np.float32)
                 for name in ("eh_proj.weight", "enorm.weight", "hnorm.weight")}  # the DeepSeek naming
        extra.update({name: np.zeros((HIDDEN, 2 * HIDDEN) if name == "mtp.fc.weight" else 4, np.float32)  # Qwen3-Next's
                      for name in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight",
                                   "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.mlp.gate.weight")})
        other = write_target(tmp_path / model_type, config_extra={"model_type": model_type,
                                                                   "num_nextn_predict_layers": 1},
                             extra_tensors=extra)
        with pytest.raises(RuntimeConfigError) as exc:
            load_pair(other, method="mtp")
        assert f"model_type {model_type!r} ({layout} layers)" in one_line_message(exc)

    # a draft directory has no meaning for mtp; the target's MTP head is not a draft model
    with pytest.raises(RuntimeConfigError, match="no draft directory"):
        load_pair(mtp_dirs["trained"], mtp_dirs["random"], method="mtp")
