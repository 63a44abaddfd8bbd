"""TensorRT-LLM 1.2's EAGLE-3 head (tensorrt_llm/_torch/models/modeling_speculative.py of the 1.2 line:
Eagle3DecoderLayer, Eagle3DraftModel) against the variants specreg validates as vLLM 0.33 runs them:
each variant it would run otherwise is refused in one line naming its source, the others are written."""

from __future__ import annotations

import pytest
from exportcase import BASELINES
from test_export_sglang_layout import make_eagle3_pair

from specreg.errors import EngineRefusal
from specreg.registry.deploy.exports import render_export

MODEL = "tensorrt_llm/_torch/models/modeling_speculative.py"


def trtllm(tmp_path, **config_extra):
    from headfiles import write_eagle3

    pair = make_eagle3_pair(tmp_path, write_eagle3, aux=(2, 8, 13), config_extra=config_extra or None)
    return dict(render_export(pair, BASELINES, "trtllm", approved=True))


@pytest.mark.parametrize("extra, words", [
    ({"norm_output": True}, "the head sets norm_output; TensorRT-LLM 1.2's Eagle3DraftModel reads only "
                            f"eh_proj_before_attn and return_hidden_post_norm of its norms ({MODEL} "
                            "Eagle3DraftModel.__init__)"),
    ({"fc_norm": True, "norm_before_fc": True}, "the head sets norm_before_fc and fc_norm; TensorRT-LLM 1.2's"),
    ({"norm_before_residual": True}, "the head was trained with norm_before_residual; TensorRT-LLM 1.2 keeps the "
                                     f"un-normed hidden state as the residual ({MODEL} Eagle3DecoderLayer.forward"),
    ({"transformer_layer_config": {"model_type": "qwen3", "hidden_size": 32, "vocab_size": 64,
                                   "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                                   "intermediate_size": 64, "rms_norm_eps": 1e-6}},
     "the head's layer is qwen3 (Eagle3Qwen3ForCausalLM); TensorRT-LLM 1.2 builds its EAGLE-3 layer with "
     "Eagle3Attention, Llama attention without q_norm/k_norm"),
    ({"transformer_layer_config": {"model_type": "llama", "hidden_size": 32, "vocab_size": 64,
                                   "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                                   "intermediate_size": 64, "rms_norm_eps": 1e-6}},
     "the head has 2 decoder layers; TensorRT-LLM 1.2 norms the input of every layer with its hidden_norm"),
])
def test_a_variant_tensorrt_llm_would_run_otherwise_is_refused_naming_its_source(tmp_path, extra, words):
    with pytest.raises(EngineRefusal) as info:
        trtllm(tmp_path, **extra)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_one_layer_llama_head_with_the_norms_it_reads_is_written(tmp_path):
    import yaml

    files = trtllm(tmp_path, norm_before_residual=False, norm_output=False, fc_norm=False, norm_before_fc=False)
    speculative = yaml.safe_load(files["trtllm-config.yaml"])["speculative_config"]
    # the states entering layers 2, 8, 13 are the outputs of layers 1, 7, 12
    assert (speculative["decoding_type"], speculative["eagle3_layers_to_capture"]) == ("Eagle", [1, 7, 12])
