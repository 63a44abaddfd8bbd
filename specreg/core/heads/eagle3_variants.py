"""Which EAGLE-3 variant a head directory holds: the decoder layers vLLM 0.33 builds for it, its
norm flags, which tool wrote it and how that tool numbers the target layers it names; and which
target layers each engine will feed it.

What we followed (vLLM is the released 0.33.0 wheel):
- The layers vLLM builds: a speculators head by transformer_layer_config.model_type, absent =
  llama, only llama and qwen3 (transformers_utils/configs/speculators/algos.py update_eagle3, and
  update_peagle for P-EAGLE, whose norm flags differ: eagle3_checkpoint.SPECULATORS_KINDS); an
  original-layout head by its architecture, prefixed "Eagle3" unless it starts or ends with it
  (transformers_utils/configs/eagle.py), looked up in model_executor/models/registry.py:698-713:
  llama_eagle3 (Llama layers), qwen3_eagle3 (Qwen3 layers: q_norm/k_norm), deepseek_eagle3 (MLA:
  specreg.core.heads.eagle3_mla says which DeepSeek configs it runs and what it reads of the flags).
- The flags: norm_before_fc (top level, or eagle_config in the original layout), fc_norm,
  norm_output, norm_before_residual (absent: true for the speculators layout, algos.py; false for
  the original layout, getattr default); llama_eagle3.py:173-286 runs them; layers after the
  first are plain decoder layers over the hidden state alone; a layer named "sliding_attention"
  in layer_types attends within config.sliding_window (models/llama.py:185-204).
- Numbering: vLLM reads the ids at the top level, then in eagle_config, as the residual stream
  entering layer L (v1/worker/gpu_model_runner.py:5207-5219, no +1), default (2, N // 2, N - 3);
  llama.cpp's converter reads the top-level key only, else the same default, and extracts layer
  inputs too (conversion/llama.py:74-81). SGLang 0.5.23 reads eagle_config's ids only
  (model_runner_components/spec_aux_hidden_state.py:184-196) and captures id v at the input of
  layer v + 1 (models/llama.py:929-941, "the output of the (i-1)th layer"), so it reads them as
  layer outputs; without ids it captures the inputs of (2, N // 2, N - 3). speculators collects its training states through vLLM
  (inputs). ModelOpt hooks the output of layer L (modelopt/torch/speculative/plugins/hf_eagle.py
  _collect_aux_hidden_states_forward_hook; default sorted {1, N // 2 - 1, N - 4}) and writes the ids
  inside eagle_config with its own keys (export/plugins/hf_spec_configs.py); SpecForge hooks
  layer outputs as well (modeling/target/eagle3_target_model.py; default [1, N // 2 - 1, N - 4])
  and writes LlamaForCausalLMEagle3 with draft_vocab_size and the ids in eagle_config; EAGLE's
  own layout (SafeAILab/EAGLE traineagle3) names no ids and reads the inputs of (2, N // 2, N - 3).
- fc's width: vLLM sizes fc_input_size = target_hidden_size x num_aux_hidden_states, the count read
  from the head's config: num_aux_hidden_states, else len(eagle_config's ids), else 3, never the
  top-level ids (llama_eagle3.py:209-221, deepseek_eagle3.py:189-199); qwen3_eagle3.py:202-214 reads
  num_aux_layers, num_aux_hidden_states, then the top-level ids or eagle_config's. A speculators head's
  config is its transformer_layer_config with the top-level ids copied in (speculators/base.py:59,
  algos.py:47-50), so neither count is read from its top level. fc.weight of another width stops vLLM
  at load (ReplicatedLinear.weight_loader's size assert, model_executor/layers/linear.py:404-412).
- logit_scale: each class scales the draft logits by the config's logit_scale (default 1.0) before
  they are scattered into the target vocabulary (llama_eagle3.py:328-336, qwen3_eagle3.py:307-316,
  deepseek_eagle3.py:298-306; layers/logits_processor.py:118-119), read from the same config: a
  speculators head's transformer_layer_config, not its top level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specreg.core.files import read_json_file
# default_aux_layer_ids: vLLM's, llama.cpp's and EAGLE's default
from specreg.core.heads.eagle3_checkpoint import SPECULATORS_KINDS, default_aux_layer_ids
from specreg.core.heads.eagle3_mla import (check_mla_tensors, mla_config_refusal, mla_ignored_flags,
                                          vllm_model_type_refusal)
from specreg.core.heads.spec import optional_str, positive_int, read_layer_ids, shown, str_list
from specreg.errors import ModelReferenceError

# vLLM 0.33 model_executor/models/registry.py:698-713: EAGLE-3 architecture -> the layers it builds
# (P-EAGLE's architectures are the EAGLE-3 classes, run with parallel drafting)
VLLM_EAGLE3_LAYERS = {
    "PeagleLlamaForCausalLM": "llama", "PeagleQwen3ForCausalLM": "qwen3",
    "Eagle3LlamaForCausalLM": "llama", "LlamaForCausalLMEagle3": "llama", "Eagle3MiniMaxM2ForCausalLM": "llama",
    "Eagle3Qwen2_5vlForCausalLM": "llama", "Eagle3Qwen3vlForCausalLM": "llama",
    "Eagle3Qwen3ForCausalLM": "qwen3",
    "Eagle3DeepseekV2ForCausalLM": "deepseek_v2", "Eagle3DeepseekV3ForCausalLM": "deepseek_v2",
}
# keys ModelOpt's export template writes into eagle_config beside the ids (hf_spec_configs.py)
MODELOPT_KEYS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm",
                 "next_layer_regular", "parallel_draft_step", "parallel_draft_heads_num_layers")
INPUTS, OUTPUTS = "layer inputs", "layer outputs"


@dataclass(frozen=True)
class Eagle3Variant:
    """What an EAGLE-3 head directory is, as vLLM 0.33 reads it."""

    architecture: str  # what vLLM builds
    layer_kind: str  # "llama" | "qwen3" | "deepseek_v2"
    model_type: str  # the config class the layer fields are read with
    layer_fields: dict  # the decoder layers' config (transformer_layer_config, or the whole config)
    num_layers: int
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    norm_before_residual: bool
    sliding_window: int | None  # the window of a layer named sliding_attention; None: full attention
    writer: str  # "speculators" | "ModelOpt" | "SpecForge" | "EAGLE" | "unknown"
    numbering: str  # INPUTS or OUTPUTS: how the writer numbers the ids it names
    top_level_ids: tuple[int, ...] | None  # eagle_aux_hidden_state_layer_ids at the top level
    eagle_config_ids: tuple[int, ...] | None  # ... inside eagle_config
    warnings: tuple[str, ...] = ()  # what the config asks for and vLLM's class for these layers ignores
    logit_scale: float = 1.0  # vLLM multiplies the draft logits by it (LogitsProcessor(scale=...))
    vllm_fc_states: int = 3  # the target states vLLM sizes fc for (fc_input_size = target_hidden_size x this)
    vllm_fc_source: str = "the default 3"  # where vLLM took that count from

    @property
    def declared_ids(self) -> tuple[int, ...] | None:
        """The ids vLLM reads: the top level first, then eagle_config (gpu_model_runner.py:5207-5219)."""
        return self.top_level_ids or self.eagle_config_ids

    def fc_width_refusal(self, head) -> str | None:
        """Why vLLM 0.33 cannot load `head` (its HeadSpec): its fc.weight reads other than the
        vllm_fc_states target states vLLM sizes fc for (None: it reads as many, or has no fc)."""
        fc = next((tensor for tensor in head.tensors if tensor.name == "fc.weight"), None)
        if fc is None or len(fc.shape) != 2:
            return None
        states = fc.shape[1] // head.target_hidden_size
        if states == self.vllm_fc_states:
            return None
        key = "num_aux_layers" if "num_aux_layers" in self.vllm_fc_source else "num_aux_hidden_states"
        lines = {"llama": "llama_eagle3.py:209-221", "qwen3": "qwen3_eagle3.py:202-214",
                 "deepseek_v2": "deepseek_eagle3.py:189-199"}[self.layer_kind]
        return (f"fc width: vLLM 0.33 sizes the head's fc for {self.vllm_fc_states} target states "
                f"({self.vllm_fc_states * head.target_hidden_size} wide, {self.vllm_fc_source}: "
                f"model_executor/models/{lines}), but fc.weight {list(fc.shape)} reads {states} "
                f"({fc.shape[1]} wide, the layers v1/worker/gpu_model_runner.py:5207-5219 feeds it), so its "
                f"weight loader stops at fc (model_executor/layers/linear.py:404-412); {key} {states} in the "
                f"head's {self.fields_place} sizes it so")

    @property
    def fields_place(self) -> str:
        """Where vLLM reads the head's own config fields (num_aux_hidden_states, logit_scale)."""
        return "transformer_layer_config" if self.writer == "speculators" else "config.json"

    def check_tensors(self, head) -> None:
        """Raise ModelReferenceError naming the file and tensor when `head` (its HeadSpec) does not
        hold the tensors vLLM loads for DeepSeek layers (eagle3_mla.check_mla_tensors); the other
        kinds' layer tensors are checked by name when the runtime loads them."""
        if self.layer_kind == "deepseek_v2":
            check_mla_tensors(head, self.layer_fields, self.num_layers)

