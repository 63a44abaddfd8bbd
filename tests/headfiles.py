"""Head directories written as the formats lay them out (speculators EAGLE-3, Medusa as TGI reads
it) over a tiny target, with numpy arrays in real safetensors files: for registration tests that
need no forward pass. Heads that run come from runtime/ (trained or random torch modules)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HIDDEN, LAYERS, VOCAB, DRAFT_VOCAB = 16, 6, 40, 24
# draft id i -> target id: every other id from 3 to 29, then 30..39 (ascending, one to one)
DRAFT_IDS = list(range(3, 30, 2)) + list(range(30, 40))
assert len(set(DRAFT_IDS)) == DRAFT_VOCAB


def token_vocab(vocab: int = VOCAB, renamed: dict[int, str] | None = None) -> dict[int, str]:
    strings = {i: f"tok{i}" for i in range(vocab)}
    strings.update(renamed or {})
    return strings


def write_tokenizer(directory: Path, strings: dict[int, str]) -> None:
    """A tokenizer.json as the tokenizers library lays it out (BPE vocab + added special tokens)."""
    added = [{"id": 0, "content": strings[0], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}]
    data = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "model": {"type": "BPE", "vocab": {token: i for i, token in strings.items() if i != 0}, "merges": []}}
    (directory / "tokenizer.json").write_text(json.dumps(data))


def write_target(directory: Path, *, hidden: int = HIDDEN, layers: int = LAYERS, vocab: int = VOCAB,
                 config_extra: dict | None = None, extra_tensors: dict | None = None,
                 strings: dict[int, str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": layers, "vocab_size": vocab, "intermediate_size": 2 * hidden,
              "num_attention_heads": 2, "num_key_value_heads": 2}
    config.update(config_extra or {})
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": np.zeros((vocab, hidden), np.float32),
               "lm_head.weight": np.zeros((vocab, hidden), np.float32),
               "model.norm.weight": np.ones(hidden, np.float32)}
    for layer in range(layers):
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = np.ones(hidden, np.float32)
    tensors.update(extra_tensors or {})
    save_file(tensors, str(directory / "model.safetensors"))
    write_tokenizer(directory, strings or token_vocab(vocab))
    return directory


def vocab_maps(draft_ids=DRAFT_IDS, vocab: int = VOCAB):
    d2t = np.array(draft_ids, np.int64) - np.arange(len(draft_ids), dtype=np.int64)
    t2d = np.zeros(vocab, bool)
    t2d[[i for i in draft_ids if 0 <= i < vocab]] = True
    return d2t, t2d


def write_eagle3(directory: Path, *, hidden: int = HIDDEN, vocab: int = VOCAB, draft_vocab: int = DRAFT_VOCAB,
                 aux: list[int] | None = (1, 3, 4), target_hidden: int | None = None, d2t=None, t2d=None,
                 vocab_map: bool = True, verifier: str | None = "models/target",
                 architectures: list[str] | None = ("LlamaForCausalLM",), fingerprint: dict | None = None,
                 config_extra: dict | None = None, tensor_extra: dict | None = None,
                 strings: dict[int, str] | None = None) -> Path:
    """A speculators-format EAGLE-3 head, laid out as speculators' save_pretrained writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    aux_count = len(aux) if aux else 3
    reads = target_hidden or hidden
    tensors = {"fc.weight": np.zeros((hidden, aux_count * reads), np.float32),
               "layers.0.self_attn.q_proj.weight": np.zeros((hidden, 2 * hidden), np.float32),
               "layers.0.hidden_norm.weight": np.ones(hidden, np.float32),
               "norm.weight": np.ones(hidden, np.float32),
               "lm_head.weight": np.zeros((draft_vocab, hidden), np.float32)}
    if vocab_map:
        default_d2t, default_t2d = vocab_maps()
        tensors["d2t"] = default_d2t if d2t is None else d2t
        tensors["t2d"] = default_t2d if t2d is None else t2d
    tensors.update(tensor_extra or {})
    save_file({k: v for k, v in tensors.items() if v is not None}, str(directory / "model.safetensors"))
    verifier_config = {"name_or_path": verifier, "architectures": list(architectures or [])}
    if fingerprint is not None:
        verifier_config["specreg"] = fingerprint
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
        "draft_vocab_size": draft_vocab, "norm_before_residual": False, "target_hidden_size": target_hidden,
        "eagle_aux_hidden_state_layer_ids": list(aux) if aux is not None else None,
        "transformer_layer_config": {"model_type": "llama", "hidden_size": hidden, "vocab_size": vocab,
                                     "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                                     "intermediate_size": 2 * hidden, "rms_norm_eps": 1e-6},
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                                     "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                               "verifier": verifier_config},
    }
    config.update(config_extra or {})
    (directory / "config.json").write_text(json.dumps(config))
    if strings is not None:
        write_tokenizer(directory, strings)
    return directory


