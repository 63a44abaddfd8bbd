"""The heads of this folder's tests, built once per session by the training tools' own code
(build_tool_heads.py, run with speculators and nvidia-modelopt on its import path:
headtool_env.py) over an 8-layer tiny Llama target (with the Llama 2 tokenizer layout, which
llama.cpp's converter reads), and a SpecForge head laid out from its source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # headtool_env

from headtool_env import BUILD_SCRIPT, ToolUnavailable, prepare_tools  # noqa: E402
from helpers import in_ci  # noqa: E402

TARGET_LAYERS = 8  # vLLM's default aux layers (2, N // 2, N - 3) = (2, 4, 5); ModelOpt's, by output, (1, 3, 4)


def write_specforge_head(target_dir: Path, directory: Path, output_ids: list[int]) -> Path:
    """An EAGLE-3 head as SpecForge saves its LlamaForCausalLMEagle3 (specforge/modeling/draft/
    llama3_eagle.py; configs/*-eagle3.json): the head's LlamaConfig with draft_vocab_size, the
    layer-output ids it trained on inside eagle_config, weights embed_tokens, midlayer.*, fc, norm,
    lm_head, d2t, t2d. The weights are a fresh head of specreg's runtime reading the inputs of
    layers output_ids + 1 (what SpecForge's layer-output hooks collect)."""
    from safetensors.torch import save_file

    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.eagle3 import new_eagle3_head

    target = load_model(target_dir)
    vocab = int(target.config.vocab_size)
    head = new_eagle3_head(target, range(1, vocab, 2), aux_layer_ids=[i + 1 for i in output_ids], seed=9)
    state = {key.replace("layers.0.", "midlayer.", 1): value.detach().contiguous()
             for key, value in head.state_dict().items()}
    directory.mkdir(parents=True)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    layer = head.config
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "attention_bias": False,
              "attention_dropout": 0.0, "bos_token_id": layer.bos_token_id, "eos_token_id": layer.eos_token_id,
              "head_dim": layer.head_dim, "hidden_act": "silu", "hidden_size": layer.hidden_size,
              "initializer_range": 0.02, "intermediate_size": layer.intermediate_size,
              "max_position_embeddings": layer.max_position_embeddings,
              "num_attention_heads": layer.num_attention_heads,
              "num_hidden_layers": 1, "num_key_value_heads": layer.num_key_value_heads,
              "rms_norm_eps": layer.rms_norm_eps, "rope_scaling": None,
              "rope_theta": layer.rope_parameters["rope_theta"], "tie_word_embeddings": False, "use_cache": True,
              "vocab_size": vocab, "draft_vocab_size": int(head.lm_head.weight.shape[0]),
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(output_ids)}}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


@pytest.fixture(scope="session")
def tool_heads(tmp_path_factory, terminal_line) -> dict[str, Path]:
    """{"target": the 8-layer target, "<head>": its directory} for build_tool_heads.py's heads and
    "specforge"; skips without the package index (a failure with CI=true)."""
    from tinymodels import build_llama, build_tokenizer

    try:
        tools = prepare_tools(log=terminal_line)
    except ToolUnavailable as exc:
        if in_ci():
            pytest.fail(f"speculators / nvidia-modelopt cannot be installed in CI: {exc}")
        pytest.skip(f"speculators / nvidia-modelopt unavailable: {exc} (set CI=true to make this a failure)")
    root = tmp_path_factory.mktemp("tool-heads")
    # the Llama 2 tokenizer layout, which llama.cpp's converter reads (it refuses our byte-level BPE)
    build_tokenizer(root / "tokenizer", llama_layout=True)
    target = build_llama(root / "target", root / "tokenizer", seed=5, num_layers=TARGET_LAYERS)
    env = dict(os.environ, PYTHONPATH=str(tools), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    built = subprocess.run([sys.executable, str(BUILD_SCRIPT), str(target), str(root / "heads")], env=env,
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-4000:]
    heads = {name: root / "heads" / name for name in json.loads((root / "heads" / "heads.json").read_text())}
    heads["specforge"] = write_specforge_head(target, root / "heads" / "specforge", [1, 3, 4])
    return {"target": target, **heads}
