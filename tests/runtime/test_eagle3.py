"""EAGLE-3 heads on the runtime: exact greedy equivalence, re-seeding after rollback, sampling,
the speculators / original EAGLE layouts, and heads refused before any forward pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specreg.errors import RuntimeConfigError, SpecregError
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.forward import forward_logits
from specreg.runtime.generate import speculative_generate, target_only_generate
from specreg.runtime.methods import load_pair
from specreg.runtime.pair import ModelPair

from headrollback import assert_drafts_equal_a_fresh_drafter  # tests/ is on sys.path (tests/conftest.py)

from helpers import hf_greedy  # tests/ is on sys.path (tests/conftest.py)


def head_pair(target, tokenizer, head) -> ModelPair:
    return ModelPair(target=target, tokenizer=tokenizer, draft=head,
                     vocab_size=int(target.get_output_embeddings().weight.shape[0]))


@pytest.fixture(scope="session")
def heads(target, tokenizer):
    """name -> Eagle3Head for the tiny target: random over an odd-id draft vocabulary (a real d2t
    map), and one distilled from the target for a few seconds over the tokenizer's corpus (the
    random target's outputs are near-uniform and off that corpus, so its acceptance stays low:
    the demo head is where high acceptance is shown)."""
    from tinymodels import CORPUS

    from specreg.builders import demo_heads
    from specreg.runtime.methods.eagle3 import new_eagle3_head

    stream = torch.tensor(tokenizer("".join(CORPUS * 3), add_special_tokens=False)["input_ids"])
    vocab = len(tokenizer)
    trained = new_eagle3_head(target, demo_heads.frequent_tokens(stream, vocab // 2), seed=5)
    demo_heads.train_eagle3_head(trained, target, stream, steps=60, batch_size=4, seed=5, max_lr=1e-2)
    for parameter in target.parameters():
        parameter.requires_grad_(True)  # as the other session fixtures expect it
    return {"random": new_eagle3_head(target, range(1, vocab, 2), seed=4), "trained": trained}


@pytest.mark.parametrize("head_name", ["random", "trained"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_eagle3_equals_target_only_and_hf(target, tokenizer, heads, prompts, head_name, k):
    pair = head_pair(target, tokenizer, heads[head_name])
    config = DecodeConfig(method="eagle3", k=k, max_new_tokens=24, eos_token_ids=())
    for prompt in prompts[:3]:
        reference = hf_greedy(target, prompt, 24, eos_token_id=None)
        assert target_only_generate(pair, prompt, config).token_ids == reference
        result = speculative_generate(pair, prompt, config)
        assert result.token_ids == reference
        # the first step is the prefill alone (no aux states yet); one head forward per draft after it
        assert result.metrics.draft_forwards == result.metrics.drafted
        assert result.metrics.drafted <= k * (result.metrics.verify_steps - 1)


def test_trained_head_is_accepted_and_metrics_come_out_as_for_draft_models(target, tokenizer, heads, prompts):
    pair = head_pair(target, tokenizer, heads["trained"])
    config = DecodeConfig(method="eagle3", k=3, max_new_tokens=40, eos_token_ids=())
    random_rate = speculative_generate(head_pair(target, tokenizer, heads["random"]), prompts[0],
                                       config).metrics.acceptance_rate
    metrics = speculative_generate(pair, prompts[0], config).metrics
    summary = metrics.summary()
    assert summary["acceptance_rate"] > random_rate and metrics.accepted > 0
    # the prefill step drafts nothing (no target states yet): tau (engines) leaves it out, ours counts it
    assert metrics.draft_steps == metrics.verify_steps - 1
    assert summary["mean_acceptance_length"] == pytest.approx(1 + metrics.accepted / (metrics.verify_steps - 1))
    assert summary["tokens_per_target_forward"] == pytest.approx(1 + metrics.accepted / metrics.verify_steps)
    assert len(summary["per_position_acceptance"]) == 3
    assert summary["per_position_acceptance"][0] >= summary["per_position_acceptance"][2]


def test_drafts_after_rollback_equal_a_head_seeded_from_scratch(target, tokenizer, heads, prompts):
    """Rollback: every step's drafts equal those of a fresh drafter fed the whole verified sequence's
    target states at once, so nothing of a rejected (or own-state) entry survives in the head cache."""
    assert_drafts_equal_a_fresh_drafter(head_pair(target, tokenizer, heads["trained"]), "eagle3", prompts[1])


def test_sampling_runs_reproducibly_within_the_vocabulary(target, tokenizer, heads, prompts):
    pair = head_pair(target, tokenizer, heads["trained"])
    # drafts drawn from q: the tiny target's near-uniform p accepts few argmax drafts
    config = DecodeConfig(method="eagle3", k=3, max_new_tokens=30, temperature=0.8, top_k=50, seed=7,
                          eos_token_ids=(), draft_sampling="probabilistic")
    first = speculative_generate(pair, prompts[2], config)
    assert len(first.token_ids) == 30 and max(first.token_ids) < len(tokenizer)
    assert 0 < first.metrics.acceptance_rate <= 1
    assert speculative_generate(pair, prompts[2], config).token_ids == first.token_ids
    # a draft outside the draft vocabulary has q = 0: the random head drafts only odd ids
    odd = speculative_generate(head_pair(target, tokenizer, heads["random"]), prompts[2],
                               DecodeConfig(method="eagle3", k=2, max_new_tokens=20, temperature=1.0, seed=3,
                                            eos_token_ids=(), draft_sampling="probabilistic"))
    assert len(odd.token_ids) == 20


def save_head(head, directory, **changes):
    """Save `head`, then apply `changes` to its config ('config.key') or weights ('weights.name')."""
    from safetensors.torch import load_file, save_file

    from specreg.runtime.methods.eagle3 import save_eagle3_head

    save_eagle3_head(head, directory, "tiny-target", ["LlamaForCausalLM"])
    config = json.loads((directory / "config.json").read_text())
    weights = load_file(directory / "model.safetensors")
    for key, value in changes.items():
        kind, name = key.split("__", 1)
        if kind == "config":
            config[name] = value
        else:
            weights[name] = value
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"))
    return directory


def test_speculators_directory_round_trip_and_load_pair(tiny_dir, target, tokenizer, heads, prompts, tmp_path):
    head = heads["trained"]
    directory = save_head(head, tmp_path / "head")
    config = json.loads((directory / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["verifier"] == {"name_or_path": "tiny-target",
                                                        "architectures": ["LlamaForCausalLM"]}
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # (2, N//2, N-3) for N = 3, in layer order
    assert config["draft_vocab_size"] == head.lm_head.weight.shape[0]
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight", "layers.0.hidden_norm.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names and "embed_tokens.weight" not in names
    pair = load_pair(tiny_dir / "target", directory, method="eagle3")
    config = DecodeConfig(method="eagle3", k=3, max_new_tokens=20, eos_token_ids=())
    loaded = speculative_generate(pair, prompts[0], config)
    original = speculative_generate(head_pair(target, tokenizer, head), prompts[0], config)
    assert loaded.token_ids == original.token_ids
    assert loaded.metrics.accepted == original.metrics.accepted


def test_original_eagle_layout_loads_the_same_head(tiny_dir, target, tokenizer, heads, prompts, tmp_path):
    """SafeAILab's layout: a LlamaConfig-style config.json and midlayer.* weights (vLLM maps them)."""
    from safetensors.torch import load_file, save_file

    head = heads["trained"]
    speculators = save_head(head, tmp_path / "speculators")
    config = json.loads((speculators / "config.json").read_text())
    original = tmp_path / "original"
    original.mkdir()
    layer = dict(config["transformer_layer_config"], architectures=["LlamaForCausalLMEagle3"],
                 draft_vocab_size=config["draft_vocab_size"])
    (original / "config.json").write_text(json.dumps(layer))
    weights = {name.replace("layers.0.", "midlayer."): value
               for name, value in load_file(speculators / "model.safetensors").items()}
    save_file(weights, str(original / "model.safetensors"))
    pair = load_pair(tiny_dir / "target", original, method="eagle3")
    # the verifier's default (2, 1, 0) for 3 layers, collected in layer order as vLLM does
    assert pair.draft.aux_layer_ids == (0, 1, 2)
    for name, value in head.state_dict().items():
        assert torch.equal(pair.draft.state_dict()[name], value), name


