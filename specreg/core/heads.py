"""Speculative heads that draft from the target's own states: EAGLE-3 (and EAGLE), Medusa, MTP.

`read_head` recognises a head directory (for MTP: the target's own directory) and returns a
HeadSpec; `check_head_fits` checks it against the target and raises HeadMismatchError naming
the field (hidden size, aux layer ids inside the target's layers, vocabulary, the d2t/t2d map,
the draft token strings, the declared verifier). A head directory that cannot be read raises
ModelReferenceError naming the file and field. Nothing here imports torch or transformers:
configs are JSON, shapes come from the safetensors headers, d2t/t2d are read as raw bytes.

What we followed (read 2026-12-01; vLLM is the released 0.33.0 wheel, speculators is
vllm-project/speculators main at c05b95b, the others their GitHub sources):
- speculators format: config.json `speculators_model_type` ("eagle3"), `transformer_layer_config`
  (the head's own decoder layer: hidden_size, vocab_size = the verifier's vocabulary),
  `draft_vocab_size`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids`,
  `speculators_config` {algorithm, proposal_methods[{proposal_type, speculative_tokens}],
  default_proposal_method, verifier {name_or_path, architectures}} (speculators
  src/speculators/config.py:40-148, models/eagle3/config.py:27-56). vLLM requires
  speculators_config.proposal_methods[0].speculative_tokens, verifier.name_or_path and a dict
  transformer_layer_config (vllm/transformers_utils/configs/speculators/base.py:77-94), copies
  draft_vocab_size, target_hidden_size and eagle_aux_hidden_state_layer_ids from the top level
  (speculators/algos.py:15-50) and knows no other speculators type than eagle3, peagle, dflash,
  dflash2, dspark (algos.py:15, 53, 90, 129, 152).
  VerifierConfig has no model_config, so pydantic ignores extra keys: specreg's export may add
  the verifier's fingerprint under VERIFIER_FINGERPRINT_KEY (speculators config.py:40-113).
- Original EAGLE-3 layout: a LlamaConfig of the head with `draft_vocab_size` (SafeAILab/EAGLE
  eagle/traineagle3/config.json), weights midlayer.*/fc/norm/lm_head/d2t/t2d; vLLM maps
  LlamaForCausalLMEagle3 to Eagle3LlamaForCausalLM (model_executor/models/registry.py:702),
  reads the aux ids at the top level or in `eagle_config` (v1/worker/gpu_model_runner.py:
  5207-5219), sizes fc as target_hidden_size x (len(eagle_config ids) or 3)
  (llama_eagle3.py:209-221), defaults draft_vocab_size to vocab_size (llama_eagle3.py:314-316).
- Aux layer id L is the residual stream entering layer L: 0 = the embeddings, N = the last
  layer's output before the final norm (vLLM llama.py:428-441 with interfaces.py:1640-1650);
  without ids the target's default is (2, N // 2, N - 3) (interfaces.py:1771,
  speculators models/utils.py:52).
- d2t holds int64 offsets, target id = i + d2t[i] (speculators train/vocab_mapping.py:88-91,
  SafeAILab/EAGLE traineagle3/cnets.py scandata, vLLM llama_eagle3.py:385-394, SGLang
  srt/models/llama_eagle3.py:350-352); t2d is a bool mask over the target vocabulary with
  draft_vocab_size entries set (speculators model.py:104-119). vLLM keeps d2t only when
  draft_vocab_size differs from the target's vocabulary and ignores t2d (llama_eagle3.py:
  338-345, 426-427); without d2t in the checkpoint its map stays all zeros (llama_eagle3.py:
  458-459), i.e. draft id i = target id i.
- vLLM shares the target's embed_tokens with a head that has none (v1/spec_decode/
  llm_base_proposer.py:1437-1441), so such a head must have the target's hidden size.
- Medusa: config.json `medusa_num_heads`, `medusa_num_layers` (default 1),
  `base_model_name_or_path` (FasterDecoding/Medusa medusa/model/medusa_model.py MedusaConfig);
  TGI reads medusa_lm_head.safetensors with head i = ResBlocks `{i}.{j}.linear.{weight,bias}`
  (H x H) then `{i}.{medusa_num_layers}.weight` (vocab x H) (text-generation-inference
  server/text_generation_server/layers/medusa.py, models/__init__.py); Medusa's training saves
  exactly `medusa_head.state_dict()` there, and a whole-model save holds the same names under
  `medusa_head.` (MedusaModel.medusa_head, medusa_model.py). vLLM 0.33 has no Medusa.
- MTP inside the target, per vLLM 0.33 config/speculative.py hf_config_override (711-1005) and
  each MTP model's load_weights: DeepSeek-V3/V3.2, GLM-5 (glm_moe_dsa) and GLM-4.5
  (Glm4MoeForCausalLM) count `num_nextn_predict_layers` and store layer i as
  `model.layers.{num_hidden_layers + i}.*` (model_executor/models/utils.py:575-600); MiMo stores
  `model.mtp_layers.{i}.*` (mimo_mtp.py:183, 218); Qwen3-Next (`num_nextn_predict_layers`,
  default 1) and Qwen3.5 (`mtp_num_hidden_layers`, default 1, also in text_config) store
  `mtp.*` (qwen3_next_mtp.py:63, 231-241; qwen3_5_mtp.py:82, 303-313). Any other target with
  num_nextn_predict_layers > 0 is read with the DeepSeek naming (vLLM's shared helper).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreg.errors import HeadMismatchError, ModelReferenceError, UsageError
from specreg.core.fingerprint import (
    PICKLE_SUFFIXES,
    read_json_file,
    read_safetensors_header,
)

HEAD_METHODS = ("eagle3", "eagle", "medusa", "mtp")
# Where specreg's export of a speculators directory records the verifier's identity, inside
# speculators_config.verifier (speculators itself records only name_or_path + architectures).
VERIFIER_FINGERPRINT_KEY = "specreg"
FINGERPRINT_FIELDS = ("weights_sha256", "config_sha256", "tokenizer_sha256", "chat_template_sha256")
# vLLM sizes an EAGLE-3 fc for this many aux layers when the config names none.
DEFAULT_AUX_LAYER_COUNT = 3
D2T_DTYPES = {"I64": "q", "I32": "i"}  # little-endian struct codes
T2D_DTYPES = ("BOOL", "U8")
MAX_SHOWN = 3  # mismatching entries quoted in one message


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """The aux layers an EAGLE-3 head reads when it names none (vLLM and speculators default)."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class HeadTensor:
    name: str
    file: str  # file name inside the directory
    dtype: str  # safetensors dtype (F32, BF16, I64 ...)
    shape: tuple[int, ...]


