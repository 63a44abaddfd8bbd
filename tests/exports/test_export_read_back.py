"""Every export read back as its engine parses it before the lock binds it (registry/deploy/read_back.py):
the registered EAGLE-3 head's method, k, aux layers and vocabulary map come back from each format's
files, and an export whose writer got one of them wrong is refused in one line naming the file, the
value read and the registered one, with nothing written (llama.cpp's GGUF files:
tests/engines/test_llamacpp_read_back.py; the same files run through vLLM's own code:
tests/engines/test_engine_exports.py)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from headfiles import DRAFT_IDS, deepseek_layout, eagle_config_layout, write_eagle3, write_target

from specreg.errors import ReadBackError
from specreg.registry.deploy.engines import llamacpp, sglang, trtllm, vllm
from specreg.registry.deploy.exports import plan_export, render_files

AUX = [1, 3, 4]  # the head's trained layer inputs on the 6-layer headfiles target
K = 3


@pytest.fixture
def heads(tmp_path):
    from specreg.api import Registry

    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="alice")
    target = write_target(tmp_path / "models" / "target")
    write_eagle3(tmp_path / "models" / "head", aux=AUX, verifier=str(target))
    eagle_config_layout(tmp_path / "models" / "head", tmp_path / "models" / "modelopt-head")
    deepseek_layout(tmp_path / "models" / "head", tmp_path / "models" / "deepseek-head")
    for name, head in (("eagle", "head"), ("modelopt", "modelopt-head"), ("deepseek", "deepseek-head")):
        registry.register(name, target=str(target), draft=str(tmp_path / "models" / head), method="eagle3",
                          num_speculative_tokens=K, allow_verifier_mismatch=True)
    return SimpleNamespace(root=tmp_path, registry=registry)


OPTIONS = {"k8s-vllm": {"model_volume": "pvc:models"}}


def read(heads, ref: str, fmt: str) -> dict[str, list]:
    plan = plan_export(heads.registry.get(ref), None, fmt, approved=True, force=True, options=OPTIONS.get(fmt))
    values: dict[str, list] = {}
    for item in plan.engine.read_back(plan, dict(render_files(plan))):
        values.setdefault(item.field, []).append(item.value)
    return values


@pytest.mark.parametrize("fmt", ["vllm", "k8s-vllm", "sglang", "trtllm"])
def test_each_format_reads_back_the_registered_head(heads, fmt):
    values = read(heads, "eagle@1", fmt)
    assert set(values["method"]) == {"eagle3"} and set(values["k"]) == {K}
    assert all(layers == AUX for layers in values["aux_layers"])  # vLLM: as both its model runners read them
    assert values["vocab_map"] == [DRAFT_IDS] * len(values["vocab_map"]) and values["vocab_map"]
    out = heads.root / fmt
    heads.registry.export("eagle@1", fmt, out_dir=str(out), force=True, options=OPTIONS.get(fmt))
    assert (out / "specreg.lock.json").is_file()


@pytest.mark.parametrize("fmt", ["vllm", "k8s-vllm", "sglang"])
def test_a_head_with_deepseek_layers_reads_back_as_registered(heads, fmt):
    """vLLM 0.33 serves it as Eagle3DeepseekV3ForCausalLM from the registered folder; SGLang 0.5.23
    as Eagle3DeepseekV2ForCausalLM (sglang/srt/models/kimi_k25_eagle3.py) from the layout written."""
    values = read(heads, "deepseek@1", fmt)
    assert set(values["method"]) == {"eagle3"} and set(values["k"]) == {K}
    assert all(layers == AUX for layers in values["aux_layers"]) and values["vocab_map"] == [DRAFT_IDS] * len(
        values["vocab_map"])
    if fmt == "sglang":
        plan = plan_export(heads.registry.get("deepseek@1"), None, fmt, approved=True, force=True)
        config = json.loads(dict(render_files(plan))["sglang-eagle3-head/config.json"])
        assert (config["architectures"], config["model_type"], config["q_lora_rank"], config["kv_lora_rank"]) == (
            ["Eagle3DeepseekV2ForCausalLM"], "deepseek_v2", 24, 16)


@pytest.mark.parametrize("fmt", ["vllm", "k8s-vllm"])
def test_vllm_refuses_a_deepseek_layer_head_of_model_type_deepseek_v3(heads, fmt):
    """vLLM 0.33 turns a deepseek_v3 draft config into its MTP drafter and refuses the EAGLE-3 name it
    then gets (tests/engines/test_engine_exports.py runs it); SGLang 0.5.23 takes it."""
    from specreg.errors import EngineRefusal

    models = heads.root / "models"
    deepseek_layout(models / "head", models / "deepseek-v3-head", model_type="deepseek_v3")
    heads.registry.register("deepseek-v3", target=str(heads.root / "models" / "target"),
                            draft=str(heads.root / "models" / "deepseek-v3-head"), method="eagle3",
                            num_speculative_tokens=K, allow_verifier_mismatch=True)
    with pytest.raises(EngineRefusal) as info:
        plan_export(heads.registry.get("deepseek-v3@1"), None, fmt, approved=True, force=True,
                    options=OPTIONS.get(fmt))
    assert ("the head's config has model_type 'deepseek_v3': vLLM 0.33 rewrites every draft config of that "
            "model_type into DeepSeek's MTP drafter (config/speculative.py:749-763") in str(info.value)
    assert "\n" not in str(info.value)
    assert read(heads, "deepseek-v3@1", "sglang")["aux_layers"] == [AUX]


@pytest.mark.parametrize("fmt, words", [
    ("trtllm", "the head's layer is deepseek_v2 (Eagle3DeepseekV3ForCausalLM); TensorRT-LLM 1.2 builds its EAGLE-3 "
               "layer with Eagle3Attention, Llama attention without q_norm/k_norm or multi-head latent attention"),
    ("llamacpp", "the head's layer is deepseek_v2 (Eagle3DeepseekV3ForCausalLM, MLA); llama.cpp's converter knows no "
                 "such architecture (conversion/__init__.py:163-166"),
])
def test_engines_without_a_deepseek_layer_head_refuse_it_in_one_line(heads, fmt, words):
    from specreg.errors import EngineRefusal

    with pytest.raises(EngineRefusal) as info:
        plan_export(heads.registry.get("deepseek@1"), None, fmt, approved=True, force=True)
    assert words in str(info.value) and "\n" not in str(info.value)


def with_value(function, **changes):
    """``function`` (a writer's dict-returning step) with ``changes`` applied to what it returns."""
    def changed(*args, **kwargs):
        return {**function(*args, **kwargs), **changes}
    return changed


def other_d2t_head(heads) -> str:
    """A copy of the registered head whose d2t maps draft id 0 elsewhere (4 instead of 3)."""
    from safetensors.numpy import load_file, save_file

    folder = heads.root / "models" / "other-head"
    shutil.copytree(heads.root / "models" / "head", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["d2t"] = tensors["d2t"] + (np.arange(len(DRAFT_IDS)) == 0)
    save_file(tensors, str(folder / "model.safetensors"))
    return str(folder)


# (format, the writer's bug, the key named in the refusal, what it reads back)
WRONG = [
    ("vllm", "k", "vllm-serve.sh --speculative-config num_speculative_tokens", f"{K + 1}, registered {K}"),
    ("vllm", "method", "vllm-serve.sh --speculative-config method", "'eagle', registered 'eagle3'"),
    ("vllm", "d2t", "d2t (draft_vocab_size 24, target vocabulary 40)", "draft id 0 -> target id 4, registered 3"),
    ("k8s-vllm", "k", "vllm-config.yaml --speculative-config num_speculative_tokens", f"{K + 1}, registered {K}"),
    ("sglang", "layers", "eagle_config.eagle_aux_hidden_state_layer_ids [1, 3, 4] (captured at layer v + 1)",
     "[2, 4, 5], registered [1, 3, 4]"),
    ("sglang", "k", "sglang-launch.sh --speculative-num-steps", f"{K + 1}, registered {K}"),
    ("trtllm", "layers", "eagle3_layers_to_capture [1, 3, 4] (layer outputs: id + 1)",
     "[2, 4, 5], registered [1, 3, 4]"),
    ("trtllm", "method", "trtllm-config.yaml decoding_type DraftTarget", "'draft_model', registered 'eagle3'"),
    ("llamacpp", "k", "llama-server.sh --spec-draft-n-max", f"{K + 1}, registered {K}"),
    ("llamacpp", "method", "llama-server.sh --spec-type draft-simple", "'draft_model', registered 'eagle3'"),
]


@pytest.mark.parametrize("fmt, bug, where, value", WRONG, ids=[f"{w[0]}-{w[1]}" for w in WRONG])
def test_a_writer_bug_is_refused_naming_both_values_and_nothing_is_written(heads, monkeypatch, fmt, bug, where,
                                                                           value):
    if fmt in ("vllm", "k8s-vllm") and bug in ("k", "method"):
        change = {"k": {"num_speculative_tokens": K + 1}, "method": {"method": "eagle"}}[bug]
        monkeypatch.setattr(vllm, "speculative_config", with_value(vllm.speculative_config, **change))
    elif bug == "d2t":
        monkeypatch.setattr(vllm, "speculative_config", with_value(vllm.speculative_config,
                                                                   model=other_d2t_head(heads)))
    elif fmt == "sglang" and bug == "layers":  # the translation into SGLang's numbering forgotten
        monkeypatch.setattr(sglang, "sglang_aux_ids", list)
    elif fmt == "sglang":
        command = sglang.command
        monkeypatch.setattr(sglang, "command", lambda *args: [
            ["--speculative-num-steps", str(K + 1)] if line[0] == "--speculative-num-steps" else line
            for line in command(*args)])
    elif fmt == "trtllm":
        change = {"layers": {"eagle3_layers_to_capture": AUX}, "method": {"decoding_type": "DraftTarget"}}[bug]
        monkeypatch.setattr(trtllm, "speculative_config", with_value(trtllm.speculative_config, **change))
    elif fmt == "llamacpp" and bug == "k":
        command = llamacpp.command
        monkeypatch.setattr(llamacpp, "command", lambda target, draft, k, *args, **kwargs:
                            command(target, draft, k + 1, *args, **kwargs))
    else:
        monkeypatch.setattr(llamacpp, "spec_type", lambda pair_version: "draft-simple")
    out = heads.root / "out"
    with pytest.raises(ReadBackError) as info:
        heads.registry.export("eagle@1", fmt, out_dir=str(out), force=True, options=OPTIONS.get(fmt))
    message = str(info.value)
    assert message.startswith(f"{fmt} export of eagle@1 refused: ") and "\n" not in message
    assert where in message and f"reads back {value}; the lock binds only" in message, message
    assert not out.exists()


def test_vllm_reads_eagle_config_ids_only_on_its_v1_runner_so_the_export_is_refused(heads):
    # ModelOpt and SpecForge write the ids inside eagle_config only: vLLM 0.33's V1 runner reads them
    # there, its V2 runner (the default with Triton) reads eagle_config["layer_ids"] and falls back to
    # the target's default (2, N // 2, N - 3) = (2, 3, 3) on 6 layers
    values = read(heads, "modelopt@1", "vllm")
    assert values["aux_layers"] == [[2, 3], AUX, [2, 3], AUX]  # V2, V1 for the script and for the JSON file
    with pytest.raises(ReadBackError, match=r"aux layers as vLLM's V2 model runner \(GPU default\) reads them "
                                            r"reads back \[2, 3\], registered \[1, 3, 4\]"):
        heads.registry.export("modelopt@1", "vllm", out_dir=str(heads.root / "modelopt"), force=True)
    assert not (heads.root / "modelopt").exists()
    # SGLang and TensorRT-LLM are given the registered ids in their own terms
    assert read(heads, "modelopt@1", "sglang")["aux_layers"] == [AUX]
    assert read(heads, "modelopt@1", "trtllm")["aux_layers"] == [AUX]


def test_vllm_serving_the_head_folder_reads_back_its_verifier_as_the_target(heads):
    # `vllm serve HEAD_DIR`: maybe_override_with_speculators serves verifier.name_or_path instead
    # (vllm/transformers_utils/config.py:800-876); the export names the target, so this never reads back
    version = heads.registry.get("eagle@1")
    plan = plan_export(version, None, "vllm", approved=True, force=True)
    head_config = json.loads((heads.root / "models" / "head" / "config.json").read_text())
    head_config["speculators_config"]["verifier"]["name_or_path"] = "meta-llama/Llama-3.1-8B-Instruct"
    (heads.root / "models" / "head" / "config.json").write_text(json.dumps(head_config))
    served = vllm.serve_args(plan, [version.draft.path], "by hand")
    assert [item.value for item in served if item.field == "target"] == \
        [version.draft.path, "meta-llama/Llama-3.1-8B-Instruct"]
    from specreg.registry.deploy.read_back import check

    with pytest.raises(ReadBackError, match="reads back 'meta-llama/Llama-3.1-8B-Instruct', registered"):
        check(plan, [item for item in served if item.value != version.draft.path])
    assert [item.value for item in vllm.read_back(plan, dict(render_files(plan))) if item.field == "target"] == \
        [version.target.path]


def test_the_cli_refuses_in_one_line_with_exit_1(heads, monkeypatch):
    from clirun import run_specreg

    monkeypatch.setattr(sglang, "sglang_aux_ids", list)  # the writer's bug: SGLang's numbering forgotten
    out = heads.root / "cli"
    done = run_specreg(["export", "eagle@1", "--format", "sglang", "-o", out, "--force",
                        "--db", f"sqlite:///{heads.root / 'registry.db'}"])
    assert done.returncode == 1 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "refused" in line]
    assert len(errors) == 1 and "reads back [2, 4, 5], registered [1, 3, 4]" in errors[0], done.stderr
    assert not out.exists()
