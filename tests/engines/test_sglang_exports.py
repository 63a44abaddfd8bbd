"""Every export format x method we produce for SGLang, run through the released engine's own
code (vLLM's: test_engine_exports.py; the cases: engine_exports.py).

SGLang 0.5.23: prepare_server_args (ServerArgs.add_cli_args + from_cli_args), its whole argument
resolution and the target's and draft's ModelConfig. One engine process for all cases (the
session fixture below); see engine_env.py for the download cache.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from engine_exports import (BLOCK_LAYER_INPUTS, BLOCK_LAYER_OUTPUTS, K, SGLANG_CASES, TRAINED_AUX, block_head,
                            eagle3_head, eagle3_head_variant, eagle3_target, export_argv, export_cases, mtp_target,
                            ok)

from specreg.registry.deploy.exports import templates_dir
from specreg.registry.store.entities import SpecMethod

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def sglang_run(tiny_models, tmp_path_factory, engine_runner):
    workdir = tmp_path_factory.mktemp("sglang-check")
    cases, exported = export_cases(SGLANG_CASES, tiny_models, workdir)
    # What the export wrote before SGLang got its own head layout: the speculators head directory itself.
    old = list(next(c for c in cases if c["id"] == "sglang-eagle3")["argv"])
    old[old.index("--speculative-draft-model-path") + 1] = str(eagle3_head(tiny_models))
    cases.append({"id": "speculators-head", "argv": old})
    # SGLang resolves DFLASH and DSPARK for CUDA, NPU or XPU only (speculative_hook.py:287-301, 667-672):
    # the block cases resolve for "cuda", the device the export is for; the same launch for the CPU is refused
    for case in list(cases):
        if case["id"] in ("sglang-dflash", "sglang-dspark"):
            cases.append({"id": f"{case['id']}-cpu", "argv": case["argv"]})
            case["device"] = "cuda"
    # what the export refuses (test_sglang_refuses_a_dspark_head_that_names_no_markov_head_type), launched by
    # hand: the DSpark head without markov_head_type, which registration reads as 'vanilla'
    unnamed = workdir / "dspark-head-unnamed"
    shutil.copytree(block_head(tiny_models, "dspark"), unnamed)
    config = json.loads((unnamed / "config.json").read_text())
    del config["markov_head_type"]
    (unnamed / "config.json").write_text(json.dumps(config))
    argv = list(next(c for c in cases if c["id"] == "sglang-dspark")["argv"])
    argv[argv.index("--speculative-draft-model-path") + 1] = str(unnamed)
    cases.append({"id": "dspark-no-markov-head-type", "argv": argv, "device": "cuda"})
    # a head in the original layout ModelOpt and SpecForge write: its layer fields at its config's top level
    # and heads with a DeepSeek (MLA) layer, model_type deepseek_v2 (what vLLM builds) and deepseek_v3
    for kind in ("modelopt", "deepseek", "deepseek-v3"):
        case = (f"sglang-eagle3-{kind}", "sglang", SpecMethod.EAGLE3, None, {})
        argv, files = export_argv(case, tiny_models, workdir, head=eagle3_head_variant(tiny_models, kind))
        cases.append({"id": case[0], "argv": argv})
        exported[case[0]] = (argv, files)
    output = engine_runner("sglang", cases, workdir)
    return {result["id"]: result for result in output["results"]}, exported, output


def test_sglang_parses_the_export(sglang_run, tiny_models):
    results, _, output = sglang_run
    args = ok(results["sglang-draft"])["server_args"]
    assert args["speculative_algorithm"] == "STANDALONE"
    assert Path(args["model_path"]) == tiny_models["target"] and args["revision"] == "abc123"
    assert Path(args["speculative_draft_model_path"]) == tiny_models["draft"]
    assert args["speculative_draft_model_revision"] == "d1e2f3"
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == (K, 1, K + 1)
    assert args["enable_metrics"] is True
    assert args["served_model_name"] == "tiny-pair"
    assert output["stand_ins"] == []
    # the whole resolution ran, and both models' configs were loaded by SGLang's ModelConfig
    draft = ok(results["sglang-draft"])
    assert draft["resolved_speculative_algorithm"] == draft["resolved"]["speculative_algorithm"] == "STANDALONE"
    assert draft["target"]["class"] == draft["draft"]["class"] == "LlamaForCausalLM"
    assert draft["target"]["dtype"] == "torch.float32"  # the baselines' dtype; SGLang's auto would serve float16
    assert Path(draft["resolved"]["speculative_draft_model_path"]) == tiny_models["draft"]
    eagle3 = ok(results["sglang-eagle3"])["server_args"]
    assert eagle3["speculative_algorithm"] == "EAGLE3"
    assert Path(eagle3["speculative_draft_model_path"]).name == "sglang-eagle3-head"  # the layout beside the script
    assert (eagle3["speculative_num_steps"], eagle3["speculative_eagle_topk"],
            eagle3["speculative_num_draft_tokens"]) == (K, 1, K + 1)


def test_sglang_loads_the_eagle3_head_layout_the_export_writes(sglang_run, tiny_models):
    """SGLang 0.5.23 resolves the launch (its whole argument resolution, --device cpu) and builds
    the target's and the draft's ModelConfig from the exported files: the head directory the
    export wrote (config.json in SGLang's terms beside links to the head's weights) is read as
    LlamaForCausalLMEagle3, the class SGLang's registry serves EAGLE-3 heads with."""
    results, exported, _ = sglang_run
    result = ok(results["sglang-eagle3"])
    draft_path = Path(result["resolved"]["speculative_draft_model_path"])
    assert draft_path.name == "sglang-eagle3-head" and draft_path.parent.name == "export"
    assert (draft_path / "model.safetensors").resolve() == (eagle3_head(tiny_models) / "model.safetensors")
    assert result["resolved_speculative_algorithm"] == "EAGLE3"
    assert result["target"] == {"architectures": ["LlamaForCausalLM"], "class": "LlamaForCausalLM",
                                "num_hidden_layers": 8, "dtype": "torch.float32"}
    hidden = json.loads((eagle3_target(tiny_models) / "config.json").read_text())["hidden_size"]
    assert result["draft"] == {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                               "class": "LlamaForCausalLMEagle3", "num_hidden_layers": 1, "hidden_size": hidden}
    assert (result["resolved"]["speculative_num_steps"], result["resolved"]["speculative_eagle_topk"],
            result["resolved"]["speculative_num_draft_tokens"]) == (K, 1, K + 1)