# the head's own consistency and its vocabulary map are refused with registration's messages
# (specreg.core.heads, one reader); what only this runtime cannot run, with the runtime's
@pytest.mark.parametrize("change, reason", [
    ("d2t_out_of_range", r"vocabulary map: d2t maps 150 draft id\(s\) outside the target's 300 ids"),
    ("d2t_not_one_to_one", "vocabulary map: d2t is not one to one: draft ids 0 and 1 both map to target id 1"),
    ("other_hidden_size", r"tensor fc.weight has shape \[64, 96\], expected \[64, 192\]"),
    ("aux_out_of_range", r"eagle_aux_hidden_state_layer_ids \[1, 3, 7\] out of range on a 3-layer target "
                         r"\(each must be in 0..3\)"),
    ("draft_vocab_mismatch", r"tensor lm_head.weight has shape \[150, 64\], expected \[7, 64\]"),
    ("target_width", "head is for hidden size 32 .* target hidden_size is 64"),
])
def test_mismatched_heads_are_refused_before_any_forward(target, heads, tmp_path, change, reason):
    from specreg.runtime.methods.eagle3 import load_eagle3_head

    head = heads["random"]
    d2t = head.d2t.clone()
    changes = {
        "d2t_out_of_range": {"weights__d2t": d2t + 10_000},
        "d2t_not_one_to_one": {"weights__d2t": torch.cat([d2t[:1], d2t[:1] - 1, d2t[2:]])},
        "other_hidden_size": {"weights__fc.weight": torch.zeros(64, 3 * 32)},
        "aux_out_of_range": {"config__eagle_aux_hidden_state_layer_ids": [1, 3, 7]},
        "draft_vocab_mismatch": {"config__draft_vocab_size": 7},
        "target_width": {"weights__fc.weight": torch.zeros(64, 3 * 32), "config__target_hidden_size": 32},
    }[change]
    directory = save_head(head, tmp_path / change, **changes)
    calls = []
    hook = target.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(SpecregError, match=reason) as error:
            load_eagle3_head(directory, target)
    finally:
        hook.remove()
    assert calls == [] and "\n" not in str(error.value)