def _flag(config: dict, key: str, default: bool, where: str) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelReferenceError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _logit_scale(fields: dict, where: str) -> float:
    """The config's logit_scale as vLLM multiplies the logits by it (1.0 when absent); a value it
    could not multiply by (null, a string, NaN) raises ModelReferenceError."""
    value = fields.get("logit_scale", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ModelReferenceError(f"{where} must be a finite number (vLLM multiplies the draft logits by it), "
                                  f"got {shown(value)}")
    return float(value)


def vllm_fc_states(layer_kind: str, hf_config: dict, where: str) -> tuple[int, str]:
    """(how many target states vLLM 0.33's class for `layer_kind` sizes fc for, the field it took the
    count from) from the head's config as vLLM loads it (llama_eagle3.py:209-221, deepseek_eagle3.py:
    189-199; qwen3_eagle3.py:202-214 also reads num_aux_layers and the top-level ids)."""
    keys = ("num_aux_layers", "num_aux_hidden_states") if layer_kind == "qwen3" else ("num_aux_hidden_states",)
    for key in keys:
        if hf_config.get(key) is not None:
            return positive_int(hf_config[key], f"{where}{key}"), f"its {key}"
    eagle_config = hf_config.get("eagle_config") if isinstance(hf_config.get("eagle_config"), dict) else {}
    top = hf_config.get("eagle_aux_hidden_state_layer_ids") if layer_kind == "qwen3" else None
    if isinstance(top, list) and top:
        return len(top), f"its {len(top)} eagle_aux_hidden_state_layer_ids"
    ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    if isinstance(ids, list) and ids:
        return len(ids), f"its {len(ids)} eagle_config.eagle_aux_hidden_state_layer_ids"
    named = "num_aux_hidden_states" + (" or top-level" if layer_kind == "qwen3" else "")
    return 3, f"the default 3: its config names no {named} or eagle_config ids"


def read_eagle3_variant(directory: str | Path) -> Eagle3Variant:
    """The EAGLE-3 variant in `directory` (config.json), as vLLM 0.33 reads it. Raises
    ModelReferenceError naming the file and field when vLLM would not build it."""
    config_path = Path(directory) / "config.json"
    config = read_json_file(config_path)
    eagle_config = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    where = str(config_path)
    top_level = config  # where vLLM reads the norm flags from
    if "speculators_model_type" in config:
        name = config["speculators_model_type"]
        kind = SPECULATORS_KINDS.get(name) if isinstance(name, str) else None
        if kind is None:
            raise ModelReferenceError(f"{where}: speculators_model_type {config['speculators_model_type']!r} is not "
                                      f"an EAGLE-3 kind ({', '.join(SPECULATORS_KINDS)})")
        layer = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"),
                                                                     dict) else {}
        model_type = optional_str(layer.get("model_type"), f"{where}: transformer_layer_config.model_type") or "llama"
        if model_type not in kind.architectures:
            raise ModelReferenceError(f"{where}: transformer_layer_config.model_type {model_type!r}: vLLM 0.33 "
                                      f"serves speculators {config['speculators_model_type']} heads with "
                                      f"{' or '.join(kind.architectures)} layers only "
                                      "(transformers_utils/configs/speculators/algos.py)")
        architecture = kind.architectures[model_type]
        writer, numbering, residual_default = "speculators", INPUTS, kind.norm_before_residual
        # the config vLLM builds the head from: transformer_layer_config, the top-level ids copied in
        hf_config = {**layer, **({"eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"]}
                                 if config.get("eagle_aux_hidden_state_layer_ids") else {})}
        prefix = "transformer_layer_config."
        # a flag the kind's updater does not copy is read from transformer_layer_config, its starting point
        top_level = {**{key: value for key, value in layer.items() if key not in kind.top_level_flags},
                     **{key: config[key] for key in kind.top_level_flags if key in config},
                     "norm_before_residual": config.get("norm_before_residual")}
    else:
        layer = hf_config = config
        prefix = ""
        model_type = optional_str(config.get("model_type"), f"{where}: model_type") or "llama"
        names = list(str_list(config.get("architectures"), f"{where}: architectures")) or ["LlamaForCausalLM"]
        architecture = names[0] if names[0].startswith("Eagle3") or names[0].endswith("Eagle3") \
            else f"Eagle3{names[0]}"
        if architecture not in VLLM_EAGLE3_LAYERS:
            raise ModelReferenceError(f"{where}: architectures {names}: vLLM 0.33 serves it as {architecture} "
                                      "(transformers_utils/configs/eagle.py), which its model registry does not "
                                      "have (model_executor/models/registry.py:700-713)")
        if any(key in eagle_config for key in MODELOPT_KEYS):
            writer, numbering = "ModelOpt", OUTPUTS
        elif eagle_config.get("eagle_aux_hidden_state_layer_ids"):
            writer, numbering = "SpecForge", OUTPUTS
        elif config.get("eagle_aux_hidden_state_layer_ids"):
            writer, numbering = "unknown", INPUTS
        else:
            writer, numbering = "EAGLE", INPUTS
        residual_default = False
    layer_kind = VLLM_EAGLE3_LAYERS[architecture]
    warnings: list[str] = []
    norm_before_fc = _flag(eagle_config, "norm_before_fc", _flag(top_level, "norm_before_fc", False, where), where)
    if layer_kind == "deepseek_v2":
        refusal = mla_config_refusal(layer, architecture)
        if refusal:
            raise ModelReferenceError(f"{where}: {refusal}")
        warnings = mla_ignored_flags({"norm_before_fc": norm_before_fc})
        # SGLang and specreg's runtime build it; vLLM's exports refuse it (engines/vllm.py head_refusal)
        unserved = vllm_model_type_refusal(layer.get("model_type"), architecture)
        if unserved:
            warnings.append(f"vLLM cannot serve this head: {unserved}; its vllm exports are refused")
        norm_before_fc = False  # deepseek_eagle3.py has no input_norm
    logit_scale = _logit_scale(layer, f"{where}: {prefix}logit_scale")
    if writer == "speculators" and "logit_scale" in config and config["logit_scale"] != logit_scale:
        warnings.append(f"logit_scale {shown(config['logit_scale'])} at the top level is not read: vLLM 0.33 builds a "
                        f"speculators head's config from transformer_layer_config and copies no logit_scale into it "
                        f"(transformers_utils/configs/speculators/base.py:59, algos.py:16-50), so it scales the draft "
                        f"logits by {logit_scale:g}, as specreg's runtime does")
    fc_states, fc_source = vllm_fc_states(layer_kind, hf_config, f"{where}: {prefix}")
    layers = positive_int(layer.get("num_hidden_layers") or 1, f"{where}: num_hidden_layers")
    types = layer.get("layer_types") if isinstance(layer.get("layer_types"), list) else []
    window = layer.get("sliding_window") if "sliding_attention" in types else None
    return Eagle3Variant(
        architecture=architecture, layer_kind=layer_kind, model_type=model_type, layer_fields=dict(layer),
        num_layers=int(layers),
        norm_before_fc=norm_before_fc,
        fc_norm=_flag(top_level, "fc_norm", False, where), norm_output=_flag(top_level, "norm_output", False, where),
        norm_before_residual=_flag(top_level, "norm_before_residual", residual_default, where),
        sliding_window=window if isinstance(window, int) and not isinstance(window, bool) else None,
        writer=writer, numbering=numbering,
        top_level_ids=read_layer_ids(config.get("eagle_aux_hidden_state_layer_ids"),
                                     f"{where}: eagle_aux_hidden_state_layer_ids"),
        eagle_config_ids=read_layer_ids(eagle_config.get("eagle_aux_hidden_state_layer_ids"),
                                        f"{where}: eagle_config.eagle_aux_hidden_state_layer_ids"),
        warnings=tuple(warnings), logit_scale=logit_scale, vllm_fc_states=fc_states, vllm_fc_source=fc_source)


