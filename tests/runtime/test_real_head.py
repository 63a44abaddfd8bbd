"""The real EAGLE-3 head's build (builders/real_head.py) on a tiny stand-in for SmolLM2: 30 layers,
so the head reads the same layer inputs (1, 14, 27), in the tokenizer layout llama.cpp's converter
reads, with a budget of seconds. The real build (up to an hour of CPU) runs the same code; its
acceptance against CPU-minutes is in docs/llamacpp-heads.md."""

from __future__ import annotations

import json
import sys

import pytest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from tinymodels import build_llama, build_tokenizer

    from specreg.golden_prompts.loader import load_golden_set
    from specreg.builders import real_head

    root = tmp_path_factory.mktemp("real-head")
    build_tokenizer(root / "tokenizer", vocab_size=500, llama_layout=True)
    build_llama(root / "target", root / "tokenizer", num_layers=30, hidden_size=32, intermediate_size=64)
    options = dict(budget_cpu_min=0.05, checkpoints=(0.05,), prompts=6, new_tokens=8, cache=root / "cache",
                   prompt_records=list(load_golden_set("default"))[:8], eval_records=list(load_golden_set("smoke")))
    head = real_head.build_real(root / "demo", root / "target", **options)
    return root, head, options


def test_the_head_is_saved_in_the_speculators_format_with_its_recipe_and_figures(built):
    from specreg.builders import real_head

    root, head, options = built
    assert head == root / "demo" / "eagle3"
    config = json.loads((head / "config.json").read_text())
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 14, 27]
    stamp = json.loads((head / "real-head.json").read_text())
    assert stamp["settings"]["aux"] == [1, 14, 27] and stamp["sequences"] > 0
    assert stamp["generation_cpu_s"] > 0 and stamp["build_cpu_s"] >= stamp["generation_cpu_s"]
    checkpoint = stamp["checkpoints"][-1]
    assert checkpoint["steps"] >= 1 and checkpoint["drafted"] > 0 and 0 <= checkpoint["alpha"] <= 1
    # the cache answers without training, for another folder too; a build it does not hold is None
    again = real_head.build_real(root / "other", root / "target", cached_only=True, **options)
    assert again == root / "other" / "eagle3"
    assert (again / "model.safetensors").read_bytes() == (head / "model.safetensors").read_bytes()
    assert real_head.build_real(root / "third", root / "target", cached_only=True,
                                     **{**options, "new_tokens": 9}) is None


def test_the_head_drafts_for_its_target_and_greedy_output_is_the_targets(built):
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate, target_only_generate
    from specreg.runtime.methods import load_pair

    root, head, _ = built
    pair = load_pair(root / "target", head, method="eagle3")
    assert pair.draft.aux_layer_ids == (1, 14, 27)
    prompt = pair.tokenizer("the quick brown", add_special_tokens=False)["input_ids"]
    config = DecodeConfig(method="eagle3", k=4, max_new_tokens=12, eos_token_ids=())
    speculative = speculative_generate(pair, prompt, config)
    assert speculative.token_ids == target_only_generate(pair, prompt, config).token_ids
    assert speculative.metrics.drafted > 0


@pytest.mark.slow
def test_llama_cpp_converts_the_head_against_its_target(built, tmp_path):
    from specreg.registry.deploy.engines import llamacpp_build

    root, head, _ = built
    gguf_file = llamacpp_build.convert(head, tmp_path / "head.gguf", "f32", target_model_dir=root / "target")
    sys.path.insert(0, str(llamacpp_build.source() / "gguf-py"))
    import gguf

    fields = {field.name: field for field in gguf.GGUFReader(gguf_file).fields.values()}
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "eagle3"
    assert [int(fields["eagle3.target_layers"].parts[i][0]) for i in fields["eagle3.target_layers"].data] == [1, 14, 27]


def test_real_with_a_method_it_does_not_build_is_one_line(tmp_path):
    from clirun import run_specreg

    done = run_specreg(["demo-pair", tmp_path / "real", "--real", "--method", "medusa"])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--real builds a draft_model pair or a head trained for it (--method eagle3); --method medusa" in done.stderr
