"""What register accepted and validate then refused: heads an engine cannot run are
refused at registration with the engine's reason; what an engine runs but specreg's runtime does
not is said at registration, and validate then records an error (exit 1), never a fail of the
pair. Real tiny Llama targets (tests/tinymodels.py), heads written by the runtime's own savers,
the CLI run as a user runs it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)

LAYERS = 4  # vLLM's default aux ids (2, N // 2, N - 3) repeat a layer on 4, 5 and 6 layers


@pytest.fixture(scope="module")
def shallow(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """A 4-layer Llama target over the tiny tokenizer; EAGLE-3 heads for it written by
    runtime.eagle3.save_eagle3_head: "named" reads layers [1, 2, 3], "default" names no ids (vLLM
    then reads the target's default [2, 2, 1]), "last" reads [1, 2, 4] (4 = the last layer's
    output). And the 2-layer tiny target with one MTP layer (runtime.mtp.save_target_with_mtp)."""
    from tinymodels import build_llama

    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.mtp import new_mtp_head, save_target_with_mtp

    root = tmp_path_factory.mktemp("shallow")
    target_dir = build_llama(root / "target", tiny_models["tokenizer"], seed=1, num_layers=LAYERS)
    target = load_model(target_dir)
    dirs = {"target": target_dir}
    for name, aux in (("named", (1, 2, 3)), ("default", (1, 2, 3)), ("last", (1, 2, 4))):
        dirs[name] = save_eagle3_head(new_eagle3_head(target, aux_layer_ids=aux, seed=3), root / name,
                                      str(target_dir), ["LlamaForCausalLM"])
    config = json.loads((dirs["default"] / "config.json").read_text())
    del config["eagle_aux_hidden_state_layer_ids"]  # fc stays sized for 3 states: vLLM's default count
    (dirs["default"] / "config.json").write_text(json.dumps(config))
    small = load_model(tiny_models["target"])
    dirs["mtp"] = save_target_with_mtp(new_mtp_head(small, seed=4), tiny_models["target"], root / "mtp")
    return dirs


def register(name, target, head, db_url, method="eagle3"):
    args = ["register", name, "--target", target, "--method", method, "-k", "2", "--db", db_url]
    return run(*args, *(["--draft", head] if head is not None else []))


def test_default_aux_ids_that_repeat_a_layer_are_refused_at_registration(shallow, db_url):
    result = register("dflt", shallow["target"], shallow["default"], db_url)
    one_line(result, 1, "aux layer ids: the head names none, and the target's default (2, N // 2, N - 3) = "
                        "[2, 2, 1] names layer 2 twice on this 4-layer target; vLLM 0.33 collects each layer once",
             "name eagle_aux_hidden_state_layer_ids in the head's config.json")
    assert "no pairs registered" in run("list", "--db", db_url).stdout
    # the same head naming its layers registers
    assert register("named", shallow["target"], shallow["named"], db_url).returncode == 0


def test_validate_on_such_a_head_gives_one_line_not_a_torch_error(shallow):
    """What validate runs on a pair registered before the refusal: the runtime's loader (was:
    "size mismatch for fc.weight: copying a param with shape torch.Size([64, 192]) ...") and the
    head check of the tokenizer step."""
    from specreg.errors import HeadMismatchError, RuntimeConfigError
    from specreg.runtime.methods import load_pair
    from specreg.validators.head_vocabulary import check_head_vocabulary

    with pytest.raises(RuntimeConfigError) as exc:
        load_pair(shallow["target"], shallow["default"], method="eagle3")
    message = str(exc.value)
    assert "\n" not in message and "names a layer twice on a 4-layer target" in message, message
    result = check_head_vocabulary("eagle3", str(shallow["default"]), str(shallow["target"]))
    assert result.status == "fail" and "names layer 2 twice" in result.summary and "\n" not in result.summary


def test_aux_id_n_registers_and_validates_as_vllm_reads_it(shallow, db_url, tmp_path):
    """Aux id N is the last layer's output before the final norm, which vLLM 0.33 collects
    (models/llama.py) and speculators' trainer may name; the runtime reads the same state (not
    transformers' normed hidden_states[N]): registered without a warning, validated exactly."""
    result = register("last", shallow["target"], shallow["last"], db_url)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    result = run("validate", "last@1", "--golden", "smoke", "--device", "cpu", "--json", "--db", db_url,
                 "--checks", "integrity,tokenizer,equivalence")
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr)
    checks = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert checks == {"integrity": "pass", "tokenizer": "pass", "equivalence": "pass"}