def test_eagle3_method_needs_a_head(target, tokenizer, drafts, prompts):
    pair = ModelPair(target=target, tokenizer=tokenizer, draft=drafts["random"], vocab_size=len(tokenizer))
    with pytest.raises(RuntimeConfigError, match="needs an EAGLE-3 head"):
        speculative_generate(pair, prompts[0], DecodeConfig(method="eagle3", k=2, max_new_tokens=4))


def test_demo_head_build_then_reuse_the_cache(tiny_dir, prompts, tmp_path, monkeypatch):
    # the real budget takes minutes; the same code path with two steps, on the tiny target
    from specreg.builders import demo_heads

    monkeypatch.setattr(demo_heads, "EAGLE3_TRAINING", (2, 2))
    head_dir = demo_heads.build_demo_head(tmp_path, "eagle3", target_dir=tiny_dir / "target")
    assert head_dir == tmp_path / "eagle3"
    config = json.loads((head_dir / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["verifier"]["name_or_path"] == str((tiny_dir / "target").resolve())
    assert config["draft_vocab_size"] == 300  # fewer ids than EAGLE3_DRAFT_VOCAB: all of them
    pair = load_pair(tiny_dir / "target", head_dir, method="eagle3")
    result = speculative_generate(pair, prompts[0], DecodeConfig(method="eagle3", k=2, max_new_tokens=6))
    assert 1 <= len(result.token_ids) <= 6
    built_at = (head_dir / "model.safetensors").stat().st_mtime_ns
    assert demo_heads.build_demo_head(tmp_path, "eagle3", target_dir=tiny_dir / "target") == head_dir
    assert (head_dir / "model.safetensors").stat().st_mtime_ns == built_at  # reused, not retrained
    monkeypatch.setattr(demo_heads, "EAGLE3_TRAINING", (3, 2))
    assert demo_heads.head_cache_key("eagle3", tiny_dir / "target") != json.loads(
        (head_dir / "demo-head.json").read_text())["cache_key"]  # a changed budget is a different head
    with pytest.raises(RuntimeConfigError, match="only 'eagle3'"):
        demo_heads.build_demo_head(tmp_path, "medusa", target_dir=tiny_dir / "target")


# ---- EAGLE-3 with a static candidate tree (top-k at every node), verified in one target forward ----

EAGLE_TREES = {
    "chain": ((0,), (0, 0), (0, 0, 0)),
    "eagle": ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)),
}