@dataclass(frozen=True)
class HeadSpec:
    """What a head is, read from its config and safetensors headers (no tensor loaded)."""

    method: str  # "eagle3" | "eagle" | "medusa" | "mtp"
    layout: str  # "speculators" | "eagle" (original EAGLE checkout) | "medusa" | "mtp:<family>"
    path: str  # the head directory; for MTP the target's own directory
    hidden_size: int  # width of the head's own layers
    target_hidden_size: int  # width of the target hidden states it reads
    draft_vocab_size: int  # rows of the head's output layer
    target_vocab_size: int  # the vocabulary its draft ids map into
    aux_layer_ids: tuple[int, ...] | None  # EAGLE-3: the target layers named; None = the target's default
    num_heads: int  # Medusa heads, MTP modules; 1 for EAGLE
    num_layers: int  # EAGLE decoder layers, ResBlocks per Medusa head, MTP modules
    verifier_name_or_path: str | None  # declared verifier (speculators, Medusa base_model_name_or_path)
    verifier_architectures: tuple[str, ...]
    verifier_fingerprint: dict[str, str]  # FINGERPRINT_FIELDS the head records for its verifier
    speculative_tokens: int | None  # speculators proposal_methods[0].speculative_tokens
    has_own_embeddings: bool  # False: the engine shares the target's embed_tokens
    has_vocab_map: bool  # a d2t tensor is present
    tensors: tuple[HeadTensor, ...]  # the head's tensors; for MTP the target tensors forming the module
    weight_files: tuple[str, ...]  # files holding `tensors`
    layer_type: str | None = None  # transformer_layer_config.model_type (vLLM serves llama, qwen3)
    notes: tuple[str, ...] = ()  # defaults applied while reading

    def tensor(self, name: str) -> HeadTensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["tensors"] = [{"name": t.name, "file": t.file, "dtype": t.dtype, "shape": list(t.shape)}
                           for t in self.tensors]
        for name in ("aux_layer_ids", "verifier_architectures", "weight_files", "notes"):
            data[name] = list(data[name]) if data[name] is not None else None
        data["verifier_fingerprint"] = dict(self.verifier_fingerprint)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HeadSpec":
        values = {name: data.get(name) for name in cls.__dataclass_fields__}
        values["tensors"] = tuple(HeadTensor(t["name"], t["file"], t["dtype"], tuple(t["shape"]))
                                  for t in data.get("tensors") or ())
        for name in ("verifier_architectures", "weight_files", "notes"):
            values[name] = tuple(data.get(name) or ())
        ids = data.get("aux_layer_ids")
        values["aux_layer_ids"] = tuple(ids) if ids is not None else None
        values["verifier_fingerprint"] = dict(data.get("verifier_fingerprint") or {})
        return cls(**values)


@dataclass(frozen=True)
class TargetShape:
    """The target's sizes a head must fit, from its config.json (text_config for multimodal)."""

    path: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    architectures: tuple[str, ...]
    model_type: str | None
    name_or_path: str | None  # config `_name_or_path`, when the saver recorded one


@dataclass(frozen=True)
class VocabMap:
    """An EAGLE-3 head's draft -> target vocabulary map, read from its d2t / t2d tensors."""

    draft_to_target: tuple[int, ...]  # target id of draft id i (i + d2t[i])
    t2d_length: int | None  # entries of the t2d mask; None when the head has no t2d
    t2d_marked: tuple[int, ...] | None  # target ids t2d marks, ascending


@dataclass(frozen=True)
class HeadFit:
    """The outcome of check_head_fits: what the binding records beside the head."""

    aux_layer_ids: tuple[int, ...]  # the target layers the head reads (declared or the target default)
    verifier_matched: bool  # the declared verifier is the target (by fingerprint or name)
    compared_token_strings: int  # draft ids whose token strings were compared with the target's
    notes: tuple[str, ...] = field(default=())  # defaults, skipped comparisons, an allowed mismatch


# --- reading config fields ----------------------------------------------------------------

def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ModelReferenceError(f"{where} must be a JSON object, got {_shown(value)}")
    return value


def _positive_int(value: Any, where: str) -> int:
    # bool is an int in Python; NaN/inf arrive as floats and fail here too
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelReferenceError(f"{where} must be a positive integer, got {_shown(value)}")
    return value


def _optional_positive_int(value: Any, where: str) -> int | None:
    return None if value is None else _positive_int(value, where)


