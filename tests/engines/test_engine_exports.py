"""Every export format x method we produce for vLLM, run through the released engine's own code
(SGLang's: test_sglang_exports.py; the cases: engine_exports.py).

vLLM 0.33.0: the `vllm serve` parser, AsyncEngineArgs.create_engine_config (target ModelConfig,
SpeculativeConfig and the draft ModelConfig built from the exported paths, which are tiny local
models) and the scheduler's build_dynamic_sd_schedule_lookup. One engine process for all cases
(the session fixture below); see engine_env.py for the download cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from engine_exports import (BLOCK_LAYER_INPUTS, CASE_BASELINES, CUTOFF, EXPORTED_BASELINES, HUB_VERIFIER, K, SUFFIX,
                            TRAINED_AUX, VLLM_CASES, block_head, eagle3_head, eagle3_head_variant, eagle3_target, export_argv,
                            export_cases, llama_with_nextn_layers, mtp_target, ok, peagle_head, tiny_pair)
from exportcase import BASELINES

from specreg.errors import EngineRefusal
from specreg.registry.deploy.exports import engine_schema, render_export, templates_dir
from specreg.registry.store.entities import SpecMethod


@pytest.fixture(scope="session")
def vllm_run(tiny_models, tmp_path_factory, engine_runner):
    workdir = tmp_path_factory.mktemp("vllm-check")
    cases, exported = export_cases(VLLM_CASES, tiny_models, workdir)
    # The defect this issue is about, as the old export wrote it: one range, nothing above it.
    old = next(c for c in cases if c["id"] == "vllm-draft-cutoff")["argv"]
    old_config = json.loads(old[old.index("--speculative-config") + 1])
    old_config["num_speculative_tokens_per_batch_size"] = [[1, CUTOFF, K]]
    old = old[:old.index("--speculative-config") + 1] + [json.dumps(old_config)] + old[old.index("--speculative-config") + 2:]
    cases.append({"id": "old-single-range", "argv": old})
    # k8s: k edited in the ConfigMap's file (what the initContainer refuses), and an argument added to
    # the Deployment's engine args after the file (what only admission control can refuse)
    k8s = next(c for c in cases if c["id"] == "k8s-draft-cutoff")["argv"]
    edited = workdir / "k8s-edited-k" / Path(k8s[3]).name
    edited.parent.mkdir()
    edited.write_text(Path(k8s[3]).read_text().replace(f"num_speculative_tokens: {K}\n", "num_speculative_tokens: 7\n"))
    cases.append({"id": "k8s-edited-k", "argv": [*k8s[:3], str(edited)]})
    override = yaml.safe_load(Path(k8s[3]).read_text())["speculative-config"] | {"num_speculative_tokens": 5}
    cases.append({"id": "k8s-args-override", "argv": [*k8s, "--speculative-config", json.dumps(override)]})
    for method in ("medusa", "mlp_speculator"):
        config = {"method": method, "model": str(tiny_models["draft"]), "num_speculative_tokens": K}
        cases.append({"id": method, "argv": ["vllm", "serve", str(tiny_models["target"]),
                                              "--speculative-config", json.dumps(config)]})
    # What our export refuses to write (test_mtp_on_a_target_no_engine_drafts_for_is_refused),
    # written by hand: mtp on a Llama target that declares num_nextn_predict_layers.
    config = {"method": "mtp", "num_speculative_tokens": K}
    cases.append({"id": "mtp-on-llama", "argv": ["vllm", "serve", str(llama_with_nextn_layers(tiny_models)),
                                                  "--speculative-config", json.dumps(config)]})
    # What our export refuses to write for a suffix pair with a batch cutoff, written by hand
    config = {"method": "suffix", "num_speculative_tokens": K,
              "num_speculative_tokens_per_batch_size": [[1, CUTOFF, K], [CUTOFF + 1, CUTOFF + 1, 0]]}
    cases.append({"id": "suffix-with-ranges", "argv": ["vllm", "serve", str(tiny_models["target"]),
                                                        "--speculative-config", json.dumps(config)]})
    # EAGLE-3 heads as other tools write them: a verifier named by a hub id, the ids inside eagle_config
    # only (ModelOpt, SpecForge), a DeepSeek (MLA) decoder layer; and what our export never writes: the
    # head folder served as the model
    for kind in ("hub-verifier", "modelopt", "deepseek"):
        case = (f"vllm-eagle3-{kind}", "vllm", SpecMethod.EAGLE3, None, {})
        argv, files = export_argv(case, tiny_models, workdir, head=eagle3_head_variant(tiny_models, kind))
        # the DeepSeek head's weights go through vLLM's own model class and loader (engine_check.load_draft)
        cases.append({"id": case[0], "argv": argv, **({"load_draft": True} if kind == "deepseek" else {})})
        exported[case[0]] = (argv, files)
    # What our export refuses (test_vllm_refuses_a_deepseek_layer_head_of_model_type_deepseek_v3, tests/exports),
    # written by hand: the DeepSeek-layer head with model_type deepseek_v3
    argv = list(exported["vllm-eagle3-deepseek"][0])
    at = argv.index("--speculative-config") + 1
    argv[at] = json.dumps(json.loads(argv[at]) | {"model": str(eagle3_head_variant(tiny_models, "deepseek-v3"))})
    cases.append({"id": "deepseek-v3-head", "argv": argv})
    cases.append({"id": "serve-head-folder",
                  "argv": ["vllm", "serve", str(eagle3_head_variant(tiny_models, "hub-verifier"))]})
    # DSpark runs on vLLM's V2 model runner only (vllm/config/vllm.py:3111-3113); V2 is its default
    # where Triton is, the GPU the export is for. The engine check runs on a CPU, where vLLM picks V1:
    # the export built with V2, as the GPU builds it, and with V1, what a CPU vLLM builds.
    dspark = next(c for c in cases if c["id"] == "vllm-dspark")
    dspark["env"] = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    cases.append({"id": "vllm-dspark-v1-runner", "argv": dspark["argv"], "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}})
    # SpeculativeConfig refuses method suffix unless arctic_inference imports (has_arctic_inference)
    output = engine_runner("vllm", cases, workdir, arctic=True)
    results = {result["id"]: result for result in output["results"]}
    return results, exported, output


@pytest.mark.parametrize("case", VLLM_CASES, ids=[case[0] for case in VLLM_CASES])
def test_vllm_builds_its_config_from_the_export(case, vllm_run, tiny_models):
    results, exported, _ = vllm_run
    result = ok(results[case[0]])
    argv, files = exported[case[0]]
    spec = result["speculative"]
    if "--config" in argv:  # k8s: the arguments are in the ConfigMap's file
        exported_config = yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text())["speculative-config"]
    else:
        exported_config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert result["served_model_name"] in ("tiny-pair", ["tiny-pair"])
    assert result["dtype"] == "torch.float32"  # the baselines' dtype; vLLM's auto would serve bfloat16 here
    # vLLM runs a P-EAGLE head as eagle3 with parallel drafting (test_vllm_reads_the_peagle_head_as_registered)
    assert spec["method"] == ("eagle3" if case[2] == SpecMethod.PEAGLE else case[2].value)
    assert spec["num_speculative_tokens"] == K
    assert Path(result["target_model"]) == Path(tiny_pair(tiny_models, case[2], case[3]).target.reference)
    if case[2] == SpecMethod.DRAFT_MODEL:
        # The draft ModelConfig was built from the exported path and shares the target's vocabulary.
        assert Path(spec["draft_model"]) == tiny_models["draft"]
        assert spec["revision"] == "d1e2f3"
        assert spec["draft_vocab_size"] == spec["target_vocab_size"]
    elif case[2] == SpecMethod.EAGLE3:
        # vLLM built the head's draft ModelConfig from the exported head directory, and its runner hands
        # the head the states entering the layers it was trained on
        assert Path(spec["draft_model"]) == eagle3_head(tiny_models)
        assert spec["eagle3_aux_layers"] == TRAINED_AUX
    elif case[2] == SpecMethod.MTP:
        # No `model` exported: vLLM drafts from the target's own directory, its config rewritten by
        # SpeculativeConfig.hf_config_override into DeepSeek's MTP drafter with the target's 1 layer.
        assert "model" not in exported_config
        assert Path(spec["draft_model"]) == mtp_target(tiny_models)
        assert spec["revision"] == result["target_revision"] == "abc123"  # the MTP layers of the pinned target
        assert (spec["draft_model_type"], spec["draft_architectures"], spec["draft_n_predict"]) == \
            ("deepseek_mtp", ["DeepSeekMTPModel"], 1)
        assert spec["draft_vocab_size"] == spec["target_vocab_size"]
    elif case[2] in (SpecMethod.DFLASH, SpecMethod.DSPARK):
        # the draft ModelConfig built from the exported head directory (test_vllm_reads_the_block_drafter_as_registered)
        assert Path(spec["draft_model"]) == block_head(tiny_models, case[2].value)
    elif case[2] == SpecMethod.PEAGLE:
        # the draft ModelConfig built from the exported head directory (test_vllm_reads_the_peagle_head_as_registered)
        assert Path(spec["draft_model"]) == peagle_head(tiny_models)
    elif case[2] == SpecMethod.SUFFIX:
        assert "model" not in exported_config and spec["model"] == "suffix"
        assert {name: spec[f"suffix_decoding_{name}"] for name in SUFFIX} == SUFFIX
    else:
        assert (spec["prompt_lookup_min"], spec["prompt_lookup_max"]) == (2, 5)
    assert spec["num_speculative_tokens_per_batch_size"] == exported_config.get("num_speculative_tokens_per_batch_size")
    # how the baselines' sampled records drafted, written for the methods whose proposers read it and
    # taken by vLLM's SpeculativeConfig as written; n-gram and suffix get vLLM's default, never written
    if case[2] in (SpecMethod.NGRAM, SpecMethod.SUFFIX):
        assert "draft_sample_method" not in exported_config and spec["draft_sample_method"] == "greedy"
    else:
        measured = CASE_BASELINES.get(case[0], {}).get("draft_sampling", "greedy")
        assert exported_config["draft_sample_method"] == spec["draft_sample_method"] == measured
    if "vllm-speculative-config.json" in files:
        assert json.loads(files["vllm-speculative-config.json"]) == exported_config


@pytest.mark.parametrize("case", [c for c in VLLM_CASES if c[3]], ids=[c[0] for c in VLLM_CASES if c[3]])
def test_vllm_speculation_is_off_above_the_cutoff(case, vllm_run):
    """vLLM's own batch-size lookup (what its scheduler indexes by the number of scheduled
    requests): k up to the cutoff, 0 above it, up to max_num_seqs."""
    results, _, _ = vllm_run
    result = ok(results[case[0]])
    lookup = result["batch_size_lookup"]
    assert len(lookup) == result["max_num_seqs"] + 1 > CUTOFF + 1
    assert lookup[1:CUTOFF + 1] == [K] * CUTOFF
    assert lookup[CUTOFF + 1:] == [0] * (result["max_num_seqs"] - CUTOFF)
    if case[4].get("max_num_seqs"):
        assert result["max_num_seqs"] == case[4]["max_num_seqs"]


def test_vllm_takes_the_k8s_arguments_from_the_configmap_file(vllm_run):
    """What the k8s initContainer's `verify --config` binds is what vLLM runs: k edited in the file
    is the k vLLM builds. An argument added to the Deployment's command line wins over the file
    (vLLM: command line > --config file > defaults), which is why the manifest's containers stay
    under the lock too (`verify --config k8s-vllm.yaml` before applying it)."""
    results, _, _ = vllm_run
    assert ok(results["k8s-draft-cutoff"])["speculative"]["num_speculative_tokens"] == K
    assert ok(results["k8s-edited-k"])["speculative"]["num_speculative_tokens"] == 7
    assert ok(results["k8s-args-override"])["speculative"]["num_speculative_tokens"] == 5


def test_vllm_single_range_keeps_speculating_above_it(vllm_run):
    """Why the export needs the k=0 range: the old single range kept k for every larger batch."""
    results, _, _ = vllm_run
    lookup = ok(results["old-single-range"])["batch_size_lookup"]
    assert lookup[CUTOFF + 1:] == [K] * (len(lookup) - CUTOFF - 1)


@pytest.mark.parametrize("method", ["medusa", "mlp_speculator"])
def test_vllm_rejects_methods_and_so_does_the_schema(method, vllm_run, tiny_models):
    results, _, _ = vllm_run
    assert "method" in results[method].get("error", ""), results[method]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"method": method, "model": "d", "num_speculative_tokens": K},
                            engine_schema("vllm")["speculative_config"])


def test_no_stand_ins_were_needed(vllm_run):
    assert vllm_run[2]["stand_ins"] == []


@pytest.mark.parametrize("fmt", ["vllm", "k8s-vllm", "sglang"])
def test_mtp_on_a_target_no_engine_drafts_for_is_refused(fmt, tiny_models):
    """A Llama target that merely carries num_nextn_predict_layers: our export refuses it in one line
    (engines.common.head_refusal) and writes nothing; test_vllm_refuses_mtp_on_llama shows vLLM refuses it too."""
    pair = tiny_pair(tiny_models, SpecMethod.MTP, None, target=llama_with_nextn_layers(tiny_models))
    options = {"model_volume": "pvc:models"} if fmt == "k8s-vllm" else None
    with pytest.raises(EngineRefusal) as info:
        render_export(pair, BASELINES, fmt, approved=True, options=options)
    assert str(info.value) == (
        f"tiny-pair@1 is a mtp pair and cannot be exported to {fmt}: no engine builds an MTP drafter for model_type "
        "'llama' (LlamaForCausalLM): vLLM 0.33 rewrites only DeepSeek-V3/V3.2, GLM, MiMo, Qwen3-Next, Qwen3.5 and "
        "similar targets into MTP drafters (config/speculative.py hf_config_override)")


def test_vllm_drops_the_batch_size_ranges_of_suffix(vllm_run, tiny_models):
    """Why the export refuses a suffix pair with a batch cutoff (test_suffix_pair.py): vLLM accepts
    the ranges, then drops them (config/vllm.py _maybe_disable_dynamic_sd_for_v1), so k holds at every
    batch size."""
    results, _, _ = vllm_run
    spec = ok(results["suffix-with-ranges"])["speculative"]
    assert spec["method"] == "suffix" and spec["num_speculative_tokens"] == K
    assert spec["num_speculative_tokens_per_batch_size"] is None


def test_vllm_refuses_mtp_on_llama(vllm_run):
    """Why the export refuses it: vLLM leaves a Llama config as it is, so no MTP drafter exists."""
    results, _, _ = vllm_run
    assert results["mtp-on-llama"].get("error", "").startswith(
        "NotImplementedError: Unsupported speculative method: 'mtp'"), results["mtp-on-llama"]


def test_schema_file_is_generated_from_the_engine(vllm_run):
    """templates/engines/vllm-0.33.json equals what vLLM's code says (scripts/engine_schemas.py
    writes it from the same run; SGLang's: test_sglang_exports.py)."""
    committed = json.loads((templates_dir() / "engines" / "vllm-0.33.json").read_text())
    assert committed == vllm_run[2]["schema"], "run scripts/engine_schemas.py and commit the result"