@pytest.mark.parametrize("head_name", ["random", "trained"])
@pytest.mark.parametrize("tree_name", list(EAGLE_TREES))
def test_greedy_eagle3_tree_equals_target_only_and_hf(target, tokenizer, heads, prompts, head_name, tree_name):
    pair = head_pair(target, tokenizer, heads[head_name])
    paths = EAGLE_TREES[tree_name]
    config = DecodeConfig(method="eagle3", k=3, tree=paths, max_new_tokens=24, eos_token_ids=())
    for prompt in prompts[:3]:
        result = speculative_generate(pair, prompt, config)
        assert result.token_ids == hf_greedy(target, prompt, 24, eos_token_id=None)
        assert len(result.metrics.per_position_acceptance) <= 3  # per depth


def test_tree_drafts_equal_sequential_drafting_along_each_path(target, tokenizer, heads, prompts):
    """Every node's token is the head's rank-r choice after drafting its path one token at a time:
    the tree mask and the shared per-depth positions in the head are right."""
    from transformers import DynamicCache

    from specreg.runtime.head_drafter import HeadDrafter
    from specreg.runtime.methods.base import DraftRequest
    from specreg.runtime.tree import parse_tree

    head = heads["trained"]
    tree = parse_tree(EAGLE_TREES["eagle"])
    sequence = torch.tensor([prompts[2]])

    request = DraftRequest(sequence, sequence[0].tolist(), tree.depth, tree)

    def seeded():
        drafter = HeadDrafter(head, int(target.config.vocab_size), [(0.0, None, None, None)])
        _, hidden = forward_logits(target, sequence[:, :-1], DynamicCache(config=target.config), 1, head.aux_layer_ids)
        drafter.rollback([sequence.shape[1] - 1], [hidden])
        return drafter

    with torch.inference_mode():
        node_tokens, probs = seeded().propose([request])[0]
        assert probs is None and node_tokens[0] == sequence[0, -1]
        for node, path in enumerate(tree.paths, start=1):
            drafter = seeded()
            hidden = drafter.seed([request])  # [1, 1, H]
            expected = None
            for depth, rank in enumerate(path):
                logits = head.draft_logits(hidden[0])[:, : drafter.vocab_size]  # [1, vocab]
                expected = torch.topk(logits, tree.width, dim=-1).indices[0, rank]
                if depth < len(path) - 1:
                    hidden = head(expected.view(1, 1), hidden, drafter.cache.cache, sequence.shape[1] + depth)
            assert int(node_tokens[node]) == int(expected), f"node {node} {path}"


def test_eagle3_tree_sampling_is_reproducible(target, tokenizer, heads, prompts):
    pair = head_pair(target, tokenizer, heads["trained"])
    runs = [speculative_generate(pair, prompts[1], DecodeConfig(method="eagle3", k=3, tree=EAGLE_TREES["eagle"],
                                                                max_new_tokens=16, temperature=0.9, top_k=50,
                                                                seed=seed, eos_token_ids=())).token_ids
            for seed in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0] != runs[2] and len(runs[0]) == 16