def write_peagle(directory: Path, *, mask_token_id: int | None = VOCAB - 1, mask_hidden_shape=None,
                 config_extra: dict | None = None, tensor_extra: dict | None = None, **options) -> Path:
    """A speculators-format P-EAGLE head as speculators' save_pretrained writes it (models/peagle/
    config.py, core.py): the EAGLE-3 files, speculators_model_type peagle, mask_token_id and the
    mask_hidden parameter # [1, 1, A * hidden]; write_eagle3's options."""
    aux = options.get("aux", (1, 3, 4))
    width = (len(aux) if aux else 3) * (options.get("target_hidden") or options.get("hidden", HIDDEN))
    extra = {"architectures": ["PEagleSpeculator"], "speculators_model_type": "peagle"}
    if mask_token_id is not None:
        extra["mask_token_id"] = mask_token_id
    tensors = {"mask_hidden": np.zeros(mask_hidden_shape or (1, 1, width), np.float32)}
    directory = write_eagle3(directory, config_extra={**extra, **(config_extra or {})},
                             tensor_extra={**tensors, **(tensor_extra or {})}, **options)
    config = json.loads((directory / "config.json").read_text())
    config["speculators_config"]["algorithm"] = "peagle"
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def write_medusa(directory: Path, *, heads: int = 3, layers: int = 1, hidden: int = HIDDEN, vocab: int = VOCAB,
                 prefix: str = "", base: str | None = "models/target") -> Path:
    """Medusa heads as TGI reads them: config.json + medusa_lm_head.safetensors."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for head in range(heads):
        for block in range(layers):
            tensors[f"{prefix}{head}.{block}.linear.weight"] = np.zeros((hidden, hidden), np.float16)
            tensors[f"{prefix}{head}.{block}.linear.bias"] = np.zeros(hidden, np.float16)
        tensors[f"{prefix}{head}.{layers}.weight"] = np.zeros((vocab, hidden), np.float16)
    save_file(tensors, str(directory / "medusa_lm_head.safetensors"))
    config = {"medusa_num_heads": heads, "medusa_num_layers": layers}
    if base is not None:
        config["base_model_name_or_path"] = base
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def write_block_drafter(directory: Path, *, kind: str = "dflash", layout: str = "speculators", hidden: int = HIDDEN,
                        vocab: int = VOCAB, layers: int = 1, block_size: int = 4, mask_token_id: int | None = 39,
                        layer_ids: list[int] | None = (2, 4), target_hidden: int | None = None,
                        sample_from_anchor: bool | None = None, markov_rank: int = 4,
                        verifier: str | None = "models/target", config_extra: dict | None = None,
                        tensor_extra: dict | None = None) -> Path:
    """A DFlash / DSpark head (zeros) as each project lays it out: layout "speculators"
    (speculators_model_type, aux_hidden_state_layer_ids in layer-input numbering), "native"
    (DFlash: z-lab's and ModelOpt's DFlashDraftModel with dflash_config; DSpark: Qwen3DSparkModel,
    target_layer_ids in layer-output numbering). `layer_ids` are written as given."""
    directory.mkdir(parents=True, exist_ok=True)
    reads = target_hidden or hidden
    count = len(layer_ids) if layer_ids else 1
    tensors = {"fc.weight": np.zeros((hidden, count * reads), np.float32),
               "hidden_norm.weight": np.ones(hidden, np.float32), "norm.weight": np.ones(hidden, np.float32)}
    for layer in range(layers):
        tensors[f"layers.{layer}.self_attn.q_proj.weight"] = np.zeros((hidden, hidden), np.float32)
    if kind == "dspark":
        tensors["markov_head.markov_w1.weight"] = np.zeros((vocab, markov_rank), np.float32)
        tensors["markov_head.markov_w2.weight"] = np.zeros((vocab, markov_rank), np.float32)
    tensors.update(tensor_extra or {})
    save_file({k: v for k, v in tensors.items() if v is not None}, str(directory / "model.safetensors"))
    qwen3 = {"model_type": "qwen3", "hidden_size": hidden, "vocab_size": vocab, "num_hidden_layers": layers,
             "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": hidden // 2,
             "intermediate_size": 2 * hidden, "rms_norm_eps": 1e-6}
    if layout == "speculators":
        config = {"architectures": ["DFlashSpeculator" if kind == "dflash" else "DSparkSpeculator"],
                  "speculators_model_type": kind, "speculators_version": "0.9.0", "transformer_layer_config": qwen3,
                  "draft_vocab_size": vocab, "target_hidden_size": target_hidden, "block_size": block_size,
                  "aux_hidden_state_layer_ids": list(layer_ids) if layer_ids is not None else None,
                  "mask_token_id": mask_token_id, "sliding_window_non_causal": True,
                  "sample_from_anchor": bool(sample_from_anchor) if sample_from_anchor is not None else kind == "dspark",
                  "speculators_config": {"algorithm": kind, "default_proposal_method": "greedy",
                                         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens":
                                                               block_size - 1}],
                                         "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}}}
        if kind == "dspark":
            config.update(markov_rank=markov_rank, markov_head_type="vanilla", enable_confidence_head=False)
    elif kind == "dflash":
        config = {"architectures": ["DFlashDraftModel"], **qwen3, "block_size": block_size,
                  "dflash_config": {"mask_token_id": mask_token_id,
                                    "target_layer_ids": list(layer_ids) if layer_ids is not None else None},
                  "num_target_layers": LAYERS}
        if sample_from_anchor is not None:
            config["dflash_config"]["sample_from_anchor"] = sample_from_anchor
    else:
        config = {"architectures": ["Qwen3DSparkModel"], **qwen3, "block_size": block_size,
                  "target_layer_ids": list(layer_ids) if layer_ids is not None else None,
                  "mask_token_id": mask_token_id, "markov_rank": markov_rank}
        if sample_from_anchor is not None:
            config["sample_from_anchor"] = sample_from_anchor
    config.update(config_extra or {})
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def eagle_config_layout(speculators_head: Path, directory: Path, *, weights_prefix: str = "midlayer.") -> Path:
    """A speculators EAGLE-3 head rewritten as ModelOpt's and SpecForge's exports lay it out (ModelOpt
    hf_spec_export.py, SpecForge llama3_eagle.py): the decoder-layer fields at the top level,
    architectures LlamaForCausalLMEagle3, draft_vocab_size, and the aux layer ids only inside
    eagle_config; the layer's tensors under ``weights_prefix`` (SpecForge's midlayer.*)."""
    from safetensors.numpy import load_file

    directory.mkdir(parents=True, exist_ok=True)
    source = json.loads((speculators_head / "config.json").read_text())
    config = dict(source["transformer_layer_config"])
    config.update({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                   "draft_vocab_size": source["draft_vocab_size"],
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": source["eagle_aux_hidden_state_layer_ids"],
                                    "use_aux_hidden_state": True}})
    (directory / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(speculators_head / "model.safetensors"))
    save_file({(weights_prefix + name[len("layers.0."):] if name.startswith("layers.0.") else name): value
               for name, value in tensors.items()}, str(directory / "model.safetensors"))
    return directory


# model_type deepseek_v2: vLLM 0.33 rewrites a deepseek_v3 draft config into its MTP drafter
# (specreg.core.heads.eagle3_mla.MTP_REWRITTEN_MODEL_TYPES)
DEEPSEEK_FIELDS = {"model_type": "deepseek_v2", "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                   "qk_rope_head_dim": 8, "v_head_dim": 12}


def deepseek_layout(speculators_head: Path, directory: Path, **fields) -> Path:
    """A speculators EAGLE-3 head rewritten as an original-layout head with DeepSeek (MLA) layers, as
    runtime.eagle3.save_eagle3_head writes one (architectures Eagle3DeepseekV3ForCausalLM, the aux ids
    at the top level): its fc, norm, lm_head and vocabulary map, and the MLA layer tensors vLLM 0.33
    loads for the config (specreg.core.heads.eagle3_mla.layer_shapes), zeros and norms of ones."""
    from safetensors.numpy import load_file

    from specreg.core.heads.eagle3_mla import layer_shapes

    directory.mkdir(parents=True, exist_ok=True)
    source = json.loads((speculators_head / "config.json").read_text())
    config = {**source["transformer_layer_config"], **DEEPSEEK_FIELDS, **fields,
              "architectures": ["Eagle3DeepseekV3ForCausalLM"], "draft_vocab_size": source["draft_vocab_size"],
              "eagle_aux_hidden_state_layer_ids": source["eagle_aux_hidden_state_layer_ids"]}
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {name: value for name, value in load_file(str(speculators_head / "model.safetensors")).items()
               if not name.startswith("layers.")}
    hidden = config["hidden_size"]
    for layer in range(config["num_hidden_layers"]):
        for name, shape in layer_shapes(config, layer, 2 * hidden if layer == 0 else hidden).items():
            tensors[f"layers.{layer}.{name}"] = (np.ones if name.endswith("norm.weight") else np.zeros)(shape, np.float32)
    save_file(tensors, str(directory / "model.safetensors"))
    return directory