def test_vllm_serves_the_registered_target_whatever_the_heads_verifier_names(vllm_run, tiny_models):
    """A speculators head records its verifier by name only; `vllm serve HEAD` would serve that name
    at its default revision (maybe_override_with_speculators replaces model and tokenizer). The export
    names the target as vLLM's model, so the override finds no speculators config and changes
    nothing: vLLM's target and tokenizer are the registered target's."""
    results, _, _ = vllm_run
    target = str(eagle3_target(tiny_models))
    result = ok(results["vllm-eagle3-hub-verifier"])
    assert result["speculators_override"] == [target, None]
    assert Path(result["target_model"]) == Path(result["target_tokenizer"]) == Path(target)
    assert result["speculative"]["draft_model"] == str(eagle3_head_variant(tiny_models, "hub-verifier"))
    # the head folder served as the model: vLLM would load the verifier's name from the hub
    assert results["serve-head-folder"]["speculators_override"] == [HUB_VERIFIER, HUB_VERIFIER]


@pytest.mark.parametrize("case_id, kind", [("vllm-eagle3-cutoff", None), ("vllm-eagle3-hub-verifier", "hub-verifier"),
                                           ("vllm-eagle3-modelopt", "modelopt"), ("vllm-eagle3-deepseek", "deepseek")])