def test_absent_flags_read_as_vllm_reads_them(tiny_dir, heads, tmp_path):
    """vLLM 0.33 (speculators/algos.py update_eagle3) makes an absent norm_before_residual true for
    a speculators head; fc_norm and norm_output are read as it reads them (llama_eagle3.py)."""
    from specreg.runtime.methods.eagle3 import read_eagle3_config

    directory = save_head(heads["trained"], tmp_path / "head")
    config = json.loads((directory / "config.json").read_text())
    assert config["norm_before_residual"] is False and not read_eagle3_config(directory).norm_before_residual
    del config["norm_before_residual"]
    (directory / "config.json").write_text(json.dumps(config))
    spec = read_eagle3_config(directory)
    assert spec.norm_before_residual and not spec.norm_output and not spec.fc_norm
    config.update(fc_norm=True, norm_output=True)
    (directory / "config.json").write_text(json.dumps(config))
    spec = read_eagle3_config(directory)
    assert spec.fc_norm and spec.norm_output and spec.layer_kind == "llama"
    # fc_norm without its weights: the head is not what its config says (vLLM would leave them unset)
    with pytest.raises(RuntimeConfigError, match=r"missing \['fc_norm.0.weight'"):
        load_pair(tiny_dir / "target", directory, method="eagle3")


# ---- the variants vLLM 0.33 serves: norm flags, Qwen3 layers, several layers ----

VARIANTS = {
    # speculators 0.9.0's trainer defaults (train/config/schema.py:791-794)
    "norm_output+norm_before_fc": dict(norm_output=True, norm_before_fc=True),
    "fc_norm": dict(fc_norm=True, norm_before_residual=True),
    "qwen3": dict(layer_kind="qwen3"),
    "two_layers": dict(num_layers=2),
    "qwen3_three_layers_norm_output": dict(layer_kind="qwen3", num_layers=3, norm_output=True, norm_before_fc=True),
}


@pytest.fixture(scope="module")
def variant_heads(target, tmp_path_factory):
    """name -> (Eagle3Head, its saved speculators directory) for each VARIANTS entry, random over
    the odd ids."""
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head

    root = tmp_path_factory.mktemp("variants")
    made = {}
    for name, flags in VARIANTS.items():
        head = new_eagle3_head(target, range(1, int(target.config.vocab_size), 2), seed=11, **flags)
        made[name] = (head, save_eagle3_head(head, root / name, "tiny-target", ["LlamaForCausalLM"]))
    return made


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_loads_as_saved_and_decodes_exactly(tiny_dir, target, tokenizer, prompts, variant_heads, name):
    from specreg.runtime.methods.eagle3 import read_eagle3_config

    head, directory = variant_heads[name]
    flags = VARIANTS[name]
    spec = read_eagle3_config(directory)
    assert (spec.layer_kind, spec.layer_config.num_hidden_layers, spec.norm_output, spec.norm_before_fc,
            spec.fc_norm) == (flags.get("layer_kind", "llama"), flags.get("num_layers", 1),
                              flags.get("norm_output", False), flags.get("norm_before_fc", False),
                              flags.get("fc_norm", False))
    pair = load_pair(tiny_dir / "target", directory, method="eagle3")
    loaded = pair.draft
    assert len(loaded.layers) == flags.get("num_layers", 1)
    if flags.get("layer_kind") == "qwen3":
        assert all(hasattr(layer.self_attn, "q_norm") for layer in loaded.layers)
    config = DecodeConfig(method="eagle3", k=3, max_new_tokens=20, eos_token_ids=())
    for prompt in prompts[:2]:
        result = speculative_generate(pair, prompt, config)
        assert result.token_ids == hf_greedy(target, prompt, 20, eos_token_id=None)
        assert result.metrics.drafted > 0
        in_memory = speculative_generate(head_pair(target, tokenizer, head), prompt, config)
        assert (result.token_ids, result.metrics.accepted) == (in_memory.token_ids, in_memory.metrics.accepted)
    tree = speculative_generate(pair, prompts[2], DecodeConfig(method="eagle3", k=3, tree=EAGLE_TREES["eagle"],
                                                                max_new_tokens=16, eos_token_ids=()))
    assert tree.token_ids == hf_greedy(target, prompts[2], 16, eos_token_id=None)