def layers_fed(variant: Eagle3Variant, num_layers: int) -> dict[str, Any]:
    """Which target layers (as layer inputs: 0 = the embeddings) the head was trained on and each
    engine will feed it on a num_layers target -> {"writer", "numbering", "trained_on", "vllm",
    "layers" (the head's decoder layers: kind, count, vLLM's architecture), "llamacpp", "sglang",
    "runtime"} (lists in layer order, as vLLM and SGLang collect them, but
    llama.cpp's as its converter writes them; trained_on None when the writer's layers are unknown).
    SGLang's are what it reads from this directory, except for the speculators layout, which it cannot
    load (no model_type: its get_config raises) and is given by specreg's sglang export in its own
    layout with the registered ids in its numbering (registry/deploy/engines/sglang.py)."""
    declared = variant.declared_ids
    shift = 1 if variant.numbering == OUTPUTS else 0
    if declared:
        trained = sorted(i + shift for i in declared) if variant.writer != "unknown" else None
    else:  # speculators and EAGLE train on the default inputs; what ModelOpt or SpecForge used is not recorded
        trained = list(default_aux_layer_ids(num_layers)) if variant.writer in ("EAGLE", "speculators") else None
    vllm = sorted(set(declared or default_aux_layer_ids(num_layers)))
    return {"writer": variant.writer, "numbering": variant.numbering, "trained_on": trained, "vllm": vllm,
            "layers": {"kind": variant.layer_kind, "count": variant.num_layers, "architecture": variant.architecture},
            # the converter writes the ids as it finds them, unsorted, a repeat kept (conversion/llama.py:74-81)
            "llamacpp": list(variant.top_level_ids or default_aux_layer_ids(num_layers)),
            "sglang": vllm if variant.writer == "speculators" else sglang_reads(variant, num_layers),
            "runtime": vllm}