def _optional_str(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ModelReferenceError(f"{where} must be a string or null, got {_shown(value)}")
    return value or None


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ModelReferenceError(f"{where} must be a list of strings, got {_shown(value)}")
    return tuple(value)


def _layer_ids(value: Any, where: str) -> tuple[int, ...] | None:
    """Aux layer ids; None or [] means "not declared" (vLLM tests `if not layer_ids`)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ModelReferenceError(f"{where} must be a list of integers, got {_shown(value)}")
    if len(set(value)) != len(value):
        # the target emits one state per layer, fewer than the fc of the head expects
        raise ModelReferenceError(f"{where} names a layer twice: {_shown(value)}")
    return tuple(value) or None


def _config_value(config: dict[str, Any], key: str) -> Any:
    """A field at the top level or, for multimodal configs, inside text_config."""
    if key in config:
        return config[key]
    text_config = config.get("text_config")
    return text_config.get(key) if isinstance(text_config, dict) else None


# --- reading tensors ----------------------------------------------------------------------

def _weight_files(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    if files:
        return files
    pickles = sorted(p.name for p in directory.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelReferenceError(f"{directory}: weights are only pickle files ({', '.join(pickles)}), which "
                                  "specreg does not open; convert them to safetensors")
    raise ModelReferenceError(f"{directory}: no weight files (*.safetensors)")


def _read_tensors(files: list[Path]) -> dict[str, HeadTensor]:
    tensors: dict[str, HeadTensor] = {}
    for path in files:
        for name, info in read_safetensors_header(path).items():
            if name == "__metadata__":
                continue
            shape = info["shape"]
            if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                      for d in shape):
                raise ModelReferenceError(f"{path}: tensor {name}: shape {_shown(shape)} is not a list of sizes")
            if name in tensors:
                raise ModelReferenceError(f"{path}: tensor {name} is also in {tensors[name].file}")
            tensors[name] = HeadTensor(name, path.name, info["dtype"], tuple(shape))
    return tensors


def _read_tensor_bytes(path: Path, name: str) -> tuple[str, list[int], bytes]:
    """(dtype, shape, raw little-endian bytes) of one tensor, located by its header offsets."""
    header = read_safetensors_header(path)  # checks that the offsets fit the file
    info = header[name]
    start, end = int(info["data_offsets"][0]), int(info["data_offsets"][1])
    with open(path, "rb") as handle:
        (header_length,) = struct.unpack("<Q", handle.read(8))
        handle.seek(8 + header_length + start)
        data = handle.read(end - start)
    if len(data) != end - start:
        raise ModelReferenceError(f"{path}: tensor {name}: file ends inside its data")
    return info["dtype"], info["shape"], data


def _expect_shape(tensor: HeadTensor | None, shape: tuple[int, ...], directory: Path, why: str) -> None:
    if tensor is None:
        return
    if tensor.shape != shape:
        raise ModelReferenceError(f"{directory / tensor.file}: tensor {tensor.name} has shape {list(tensor.shape)}, "
                                  f"expected {list(shape)} ({why})")


def _find_one(tensors: dict[str, HeadTensor], name: str, directory: Path) -> HeadTensor | None:
    """A tensor stored as `name` or under a module prefix (`model.name`); vLLM matches by substring."""
    found = [t for key, t in tensors.items() if key == name or key.endswith("." + name)]
    if len(found) > 1:
        raise ModelReferenceError(f"{directory}: more than one tensor named {name}: "
                                  f"{', '.join(t.name for t in found)}")
    return found[0] if found else None


# --- recognising a head -------------------------------------------------------------------

def read_head(directory: str | Path, method: str | None = None) -> HeadSpec:
    """Recognise the head in `directory`: an EAGLE-3 head (speculators format or the original
    EAGLE layout), an EAGLE head, or Medusa heads; with method="mtp", `directory` is the target
    itself and its MTP layers are read (read_mtp). `method`, when given, must be what the
    directory holds. Raises ModelReferenceError naming the file and field when it cannot be read."""
    if method is not None and method not in HEAD_METHODS:
        raise UsageError(f"unknown head method {method!r}: use one of {', '.join(HEAD_METHODS)}")
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelReferenceError(f"{directory}: no such head directory")
    if method == "mtp":
        return read_mtp(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelReferenceError(f"{directory}: no config.json (not a head directory)")
    config = read_json_file(config_path)
    if "speculators_model_type" in config:
        spec = _read_speculators(directory, config_path, config)
    elif "medusa_num_heads" in config:
        spec = _read_medusa(directory, config_path, config)
    else:
        spec = _read_eagle_checkpoint(directory, config_path, config)
    if method is not None and spec.method != method:
        raise ModelReferenceError(f"{directory}: holds {spec.method} head(s) ({spec.layout} layout), not {method}")
    return spec


def _read_speculators(directory: Path, config_path: Path, config: dict[str, Any]) -> HeadSpec:
    kind = config["speculators_model_type"]
    if kind != "eagle3":
        raise ModelReferenceError(f"{config_path}: speculators_model_type {_shown(kind)} is not a head kind "
                                  "specreg registers (eagle3)")
    layer = _object(config.get("transformer_layer_config"), f"{config_path}: transformer_layer_config")
    speculators = _object(config.get("speculators_config"), f"{config_path}: speculators_config")
    verifier = _object(speculators.get("verifier"), f"{config_path}: speculators_config.verifier")
    if "name_or_path" not in verifier:
        raise ModelReferenceError(f"{config_path}: speculators_config.verifier.name_or_path is missing")
    name = _optional_str(verifier["name_or_path"], f"{config_path}: speculators_config.verifier.name_or_path")
    architectures = _str_list(verifier.get("architectures"),
                              f"{config_path}: speculators_config.verifier.architectures")
    fingerprint = _verifier_fingerprint(verifier.get(VERIFIER_FINGERPRINT_KEY), config_path)
    methods = speculators.get("proposal_methods")
    if not isinstance(methods, list) or not methods:
        raise ModelReferenceError(f"{config_path}: speculators_config.proposal_methods must be a non-empty list")
    first = _object(methods[0], f"{config_path}: speculators_config.proposal_methods[0]")
    tokens = _positive_int(first.get("speculative_tokens"),
                           f"{config_path}: speculators_config.proposal_methods[0].speculative_tokens")
    ids = _layer_ids(config.get("eagle_aux_hidden_state_layer_ids"),
                     f"{config_path}: eagle_aux_hidden_state_layer_ids")
    return _eagle3_spec(directory, config_path, "speculators", config, layer, "transformer_layer_config.", ids,
                        verifier=(name, architectures, fingerprint), speculative_tokens=tokens)


def _verifier_fingerprint(value: Any, config_path: Path) -> dict[str, str]:
    if value is None:
        return {}
    where = f"{config_path}: speculators_config.verifier.{VERIFIER_FINGERPRINT_KEY}"
    value = _object(value, where)
    recorded = {key: value[key] for key in FINGERPRINT_FIELDS if value.get(key) is not None}
    for key, digest in recorded.items():
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ModelReferenceError(f"{where}.{key} must be a sha256 hex digest, got {_shown(digest)}")
    return recorded


def _read_eagle_checkpoint(directory: Path, config_path: Path, config: dict[str, Any]) -> HeadSpec:
    """The original EAGLE / EAGLE-3 layout: the head's own LlamaConfig next to its weights."""
    tensors = _read_tensors(_weight_files(directory))
    fc = _find_one(tensors, "fc.weight", directory)
    eagle3_signs = ("draft_vocab_size" in config or "eagle_config" in config
                    or "eagle_aux_hidden_state_layer_ids" in config
                    or any("Eagle3" in arch for arch in _str_list(config.get("architectures"),
                                                                  f"{config_path}: architectures"))
                    or _find_one(tensors, "d2t", directory) is not None
                    or any(name.startswith("midlayer.") for name in tensors))
    if eagle3_signs:
        eagle_config = config.get("eagle_config")
        eagle_config = {} if eagle_config is None else _object(eagle_config, f"{config_path}: eagle_config")
        # vLLM reads the top-level ids first, then eagle_config's (gpu_model_runner.py:5207-5219)
        ids = _layer_ids(config.get("eagle_aux_hidden_state_layer_ids"),
                         f"{config_path}: eagle_aux_hidden_state_layer_ids")
        if ids is None:
            ids = _layer_ids(eagle_config.get("eagle_aux_hidden_state_layer_ids"),
                             f"{config_path}: eagle_config.eagle_aux_hidden_state_layer_ids")
        return _eagle3_spec(directory, config_path, "eagle", config, config, "", ids, tensors=tensors,
                            eagle_config=eagle_config)
    if fc is None:
        raise ModelReferenceError(f"{directory}: not a head directory: config.json has no speculators_model_type "
                                  "or medusa_num_heads and the weights have no EAGLE fc.weight (for the MTP "
                                  "layers inside a target, use method mtp)")
    # EAGLE(-1/2): fc reads cat(embeds, hidden) # [.., 2H] (vLLM llama_eagle.py:110-130)
    hidden = _positive_int(config.get("hidden_size"), f"{config_path}: hidden_size")
    vocab = _positive_int(config.get("vocab_size"), f"{config_path}: vocab_size")
    layers = _positive_int(config.get("num_hidden_layers"), f"{config_path}: num_hidden_layers")
    _expect_shape(fc, (hidden, 2 * hidden), directory, "EAGLE's fc maps [embeds, hidden] to hidden_size")
    embed = _find_one(tensors, "embed_tokens.weight", directory)
    _expect_shape(embed, (vocab, hidden), directory, "vocab_size x hidden_size")
    lm_head = _find_one(tensors, "lm_head.weight", directory)
    _expect_shape(lm_head, (vocab, hidden), directory, "vocab_size x hidden_size")
    return HeadSpec(method="eagle", layout="eagle", path=str(directory.resolve()), hidden_size=hidden,
                    target_hidden_size=hidden, draft_vocab_size=vocab, target_vocab_size=vocab, aux_layer_ids=None,
                    num_heads=1, num_layers=layers, verifier_name_or_path=None, verifier_architectures=(),
                    verifier_fingerprint={}, speculative_tokens=None, has_own_embeddings=embed is not None,
                    has_vocab_map=False, tensors=tuple(sorted(tensors.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in tensors.values()})),
                    layer_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None)


