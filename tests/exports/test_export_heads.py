"""Exports of the pair kinds that draft from the target's hidden states: each engine's own method
name and flags where the engine serves the pair as registered, a one-line refusal naming why where
it does not (Medusa anywhere, a static tree, MTP on a target no engine builds an MTP drafter for)."""

from __future__ import annotations

import dataclasses
import json
import shlex

import jsonschema
import pytest
import yaml
from exportcase import BASELINES, fingerprint, k8s_engine, make_pair

from specreg.core.types import ModelRef
from specreg.errors import EngineRefusal
from specreg.registry.deploy.exports import engine_schema, render_export
from specreg.registry.store.entities import SpecConfig, SpecMethod

HEAD = ModelRef("/models/eagle3-head", "/cache/eagle3-head", None, fingerprint("e"))


def head_pair(method: SpecMethod, *, k: int = 3, tree=None, model_type: str = "llama",
              architecture: str = "LlamaForCausalLM", head: dict | None = None, aux=(2, 8, 13)):
    """``aux``: the trained aux layer ids registration records (head.fit.aux_layer_ids), vLLM's numbering."""
    base = make_pair()
    target = dataclasses.replace(base.target, fingerprint=dataclasses.replace(
        base.target.fingerprint, model_type=model_type, architecture=architecture))
    config = SpecConfig(method, k, tree=tree, head=head or {"layout": "speculators", "num_heads": 1,
                                                             "fit": {"aux_layer_ids": list(aux)}})
    draft = HEAD if method in (SpecMethod.EAGLE3, SpecMethod.MEDUSA) else None
    return dataclasses.replace(base, target=target, draft=draft, config=config)


def files_of(pair, fmt: str, **options) -> dict[str, str]:
    return dict(render_export(pair, BASELINES, fmt, approved=True, options=options or None))


def test_eagle3_to_vllm_names_the_head_as_the_speculative_model(tmp_path):
    from headfiles import write_eagle3

    # vLLM's refusal reads the head's fc width against its config (vllm.head_refusal): a head folder that exists
    head = write_eagle3(tmp_path / "eagle3-head", aux=[2, 8, 13])
    pair = dataclasses.replace(head_pair(SpecMethod.EAGLE3), draft=dataclasses.replace(HEAD, path=str(head)))
    script = files_of(pair, "vllm")["vllm-serve.sh"]
    words = shlex.split(script.split("vllm serve", 1)[1].replace("\\\n", " "), comments=True)
    speculative = json.loads(words[words.index("--speculative-config") + 1])
    # a local folder is served by the path registration resolved (the folder as typed may be a link)
    assert speculative == {"method": "eagle3", "num_speculative_tokens": 3, "model": str(head),
                           "draft_tensor_parallel_size": 1, "draft_sample_method": "greedy"}


def test_eagle3_to_trtllm_and_k8s(tmp_path):
    from headfiles import write_eagle3

    # TensorRT-LLM's refusal reads the head's variant (trtllm.variant_refusal): a head folder that exists
    head = write_eagle3(tmp_path / "eagle3-head", aux=[2, 8, 13])
    pair = dataclasses.replace(head_pair(SpecMethod.EAGLE3), draft=dataclasses.replace(HEAD, path=str(head)))
    config = yaml.safe_load(files_of(pair, "trtllm")["trtllm-config.yaml"])
    spec = config["speculative_config"]
    # 1.2 knows "Eagle" (EagleDecodingConfig; eagle3_one_model selects EAGLE-3), not "Eagle3"
    assert (spec["decoding_type"], spec["max_draft_len"], spec["speculative_model"], spec["eagle3_one_model"]) == \
        ("Eagle", 3, str(head), True)  # a local folder: its resolved path
    # the head's trained states entering layers 2, 8, 13 are TensorRT-LLM's outputs of layers 1, 7, 12
    assert spec["eagle3_layers_to_capture"] == [1, 7, 12]
    jsonschema.validate(config, engine_schema("trtllm")["config"])
    manifest = files_of(pair, "k8s-vllm", model_volume="pvc:models")["k8s-vllm.yaml"]
    args = k8s_engine(manifest)[1]
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    assert speculative["method"] == "eagle3" and speculative["model"] == "/models/draft"  # the in-container path