def sglang_reads(variant: Eagle3Variant, num_layers: int) -> list[int]:
    """The layers SGLang 0.5.23 feeds a head directory it loads: eagle_config's ids only, id v at the
    input of layer v + 1 (spec_aux_hidden_state.py:184-196, models/llama.py:929-941), else the
    inputs of (2, N // 2, N - 3)."""
    if variant.eagle_config_ids:
        return sorted({i + 1 for i in variant.eagle_config_ids})
    return sorted(set(default_aux_layer_ids(num_layers)))


def layers_fed_line(fed: dict[str, Any]) -> str:
    """One line: the layers the head was trained on and those each engine feeds it."""
    trained = (f"trained on the inputs of layers {fed['trained_on']}" if fed["trained_on"] is not None
               else "trained on layers its config does not name")
    return (f"layers fed (as layer inputs): written by {fed['writer']} ({fed['numbering']}), {trained}; vLLM 0.33 "
            f"feeds {fed['vllm']}; llama.cpp's converter reads {fed['llamacpp']} from this directory; "
            + (sglang_words(fed) if "sglang" in fed else "")
            + f"specreg's runtime feeds {fed['runtime']} (as vLLM)" + layers_words(fed))


def layers_words(fed: dict[str, Any]) -> str:
    """The head's decoder layers as vLLM builds them (registrations made before they were named have none)."""
    layers = fed.get("layers")
    if not layers:
        return ""
    return (f"; the head's {layers['count']} {layers['kind']} decoder layer{'s' if layers['count'] != 1 else ''} "
            f"({layers['architecture']} in vLLM 0.33)")


