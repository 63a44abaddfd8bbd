"""SGLang EAGLE-3: the export writes the head as SGLang 0.5.23 loads it (sglang-eagle3-head/: a
config.json in SGLang's terms beside links to the head's own files), translates the trained aux
layers into SGLang's numbering, refuses what SGLang cannot capture, and the pair lock binds the
layout's files. tests/engines runs the written layout through SGLang's own model-config path."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from exportcase import BASELINES, fingerprint, make_pair, record_argv

from specreg.core.types import ModelRef
from specreg.errors import EngineRefusal, SpecregError
from specreg.registry.deploy.exports import draft_layout, plan_export, render_export, render_files
from specreg.registry.deploy.lock import build_lock, lock_text
from specreg.registry.deploy.verify import verify_lock
from specreg.registry.deploy.export_files import Link, write_export
from specreg.registry.store.entities import SpecConfig, SpecMethod


LAYERS = 16


@pytest.fixture
def eagle3_pair(tmp_path):
    """An eagle3 pair whose head and target directories exist: a speculators head (tests/headfiles.py)
    trained on the states entering layers 2, 8 and 13 of a 16-layer Llama target (its config.json)."""
    from headfiles import write_eagle3

    return make_eagle3_pair(tmp_path, write_eagle3, aux=(2, 8, 13))


def make_eagle3_pair(tmp_path: Path, write_eagle3, aux, architecture="LlamaForCausalLM", config_extra=None):
    target = tmp_path / "target"
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps({
        "architectures": [architecture], "model_type": "llama", "hidden_size": 32, "num_hidden_layers": LAYERS,
        "vocab_size": 64}))
    head = write_eagle3(tmp_path / "head", hidden=32, vocab=64, draft_vocab=64, vocab_map=False, aux=list(aux),
                        verifier=str(target), config_extra=config_extra)
    base = make_pair()
    identity = dataclasses.replace(base.target.fingerprint, architecture=architecture)
    config = SpecConfig(SpecMethod.EAGLE3, 3, head={"layout": "speculators", "fit": {"aux_layer_ids": list(aux)}})
    return dataclasses.replace(base, target=ModelRef(str(target), str(target), "abc123", identity),
                               draft=ModelRef(str(head), str(head), None, fingerprint("e")), config=config)


def test_the_export_writes_sglang_its_head_layout(eagle3_pair, tmp_path):
    files = dict(render_export(eagle3_pair, BASELINES, "sglang", approved=True))
    assert sorted(files) == ["sglang-eagle3-head/config.json", "sglang-eagle3-head/model.safetensors",
                             "sglang-launch.sh"]
    config = json.loads(files["sglang-eagle3-head/config.json"])
    assert (config["architectures"], config["model_type"], config["num_hidden_layers"]) == \
        (["LlamaForCausalLMEagle3"], "llama", 1)
    # the states entering layers 2, 8, 13 are SGLang's ids 1, 7, 12 (it captures id v at layer v + 1)
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 7, 12], "use_aux_hidden_state": True}
    assert (config["hidden_size"], config["draft_vocab_size"]) == (32, 64)
    link = files["sglang-eagle3-head/model.safetensors"]
    assert isinstance(link, Link) and link == str(Path(eagle3_pair.draft.reference) / "model.safetensors")
    out = tmp_path / "out"
    write_export(list(files.items()), out)
    argv = record_argv("", tmp_path / "run", script=out / "sglang-launch.sh")
    flag = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert flag["--speculative-draft-model-path"] == str(out.resolve() / "sglang-eagle3-head")
    # SGLang counts the verified root among the draft tokens: with top-k 1, a chain of k is k + 1
    assert (flag["--speculative-algorithm"], flag["--speculative-num-steps"], flag["--speculative-eagle-topk"],
            flag["--speculative-num-draft-tokens"]) == ("EAGLE3", "3", "1", "4")
    assert "--enable-metrics" in argv
    assert (out / "sglang-eagle3-head" / "model.safetensors").resolve() == Path(eagle3_pair.draft.path) / "model.safetensors"
    # a second export over the first replaces the links, never writes through them
    write_export(list(files.items()), out, overwrite=True)
    assert os.readlink(out / "sglang-eagle3-head" / "model.safetensors") == link


def test_the_lock_binds_the_layout_sglang_loads(eagle3_pair, tmp_path):
    """`specreg verify --draft` passes on the written layout and fails on the registered head, whose
    config.json is not what SGLang reads."""
    plan = plan_export(eagle3_pair, BASELINES, "sglang", approved=True)
    out = tmp_path / "out"
    write_export(render_files(plan), out)
    layout = draft_layout(plan)
    lock = build_lock(eagle3_pair, engine=None, baselines=BASELINES, approvals=[], audit_head={}, approved=True,
                      exported_by="tester", draft_layout=layout)
    assert lock["models"]["draft"]["layout"] == "sglang-eagle3-head"
    (out / "specreg.lock.json").write_text(lock_text(lock))
    check = dict(lock_path=out / "specreg.lock.json", public_key=None, allow_unsigned=True, target=eagle3_pair.target.path)
    assert verify_lock(**check, draft=out / "sglang-eagle3-head").passed
    report = verify_lock(**check, draft=eagle3_pair.draft.path)
    assert not report.passed and "config.json differs" in report.failure["detail"]


@pytest.mark.parametrize("aux, architecture, extra, reason", [
    ((2, 8, LAYERS), "LlamaForCausalLM", None, r"state after the target's last layer .*llama.py:929-941"),
    ((2, 8, 13), "GptOssForCausalLM", None, "checked for LlamaForCausalLM.*not GptOssForCausalLM"),
    ((2, 8, 13), "LlamaForCausalLM", {"norm_before_residual": True}, "llama_eagle3.py:96-99"),
    ((2, 8, 13), "LlamaForCausalLM", {"transformer_layer_config": {
        "model_type": "llama", "hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "intermediate_size": 64}}, "2 decoder layers.*llama_eagle3.py:104-105"),
])
def test_what_sglang_cannot_capture_or_load_is_refused(aux, architecture, extra, reason, tmp_path):
    from headfiles import write_eagle3

    pair = make_eagle3_pair(tmp_path, write_eagle3, aux=aux, architecture=architecture, config_extra=extra)
    with pytest.raises(EngineRefusal, match=reason) as info:
        render_export(pair, BASELINES, "sglang", approved=True)
    assert "\n" not in str(info.value)


def test_a_head_reference_that_is_no_path_is_refused(eagle3_pair):
    # a hub id (ORG/NAME@REVISION): the export names it as such, so there is no folder to link to
    # (a local folder is always named by its absolute path: exports.served_reference)
    pair = dataclasses.replace(eagle3_pair, draft=dataclasses.replace(eagle3_pair.draft, reference="org/head",
                                                                      revision="0123456789abcdef0123456789abcdef01234567"))
    with pytest.raises(SpecregError, match="links the head's files by absolute path"):
        render_export(pair, BASELINES, "sglang", approved=True)
    assert render_export(pair, BASELINES, "sglang", approved=True, options={"model_source": "path"})


def test_the_norm_flags_the_head_was_validated_with_reach_sglang(tmp_path):
    """SGLang 0.5.23 reads norm_output and fc_norm from the head's config (llama_eagle3.py:185, 207),
    norm_before_fc from eagle_config: the layout carries each flag the head sets."""
    from headfiles import write_eagle3

    pair = make_eagle3_pair(tmp_path, write_eagle3, aux=(2, 8, 13),
                            config_extra={"norm_output": True, "fc_norm": True, "norm_before_fc": False})
    config = json.loads(dict(render_export(pair, BASELINES, "sglang", approved=True))["sglang-eagle3-head/config.json"])
    assert (config["norm_output"], config["fc_norm"], "norm_before_fc" in config["eagle_config"]) == (True, True, False)


def test_a_head_in_the_original_layout_keeps_its_layer_fields(tmp_path):
    """ModelOpt and SpecForge write the head's decoder-layer fields at the top level of its config
    (no transformer_layer_config): the layout takes them from there, with SGLang's ids in eagle_config
    and no top-level ids (SGLang reads eagle_config's only, spec_aux_hidden_state.py:184-196)."""
    from headfiles import eagle_config_layout, write_eagle3

    pair = make_eagle3_pair(tmp_path, write_eagle3, aux=(2, 8, 13))
    head = eagle_config_layout(Path(pair.draft.path), tmp_path / "modelopt-head")
    pair = dataclasses.replace(pair, draft=dataclasses.replace(pair.draft, path=str(head), reference=str(head)))
    config = json.loads(dict(render_export(pair, BASELINES, "sglang", approved=True))["sglang-eagle3-head/config.json"])
    assert (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"], config["vocab_size"],
            config["rms_norm_eps"]) == (32, 64, 2, 64, 1e-6)
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 7, 12], "use_aux_hidden_state": True}
    assert "eagle_aux_hidden_state_layer_ids" not in config and config["draft_vocab_size"] == 64


