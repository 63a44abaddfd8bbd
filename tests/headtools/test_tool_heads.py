"""EAGLE-3 heads as users bring them, built by the training tools' own code (conftest.tool_heads:
speculators 0.9.0's trainer builders, save_pretrained and Eagle3Converter; nvidia-modelopt
0.47.0's EAGLE export; SpecForge's layout from its source): each registers with the layers every
engine feeds it said in one line (a warning where an engine reads the ids otherwise than the tool
that trained it), and validates: the runtime runs it as vLLM 0.33 would and decodes exactly the
target's greedy tokens. The CLI is run as a user runs it."""

from __future__ import annotations

import json
import shutil

import pytest

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)

# the session fixture builds the heads in a process that imports both tools (about a minute)
pytestmark = [pytest.mark.slow, pytest.mark.engine_process]

# head -> (writer, numbering, trained on, vLLM feeds, llama.cpp's converter reads, SGLang feeds), as
# layer inputs; SGLang reads eagle_config's ids as layer outputs (as ModelOpt and SpecForge write them)
# and is given a speculators head's registered ids by specreg's export
EXPECTED = {
    # the trainer resolves no target_layer_ids to (2, N // 2, N - 3) and writes them at the top level
    "speculators-defaults": ("speculators", "layer inputs", [2, 4, 5], [2, 4, 5], [2, 4, 5], [2, 4, 5]),
    "speculators-qwen3": ("speculators", "layer inputs", [1, 4, 7], [1, 4, 7], [1, 4, 7], [1, 4, 7]),
    # ModelOpt's default sorted {1, N // 2 - 1, N - 4} = [1, 3, 4] are layer outputs, inside eagle_config
    "modelopt": ("ModelOpt", "layer outputs", [2, 4, 5], [1, 3, 4], [2, 4, 5], [2, 4, 5]),
    "speculators-converted": ("speculators", "layer inputs", [2, 4, 5], [2, 4, 5], [2, 4, 5], [2, 4, 5]),
    "specforge": ("SpecForge", "layer outputs", [2, 4, 5], [1, 3, 4], [2, 4, 5], [2, 4, 5]),
}
ONE_LAYER_EARLY = {"modelopt", "specforge"}


def test_the_tools_wrote_the_variants_this_folder_is_about(tool_heads):
    """What each tool wrote (so a tool release that writes otherwise is seen here first)."""
    defaults = json.loads((tool_heads["speculators-defaults"] / "config.json").read_text())
    assert (defaults["norm_before_fc"], defaults["norm_output"], defaults["norm_before_residual"]) == (True, True, True)
    assert defaults["transformer_layer_config"]["layer_types"] == ["sliding_attention"]
    qwen3 = json.loads((tool_heads["speculators-qwen3"] / "config.json").read_text())["transformer_layer_config"]
    assert (qwen3["model_type"], qwen3["num_hidden_layers"]) == ("qwen3", 2)
    modelopt = json.loads((tool_heads["modelopt"] / "config.json").read_text())
    assert modelopt["architectures"] == ["LlamaForCausalLMEagle3"]
    assert "eagle_aux_hidden_state_layer_ids" not in modelopt  # only inside eagle_config
    assert modelopt["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_tool_head_registers_with_the_layers_fed_and_validates_exactly(tool_heads, name, tmp_path):
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    writer, numbering, trained, vllm, llamacpp, sglang = EXPECTED[name]
    result = run("register", name, "--target", tool_heads["target"], "--draft", tool_heads[name], "--method",
                 "eagle3", "-k", "3", "--db", db, "--json")
    assert result.returncode == 0, result.stderr
    registered = json.loads(result.stdout)
    fed = dict(registered["config"]["head"]["fit"]["layers_fed"])
    assert fed.pop("layers")["kind"] == ("qwen3" if "qwen3" in name else "llama")
    assert fed == {"writer": writer, "numbering": numbering, "trained_on": trained, "vllm": vllm, "llamacpp": llamacpp,
                   "sglang": sglang, "runtime": vllm}
    assert registered["layers_fed"].startswith(f"layers fed (as layer inputs): written by {writer} ({numbering}), "
                                               f"trained on the inputs of layers {trained}; vLLM 0.33 feeds {vllm};")
    warnings = [line for line in result.stderr.splitlines() if "layer numbering" in line]
    if name in ONE_LAYER_EARLY:
        assert warnings == [f"specreg: warning: layer numbering: {writer} numbers the layers it names by their output, "
                            f"so the head was trained on the inputs of layers {trained}, but vLLM 0.33 feeds it "
                            f"{vllm} (one layer early) (reads the ids as layer inputs, no +1: "
                            "v1/worker/gpu_model_runner.py:5207-5219)"]
    else:
        assert warnings == []
    result = run("validate", f"{name}@1", "--golden", "smoke", "--device", "cpu", "--checks",
                 "integrity,tokenizer,equivalence", "--json", "--db", db)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr)
    checks = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert checks == {"integrity": "pass", "tokenizer": "pass", "equivalence": "pass"}


