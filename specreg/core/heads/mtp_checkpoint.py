"""The MTP layers a target ships inside its own checkpoint, per vLLM 0.33 (the released wheel)
config/speculative.py hf_config_override (711-1005) and each MTP model's load_weights:
DeepSeek-V3/V3.2, GLM-5 (glm_moe_dsa) and GLM-4.5 (Glm4MoeForCausalLM) count
`num_nextn_predict_layers` and store layer i as `model.layers.{num_hidden_layers + i}.*`
(model_executor/models/utils.py:575-600); MiMo stores `model.mtp_layers.{i}.*` (mimo_mtp.py:183,
218); Qwen3-Next (`num_nextn_predict_layers`, default 1) and Qwen3.5 (`mtp_num_hidden_layers`,
default 1, also in text_config) store `mtp.*` (qwen3_next_mtp.py:63, 231-241; qwen3_5_mtp.py:82,
303-313). Any other target with num_nextn_predict_layers > 0 is read with the DeepSeek naming
(vLLM's shared helper).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specreg.core.files import read_json_file
from specreg.core.heads.spec import HeadSpec, HeadTensor, config_value, positive_int, read_target_shape
from specreg.core.heads.tensors import expect_shape, list_weight_files, read_tensors
from specreg.errors import ModelReferenceError


@dataclass(frozen=True)
class _MtpLayout:
    family: str
    model_types: frozenset[str]
    architectures: frozenset[str]
    count_fields: tuple[str, ...]
    default_count: int | None  # vLLM's getattr default when the config has no count field
    shared_prefix: str | None  # tensors every MTP layer shares (Qwen's mtp.fc, mtp.norm ...)
    # The tensors that join the token's embedding to the previous hidden state, under each layer's
    # prefix (or shared_prefix when set), the [H, 2H] projection first. vLLM 0.33 builds them
    # (deepseek_mtp.py:85-87, glm4_moe_mtp.py:90-92, mimo_mtp.py:54-58, qwen3_next_mtp.py:79-87
    # and 108-113, qwen3_5_mtp.py:98 and 136-141) and refuses a checkpoint without them:
    # "Following weights were not initialized from checkpoint" (model_loader/default_loader.py:567-572).
    projection: tuple[str, ...] = ()

    def layer_prefixes(self, num_hidden_layers: int, index: int) -> tuple[str, ...]:
        if self.family == "deepseek":  # vLLM models/utils.py get_spec_layer_idx_from_weight_name
            layer = num_hidden_layers + index
            return (f"model.layers.{layer}.", f"layers.{layer}.", f"model.language_model.layers.{layer}.")
        if self.family == "mimo":
            return (f"model.mtp_layers.{index}.",)
        return (f"mtp.layers.{index}.",)


_QWEN_PROJECTION = ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")
_DEEPSEEK_MTP = _MtpLayout("deepseek", frozenset({"deepseek_v3", "deepseek_v32", "glm_moe_dsa", "deepseek_mtp"}),
                           frozenset({"Glm4MoeForCausalLM"}), ("num_nextn_predict_layers",), None, None,
                           ("eh_proj.weight", "enorm.weight", "hnorm.weight"))
MTP_LAYOUTS = (
    _DEEPSEEK_MTP,
    _MtpLayout("mimo", frozenset(), frozenset({"MiMoForCausalLM"}), ("num_nextn_predict_layers",), None, None,
               ("input_proj.weight", "token_layernorm.weight", "hidden_layernorm.weight")),
    _MtpLayout("qwen3_next", frozenset({"qwen3_next", "qwen3_next_mtp"}), frozenset(),
               ("num_nextn_predict_layers",), 1, "mtp.", _QWEN_PROJECTION),
    _MtpLayout("qwen3_5", frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}), frozenset(),
               ("mtp_num_hidden_layers",), 1, "mtp.", _QWEN_PROJECTION),
)


def _check_projection(layout: _MtpLayout, prefix: str, tensors: dict[str, HeadTensor], hidden: int,
                      directory: Path, where: str) -> None:
    """The tensors joining embedding and hidden state under `prefix`, as vLLM loads them."""
    missing = [prefix + name for name in layout.projection if prefix + name not in tensors]
    if missing:
        raise ModelReferenceError(f"{directory}: {where} has no {', '.join(missing)}: vLLM 0.33 builds it for "
                                  f"{layout.family} MTP layers and refuses a checkpoint without it (\"Following "
                                  "weights were not initialized from checkpoint\", model_loader/default_loader.py:567)")
    expect_shape(tensors[prefix + layout.projection[0]], (hidden, 2 * hidden), directory,
                 "it projects [embedding, hidden state] to hidden_size")


def served_mtp_family(model_type: str | None, architectures: tuple[str, ...] | list[str] | None) -> str | None:
    """The MTP family an engine builds a drafter for from this target's config (vLLM 0.33
    config/speculative.py hf_config_override rewrites exactly these model types and
    architectures), or None: a target that merely carries num_nextn_predict_layers (the generic
    DeepSeek-style naming) has no MTP drafter in any engine."""
    names = set(architectures or ())
    for layout in MTP_LAYOUTS:
        if model_type in layout.model_types or names & layout.architectures:
            return layout.family
    return None



def read_mtp(directory: str | Path) -> HeadSpec:
    """The MTP layers a target ships in its own checkpoint: how many (num_nextn_predict_layers or
    the architecture's equivalent) and which of its tensors form them (safetensors headers)."""
    directory = Path(directory)
    target = read_target_shape(directory)
    config_path = directory / "config.json"
    config = read_json_file(config_path)
    layout = next((lay for lay in MTP_LAYOUTS if target.model_type in lay.model_types
                   or set(target.architectures) & lay.architectures), None)
    if layout is None and config_value(config, "num_nextn_predict_layers") is not None:
        layout = _DEEPSEEK_MTP  # vLLM's shared naming for any num_nextn_predict_layers target
    if layout is None:
        raise ModelReferenceError(f"{config_path}: the target declares no MTP layers (no num_nextn_predict_layers "
                                  "or mtp_num_hidden_layers)")
    field_name = next((name for name in layout.count_fields if config_value(config, name) is not None), None)
    notes: list[str] = []
    if field_name is not None:
        count_value = config_value(config, field_name)
        if isinstance(count_value, int) and not isinstance(count_value, bool) and count_value == 0:
            raise ModelReferenceError(f"{config_path}: {field_name} is 0: the target ships no MTP layers")
        count = positive_int(count_value, f"{config_path}: {field_name}")
    elif layout.default_count is not None:
        count, field_name = layout.default_count, layout.count_fields[0]
        notes.append(f"{field_name} absent: {count} (vLLM's default for {layout.family})")
    else:
        raise ModelReferenceError(f"{config_path}: {' or '.join(layout.count_fields)} is missing: the target ships "
                                  "no MTP layers")
    files = list_weight_files(directory)
    tensors = read_tensors(files)
    chosen: dict[str, HeadTensor] = {}
    for index in range(count):
        prefixes = layout.layer_prefixes(target.num_hidden_layers, index)
        layer_tensors = {name: t for name, t in tensors.items() if name.startswith(prefixes)}
        if not layer_tensors:
            raise ModelReferenceError(f"{directory}: {field_name} = {count} but the weights hold no tensor under "
                                      f"{prefixes[0]} (a checkpoint saved without its MTP layers?)")
        if not layout.shared_prefix:
            prefix = next(p for p in prefixes if any(name.startswith(p) for name in layer_tensors))
            _check_projection(layout, prefix, tensors, target.hidden_size, directory, f"MTP layer {index}")
        chosen.update(layer_tensors)
    if layout.shared_prefix:
        _check_projection(layout, layout.shared_prefix, tensors, target.hidden_size, directory, "the MTP block")
        chosen.update({name: t for name, t in tensors.items() if name.startswith(layout.shared_prefix)})
    return HeadSpec(method="mtp", layout=f"mtp:{layout.family}", path=target.path, hidden_size=target.hidden_size,
                    target_hidden_size=target.hidden_size, draft_vocab_size=target.vocab_size,
                    target_vocab_size=target.vocab_size, aux_layer_ids=None, num_heads=count, num_layers=count,
                    verifier_name_or_path=None, verifier_architectures=target.architectures,
                    verifier_fingerprint={}, speculative_tokens=None, has_own_embeddings=False, has_vocab_map=False,
                    tensors=tuple(sorted(chosen.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in chosen.values()})), notes=tuple(notes))