def test_an_mtp_layer_without_eh_proj_is_refused_at_registration(shallow, db_url, tmp_path):
    from safetensors.torch import load_file, save_file

    layers = json.loads((shallow["mtp"] / "config.json").read_text())["num_hidden_layers"]
    assert register("mtp", shallow["mtp"], None, db_url, method="mtp").returncode == 0
    broken = Path(shutil.copytree(shallow["mtp"], tmp_path / "no-eh-proj"))
    weights = load_file(broken / "model.safetensors")
    del weights[f"model.layers.{layers}.eh_proj.weight"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    result = register("mtp-broken", broken, None, db_url, method="mtp")
    one_line(result, 1, f"MTP layer 0 has no model.layers.{layers}.eh_proj.weight: vLLM 0.33 builds it for deepseek "
                        "MTP layers and refuses a checkpoint without it (\"Following weights were not initialized "
                        "from checkpoint\", model_loader/default_loader.py:567)")
    assert [row["name"] for row in json.loads(run("list", "--json", "--db", db_url).stdout)] == ["mtp"]


def original_layout(speculators_dir: Path, directory: Path, *, architectures=("LlamaForCausalLMEagle3",),
                    eagle_config: dict | None = None, extra: dict | None = None) -> Path:
    """The head of a speculators directory rewritten in the original EAGLE-3 layout (a LlamaConfig
    of the head with draft_vocab_size beside its weights), as ModelOpt and SpecForge write it."""
    config = json.loads((speculators_dir / "config.json").read_text())
    layout = dict(config["transformer_layer_config"], architectures=list(architectures),
                  draft_vocab_size=config["draft_vocab_size"], **(extra or {}))
    if eagle_config is not None:
        layout["eagle_config"] = eagle_config
    directory.mkdir(parents=True)
    shutil.copyfile(speculators_dir / "model.safetensors", directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(layout))
    return directory


MODELOPT_EAGLE_CONFIG = {"use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True,
                         "use_last_layernorm": True, "use_mtp_layernorm": False, "next_layer_regular": True,
                         "parallel_draft_step": 1, "parallel_draft_heads_num_layers": None}


def test_the_layers_each_engine_feeds_are_said_in_one_line_and_a_shift_is_warned(shallow, db_url, tmp_path):
    """ModelOpt numbers the layers it names by their output (a hook on layer L): ids [0, 1, 2] are
    the inputs of layers [1, 2, 3]; vLLM reads eagle_config's ids as inputs (no +1), llama.cpp's
    converter reads no eagle_config at all and takes its default."""
    modelopt = original_layout(shallow["named"], tmp_path / "modelopt",
                               eagle_config={**MODELOPT_EAGLE_CONFIG, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    result = register("modelopt", shallow["target"], modelopt, db_url)
    assert result.returncode == 0, result.stderr
    line = ("layers fed (as layer inputs): written by ModelOpt (layer outputs), trained on the inputs of layers "
            "[1, 2, 3]; vLLM 0.33 feeds [0, 1, 2]; llama.cpp's converter reads [2, 2, 1] from this directory; "
            "SGLang 0.5.23 reads [1, 2, 3] from it; specreg's runtime feeds [0, 1, 2] (as vLLM); the head's 1 llama "
            "decoder layer (LlamaForCausalLMEagle3 in vLLM 0.33)")
    assert f"  {line}\n" in result.stdout, result.stdout
    warnings = result.stderr.splitlines()
    assert warnings[0] == ("specreg: warning: layer numbering: ModelOpt numbers the layers it names by their output, "
                           "so the head was trained on the inputs of layers [1, 2, 3], but vLLM 0.33 feeds it "
                           "[0, 1, 2] (one layer early) (reads the ids as layer inputs, no +1: "
                           "v1/worker/gpu_model_runner.py:5207-5219)"), result.stderr
    assert warnings[1].startswith("specreg: warning: layer numbering: ModelOpt numbers the layers it names by their "
                                  "output, so the head was trained on the inputs of layers [1, 2, 3], but llama.cpp "
                                  "feeds it [2, 2, 1]"), result.stderr
    shown = json.loads(run("show", "modelopt@1", "--json", "--db", db_url).stdout)
    assert shown["config"]["head"]["fit"]["layers_fed"] == {
        "writer": "ModelOpt", "numbering": "layer outputs", "trained_on": [1, 2, 3], "vllm": [0, 1, 2],
        "layers": {"kind": "llama", "count": 1, "architecture": "LlamaForCausalLMEagle3"},
        "llamacpp": [2, 2, 1], "sglang": [1, 2, 3], "runtime": [0, 1, 2]}
    assert len(warnings) == 2  # SGLang reads eagle_config's ids as layer outputs, as ModelOpt wrote them
    assert f"layers          {line}" in run("show", "modelopt@1", "--db", db_url).stdout
    # a speculators head: every engine feeds what it was trained on, no warning; --json says the line too
    result = run("register", "spec", "--target", shallow["target"], "--draft", shallow["named"], "--method",
                 "eagle3", "-k", "2", "--db", db_url, "--json")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert json.loads(result.stdout)["layers_fed"] == (
        "layers fed (as layer inputs): written by speculators (layer inputs), trained on the inputs of layers "
        "[1, 2, 3]; vLLM 0.33 feeds [1, 2, 3]; llama.cpp's converter reads [1, 2, 3] from this directory; "
        "SGLang 0.5.23 is fed [1, 2, 3] through specreg's sglang export (it cannot load this layout); "
        "specreg's runtime feeds [1, 2, 3] (as vLLM); the head's 1 llama decoder layer (Eagle3LlamaForCausalLM in "
        "vLLM 0.33)")


def test_sglang_reading_other_layers_than_the_head_was_trained_on_is_warned(shallow, db_url, tmp_path):
    """SGLang 0.5.23 reads eagle_config's ids only, each as a layer output (captured at the input of
    layer v + 1): a ModelOpt head given top-level ids as well (as a user does for llama.cpp's
    converter) was trained on what vLLM reads first, the top level, but SGLang feeds eagle_config's."""
    head = original_layout(shallow["named"], tmp_path / "both", extra={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
                           eagle_config={**MODELOPT_EAGLE_CONFIG, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    result = register("both", shallow["target"], head, db_url)
    assert result.returncode == 0, result.stderr
    fed = json.loads(run("show", "both@1", "--json", "--db", db_url).stdout)["config"]["head"]["fit"]["layers_fed"]
    assert (fed["trained_on"], fed["vllm"], fed["sglang"]) == ([1, 2, 3], [0, 1, 2], [2, 3, 4])
    assert ("specreg: warning: layer numbering: ModelOpt numbers the layers it names by their output, so the head "
            "was trained on the inputs of layers [1, 2, 3], but SGLang 0.5.23 feeds it [2, 3, 4] (it reads only "
            "eagle_config.eagle_aux_hidden_state_layer_ids, id v at the input of layer v + 1, else "
            "(2, N // 2, N - 3): model_runner_components/spec_aux_hidden_state.py:184-196, "
            "models/llama.py:929-941)") in result.stderr.splitlines(), result.stderr


MLA_FIELDS = dict(model_type="deepseek_v2", q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                  v_head_dim=12)


@pytest.fixture(scope="module")
def deepseek(shallow, tmp_path_factory) -> Path:
    """An EAGLE-3 head with one DeepSeek (MLA) layer for the shallow target, reading layers [1, 2, 3],
    as runtime.eagle3.save_eagle3_head writes it (the original layout, Eagle3DeepseekV3ForCausalLM)."""
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head

    target = load_model(shallow["target"])
    head = new_eagle3_head(target, aux_layer_ids=(1, 2, 3), seed=5, layer_kind="deepseek_v2", layer_fields=MLA_FIELDS)
    return save_eagle3_head(head, tmp_path_factory.mktemp("deepseek") / "head", str(shallow["target"]),
                            ["LlamaForCausalLM"])


def test_a_head_with_deepseek_layers_registers_and_validates_exactly(shallow, deepseek, db_url):
    """vLLM 0.33 serves it (deepseek_eagle3.py); specreg's runtime runs the same MLA layers: the
    layers line names them, and speculative greedy equals target-only on the golden prompts, decoded
    16 at once and one at a time."""
    result = register("deepseek", shallow["target"], deepseek, db_url)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert ("specreg's runtime feeds [1, 2, 3] (as vLLM); the head's 1 deepseek_v2 decoder layer "
            "(Eagle3DeepseekV3ForCausalLM in vLLM 0.33)\n") in result.stdout, result.stdout
    for batch in ("16", "1"):
        result = run("validate", "deepseek@1", "--golden", "smoke", "--device", "cpu", "--json", "--db", db_url,
                     "--checks", "integrity,tokenizer,equivalence", "--runtime-batch", batch)
        assert result.returncode == 0, (result.stdout[-2000:], result.stderr)
        checks = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
        assert checks == {"integrity": "pass", "tokenizer": "pass", "equivalence": "pass"}


def edited(head: Path, directory: Path, config: dict | None = None, tensors: dict | None = None,
           dropped: tuple[str, ...] = ()) -> Path:
    """A copy of `head` with config fields set (None: removed) and tensors set or dropped."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(head, directory)
    fields = json.loads((directory / "config.json").read_text())
    for key, value in (config or {}).items():
        fields.pop(key, None) if value is None else fields.__setitem__(key, value)
    (directory / "config.json").write_text(json.dumps(fields))
    weights = {name: value for name, value in load_file(directory / "model.safetensors").items() if name not in dropped}
    save_file({**weights, **(tensors or {})}, str(directory / "model.safetensors"))
    return directory


def test_a_deepseek_head_vllm_cannot_run_as_registered_is_refused_in_one_line(shallow, deepseek, db_url, tmp_path):
    """What vLLM 0.33's Eagle3DeepseekV2ForCausalLM would build otherwise, leave unset or refuse to
    load is refused at register (exit 1); a flag its class never reads is warned. A layer vLLM has
    no class for is refused naming vLLM's registry."""
    import torch

    llama = original_layout(shallow["named"], tmp_path / "llama", architectures=("Eagle3DeepseekV3ForCausalLM",),
                            extra={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    one_line(register("llama", shallow["target"], llama, db_url), 1,
             f"{llama / 'config.json'}: model_type 'llama': vLLM 0.33 builds Eagle3DeepseekV3ForCausalLM's MLA "
             "layers from a DeepSeek config's kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim "
             "(model_executor/models/deepseek_eagle3.py:64-77), read by model_type: deepseek_v2 or deepseek_v3")
    sparse = edited(deepseek, tmp_path / "sparse", {"index_topk": 64})
    one_line(register("sparse", shallow["target"], sparse, db_url), 1,
             f"{sparse / 'config.json'}: index_topk (DeepSeek sparse attention): vLLM 0.33 builds an Indexer",
             "so it cannot run this head")
    gelu = edited(deepseek, tmp_path / "gelu", {"hidden_act": "gelu"})
    one_line(register("gelu", shallow["target"], gelu, db_url), 1, "hidden_act 'gelu': vLLM 0.33's DeepSeek EAGLE-3 "
             "MLP runs silu only (model_executor/models/deepseek_v2.py:279-282 raises on another)")
    narrow = edited(deepseek, tmp_path / "narrow", {"kv_lora_rank": 8})
    one_line(register("narrow", shallow["target"], narrow, db_url), 1,
             f"{narrow / 'model.safetensors'}: tensor layers.0.self_attn.kv_a_proj_with_mqa.weight has shape [24, 128], "
             "expected [16, 128] (from the config's hidden_size")
    no_lora = edited(deepseek, tmp_path / "no-lora", {"q_lora_rank": None})  # the default 1536 then
    one_line(register("no-lora", shallow["target"], no_lora, db_url), 1,
             f"{no_lora / 'model.safetensors'}: tensor layers.0.self_attn.q_a_proj.weight has shape [24, 128], "
             "expected [1536, 128]")
    missing = edited(deepseek, tmp_path / "missing", dropped=("layers.0.self_attn.kv_a_layernorm.weight",))
    one_line(register("missing", shallow["target"], missing, db_url), 1,
             f"{missing}: no tensor layers.0.self_attn.kv_a_layernorm.weight: vLLM 0.33 builds it for the head's "
             "DeepSeek layer 0 (model_executor/models/deepseek_eagle3.py:38-99) and would leave it unset")
    normed = edited(deepseek, tmp_path / "input-norm", {"norm_before_fc": True}, {"input_norm.weight": torch.ones(192)})
    one_line(register("input-norm", shallow["target"], normed, db_url), 1,
             f"{normed / 'model.safetensors'}: tensor input_norm.weight: vLLM 0.33's Eagle3DeepseekV2ForCausalLM has "
             "no such parameter and refuses to load it (model_executor/models/utils.py:443")
    mistral = original_layout(shallow["named"], tmp_path / "mistral", architectures=("MistralForCausalLM",),
                              extra={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    one_line(register("mistral", shallow["target"], mistral, db_url), 1,
             f"{mistral / 'config.json'}: architectures ['MistralForCausalLM']: vLLM 0.33 serves it as "
             "Eagle3MistralForCausalLM (transformers_utils/configs/eagle.py), which its model registry does not have")
    assert "no pairs registered" in run("list", "--db", db_url).stdout
    # the flag alone: vLLM runs fc on the un-normed states, and so does the runtime; registered with the warning
    flagged = edited(deepseek, tmp_path / "flagged", {"norm_before_fc": True})
    result = register("flagged", shallow["target"], flagged, db_url)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "specreg: warning: norm_before_fc: the head's config sets it, but vLLM 0.33's Eagle3DeepseekV2ForCausalLM has "
        "no input_norm and never reads the flag (model_executor/models/deepseek_eagle3.py:152-226): vLLM, and "
        "specreg's runtime as it, run fc on the un-normed aux states"]
    # model_type deepseek_v3: vLLM rewrites such a draft into DeepSeek's MTP drafter; registered (SGLang and
    # the runtime build it) with the warning, and its vllm export refused
    v3 = edited(deepseek, tmp_path / "v3", {"model_type": "deepseek_v3"})
    result = register("v3", shallow["target"], v3, db_url)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "specreg: warning: vLLM cannot serve this head: the head's config has model_type 'deepseek_v3': vLLM 0.33 "
        "rewrites every draft config of that model_type into DeepSeek's MTP drafter (config/speculative.py:749-763, "
        "applied to drafts at 1403-1428) and refuses it (\"Model architectures ['Eagle3DeepSeekMTPModel'] are not "
        "supported\"); it builds Eagle3DeepseekV3ForCausalLM from model_type deepseek_v2 only; its vllm exports are "
        "refused"]
    # such a head registered before these checks: validate's head check says why in one line
    from specreg.validators.head_vocabulary import check_head_vocabulary

    result = check_head_vocabulary("eagle3", str(sparse), str(shallow["target"]))
    assert result.status != "pass" and "index_topk" in result.summary and "\n" not in result.summary


def test_a_head_whose_fc_vllm_sizes_otherwise_is_registered_with_one_warning(shallow, db_url, tmp_path):
    """vLLM 0.33 sizes fc for num_aux_hidden_states, else eagle_config's ids, else 3 states, never the
    top-level ids a speculators head names (llama_eagle3.py:209-221): a 4-id or a 2-id speculators
    head cannot be loaded by it, but the tensors agree with the ids, so another engine may serve it."""
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head

    target = load_model(shallow["target"])
    heads = {name: save_eagle3_head(new_eagle3_head(target, aux_layer_ids=aux, seed=3), tmp_path / name,
                                    str(shallow["target"]), ["LlamaForCausalLM"])
             for name, aux in (("four", (1, 2, 3, 4)), ("two", (1, 3)))}
    for name, states in (("four", 4), ("two", 2)):
        result = register(name, shallow["target"], heads[name], db_url)
        assert result.returncode == 0, result.stderr
        width = [line for line in result.stderr.splitlines() if "fc width" in line]
        assert width == [
            f"specreg: warning: fc width: vLLM 0.33 sizes the head's fc for 3 target states (192 wide, the default 3: "
            f"its config names no num_aux_hidden_states or eagle_config ids: model_executor/models/llama_eagle3.py:"
            f"209-221), but fc.weight [64, {64 * states}] reads {states} ({64 * states} wide, the layers "
            f"v1/worker/gpu_model_runner.py:5207-5219 feeds it), so its weight loader stops at fc "
            f"(model_executor/layers/linear.py:404-412); num_aux_hidden_states {states} in the head's "
            f"transformer_layer_config sizes it so; vLLM 0.33 cannot serve this head (its exports refuse it), "
            f"another engine may"], result.stderr
    # sized as its fc reads: no warning
    config = json.loads((heads["four"] / "config.json").read_text())
    config["transformer_layer_config"]["num_aux_hidden_states"] = 4
    (heads["four"] / "config.json").write_text(json.dumps(config))
    result = register("four-sized", shallow["target"], heads["four"], db_url)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    # the original layout with the 4 ids in eagle_config: vLLM sizes fc by them (the numbering warnings
    # of a SpecForge-style head are the other test's)
    speculators = json.loads((heads["four"] / "config.json").read_text())
    del speculators["transformer_layer_config"]["num_aux_hidden_states"]
    (heads["four"] / "config.json").write_text(json.dumps(speculators))
    original = original_layout(heads["four"], tmp_path / "original",
                               eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]})
    result = register("original", shallow["target"], original, db_url)
    assert result.returncode == 0 and "fc width" not in result.stderr, result.stderr


def test_a_logit_scale_vllm_does_not_read_is_warned(shallow, db_url, tmp_path):
    """A speculators head's config is its transformer_layer_config for vLLM (speculators/base.py:59), and
    update_eagle3 copies no logit_scale from the top level: the runtime and vLLM scale by 1 there."""
    config = json.loads((shallow["named"] / "config.json").read_text())
    head = tmp_path / "top-scale"
    shutil.copytree(shallow["named"], head)
    (head / "config.json").write_text(json.dumps({**config, "logit_scale": 0.5}))
    result = register("top-scale", shallow["target"], head, db_url)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "specreg: warning: logit_scale 0.5 at the top level is not read: vLLM 0.33 builds a speculators head's config "
        "from transformer_layer_config and copies no logit_scale into it (transformers_utils/configs/speculators/"
        "base.py:59, algos.py:16-50), so it scales the draft logits by 1, as specreg's runtime does"]
    (head / "config.json").write_text(json.dumps({**config, "transformer_layer_config": {
        **config["transformer_layer_config"], "logit_scale": None}}))
    one_line(register("null-scale", shallow["target"], head, db_url), 1,
             "transformer_layer_config.logit_scale must be a finite number (vLLM multiplies the draft logits by it), "
             "got None")