@pytest.mark.parametrize("fields, reason", [
    ({"q_lora_rank": None}, r"no q_lora_rank \(q_proj\); SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM requires one "
                            r"\(\"Eagle3 MLA layer requires q_lora_rank\", sglang/srt/models/kimi_k25_eagle3.py:114-117\)"),
    ({"num_hidden_layers": 2}, r"2 decoder layers; .*kimi_k25_eagle3.py:243-244"),
    ({"norm_before_residual": True}, r"keeps the un-normed hidden state as the residual .*kimi_k25_eagle3.py:159"),
    ({"rope_interleave": False}, r"rope_interleave false; SGLang 0.5.23 then rotates .*deepseek_v2.py:2166"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "attention_factor": 1.0,
                          "original_max_position_embeddings": 16}}, r"deepseek_llama_scaling.*deepseek_v2.py:1115-1136"),
])
def test_a_deepseek_layer_head_sglang_would_run_otherwise_is_refused(tmp_path, fields, reason):
    """SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM against vLLM 0.33's deepseek_eagle3.py, which the
    runtime validated: what it would build or compute otherwise is refused in one line."""
    from headfiles import deepseek_layout, write_eagle3

    pair = make_eagle3_pair(tmp_path, write_eagle3, aux=(2, 8, 13))
    speculators = Path(pair.draft.path)
    head = deepseek_layout(speculators, tmp_path / "deepseek-head", **fields)
    pair = dataclasses.replace(pair, draft=dataclasses.replace(pair.draft, path=str(head), reference=str(head)))
    with pytest.raises(EngineRefusal, match=reason) as info:
        render_export(pair, BASELINES, "sglang", approved=True)
    assert "\n" not in str(info.value)
    written = deepseek_layout(speculators, tmp_path / "plain")  # the same head without the field
    pair = dataclasses.replace(pair, draft=dataclasses.replace(pair.draft, path=str(written), reference=str(written)))
    config = json.loads(dict(render_export(pair, BASELINES, "sglang", approved=True))["sglang-eagle3-head/config.json"])
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and config["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"] == [1, 7, 12]