def test_a_speculators_head_for_another_verifier_is_refused_unless_allowed(tool_heads, tiny_models, tmp_path):
    """speculators records its verifier as name_or_path + architectures only: specreg checks both
    against the registered target and refuses another model unless --allow-verifier-mismatch."""
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    other = shutil.copytree(tool_heads["target"], tmp_path / "other-target")  # the same model elsewhere
    head = tool_heads["speculators-defaults"]
    declared = json.loads((head / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    result = run("register", "moved", "--target", other, "--draft", head, "--method", "eagle3", "-k", "3", "--db", db)
    one_line(result, 1, f"verifier: the head declares verifier {declared!r}, the target is {str(other)!r}",
             "--allow-verifier-mismatch")
    result = run("register", "moved", "--target", other, "--draft", head, "--method", "eagle3", "-k", "3", "--db", db,
                 "--allow-verifier-mismatch", "--json")
    assert result.returncode == 0, result.stderr
    fit = json.loads(result.stdout)["config"]["head"]["fit"]
    assert fit["verifier_matched"] is False and fit["allow_verifier_mismatch"] is True
    assert any(note.startswith("verifier mismatch allowed: the head declares verifier") for note in fit["notes"])
    # a verifier of another architecture is refused the same way, naming both
    config = json.loads((head / "config.json").read_text())
    config["speculators_config"]["verifier"].update(name_or_path=str(other), architectures=["Qwen3ForCausalLM"])
    renamed = shutil.copytree(head, tmp_path / "qwen3-verifier")
    (renamed / "config.json").write_text(json.dumps(config))
    one_line(run("register", "arch", "--target", other, "--draft", renamed, "--method", "eagle3", "-k", "3", "--db",
                 db), 1, "verifier: the head declares verifier architectures ['Qwen3ForCausalLM'], the target is "
                         "['LlamaForCausalLM']")


@pytest.mark.parametrize("name", ["speculators-defaults", "speculators-qwen3", "speculators-converted"])
def test_the_runtime_computes_what_speculators_trained(tool_heads, name):
    """The runtime's head, loaded from the directory as registration reads it, gives the logits
    speculators' own Eagle3DraftModel.forward gives for two training-time-test steps: the aux
    states through input_norm and fc, each decoder layer (Qwen3's q_norm/k_norm, the second
    layer), and at the second step the first step's output (normed with norm_output) with the next
    tokens, seeing the first step's entries up to its own and its own entry."""
    import torch
    from safetensors.torch import load_file
    from transformers import DynamicCache

    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.eagle3 import load_eagle3_head

    reference = load_file(tool_heads[name].parent / f"{name}.reference.safetensors")
    head = load_eagle3_head(tool_heads[name], load_model(tool_heads["target"]))
    input_ids, length = reference["input_ids"], reference["input_ids"].shape[1]
    positions = torch.arange(1, length + 1).view(1, -1)  # speculators: token index j at position j + 1
    causal = torch.ones(length, length).tril().bool()
    cache = DynamicCache(config=head.config)
    with torch.no_grad():
        output = head(input_ids, head.seed_input(reference["hidden"]), cache, 0,
                      attention_mask=causal.view(1, 1, length, length), position_ids=positions)
        torch.testing.assert_close(head.lm_head(head.norm(output)), reference["logits_0"], rtol=1e-4, atol=1e-5)
        next_ids = torch.cat([input_ids[:, 1:], input_ids.new_zeros(1, 1)], dim=1)
        sees = torch.cat([causal, torch.eye(length).bool()], dim=1).view(1, 1, length, 2 * length)
        output = head(next_ids, head.recycle(output), cache, 0, attention_mask=sees, position_ids=positions + 1)
        torch.testing.assert_close(head.lm_head(head.norm(output)), reference["logits_1"], rtol=1e-4, atol=1e-5)