def test_sglang_captures_the_layers_the_head_was_trained_on(sglang_run):
    """The ids the export writes ([0, 2, 5], SGLang's numbering) become, through SGLang's own aux
    resolution and the Llama target's set_eagle3_layers_to_capture (+1), captures at the inputs of
    layers 1, 3 and 6: the head's trained layers. The head's own ids, read as they are, would be
    captured at [2, 4, 7]."""
    results, _, _ = sglang_run
    result = ok(results["sglang-eagle3"])
    assert result["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in TRAINED_AUX]
    assert result["layers_to_capture"] == TRAINED_AUX


def test_sglang_builds_a_modelopt_layout_head_with_its_own_layer_fields(sglang_run, tiny_models):
    """A head laid out as ModelOpt and SpecForge write it (no transformer_layer_config: the layer's
    fields at the top level, the ids in eagle_config) gets the export's layout with those fields, so
    SGLang builds the draft at the head's width (a layout without them would be a default
    LlamaConfig, 4096 wide), capturing the layers it was registered with."""
    results, _, _ = sglang_run
    result = ok(results["sglang-eagle3-modelopt"])
    hidden = json.loads((eagle3_target(tiny_models) / "config.json").read_text())["hidden_size"]
    assert result["draft"] == {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                               "class": "LlamaForCausalLMEagle3", "num_hidden_layers": 1, "hidden_size": hidden}
    assert result["layers_to_capture"] == TRAINED_AUX


def test_our_read_back_is_what_sglang_builds_from_the_same_files(sglang_run, tiny_models):
    """engines/sglang.py read_back (what the export checks before the lock binds it) against SGLang's
    own resolution of the same files: the target, the algorithm, k and the layers it captures."""
    from engine_exports import EXPORTED_BASELINES, tiny_pair

    from specreg.registry.deploy.engines import sglang
    from specreg.registry.deploy.exports import plan_export
    from specreg.registry.store.entities import SpecMethod

    results, exported, _ = sglang_run
    result = ok(results["sglang-eagle3"])
    plan = plan_export(tiny_pair(tiny_models, SpecMethod.EAGLE3, None), EXPORTED_BASELINES, "sglang", approved=True)
    ours: dict[str, list] = {}
    for item in sglang.read_back(plan, exported["sglang-eagle3"][1]):
        ours.setdefault(item.field, []).append(item.value)
    resolved = result["resolved"]
    assert ours["target"] == [resolved["model_path"]] and ours["target_revision"] == [resolved["revision"]]
    assert [f"torch.{dtype}" for dtype in ours["dtype"]] == [result["target"]["dtype"]] == ["torch.float32"]
    assert ours["method"] == [sglang.ALGORITHMS[resolved["speculative_algorithm"]]] == ["eagle3"]
    assert set(ours["k"]) == {resolved["speculative_num_steps"], resolved["speculative_num_draft_tokens"] - 1}
    assert ours["aux_layers"] == [result["layers_to_capture"]] == [TRAINED_AUX]


def test_sglang_cannot_load_the_speculators_head_directory(sglang_run):
    """Why the export writes SGLang its own layout: handed the registered (speculators) head, SGLang's
    get_config raises before any weight loads."""
    results, _, _ = sglang_run
    assert results["speculators-head"].get("error", "").startswith(
        "ValueError: Unrecognized model in"), results["speculators-head"]


def test_sglang_parses_the_mtp_export(sglang_run, tiny_models):
    """NEXTN with no draft path, k steps, top-k 1, k + 1 draft tokens as SGLang's parser reads them;
    its launch resolves NEXTN to EAGLE (speculative_hook._resolve_speculative_algorithm_alias, run
    here) and, for a DeepseekV3ForCausalLM target, sets the draft path to the model's own NextN
    layers (_handle_eagle_family: needs SGLang's ModelConfig, not run here, see engine_check.py)."""
    results, exported, _ = sglang_run
    result = ok(results["sglang-mtp"])
    args = result["server_args"]
    assert "--speculative-draft-model-path" not in exported["sglang-mtp"][0]
    assert (args["speculative_algorithm"], result["resolved_speculative_algorithm"]) == ("NEXTN", "EAGLE")
    assert Path(args["model_path"]) == mtp_target(tiny_models) and args["revision"] == "abc123"
    assert args["speculative_draft_model_path"] is None
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == \
        (K, 1, K + 1)
    assert args["enable_metrics"] is True and args["served_model_name"] == "tiny-pair"
    # SGLang's resolution drafts from the target's own directory, read as its NextN model
    # (sglang/srt/configs/model_config.py:1032-1036), with the k-step chain the export asked for
    assert Path(result["resolved"]["speculative_draft_model_path"]) == mtp_target(tiny_models)
    assert result["resolved"]["speculative_algorithm"] == "EAGLE"
    assert result["target"]["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (result["draft"]["architectures"], result["draft"]["class"]) == \
        (["DeepseekV3ForCausalLMNextN"], "DeepseekV3ForCausalLMNextN")
    assert (result["resolved"]["speculative_num_steps"], result["resolved"]["speculative_eagle_topk"],
            result["resolved"]["speculative_num_draft_tokens"]) == (K, 1, K + 1)


def test_schema_file_is_generated_from_the_engine(sglang_run):
    """templates/engines/sglang-0.5.23.json equals what SGLang's code says (scripts/engine_schemas.py
    writes it from the same run)."""
    committed = json.loads((templates_dir() / "engines" / "sglang-0.5.23.json").read_text())
    assert committed == sglang_run[2]["schema"], "run scripts/engine_schemas.py and commit the result"


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_sglang_reads_the_block_drafter_as_registered(sglang_run, tiny_models, kind):
    """A DFLASH / DSPARK export (engine-native head) through SGLang 0.5.23's whole resolution and its
    model runner's set-up: one step, top-k 1, the verify window k + 1 (DFlash: the block; DSpark:
    gamma + 1 with gamma the block it drafts from the anchor), the mask token, and the target layers
    captured: the head's target_layer_ids (layer outputs) captured at layer id + 1, the layer inputs
    registration recorded."""
    from engine_exports import tiny_pair

    from specreg.registry.store.entities import SpecMethod

    results, _, _ = sglang_run
    result = ok(results[f"sglang-{kind}"])
    registered = tiny_pair(tiny_models, SpecMethod(kind), None).config
    block = registered.head["block"]
    resolved = result["resolved"]
    assert resolved["speculative_algorithm"] == kind.upper()
    assert Path(resolved["speculative_draft_model_path"]) == block_head(tiny_models, kind)
    assert (resolved["speculative_num_steps"], resolved["speculative_eagle_topk"],
            resolved["speculative_num_draft_tokens"]) == (1, 1, registered.num_speculative_tokens + 1) == (1, 1, K + 1)
    assert result["block"]["mask_token_id"] == block["mask_token_id"]
    assert result["dflash_target_layer_ids"] == BLOCK_LAYER_OUTPUTS
    assert result["layers_to_capture"] == registered.head["fit"]["aux_layer_ids"] == BLOCK_LAYER_INPUTS
    if kind == "dflash":
        assert result["block"]["block_size"] == block["block_size"] == resolved["speculative_num_draft_tokens"]
    else:
        assert block["sample_from_anchor"] is result["block"]["sample_from_anchor"] is True
        assert result["block"]["gamma"] == block["draft_length"] == block["block_size"] == K
        assert result["block"]["verify_num_draft_tokens"] == K + 1


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_our_read_back_of_a_block_drafter_is_what_sglang_resolves(sglang_run, tiny_models, kind):
    """engines/sglang.py read_back on the block exports: the method and k SGLang resolves (its step
    count is forced to 1 for a block: k is the verify window less the root), and the lock check passes."""
    from engine_exports import EXPORTED_BASELINES, tiny_pair

    from specreg.registry.deploy import read_back as rb
    from specreg.registry.deploy.engines import sglang
    from specreg.registry.deploy.exports import plan_export
    from specreg.registry.store.entities import SpecMethod

    results, exported, _ = sglang_run
    resolved = ok(results[f"sglang-{kind}"])["resolved"]
    plan = plan_export(tiny_pair(tiny_models, SpecMethod(kind), None), EXPORTED_BASELINES, "sglang", approved=True)
    read = sglang.read_back(plan, exported[f"sglang-{kind}"][1])
    ours = {item.field: item.value for item in read}
    assert ours["method"] == sglang.ALGORITHMS[resolved["speculative_algorithm"]] == kind
    assert ours["k"] == resolved["speculative_num_draft_tokens"] - 1 == K
    rb.check(plan, read)


@pytest.mark.parametrize("kind, refusal", [
    ("dflash", "ValueError: DFLASH speculative decoding is not supported by SRTPlatform on device 'cpu'."),
    ("dspark", "ValueError: DSpark speculative decoding only supports CUDA, NPU or XPU device.")])
def test_sglang_serves_block_drafters_on_accelerators_only(sglang_run, kind, refusal):
    """Why the SGLang block exports are checked as SGLang resolves them for CUDA: on a CPU its own
    resolution refuses them."""
    results, _, _ = sglang_run
    assert results[f"sglang-{kind}-cpu"].get("error") == refusal, results[f"sglang-{kind}-cpu"]


def test_sglang_refuses_a_dspark_head_without_markov_head_type(sglang_run):
    """Why the SGLang export refuses a DSpark head whose config names no markov_head_type."""
    results, _, _ = sglang_run
    assert results["dspark-no-markov-head-type"].get("error") == (
        "ValueError: DSpark requires markov_head_type when markov_rank > 0, got None."), results["dspark-no-markov-head-type"]


@pytest.mark.parametrize("kind", ["deepseek", "deepseek-v3"])
def test_sglang_builds_the_deepseek_layer_head_layout_the_export_writes(sglang_run, tiny_models, kind):
    """A head with a DeepSeek (MLA) layer: SGLang 0.5.23 resolves the export and reads the layout written
    for it as Eagle3DeepseekV2ForCausalLM (its registry's class, sglang/srt/models/kimi_k25_eagle3.py),
    with the head's model_type (either DeepSeek type: SGLang does not rewrite an EAGLE-3 draft's config
    as vLLM does a deepseek_v3 one), one layer at the head's width; k as exported; the target captures
    the layers the head was trained on. Our read-back of the same files reads what SGLang resolved."""
    from engine_exports import EXPORTED_BASELINES, tiny_pair

    from specreg.registry.deploy.engines import sglang
    from specreg.registry.deploy.exports import plan_export

    results, exported, _ = sglang_run
    result = ok(results[f"sglang-eagle3-{kind}"])
    resolved = result["resolved"]
    hidden = json.loads((eagle3_target(tiny_models) / "config.json").read_text())["hidden_size"]
    assert result["draft"] == {"architectures": ["Eagle3DeepseekV2ForCausalLM"],
                               "model_type": {"deepseek": "deepseek_v2", "deepseek-v3": "deepseek_v3"}[kind],
                               "class": "Eagle3DeepseekV2ForCausalLM", "num_hidden_layers": 1, "hidden_size": hidden}
    assert (resolved["speculative_algorithm"], resolved["speculative_num_steps"], resolved["speculative_eagle_topk"],
            resolved["speculative_num_draft_tokens"]) == ("EAGLE3", K, 1, K + 1)
    assert result["layers_to_capture"] == TRAINED_AUX
    pair = tiny_pair(tiny_models, SpecMethod.EAGLE3, None, head=eagle3_head_variant(tiny_models, kind))
    plan = plan_export(pair, EXPORTED_BASELINES, "sglang", approved=True)
    ours: dict[str, list] = {}
    for item in sglang.read_back(plan, exported[f"sglang-eagle3-{kind}"][1]):
        ours.setdefault(item.field, []).append(item.value)
    assert ours["method"] == [sglang.ALGORITHMS[resolved["speculative_algorithm"]]] == ["eagle3"]
    assert set(ours["k"]) == {resolved["speculative_num_steps"], resolved["speculative_num_draft_tokens"] - 1}
    assert ours["aux_layers"] == [result["layers_to_capture"]]