def _eagle3_spec(directory: Path, config_path: Path, layout: str, config: dict[str, Any], layer: dict[str, Any],
                 layer_prefix: str, ids: tuple[int, ...] | None, *, verifier=(None, (), {}),
                 speculative_tokens: int | None = None, tensors: dict[str, HeadTensor] | None = None,
                 eagle_config: dict[str, Any] | None = None) -> HeadSpec:
    """The checks and sizes both EAGLE-3 layouts share. `layer` holds the head's decoder-layer
    fields (transformer_layer_config, or the whole config in the original layout)."""
    if tensors is None:
        tensors = _read_tensors(_weight_files(directory))
    notes: list[str] = []
    hidden = _positive_int(layer.get("hidden_size"), f"{config_path}: {layer_prefix}hidden_size")
    vocab = _positive_int(layer.get("vocab_size"), f"{config_path}: {layer_prefix}vocab_size")
    target_hidden = _optional_positive_int(config.get("target_hidden_size"), f"{config_path}: target_hidden_size")
    target_hidden = target_hidden or hidden
    declared_draft_vocab = _optional_positive_int(config.get("draft_vocab_size"), f"{config_path}: draft_vocab_size")
    draft_vocab = declared_draft_vocab or vocab  # vLLM llama_eagle3.py:314-316
    if declared_draft_vocab is None:
        notes.append(f"draft_vocab_size absent: the vocab_size {vocab} (vLLM's default)")
    layers = layer.get("num_hidden_layers")
    if layers is None:
        indices = {int(m.group(1)) for name in tensors if (m := re.match(r"(?:model\.)?layers\.(\d+)\.", name))}
        layers = len(indices) or (1 if any(name.startswith("midlayer.") for name in tensors) else 0)
        if not layers:
            raise ModelReferenceError(f"{config_path}: {layer_prefix}num_hidden_layers is missing and the weights "
                                      "hold no decoder layer")
    layers = _positive_int(layers, f"{config_path}: {layer_prefix}num_hidden_layers")

    lm_head = _find_one(tensors, "lm_head.weight", directory)
    if lm_head is None:
        raise ModelReferenceError(f"{directory}: no lm_head.weight tensor (an EAGLE-3 head has its own output layer)")
    _expect_shape(lm_head, (draft_vocab, hidden), directory, "draft_vocab_size x hidden_size")
    embed = _find_one(tensors, "embed_tokens.weight", directory)
    _expect_shape(embed, (vocab, hidden), directory, f"{layer_prefix}vocab_size x hidden_size")
    use_aux = (eagle_config or {}).get("use_aux_hidden_state", True)
    if not isinstance(use_aux, bool):
        raise ModelReferenceError(f"{config_path}: eagle_config.use_aux_hidden_state must be true or false")
    fc = _find_one(tensors, "fc.weight", directory)
    if use_aux:
        if fc is None:
            raise ModelReferenceError(f"{directory}: no fc.weight tensor (EAGLE-3 projects the aux states with fc)")
        aux_count = len(ids) if ids else DEFAULT_AUX_LAYER_COUNT
        expected = (hidden, aux_count * target_hidden)
        if fc.shape != expected:
            named = (f"{len(ids)} aux layer ids" if ids else
                     f"no aux layer ids, so {DEFAULT_AUX_LAYER_COUNT} aux layers (vLLM's default)")
            raise ModelReferenceError(f"{directory / fc.file}: tensor {fc.name} has shape {list(fc.shape)}, expected "
                                      f"{list(expected)}: the config names {named} of width {target_hidden}")
    d2t = _find_one(tensors, "d2t", directory)
    t2d = _find_one(tensors, "t2d", directory)
    if d2t is not None:
        if d2t.dtype not in D2T_DTYPES or d2t.shape != (draft_vocab,):
            raise ModelReferenceError(f"{directory / d2t.file}: tensor {d2t.name} is {d2t.dtype} {list(d2t.shape)}, "
                                      f"expected int64 [{draft_vocab}] (one target-id offset per draft id)")
    if t2d is not None:
        if t2d.dtype not in T2D_DTYPES or t2d.shape != (vocab,):
            raise ModelReferenceError(f"{directory / t2d.file}: tensor {t2d.name} is {t2d.dtype} {list(t2d.shape)}, "
                                      f"expected bool [{vocab}] (a mask over the {layer_prefix}vocab_size ids)")
    if layout == "speculators" and "norm_before_residual" not in config:
        # vLLM speculators/algos.py:33-35 defaults it to True, speculators eagle3/config.py:43-46 to False
        notes.append("norm_before_residual absent: vLLM reads true, speculators false")
    name, architectures, fingerprint = verifier
    layer_type = layer.get("model_type") if isinstance(layer.get("model_type"), str) else None
    return HeadSpec(method="eagle3", layout=layout, path=str(directory.resolve()), hidden_size=hidden,
                    target_hidden_size=target_hidden, draft_vocab_size=draft_vocab, target_vocab_size=vocab,
                    aux_layer_ids=ids, num_heads=1, num_layers=layers, verifier_name_or_path=name,
                    verifier_architectures=architectures, verifier_fingerprint=fingerprint,
                    speculative_tokens=speculative_tokens, has_own_embeddings=embed is not None,
                    has_vocab_map=d2t is not None, tensors=tuple(sorted(tensors.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in tensors.values()})), layer_type=layer_type,
                    notes=tuple(notes))