def test_our_read_back_is_what_vllm_builds_from_the_same_files(vllm_run, tiny_models, case_id, kind):
    """engines/vllm.py read_back (what the export checks before the lock binds it) against vLLM's own
    code on the same files: target, method, k, the layers each model runner feeds the head (an empty
    list from vLLM: the config names none, so the target's default (2, N // 2, N - 3) = [2, 4, 5]) and
    whether the head's d2t is used. The ModelOpt layout shows why its vLLM export is refused: vLLM's
    V1 runner reads eagle_config's ids, its V2 runner (the GPU default) does not."""
    from specreg.registry.deploy.engines import vllm
    from specreg.registry.deploy.exports import plan_export

    results, exported, _ = vllm_run
    result = ok(results[case_id])
    spec = result["speculative"]
    pair = tiny_pair(tiny_models, SpecMethod.EAGLE3, CUTOFF if kind is None else None,
                     head=eagle3_head_variant(tiny_models, kind) if kind else None)
    plan = plan_export(pair, EXPORTED_BASELINES, "vllm", approved=True)
    ours: dict[str, list] = {}
    for item in vllm.read_back(plan, exported[case_id][1]):
        ours.setdefault(item.field, []).append(item.value)
    assert ours["target"] == [result["target_model"]] and ours["target_revision"] == [result["target_revision"]]
    assert [f"torch.{dtype}" for dtype in ours["dtype"]] == [result["dtype"]] == ["torch.float32"]
    assert set(ours["method"]) == {spec["method"]} and set(ours["k"]) == {spec["num_speculative_tokens"]}
    default = [2, 4, 5]
    v2, v1 = ours["aux_layers"][:2]
    assert v2 == (spec["eagle3_aux_layers"] or default) and v1 == (spec["eagle3_aux_layers_v1"] or default)
    assert (v2, v1) == ((default, TRAINED_AUX) if kind == "modelopt" else (TRAINED_AUX, TRAINED_AUX))
    assert set(map(str, ours["vocab_map"])) == {"None"}  # the identity: ...
    assert spec["draft_config_vocab_size"] == spec["target_vocab_size"]  # ... vLLM keeps no d2t for this head


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_vllm_reads_the_block_drafter_as_registered(vllm_run, tiny_models, kind):
    """A DFlash / DSpark export (engine-native head: DFlashDraftModel, Qwen3DSparkModel) through vLLM
    0.33.0's create_engine_config and its proposer's readers: the method, k (DFlash: block - 1 after
    the anchor; DSpark sampling from the anchor: the block), parallel drafting, the masked slots'
    token, the target layers both model runners feed the head (its target_layer_ids name layer
    outputs; vLLM adds one, so they equal the layer inputs registration recorded) and, for DFlash,
    the block attention registration recorded (not causal: bidirectional)."""
    results, _, _ = vllm_run
    spec = ok(results[f"vllm-{kind}"])["speculative"]
    registered = tiny_pair(tiny_models, SpecMethod(kind), None).config
    block = registered.head["block"]
    assert (spec["method"], spec["num_speculative_tokens"]) == (kind, registered.num_speculative_tokens) == (kind, K)
    assert spec["num_speculative_tokens"] == block["draft_length"] == block["block_size"] - (
        0 if block["sample_from_anchor"] else 1)
    assert spec["parallel_drafting"] is True
    assert spec["mask_token_id"] == block["mask_token_id"] == spec["target_vocab_size"] - 1
    assert spec["eagle3_aux_layers"] == registered.head["fit"]["aux_layer_ids"] == BLOCK_LAYER_INPUTS
    if kind == "dflash":  # (DSpark never reaches the V1 runner: test_vllm_v1_runner_refuses_dspark)
        assert spec["eagle3_aux_layers_v1"] == BLOCK_LAYER_INPUTS
    assert spec["draft_architectures"] == (["DFlashDraftModel"] if kind == "dflash" else ["Qwen3DSparkModel"])
    if kind == "dflash":
        assert block["causal"] is None and spec["non_causal"] is True