def test_mtp_on_a_deepseek_target_exports_without_a_draft():
    pair = head_pair(SpecMethod.MTP, k=1, model_type="deepseek_v3", architecture="DeepseekV3ForCausalLM")
    script = files_of(pair, "vllm")["vllm-serve.sh"]
    words = shlex.split(script.split("vllm serve", 1)[1].replace("\\\n", " "), comments=True)
    # no `model`; the draft (the target's own MTP layers) pinned to the target's revision
    assert json.loads(words[words.index("--speculative-config") + 1]) == \
        {"method": "mtp", "num_speculative_tokens": 1, "revision": "abc123", "draft_sample_method": "greedy"}
    assert words[words.index("--revision") + 1] == "abc123"
    sglang = files_of(pair, "sglang")["sglang-launch.sh"]
    assert "--speculative-algorithm NEXTN" in sglang and "--speculative-draft-model-path" not in sglang
    config = yaml.safe_load(files_of(pair, "trtllm")["trtllm-config.yaml"])
    assert config["speculative_config"]["decoding_type"] == "MTP"
    assert config["speculative_config"]["num_nextn_predict_layers"] == 1
    jsonschema.validate(config, engine_schema("trtllm")["config"])


def test_trtllm_mtp_reuses_a_one_layer_target_for_k_tokens():
    """DeepSeek-V3/R1 have one MTP layer; TensorRT-LLM 1.2 runs it k times (MTP-Eagle: llm_args.py
    MTPDecodingConfig.spec_dec_mode, use_mtp_vanilla false), the chain specreg validates."""
    pair = head_pair(SpecMethod.MTP, k=3, model_type="deepseek_v3", architecture="DeepseekV3ForCausalLM",
                     head={"layout": "mtp:deepseek", "num_heads": 1})
    spec = yaml.safe_load(files_of(pair, "trtllm")["trtllm-config.yaml"])["speculative_config"]
    assert (spec["decoding_type"], spec["num_nextn_predict_layers"], spec["use_mtp_vanilla"]) == ("MTP", 3, False)
    jsonschema.validate({"speculative_config": spec}, engine_schema("trtllm")["config"])


@pytest.mark.parametrize("pair, fmt, reason", [
    (head_pair(SpecMethod.MEDUSA, tree=((0,), (1,), (0, 0))), "vllm", "vLLM 0.33 has no medusa method"),
    (head_pair(SpecMethod.MEDUSA), "tgi", "combined model repository"),
    (head_pair(SpecMethod.EAGLE3), "tgi", "TGI 3.3's --speculate does Medusa"),
    (head_pair(SpecMethod.EAGLE3, tree=((0,), (1,), (0, 0))), "vllm", "speculative.py:407 SpeculativeConfig"),
    (head_pair(SpecMethod.EAGLE3, tree=((0,), (1,), (0, 0))), "sglang", "fields/spec.py:62"),
    (head_pair(SpecMethod.MTP, k=1), "vllm", "no engine builds an MTP drafter for model_type 'llama'"),
    (head_pair(SpecMethod.MTP, k=3, model_type="deepseek_v3", architecture="DeepseekV3ForCausalLM",
               head={"layout": "mtp:deepseek", "num_heads": 2}), "trtllm",
     "k = 3 but the target has 2 MTP layers.*MTPDecodingConfig.spec_dec_mode"),
    (head_pair(SpecMethod.EAGLE3, aux=(0, 8, 13)), "trtllm", "reads the embeddings.*maybe_capture_hidden_states"),
    (head_pair(SpecMethod.EAGLE3, tree=((0,), (1,), (0, 0))), "trtllm", "PLEASE DO NOT USE IT"),
    (head_pair(SpecMethod.MTP, k=1, model_type="qwen3_next", architecture="Qwen3NextForCausalLM"), "sglang",
     "DeepSeek-family targets only"),
])
def test_what_an_engine_cannot_serve_is_refused_in_one_line(pair, fmt, reason):
    with pytest.raises(EngineRefusal, match=reason) as info:
        files_of(pair, fmt, **({"model_volume": "pvc:m"} if fmt == "k8s-vllm" else {}))
    assert "\n" not in str(info.value)
