"""What every head format shares: the HeadSpec a reader returns (sizes and tensors, no tensor
loaded), the target's shape a head must fit, and the readers of config fields that name the
file and field of a bad value (ModelReferenceError)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specreg.core.files import read_json_file
from specreg.errors import ModelReferenceError


@dataclass(frozen=True)
class HeadTensor:
    name: str
    file: str  # file name inside the directory
    dtype: str  # safetensors dtype (F32, BF16, I64 ...)
    shape: tuple[int, ...]


@dataclass(frozen=True)
class HeadSpec:
    """What a head is, read from its config and safetensors headers (no tensor loaded)."""

    method: str  # a HEAD_FORMATS name (specreg.core.methods): "eagle3", "peagle", "medusa", "mtp" ...
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
    # block drafters (DFlash, DSpark): block_size, draft_length, sample_from_anchor, mask_token_id,
    # causal, the layer ids as declared and their numbering, DSpark's Markov head; None for others
    block: dict[str, Any] | None = None
    # P-EAGLE (parallel drafting): mask_token_id, the token of the k - 1 placeholder slots; None for others
    parallel: dict[str, Any] | None = None

    def tensor(self, name: str) -> HeadTensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["tensors"] = [{"name": t.name, "file": t.file, "dtype": t.dtype, "shape": list(t.shape)}
                           for t in self.tensors]
        for name in ("aux_layer_ids", "verifier_architectures", "weight_files", "notes"):
            data[name] = list(data[name]) if data[name] is not None else None
        data["verifier_fingerprint"] = dict(self.verifier_fingerprint)
        for name in ("block", "parallel"):
            if data[name] is None:  # only when set: other heads' bindings hash as before it existed
                del data[name]
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



# --- reading config fields ----------------------------------------------------------------

def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ModelReferenceError(f"{where} must be a JSON object, got {shown(value)}")
    return value


def positive_int(value: Any, where: str) -> int:
    # bool is an int in Python; NaN/inf arrive as floats and fail here too
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelReferenceError(f"{where} must be a positive integer, got {shown(value)}")
    return value


def optional_positive_int(value: Any, where: str) -> int | None:
    return None if value is None else positive_int(value, where)


def optional_str(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ModelReferenceError(f"{where} must be a string or null, got {shown(value)}")
    return value or None


def str_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ModelReferenceError(f"{where} must be a list of strings, got {shown(value)}")
    return tuple(value)


def read_layer_ids(value: Any, where: str) -> tuple[int, ...] | None:
    """Aux layer ids; None or [] means "not declared" (vLLM tests `if not layer_ids`)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ModelReferenceError(f"{where} must be a list of integers, got {shown(value)}")
    if len(set(value)) != len(value):
        # the target emits one state per layer, fewer than the fc of the head expects
        raise ModelReferenceError(f"{where} names a layer twice: {shown(value)}")
    return tuple(value) or None


def config_value(config: dict[str, Any], key: str) -> Any:
    """A field at the top level or, for multimodal configs, inside text_config."""
    if key in config:
        return config[key]
    text_config = config.get("text_config")
    return text_config.get(key) if isinstance(text_config, dict) else None



# --- the target ---------------------------------------------------------------------------

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
        hidden_size=positive_int(config_value(config, "hidden_size"), f"{config_path}: hidden_size"),
        num_hidden_layers=positive_int(config_value(config, "num_hidden_layers"),
                                        f"{config_path}: num_hidden_layers"),
        vocab_size=positive_int(config_value(config, "vocab_size"), f"{config_path}: vocab_size"),
        architectures=str_list(config.get("architectures"), f"{config_path}: architectures"),
        model_type=model_type if isinstance(model_type, str) else None,
        name_or_path=config.get("_name_or_path") if isinstance(config.get("_name_or_path"), str) else None,
    )