def _read_medusa(directory: Path, config_path: Path, config: dict[str, Any]) -> HeadSpec:
    heads = _positive_int(config.get("medusa_num_heads"), f"{config_path}: medusa_num_heads")
    # MedusaConfig's default; medusa_num_layers = 0 would be a bare linear head per position
    layers_value = config.get("medusa_num_layers", 1)
    if isinstance(layers_value, bool) or not isinstance(layers_value, int) or layers_value < 0:
        raise ModelReferenceError(f"{config_path}: medusa_num_layers must be a non-negative integer, "
                                  f"got {_shown(layers_value)}")
    name = _optional_str(config.get("base_model_name_or_path"), f"{config_path}: base_model_name_or_path")
    tensors = _read_tensors(_weight_files(directory))
    prefix = "medusa_head." if any(n.startswith("medusa_head.") for n in tensors) else ""
    out = tensors.get(f"{prefix}0.{layers_value}.weight")
    if out is None or len(out.shape) != 2:
        raise ModelReferenceError(f"{directory}: no 2-D tensor {prefix}0.{layers_value}.weight (head 0's output "
                                  f"layer after {layers_value} ResBlock(s))")
    vocab, hidden = out.shape
    for head in range(heads):
        for block in range(layers_value):
            for suffix, shape in (("linear.weight", (hidden, hidden)), ("linear.bias", (hidden,))):
                tensor_name = f"{prefix}{head}.{block}.{suffix}"
                if tensor_name not in tensors:
                    raise ModelReferenceError(f"{directory}: no tensor {tensor_name} (medusa_num_heads = {heads}, "
                                              f"medusa_num_layers = {layers_value})")
                _expect_shape(tensors[tensor_name], shape, directory, "a ResBlock of the target's hidden size")
        tensor_name = f"{prefix}{head}.{layers_value}.weight"
        if tensor_name not in tensors:
            raise ModelReferenceError(f"{directory}: no tensor {tensor_name} (medusa_num_heads = {heads})")
        _expect_shape(tensors[tensor_name], (vocab, hidden), directory, "every head has the same output layer shape")
    notes = [] if "medusa_num_layers" in config else ["medusa_num_layers absent: 1 (MedusaConfig's default)"]
    return HeadSpec(method="medusa", layout="medusa", path=str(directory.resolve()), hidden_size=hidden,
                    target_hidden_size=hidden, draft_vocab_size=vocab, target_vocab_size=vocab, aux_layer_ids=None,
                    num_heads=heads, num_layers=layers_value, verifier_name_or_path=name, verifier_architectures=(),
                    verifier_fingerprint={}, speculative_tokens=heads, has_own_embeddings=False, has_vocab_map=False,
                    tensors=tuple(sorted(tensors.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in tensors.values()})), notes=tuple(notes))


# --- MTP layers inside the target ---------------------------------------------------------

@dataclass(frozen=True)
class _MtpLayout:
    family: str
    model_types: frozenset[str]
    architectures: frozenset[str]
    count_fields: tuple[str, ...]
    default_count: int | None  # vLLM's getattr default when the config has no count field
    shared_prefix: str | None  # tensors every MTP layer shares (Qwen's mtp.fc, mtp.norm ...)

    def layer_prefixes(self, num_hidden_layers: int, index: int) -> tuple[str, ...]:
        if self.family == "deepseek":  # vLLM models/utils.py get_spec_layer_idx_from_weight_name
            layer = num_hidden_layers + index
            return (f"model.layers.{layer}.", f"layers.{layer}.", f"model.language_model.layers.{layer}.")
        if self.family == "mimo":
            return (f"model.mtp_layers.{index}.",)
        return (f"mtp.layers.{index}.",)


_DEEPSEEK_MTP = _MtpLayout("deepseek", frozenset({"deepseek_v3", "deepseek_v32", "glm_moe_dsa", "deepseek_mtp"}),
                           frozenset({"Glm4MoeForCausalLM"}), ("num_nextn_predict_layers",), None, None)
MTP_LAYOUTS = (
    _DEEPSEEK_MTP,
    _MtpLayout("mimo", frozenset(), frozenset({"MiMoForCausalLM"}), ("num_nextn_predict_layers",), None, None),
    _MtpLayout("qwen3_next", frozenset({"qwen3_next", "qwen3_next_mtp"}), frozenset(),
               ("num_nextn_predict_layers",), 1, "mtp."),
    _MtpLayout("qwen3_5", frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}), frozenset(),
               ("mtp_num_hidden_layers",), 1, "mtp."),
)


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


