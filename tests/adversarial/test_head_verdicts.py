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
            "SGLang 0.5.23 reads [1, 2, 3] from it; specreg's runtime feeds [0, 1, 2] (as vLLM)")
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
        "specreg's runtime feeds [1, 2, 3] (as vLLM)")


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


def test_a_head_whose_layers_the_runtime_cannot_build_is_refused_at_registration(shallow, db_url, tmp_path):
    """vLLM 0.33 serves an EAGLE-3 head with DeepSeek (MLA) layers; specreg's runtime builds Llama
    and Qwen3 layers: refused at register (exit 1), never registered to be failed at validate. A
    layer vLLM has no class for is refused naming vLLM's registry."""
    deepseek = original_layout(shallow["named"], tmp_path / "deepseek", architectures=("Eagle3DeepseekV3ForCausalLM",),
                               extra={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    one_line(register("deepseek", shallow["target"], deepseek, db_url), 1,
             f"{deepseek / 'config.json'}: vLLM 0.33 serves this head as Eagle3DeepseekV3ForCausalLM (deepseek_v2 "
             "decoder layers, model_executor/models/registry.py:712-713), but specreg's runtime builds llama and "
             "qwen3 layers only, so validate could not judge the pair")
    mistral = original_layout(shallow["named"], tmp_path / "mistral", architectures=("MistralForCausalLM",),
                              extra={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    one_line(register("mistral", shallow["target"], mistral, db_url), 1,
             f"{mistral / 'config.json'}: architectures ['MistralForCausalLM']: vLLM 0.33 serves it as "
             "Eagle3MistralForCausalLM (transformers_utils/configs/eagle.py), which its model registry does not have")
    assert "no pairs registered" in run("list", "--db", db_url).stdout
    # such a head registered before this refusal: validate's head check records an error, not a fail
    from specreg.validators.head_vocabulary import check_head_vocabulary

    result = check_head_vocabulary("eagle3", str(deepseek), str(shallow["target"]))
    assert result.status == "error" and "specreg's runtime builds llama and qwen3 layers only" in result.summary
