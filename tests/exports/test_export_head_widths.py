"""EAGLE-3 heads vLLM 0.33 builds otherwise than their tensors: fc sized for num_aux_hidden_states,
else eagle_config's ids, else 3 (llama_eagle3.py:209-221), which a speculators head naming 4 or 2 ids
at the top level does not load into: the vllm, k8s-vllm exports (and validate --engine vllm, the same
refusal) refuse it in one line naming both widths, the engines that size fc from the ids they are
given write it. And logit_scale, which SGLang, TensorRT-LLM and llama.cpp drop: they draft the argmax,
which a positive scale keeps, so only a scale of 0 or below is refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from exportcase import BASELINES
from test_export_sglang_layout import make_eagle3_pair

from specreg.errors import EngineRefusal
from specreg.registry.deploy.engines import llamacpp, vllm
from specreg.registry.deploy.exports import render_export


def pair_with(tmp_path, aux, **config_extra):
    from headfiles import write_eagle3

    return make_eagle3_pair(tmp_path, write_eagle3, aux=aux, config_extra=config_extra or None)


def files_of(pair, fmt: str, **options) -> dict[str, str]:
    return dict(render_export(pair, BASELINES, fmt, approved=True, options=options or None))


@pytest.mark.parametrize("aux", [(2, 5, 8, 13), (2, 8)])
def test_vllm_exports_refuse_a_head_whose_fc_it_sizes_for_three_states(tmp_path, aux):
    pair = pair_with(tmp_path, aux)
    width = 32 * len(aux)
    for fmt, options in (("vllm", {}), ("k8s-vllm", {"model_volume": "pvc:models"})):
        with pytest.raises(EngineRefusal) as info:
            files_of(pair, fmt, **options)
        message = str(info.value)
        assert "\n" not in message and (
            f"fc width: vLLM 0.33 sizes the head's fc for 3 target states (96 wide, the default 3: its config names "
            f"no num_aux_hidden_states or eagle_config ids: model_executor/models/llama_eagle3.py:209-221), but "
            f"fc.weight [32, {width}] reads {len(aux)} ({width} wide, the layers v1/worker/gpu_model_runner.py:"
            f"5207-5219 feeds it), so its weight loader stops at fc (model_executor/layers/linear.py:404-412)"
        ) in message, message
    # SGLang sizes fc from the ids its layout names, TensorRT-LLM from the layers it captures: written
    sglang = json.loads(files_of(pair, "sglang")["sglang-eagle3-head/config.json"])
    assert sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in aux]
    trtllm = yaml.safe_load(files_of(pair, "trtllm")["trtllm-config.yaml"])["speculative_config"]
    assert trtllm["eagle3_layers_to_capture"] == [i - 1 for i in aux]


def test_num_aux_hidden_states_sizes_fc_as_the_tensors_read(tmp_path):
    layer = {"model_type": "llama", "hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 64, "rms_norm_eps": 1e-6}
    pair = pair_with(tmp_path, (2, 5, 8, 13), transformer_layer_config={**layer, "num_aux_hidden_states": 4})
    speculative = json.loads(files_of(pair, "vllm")["vllm-speculative-config.json"])
    assert speculative["model"] == pair.draft.path
    # SGLang would size fc by num_aux_hidden_states first (llama_eagle3.py:156-161): the layout leaves it to the ids
    assert "num_aux_hidden_states" not in json.loads(files_of(pair, "sglang")["sglang-eagle3-head/config.json"])
    # a count that disagrees with the tensors is refused as well, naming it
    (tmp_path / "other").mkdir()
    other = pair_with(tmp_path / "other", (2, 5, 8, 13), transformer_layer_config={**layer, "num_aux_hidden_states": 5})
    with pytest.raises(EngineRefusal, match=r"sizes the head's fc for 5 target states \(160 wide, its "
                                            r"num_aux_hidden_states: .*but fc.weight \[32, 128\] reads 4"):
        files_of(other, "vllm")


def test_an_original_layout_head_with_four_eagle_config_ids_is_sized_right(tmp_path):
    from headfiles import eagle_config_layout

    pair = pair_with(tmp_path, (2, 5, 8, 13))
    head = eagle_config_layout(Path(pair.draft.path), tmp_path / "specforge-head")
    pair = dataclasses.replace(pair, draft=dataclasses.replace(pair.draft, path=str(head), reference=str(head)))
    # vLLM sizes fc by eagle_config's 4 ids (which ids its V2 runner feeds is the read-back's, tested there)
    assert vllm.refusal(pair) is None


@pytest.mark.parametrize("scale", [0.5, 2])
def test_a_positive_logit_scale_is_exported_everywhere(tmp_path, scale):
    layer = {"model_type": "llama", "hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 64, "rms_norm_eps": 1e-6,
             "logit_scale": scale}
    pair = pair_with(tmp_path, (2, 8, 13), transformer_layer_config=layer)
    assert json.loads(files_of(pair, "vllm")["vllm-speculative-config.json"])["method"] == "eagle3"
    assert "sglang-launch.sh" in files_of(pair, "sglang") and "trtllm-config.yaml" in files_of(pair, "trtllm")
    assert llamacpp.variant_refusal(pair.draft.path) is None


@pytest.mark.parametrize("scale", [0, -1.5])
def test_a_logit_scale_that_moves_the_argmax_is_refused_where_it_is_dropped(tmp_path, scale):
    layer = {"model_type": "llama", "hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 64, "rms_norm_eps": 1e-6,
             "logit_scale": scale}
    pair = pair_with(tmp_path, (2, 8, 13), transformer_layer_config=layer)
    assert json.loads(files_of(pair, "vllm")["vllm-speculative-config.json"])["method"] == "eagle3"
    for fmt, source in (("sglang", "sglang/srt/models/llama_eagle3.py:320"),
                        ("trtllm", "tensorrt_llm/_torch/speculative/eagle3.py Eagle3OneModelWorker.draft_decoder")):
        with pytest.raises(EngineRefusal) as info:
            files_of(pair, fmt)
        message = str(info.value)
        assert "\n" not in message and f"the head's logit_scale is {scale:g}: vLLM drafts from its logits scaled by it" \
            in message and source in message, message
    assert llamacpp.variant_refusal(pair.draft.path).startswith(
        f"the head's logit_scale is {scale:g}: vLLM drafts from its logits scaled by it; llama.cpp's converter writes "
        f"no logit_scale for an EAGLE-3 head (conversion/llama.py:74-104)")