def read_target_shape(directory: str | Path) -> TargetShape:
    """The target's hidden size, layer count, vocabulary and declared identity (config.json)."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelReferenceError(f"{directory}: no config.json (not a Hugging Face model directory)")
    config = read_json_file(config_path)
    model_type = config.get("model_type")
    return TargetShape(
        path=str(directory.resolve()),
        hidden_size=_positive_int(_config_value(config, "hidden_size"), f"{config_path}: hidden_size"),
        num_hidden_layers=_positive_int(_config_value(config, "num_hidden_layers"),
                                        f"{config_path}: num_hidden_layers"),
        vocab_size=_positive_int(_config_value(config, "vocab_size"), f"{config_path}: vocab_size"),
        architectures=_str_list(config.get("architectures"), f"{config_path}: architectures"),
        model_type=model_type if isinstance(model_type, str) else None,
        name_or_path=config.get("_name_or_path") if isinstance(config.get("_name_or_path"), str) else None,
    )


def read_mtp(directory: str | Path) -> HeadSpec:
    """The MTP layers a target ships in its own checkpoint: how many (num_nextn_predict_layers or
    the architecture's equivalent) and which of its tensors form them (safetensors headers)."""
    directory = Path(directory)
    target = read_target_shape(directory)
    config_path = directory / "config.json"
    config = read_json_file(config_path)
    layout = next((lay for lay in MTP_LAYOUTS if target.model_type in lay.model_types
                   or set(target.architectures) & lay.architectures), None)
    if layout is None and _config_value(config, "num_nextn_predict_layers") is not None:
        layout = _DEEPSEEK_MTP  # vLLM's shared naming for any num_nextn_predict_layers target
    if layout is None:
        raise ModelReferenceError(f"{config_path}: the target declares no MTP layers (no num_nextn_predict_layers "
                                  "or mtp_num_hidden_layers)")
    field_name = next((name for name in layout.count_fields if _config_value(config, name) is not None), None)
    notes: list[str] = []
    if field_name is not None:
        count_value = _config_value(config, field_name)
        if isinstance(count_value, int) and not isinstance(count_value, bool) and count_value == 0:
            raise ModelReferenceError(f"{config_path}: {field_name} is 0: the target ships no MTP layers")
        count = _positive_int(count_value, f"{config_path}: {field_name}")
    elif layout.default_count is not None:
        count, field_name = layout.default_count, layout.count_fields[0]
        notes.append(f"{field_name} absent: {count} (vLLM's default for {layout.family})")
    else:
        raise ModelReferenceError(f"{config_path}: {' or '.join(layout.count_fields)} is missing: the target ships "
                                  "no MTP layers")
    files = _weight_files(directory)
    tensors = _read_tensors(files)
    chosen: dict[str, HeadTensor] = {}
    for index in range(count):
        prefixes = layout.layer_prefixes(target.num_hidden_layers, index)
        layer_tensors = {name: t for name, t in tensors.items() if name.startswith(prefixes)}
        if not layer_tensors:
            raise ModelReferenceError(f"{directory}: {field_name} = {count} but the weights hold no tensor under "
                                      f"{prefixes[0]} (a checkpoint saved without its MTP layers?)")
        chosen.update(layer_tensors)
    if layout.shared_prefix:
        chosen.update({name: t for name, t in tensors.items() if name.startswith(layout.shared_prefix)})
    return HeadSpec(method="mtp", layout=f"mtp:{layout.family}", path=target.path, hidden_size=target.hidden_size,
                    target_hidden_size=target.hidden_size, draft_vocab_size=target.vocab_size,
                    target_vocab_size=target.vocab_size, aux_layer_ids=None, num_heads=count, num_layers=count,
                    verifier_name_or_path=None, verifier_architectures=target.architectures,
                    verifier_fingerprint={}, speculative_tokens=None, has_own_embeddings=False, has_vocab_map=False,
                    tensors=tuple(sorted(chosen.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in chosen.values()})), notes=tuple(notes))


# --- the vocabulary map -------------------------------------------------------------------

def read_vocab_map(head: HeadSpec) -> VocabMap | None:
    """An EAGLE-3 head's d2t (and t2d, when present) read from the safetensors bytes; None when
    the head has no d2t."""
    directory = Path(head.path)
    d2t = next((t for t in head.tensors if t.name == "d2t" or t.name.endswith(".d2t")), None)
    if d2t is None:
        return None
    dtype, shape, data = _read_tensor_bytes(directory / d2t.file, d2t.name)
    if dtype not in D2T_DTYPES or shape != [head.draft_vocab_size]:
        raise ModelReferenceError(f"{directory / d2t.file}: tensor {d2t.name} is {dtype} {shape}, expected "
                                  f"int64 [{head.draft_vocab_size}]")
    offsets = struct.unpack(f"<{head.draft_vocab_size}{D2T_DTYPES[dtype]}", data)
    draft_to_target = tuple(index + offset for index, offset in enumerate(offsets))
    t2d = next((t for t in head.tensors if t.name == "t2d" or t.name.endswith(".t2d")), None)
    if t2d is None:
        return VocabMap(draft_to_target, None, None)
    dtype, shape, data = _read_tensor_bytes(directory / t2d.file, t2d.name)
    if dtype not in T2D_DTYPES or len(shape) != 1:
        raise ModelReferenceError(f"{directory / t2d.file}: tensor {t2d.name} is {dtype} {shape}, expected a bool mask")
    if any(byte > 1 for byte in data):
        raise ModelReferenceError(f"{directory / t2d.file}: tensor {t2d.name} holds values other than 0 and 1")
    marked = tuple(index for index, byte in enumerate(data) if byte)
    return VocabMap(draft_to_target, len(data), marked)


def check_vocab_fit(head: HeadSpec, vocabulary: int) -> None:
    """The vocabulary part of check_head_fits against a target vocabulary size alone (the runtime
    checks a loaded target model with it): d2t into the target's ids, one to one, t2d agreeing.
    Raises HeadMismatchError naming the field."""
    _check_vocab_map(head, read_vocab_map(head) if head.has_vocab_map else None, vocabulary)