def test_vllm_v1_runner_refuses_dspark(vllm_run):
    """Why the CPU vLLM cannot serve a DSpark export (validate --engine vllm refuses it): vLLM builds
    DSpark for its V2 model runner only, and without Triton (a CPU) it picks V1."""
    results, _, _ = vllm_run
    assert results["vllm-dspark-v1-runner"].get("error", "").startswith(
        "ValidationError: 1 validation error for VllmConfig | Value error, Model Runner V1 does not support: "
        "dspark speculative decoding"), results["vllm-dspark-v1-runner"]


def test_vllm_reads_the_peagle_head_as_registered(vllm_run, tiny_models):
    """A P-EAGLE export (speculators' peagle head) through vLLM 0.33.0's create_engine_config and its
    proposer's reader: method eagle3 with parallel drafting (without the key vLLM drafts the head one
    token a forward), the architecture its speculators reader picks (PeagleLlamaForCausalLM, built as
    Eagle3LlamaForCausalLM), the masked slots' token (pard_token, from the head's mask_token_id) as
    registered, the layers both model runners feed it equal to the trained ones, and the V2 runner
    declining parallel drafting for EAGLE, so vLLM builds it for V1 on a GPU too (config/vllm.py:758-765).
    Our read-back of the same files reads the registered peagle pair."""
    from specreg.registry.deploy.engines import vllm
    from specreg.registry.deploy.exports import plan_export

    results, exported, _ = vllm_run
    spec = ok(results["vllm-peagle"])["speculative"]
    registered = tiny_pair(tiny_models, SpecMethod.PEAGLE, None)
    assert (spec["method"], spec["num_speculative_tokens"], spec["parallel_drafting"]) == ("eagle3", K, True)
    assert Path(spec["draft_model"]) == peagle_head(tiny_models)
    assert spec["draft_architectures"] == ["PeagleLlamaForCausalLM"]
    assert spec["mask_token_id"] == registered.config.head["parallel"]["mask_token_id"] == spec["target_vocab_size"] - 1
    assert spec["eagle3_aux_layers"] == spec["eagle3_aux_layers_v1"] == TRAINED_AUX
    assert "parallel drafting for EAGLE speculative decoding" in spec["v2_runner_unsupported"]
    assert spec["draft_config_vocab_size"] == spec["target_vocab_size"]  # no d2t for this head
    plan = plan_export(registered, EXPORTED_BASELINES, "vllm", approved=True)
    ours: dict[str, list] = {}
    for item in vllm.read_back(plan, exported["vllm-peagle"][1]):
        ours.setdefault(item.field, []).append(item.value)
    assert set(ours["method"]) == {"peagle"} and set(ours["k"]) == {spec["num_speculative_tokens"]}
    assert ours["aux_layers"][:2] == [spec["eagle3_aux_layers"], spec["eagle3_aux_layers_v1"]]