def test_norm_output_recycles_the_normed_state_and_later_layers_read_the_first(target, variant_heads):
    """What vLLM 0.33's llama_eagle3.py computes: the next draft step reads norm(output) with
    norm_output (aux_output), the output as is without; a layer after the first reads the first
    layer's output alone (no embeddings), in the usual decoder-layer form."""
    head, _ = variant_heads["qwen3_three_layers_norm_output"]
    output = torch.randn(2, 1, head.config.hidden_size)
    assert torch.equal(head.recycle(output), head.norm(output))
    plain, _ = variant_heads["two_layers"]
    assert torch.equal(plain.recycle(output), output)
    assert plain.layers[1].self_attn.q_proj.in_features == plain.config.hidden_size
    assert plain.layers[0].self_attn.q_proj.in_features == 2 * plain.config.hidden_size


def test_a_sliding_window_head_drafts_below_its_window_and_stops_with_an_error_past_it(tiny_dir, target, prompts,
                                                                                       variant_heads, tmp_path):
    """speculators' trainer names its draft layers sliding_attention with a 2048 window by default;
    vLLM attends within it. Below the window that is every entry, as the runtime attends; past it the
    runtime stops (RuntimeUnsupportedError: validate records an error, never a fail)."""
    import shutil

    from specreg.errors import RuntimeUnsupportedError

    _, directory = variant_heads["two_layers"]
    windowed = Path(shutil.copytree(directory, tmp_path / "windowed"))
    config = json.loads((windowed / "config.json").read_text())
    config["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2, sliding_window=2048,
                                              use_sliding_window=True)
    (windowed / "config.json").write_text(json.dumps(config))
    decode = DecodeConfig(method="eagle3", k=3, max_new_tokens=12, eos_token_ids=())
    assert speculative_generate(load_pair(tiny_dir / "target", windowed, method="eagle3"), prompts[0],
                                decode).token_ids == hf_greedy(target, prompts[0], 12, eos_token_id=None)
    config["transformer_layer_config"]["sliding_window"] = len(prompts[0]) + 4
    (windowed / "config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeUnsupportedError, match=f"sliding window of {len(prompts[0]) + 4} positions"):
        speculative_generate(load_pair(tiny_dir / "target", windowed, method="eagle3"), prompts[0], decode)


def test_aux_id_n_is_the_last_layers_output_before_the_final_norm(tiny_dir, target, prompts, tmp_path):
    """forward_logits' LAST_LAYER_OUTPUT is the final norm's input on both of its paths (a plain
    Llama's own loop; any other model through model() and a hook), and a head naming id N reads it
    and decodes exactly."""
    from tinymodels import build_other
    from transformers import DynamicCache

    from specreg.runtime.forward import LAST_LAYER_OUTPUT
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.eagle3 import new_eagle3_head

    qwen2 = load_model(build_other(tmp_path / "qwen2", tiny_dir / "tokenizer", "qwen2", num_layers=3))
    ids = torch.tensor([prompts[0]])
    for model in (target, qwen2):
        layers = model.config.num_hidden_layers
        seen = {}
        hook = model.model.norm.register_forward_pre_hook(lambda module, args: seen.update(state=args[0]))
        try:
            with torch.inference_mode():
                _, states = forward_logits(model, ids, DynamicCache(config=model.config), 1,
                                           (LAST_LAYER_OUTPUT, layers))
        finally:
            hook.remove()
        width = model.config.hidden_size
        assert torch.equal(states[..., :width], seen["state"])
        assert torch.equal(states[..., width:], model.model.norm(seen["state"]))
    layers = target.config.num_hidden_layers
    head = new_eagle3_head(target, aux_layer_ids=(0, 1, layers), seed=2)
    assert head.hidden_state_ids == (0, 1, LAST_LAYER_OUTPUT)
    config = DecodeConfig(method="eagle3", k=3, max_new_tokens=16, eos_token_ids=())
    result = speculative_generate(head_pair(target, None, head), prompts[1], config)
    assert result.token_ids == hf_greedy(target, prompts[1], 16, eos_token_id=None) and result.metrics.drafted > 0