def _check_vocab_map(head: HeadSpec, vocab_map: VocabMap | None, vocabulary: int) -> None:
    if vocab_map is None:
        if head.method == "eagle3" and head.draft_vocab_size != vocabulary:
            raise HeadMismatchError(f"vocabulary map: draft_vocab_size {head.draft_vocab_size} differs from the "
                                    f"target's vocab_size {vocabulary} but the head has no d2t tensor (an engine "
                                    "would then read draft id i as target id i)")
        return
    ids = vocab_map.draft_to_target
    outside = [(i, t) for i, t in enumerate(ids) if not 0 <= t < vocabulary]
    if outside:
        shown = ", ".join(f"draft id {i} -> {t}" for i, t in outside[:MAX_SHOWN])
        raise HeadMismatchError(f"vocabulary map: d2t maps {len(outside)} draft id(s) outside the target's "
                                f"{vocabulary} ids ({shown}); target id = i + d2t[i]")
    first_draft: dict[int, int] = {}
    for draft_id, target_id in enumerate(ids):
        if target_id in first_draft:
            raise HeadMismatchError(f"vocabulary map: d2t is not one to one: draft ids {first_draft[target_id]} and "
                                    f"{draft_id} both map to target id {target_id}")
        first_draft[target_id] = draft_id
    if head.draft_vocab_size == vocabulary and any(t != i for i, t in enumerate(ids)):
        raise HeadMismatchError(f"vocabulary map: d2t permutes the ids but draft_vocab_size equals the target's "
                                f"vocab_size {vocabulary}, where engines ignore d2t and read draft id i as target id i")
    if vocab_map.t2d_length is not None:
        if vocab_map.t2d_length != vocabulary:
            raise HeadMismatchError(f"vocabulary map: t2d has {vocab_map.t2d_length} entries but the target's "
                                    f"vocab_size is {vocabulary}")
        marked = set(vocab_map.t2d_marked or ())
        if marked != set(ids):
            extra = sorted(marked - set(ids))[:MAX_SHOWN]
            missing = sorted(set(ids) - marked)[:MAX_SHOWN]
            raise HeadMismatchError(f"vocabulary map: t2d marks {len(marked)} target ids but d2t maps to "
                                    f"{len(ids)}; t2d does not mark the same set (marked, not mapped: {extra}; "
                                    f"mapped, not marked: {missing})")


# --- token strings ------------------------------------------------------------------------

TokenStrings = Mapping[int, str] | Callable[[int], "str | None"]