def test_vllm_builds_and_loads_the_deepseek_layer_head_as_registered(vllm_run, tiny_models):
    """An EAGLE-3 head with a DeepSeek (MLA) layer, exported by specreg, through vLLM 0.33.0's
    create_engine_config and then its proposer's model loading on the CPU (engine_check.load_draft):
    the architecture registration recorded, the class vLLM's registry builds for it
    (Eagle3DeepseekV2ForCausalLM, models/registry.py:712-713), method, k, the layers its runners feed
    the head, no vocabulary map; its loader takes every tensor of the head's file (a tensor no module
    has raises, models/utils.py:443; a wrong shape fails the weight loader's assert) and leaves only
    embed_tokens unset, which the proposer shares from the target (llm_base_proposer.py:1418-1450).
    vLLM's layer parameters are the tensors registration requires (eagle3_mla.layer_shapes), stacked
    as its loader stacks them (q_a_proj + kv_a_proj_with_mqa, gate + up: deepseek_eagle3.py:259-267)."""
    from specreg.core.heads.eagle3_mla import layer_shapes

    results, _, _ = vllm_run
    spec = ok(results["vllm-eagle3-deepseek"])["speculative"]
    head = eagle3_head_variant(tiny_models, "deepseek")
    registered = tiny_pair(tiny_models, SpecMethod.EAGLE3, None, head=head).config
    layers = registered.head["fit"]["layers_fed"]["layers"]
    assert layers == {"kind": "deepseek_v2", "count": 1, "architecture": "Eagle3DeepseekV3ForCausalLM"}
    assert (spec["method"], spec["num_speculative_tokens"], Path(spec["draft_model"])) == ("eagle3", K, head)
    assert spec["draft_architectures"] == [layers["architecture"]]
    assert spec["draft_class"] == "Eagle3DeepseekV2ForCausalLM"
    assert spec["eagle3_aux_layers"] == spec["eagle3_aux_layers_v1"] == registered.head["fit"]["aux_layer_ids"]
    assert spec["eagle3_aux_layers"] == TRAINED_AUX
    assert spec["draft_config_vocab_size"] == spec["target_vocab_size"]  # no d2t: the target's vocabulary
    assert spec["draft_unloaded"] == ["model.embed_tokens.weight"]
    fields = json.loads((head / "config.json").read_text())
    stacked = {"self_attn.q_a_proj.weight": "self_attn.fused_qkv_a_proj.weight",
               "self_attn.kv_a_proj_with_mqa.weight": "self_attn.fused_qkv_a_proj.weight",
               "mlp.gate_proj.weight": "mlp.gate_up_proj.weight", "mlp.up_proj.weight": "mlp.gate_up_proj.weight"}
    required: dict[str, list[int]] = {}
    for name, shape in layer_shapes(fields, 0, 2 * fields["hidden_size"]).items():
        vllm_name = f"model.layers.0.{stacked.get(name, name)}"
        required[vllm_name] = [required.get(vllm_name, [0])[0] + shape[0], *shape[1:]]
    built = {name: shape for name, shape in spec["draft_parameters"].items() if name.startswith("model.layers.0.")}
    assert built == required


def test_vllm_refuses_a_deepseek_layer_head_of_model_type_deepseek_v3(vllm_run):
    """Why the vLLM export refuses such a head (eagle3_mla.vllm_model_type_refusal): vLLM rewrites the
    draft config into DeepSeek's MTP drafter, then finds no EAGLE-3 class for it."""
    results, _, _ = vllm_run
    assert results["deepseek-v3-head"].get("error", "").startswith(
        "ValidationError: 1 validation error for SpeculativeConfig | Value error, Model architectures "
        "['Eagle3DeepSeekMTPModel'] are not supported for now."), results["deepseek-v3-head"]
