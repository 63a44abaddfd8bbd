"""Every export format x method we produce, run through the released engines' own code.

vLLM 0.33.0: the `vllm serve` parser, AsyncEngineArgs.create_engine_config (target ModelConfig,
SpeculativeConfig and the draft ModelConfig built from the exported paths, which are tiny local
models) and the scheduler's build_dynamic_sd_schedule_lookup. SGLang 0.5.23:
prepare_server_args (ServerArgs.add_cli_args + from_cli_args). One engine process per engine
for all cases (session fixtures below); see engine_env.py for the download cache.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest
import yaml
from exportcase import BASELINES, fingerprint, record_argv

from specreg.core.types import ModelRef
from specreg.errors import UsageError
from specreg.registry.store.entities import PairState, PairVersion, SpecConfig, SpecMethod
from specreg.registry.deploy.exports import engine_schema, render_export, templates_dir
from specreg.registry.deploy.writing import write_export

K = 4
CUTOFF = 16


# The layers the EAGLE-3 head was trained on, in the speculators' (and vLLM's) numbering: the
# state entering layers 1, 3 and 6 of an 8-layer target. SGLang reads explicit ids one layer later
# (the example: [1, 3, 6] in the head's config become [2, 4, 7] in SGLang).
TRAINED_AUX = [1, 3, 6]


def eagle3_target(models: dict[str, Path]) -> Path:
    """A tiny 8-layer Llama over the tiny tokenizer (tests/tinymodels.py), beside the others: deep
    enough for aux layers inside it."""
    from tinymodels import build_llama

    target = models["target"].parent / "llama-8-layers"
    if not target.exists():
        build_llama(target, models["tokenizer"], seed=4, hidden_size=96, num_layers=8)
    return target


def eagle3_head(models: dict[str, Path]) -> Path:
    """A speculators-format EAGLE-3 head for eagle3_target, trained on TRAINED_AUX (tests/headfiles.py)."""
    from headfiles import write_eagle3

    target = eagle3_target(models)
    config = json.loads((target / "config.json").read_text())
    head = models["target"].parent / "eagle3-head"
    if not head.exists():
        write_eagle3(head, hidden=config["hidden_size"], vocab=config["vocab_size"], draft_vocab=config["vocab_size"],
                     vocab_map=False, aux=TRAINED_AUX, verifier=str(target))
    return head


def mtp_target(models: dict[str, Path]) -> Path:
    """A tiny DeepSeek-V3 target with one MTP layer over the tiny tokenizer (tests/tinymodels.py), beside them."""
    from tinymodels import build_deepseek_v3

    target = models["target"].parent / "deepseek-v3-mtp"
    if not target.exists():
        build_deepseek_v3(target, models["tokenizer"], num_nextn_predict_layers=1)
    return target


def llama_with_nextn_layers(models: dict[str, Path]) -> Path:
    """The tiny Llama target's config declaring num_nextn_predict_layers (DeepSeek's field name on a
    model type no engine rewrites into an MTP drafter), with its tokenizer, beside it."""
    from tinymodels import copy_tokenizer

    target = models["target"].parent / "llama-nextn"
    if not target.exists():
        copy_tokenizer(models["target"], target)
        config = json.loads((models["target"] / "config.json").read_text())
        (target / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=1)))
    return target


def target_ref(directory: Path) -> ModelRef:
    """The target as registered: its model_type and architecture read from its config.json."""
    config = json.loads((directory / "config.json").read_text())
    identity = dataclasses.replace(fingerprint("a"), model_type=config["model_type"],
                                   architecture=config["architectures"][0])
    return ModelRef(str(directory), str(directory), "abc123", identity)


def tiny_pair(models: dict[str, Path], method: SpecMethod, max_batch: int | None,
              target: Path | None = None) -> PairVersion:
    """A pair of the tiny local models (tests/tinymodels.py), registered by their paths; ``target``
    (default: the tiny Llama, or the tiny DeepSeek-V3 for mtp) is the target directory."""
    default = {SpecMethod.MTP: mtp_target, SpecMethod.EAGLE3: eagle3_target}.get(method, lambda m: m["target"])
    target = target_ref(target or default(models))
    if method == SpecMethod.MTP:
        # what registration reads of the target's MTP layers (specreg.core.heads.mtp.read_mtp)
        layers = json.loads((Path(target.reference) / "config.json").read_text()).get("num_nextn_predict_layers")
        config = SpecConfig(method, K, max_batch_size_for_speculation=max_batch,
                            head={"layout": "mtp:deepseek", "num_heads": layers})
        draft = None
    elif method == SpecMethod.EAGLE3:
        # what registration records of the head (specreg.api.describe_head: read_head + check_head_fits)
        from specreg.api import describe_head

        draft = ModelRef(str(eagle3_head(models)), str(eagle3_head(models)), None, fingerprint("e"))
        config = SpecConfig(method, K, max_batch_size_for_speculation=max_batch)
        config = dataclasses.replace(config, head=describe_head(config, target, draft, allow_verifier_mismatch=False))
    elif method == SpecMethod.DRAFT_MODEL:
        config = SpecConfig(method, K, max_batch_size_for_speculation=max_batch)
        draft = ModelRef(str(models["draft"]), str(models["draft"]), "d1e2f3", fingerprint("b"))
    else:
        config = SpecConfig(method, K, prompt_lookup_min=2, prompt_lookup_max=5, max_batch_size_for_speculation=max_batch)
        draft = None
    return PairVersion(id=1, name="tiny-pair", version=1, target=target, draft=draft, config=config,
                       binding_sha256="f" * 64, state=PairState.APPROVED, registered_by="tester",
                       registered_at=datetime(2025, 1, 1, tzinfo=timezone.utc))


# The export cases: (id, format, method, max_batch_size_for_speculation, export options).
# New pair kinds get their rows here and a SpecMethod in tiny_pair; the engine checks below then
# run on them unchanged (mtp pairs are served by a tiny DeepSeek-V3 target, mtp_target).
VLLM_CASES = [
    ("vllm-draft-cutoff", "vllm", SpecMethod.DRAFT_MODEL, CUTOFF, {}),
    ("vllm-draft-cutoff-max-num-seqs", "vllm", SpecMethod.DRAFT_MODEL, CUTOFF, {"max_num_seqs": 64}),
    ("vllm-draft-no-cutoff", "vllm", SpecMethod.DRAFT_MODEL, None, {}),
    ("vllm-ngram-cutoff", "vllm", SpecMethod.NGRAM, CUTOFF, {}),
    ("k8s-draft-cutoff", "k8s-vllm", SpecMethod.DRAFT_MODEL, CUTOFF, {}),
    ("k8s-ngram", "k8s-vllm", SpecMethod.NGRAM, None, {}),
    ("vllm-eagle3-cutoff", "vllm", SpecMethod.EAGLE3, CUTOFF, {}),
    ("vllm-mtp", "vllm", SpecMethod.MTP, None, {}),
    ("vllm-mtp-cutoff", "vllm", SpecMethod.MTP, CUTOFF, {}),
    ("k8s-mtp-cutoff", "k8s-vllm", SpecMethod.MTP, CUTOFF, {}),
]
SGLANG_CASES = [
    ("sglang-draft", "sglang", SpecMethod.DRAFT_MODEL, CUTOFF, {}),
    ("sglang-eagle3", "sglang", SpecMethod.EAGLE3, None, {}),
    ("sglang-mtp", "sglang", SpecMethod.MTP, None, {}),
]


def export_argv(case: tuple, models: dict[str, Path], workdir: Path) -> tuple[list[str], dict]:
    """Render one case, write it as `specreg export -o` does, and return the engine argv as the
    engine would receive it from the written script (paths beside the script resolve there)."""
    case_id, fmt, method, max_batch, options = case
    options = dict(options)
    pair = tiny_pair(models, method, max_batch)
    if fmt == "k8s-vllm":
        # The manifest names in-container paths; mount "the volume" where the models lie here.
        options.update(model_volume="pvc:models", model_mount_path=str(models["target"].parent),
                       target_subpath=Path(pair.target.reference).name)
    files = dict(render_export(pair, BASELINES, fmt, approved=True, options=options))
    if fmt == "k8s-vllm":
        # The engine container runs `vllm serve --config FILE`, FILE the engine ConfigMap's file:
        # written here from the manifest's ConfigMap, so vLLM's own parser reads what the pod mounts.
        engine_map, deployment, _ = yaml.safe_load_all(files["k8s-vllm.yaml"])
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        argv = container["command"] + container["args"]
        assert argv[:3] == ["vllm", "serve", "--config"] and len(argv) == 4, argv
        mounted = workdir / case_id / "engine" / Path(argv[3]).name
        mounted.parent.mkdir(parents=True)
        mounted.write_text(engine_map["data"][mounted.name])
        assert mounted.read_text() == files[mounted.name]  # the file the lock binds
        return [*argv[:3], str(mounted)], files
    script = {"vllm": "vllm-serve.sh", "sglang": "sglang-launch.sh"}[fmt]
    out = workdir / case_id / "export"
    write_export(list(files.items()), out)
    return record_argv(files[script], workdir / case_id, script=out / script), files


@pytest.fixture(scope="session")
def vllm_run(tiny_models, tmp_path_factory, engine_runner):
    workdir = tmp_path_factory.mktemp("vllm-check")
    cases, exported = [], {}
    for case in VLLM_CASES:
        argv, files = export_argv(case, tiny_models, workdir)
        cases.append({"id": case[0], "argv": argv})
        exported[case[0]] = (argv, files)
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
    output = engine_runner("vllm", cases, workdir)
    results = {result["id"]: result for result in output["results"]}
    return results, exported, output


@pytest.fixture(scope="session")
def sglang_run(tiny_models, tmp_path_factory, engine_runner):
    workdir = tmp_path_factory.mktemp("sglang-check")
    cases, exported = [], {}
    for case in SGLANG_CASES:
        argv, files = export_argv(case, tiny_models, workdir)
        cases.append({"id": case[0], "argv": argv})
        exported[case[0]] = (argv, files)
    # What the export wrote before SGLang got its own head layout: the speculators head directory itself.
    old = list(next(c for c in cases if c["id"] == "sglang-eagle3")["argv"])
    old[old.index("--speculative-draft-model-path") + 1] = str(eagle3_head(tiny_models))
    cases.append({"id": "speculators-head", "argv": old})
    output = engine_runner("sglang", cases, workdir)
    return {result["id"]: result for result in output["results"]}, exported, output


def ok(result: dict) -> dict:
    assert "error" not in result, f"{result['id']}: the engine refused it: {result['error']}\n{result.get('traceback')}"
    return result


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
    assert spec["method"] == case[2].value
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
    else:
        assert (spec["prompt_lookup_min"], spec["prompt_lookup_max"]) == (2, 5)
    assert spec["num_speculative_tokens_per_batch_size"] == exported_config.get("num_speculative_tokens_per_batch_size")
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
                                "num_hidden_layers": 8}
    assert result["draft"] == {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                               "class": "LlamaForCausalLMEagle3", "num_hidden_layers": 1}
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


@pytest.mark.parametrize("fmt", ["vllm", "k8s-vllm", "sglang"])
def test_mtp_on_a_target_no_engine_drafts_for_is_refused(fmt, tiny_models):
    """A Llama target that merely carries num_nextn_predict_layers: our export refuses it in one line
    (engines.common.head_refusal) and writes nothing; test_vllm_refuses_mtp_on_llama shows vLLM refuses it too."""
    pair = tiny_pair(tiny_models, SpecMethod.MTP, None, target=llama_with_nextn_layers(tiny_models))
    options = {"model_volume": "pvc:models"} if fmt == "k8s-vllm" else None
    with pytest.raises(UsageError) as info:
        render_export(pair, BASELINES, fmt, approved=True, options=options)
    assert str(info.value) == (
        f"tiny-pair@1 is a mtp pair and cannot be exported to {fmt}: no engine builds an MTP drafter for model_type "
        "'llama' (LlamaForCausalLM): vLLM 0.33 rewrites only DeepSeek-V3/V3.2, GLM, MiMo, Qwen3-Next, Qwen3.5 and "
        "similar targets into MTP drafters (config/speculative.py hf_config_override)")


def test_vllm_refuses_mtp_on_llama(vllm_run):
    """Why the export refuses it: vLLM leaves a Llama config as it is, so no MTP drafter exists."""
    results, _, _ = vllm_run
    assert results["mtp-on-llama"].get("error", "").startswith(
        "NotImplementedError: Unsupported speculative method: 'mtp'"), results["mtp-on-llama"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_schema_files_are_generated_from_the_engine(engine, request):
    """templates/engines/*.json equal what the engine's code says (scripts/engine_schemas.py
    writes them from the same run)."""
    generated = request.getfixturevalue(f"{engine}_run")[2]["schema"]
    name = {"vllm": "vllm-0.33.json", "sglang": "sglang-0.5.23.json"}[engine]
    committed = json.loads((templates_dir() / "engines" / name).read_text())
    assert committed == generated, "run scripts/engine_schemas.py and commit the result"