def tokenizer_token_strings(directory: str | Path) -> dict[int, str] | None:
    """id -> token string from a directory's tokenizer.json (model vocab and added tokens), read as
    JSON; None when the directory has no tokenizer.json."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    data = read_json_file(path)
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    strings: dict[int, str] = {}
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        for token, index in vocab.items():
            if isinstance(index, bool) or not isinstance(index, int):
                raise ModelReferenceError(f"{path}: model.vocab[{_shown(token)}] is not an integer id")
            strings[index] = token
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...] in id order
        for index, entry in enumerate(vocab):
            if not isinstance(entry, list) or not entry or not isinstance(entry[0], str):
                raise ModelReferenceError(f"{path}: model.vocab[{index}] is not a [piece, score] pair")
            strings[index] = entry[0]
    else:
        raise ModelReferenceError(f"{path}: model.vocab must be an object or a list")
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise ModelReferenceError(f"{path}: added_tokens must be a list")
    for number, token in enumerate(added):
        if not isinstance(token, dict) or not isinstance(token.get("content"), str) \
                or isinstance(token.get("id"), bool) or not isinstance(token.get("id"), int):
            raise ModelReferenceError(f"{path}: added_tokens[{number}] needs an integer id and a string content")
        strings[token["id"]] = token["content"]
    return strings


def _lookup(strings: TokenStrings) -> Callable[[int], str | None]:
    return strings.get if isinstance(strings, Mapping) else strings


def _check_token_strings(head: HeadSpec, vocab_map: VocabMap | None, target: TargetShape,
                         draft_token_strings: TokenStrings | None,
                         target_token_strings: TokenStrings | None) -> tuple[int, str | None]:
    """Each draft id must spell what the target id it maps to spells. Returns (ids compared, a
    note when nothing could be compared)."""
    mapped = vocab_map.draft_to_target if vocab_map is not None else tuple(range(head.draft_vocab_size))
    if draft_token_strings is None:
        # the head's tokenizer is indexed by target ids: draft id i spells its token at i + d2t[i]
        head_strings = tokenizer_token_strings(head.path)
        if head_strings is None:
            return 0, "draft token strings not compared: the head ships no tokenizer.json"
        draft_lookup = lambda draft_id: head_strings.get(mapped[draft_id])  # noqa: E731
    else:
        draft_lookup = _lookup(draft_token_strings)
    if target_token_strings is None:
        target_token_strings = tokenizer_token_strings(target.path)
        if target_token_strings is None:
            return 0, "draft token strings not compared: the target has no tokenizer.json"
    target_lookup = _lookup(target_token_strings)
    differing = [(draft_id, target_id) for draft_id, target_id in enumerate(mapped)
                 if draft_lookup(draft_id) != target_lookup(target_id)]
    if differing:
        draft_id, target_id = differing[0]
        raise HeadMismatchError(f"draft vocabulary: draft id {draft_id} maps to target id {target_id}, spelled "
                                f"{_shown(draft_lookup(draft_id))} by the head but {_shown(target_lookup(target_id))} "
                                f"by the target ({len(differing)} of {len(mapped)} draft ids differ)")
    return len(mapped), None


# --- the declared verifier ----------------------------------------------------------------

def _hub_id_from_cache_path(path: Path) -> str | None:
    """org/name for a snapshot in the Hugging Face cache (models--org--name/snapshots/<commit>)."""
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/")
    return None


def _verifier_names(target: TargetShape, target_reference: str | None) -> set[str]:
    names = {target.path}
    if target_reference:
        names.add(target_reference)
        if "@" in target_reference:
            names.add(target_reference.rsplit("@", 1)[0])
    hub_id = _hub_id_from_cache_path(Path(target.path))
    if hub_id:
        names.add(hub_id)
    if target.name_or_path:
        names.add(target.name_or_path)
    return {name.rstrip("/").casefold() for name in names}


def _declared_is_target(declared: str, target: TargetShape, target_reference: str | None) -> bool:
    if declared.rstrip("/").casefold() in _verifier_names(target, target_reference):
        return True
    local = Path(declared).expanduser()
    return local.is_dir() and local.resolve() == Path(target.path)


def _check_verifier(head: HeadSpec, target: TargetShape, target_reference: str | None, target_fingerprint: Any,
                    allow_verifier_mismatch: bool) -> tuple[bool, list[str]]:
    """(matched, notes). A head whose declared verifier is another model is refused unless
    allow_verifier_mismatch, which turns the mismatch into a note the binding records."""
    problems: list[str] = []
    notes: list[str] = []
    matched_by_fingerprint = False
    if head.verifier_fingerprint and target_fingerprint is None:
        notes.append("the head records its verifier's fingerprint; not compared (no target fingerprint given)")
    if head.verifier_fingerprint and target_fingerprint is not None:
        differing = [key for key, digest in head.verifier_fingerprint.items()
                     if getattr(target_fingerprint, key, None) != digest]
        for key in differing:
            problems.append(f"the head records verifier {key} {head.verifier_fingerprint[key][:12]}, the target's "
                            f"is {str(getattr(target_fingerprint, key, None))[:12]}")
        matched_by_fingerprint = not differing
    name = head.verifier_name_or_path
    if name and not matched_by_fingerprint and not problems and not _declared_is_target(name, target,
                                                                                         target_reference):
        problems.append(f"the head declares verifier {name!r}, the target is {target_reference or target.path!r}")
    if head.verifier_architectures and target.architectures \
            and not set(head.verifier_architectures) & set(target.architectures):
        problems.append(f"the head declares verifier architectures {list(head.verifier_architectures)}, the target "
                        f"is {list(target.architectures)}")
    if problems:
        if not allow_verifier_mismatch:
            raise HeadMismatchError("verifier: " + "; ".join(problems) + " (--allow-verifier-mismatch registers it "
                                    "anyway and records the mismatch)")
        return False, notes + ["verifier mismatch allowed: " + "; ".join(problems)]
    if not name and not head.verifier_fingerprint:
        return False, notes + ["the head declares no verifier"]
    return matched_by_fingerprint or bool(name), notes


# --- the fit ------------------------------------------------------------------------------

def check_head_fits(head: HeadSpec, target_directory: str | Path, *, target_reference: str | None = None,
                    target_fingerprint: Any = None, allow_verifier_mismatch: bool = False,
                    draft_token_strings: TokenStrings | None = None,
                    target_token_strings: TokenStrings | None = None) -> HeadFit:
    """Check that `head` fits the target in `target_directory`; raise HeadMismatchError naming the
    field when it does not. `target_reference` (what the user typed) and `target_fingerprint` (a
    ModelFingerprint) identify the target against the head's declared verifier. Token strings:
    draft id -> string and target id -> string (a mapping or a callable); by default both come
    from the tokenizer.json files (the head's is indexed by target ids)."""
    target = read_target_shape(target_directory)
    notes = list(head.notes)
    if head.method == "mtp":
        if Path(head.path).resolve() != Path(target.path):
            raise HeadMismatchError(f"MTP layers: read from {head.path}, but the target is {target.path}; MTP "
                                    "layers belong to the target's own checkpoint")
        return HeadFit(aux_layer_ids=(), verifier_matched=True, compared_token_strings=0, notes=tuple(notes))
    # first: a head made for another model is named as such before its sizes are compared
    matched, verifier_notes = _check_verifier(head, target, target_reference, target_fingerprint,
                                              allow_verifier_mismatch)

    if head.target_hidden_size != target.hidden_size:
        source = "target_hidden_size" if head.target_hidden_size != head.hidden_size else "hidden_size"
        raise HeadMismatchError(f"hidden size: the head reads {head.target_hidden_size}-wide target states "
                                f"({source}) but the target's hidden_size is {target.hidden_size}")
    if not head.has_own_embeddings and head.method in ("eagle3", "eagle") and head.hidden_size != target.hidden_size:
        raise HeadMismatchError(f"hidden size: the head has no embed_tokens of its own, so it shares the target's "
                                f"{target.hidden_size}-wide embeddings, but its hidden_size is {head.hidden_size}")

    aux: tuple[int, ...] = ()
    if head.method == "eagle3":
        layers = target.num_hidden_layers
        declared = head.aux_layer_ids is not None
        aux = head.aux_layer_ids if declared else default_aux_layer_ids(layers)
        # vLLM 0.33 (models/interfaces.py _maybe_add_hidden_state, llama.py): id 0 is the embeddings,
        # id i + 1 the residual stream after layer i, so 0..N; it sorts and dedups the ids
        outside = [i for i in aux if not 0 <= i <= layers]
        if outside:
            what = "eagle_aux_hidden_state_layer_ids" if declared else "the default aux layer ids"
            raise HeadMismatchError(f"aux layer ids: {what} {list(aux)} name layer(s) {outside} outside the "
                                    f"target's {layers} layers (valid: 0 = embeddings .. {layers} = last layer output)")
        if not declared:
            notes.append(f"aux layer ids: the target's default {list(aux)} (the head names none)")

    if head.target_vocab_size != target.vocab_size:
        field_name = {"eagle3": "transformer_layer_config.vocab_size", "eagle": "vocab_size",
                      "medusa": "rows of each head's output layer"}[head.method]
        raise HeadMismatchError(f"vocabulary size: the head maps into {head.target_vocab_size} ids ({field_name}) "
                                f"but the target's vocab_size is {target.vocab_size}")
    vocab_map = read_vocab_map(head) if head.has_vocab_map else None
    _check_vocab_map(head, vocab_map, target.vocab_size)
    compared, note = _check_token_strings(head, vocab_map, target, draft_token_strings, target_token_strings)
    if note:
        notes.append(note)
    return HeadFit(aux_layer_ids=aux, verifier_matched=matched, compared_token_strings=compared,
                   notes=tuple(notes + verifier_notes))