def sglang_words(fed: dict[str, Any]) -> str:
    if fed["writer"] == "speculators":
        return f"SGLang 0.5.23 is fed {fed['sglang']} through specreg's sglang export (it cannot load this layout); "
    return f"SGLang 0.5.23 reads {fed['sglang']} from it; "


def numbering_warnings(fed: dict[str, Any]) -> list[str]:
    """A warning for each engine that feeds the head other layers than it was trained on."""
    trained = fed["trained_on"]
    if trained is None:
        return []
    warnings = []
    engines = (("vLLM 0.33", fed["vllm"], "reads the ids as layer inputs, no +1: v1/worker/gpu_model_runner.py:"
                                          "5207-5219"),
               ("llama.cpp", fed["llamacpp"], "its converter reads only a top-level "
                                              "eagle_aux_hidden_state_layer_ids, else (2, N // 2, N - 3): "
                                              "conversion/llama.py:74-81"))
    if "sglang" in fed:  # registrations made before SGLang was named have no entry
        engines += (("SGLang 0.5.23", fed["sglang"], "it reads only eagle_config.eagle_aux_hidden_state_layer_ids, "
                                                     "id v at the input of layer v + 1, else (2, N // 2, N - 3): "
                                                     "model_runner_components/spec_aux_hidden_state.py:184-196, "
                                                     "models/llama.py:929-941"),)
    for engine, fed_layers, why in engines:
        if fed_layers != trained:
            early = all(f == t - 1 for f, t in zip(fed_layers, trained)) and len(fed_layers) == len(trained)
            warnings.append(f"layer numbering: {fed['writer']} numbers the layers it names by their "
                            f"{fed['numbering'][6:-1]}, so the head was trained on the inputs of layers {trained}, "
                            f"but {engine} feeds it {fed_layers}" + (" (one layer early)" if early else "")
                            + f" ({why})")
    return warnings
