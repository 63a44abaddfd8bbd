"""Memory headroom (static, no forward pass): do both models and both KV caches fit the device?

weights: read from the safetensors headers (dtype size x shape per tensor), or recomputed for
    the dtype the models will run in;
KV cache of each model: 2 (keys and values) x layers x kv_heads x head_dim x bytes x tokens x
    batch, at the configured max context length and batch size;
budget: a size string ("80GiB", "24GB", "512MiB") or the detected CUDA device's total memory.
The check fails when weights + caches exceed the budget less a headroom fraction, which is
what covers activations, the CUDA context and allocator fragmentation.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from specreg.errors import ModelReferenceError, UsageError
from specreg.core.safetensors_header import read_safetensors_header
from specreg.core.types import FAIL, PASS, SKIP, CheckResult
from specreg.validators.context import Check, CheckContext

CHECK_NAME = "memory"
DEFAULT_HEADROOM = 0.10

# Bytes per element of the safetensors dtype codes (F4/F6 are packed sub-byte floats).
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "F6_E2M3": 0.75, "F6_E3M2": 0.75, "F4": 0.5,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
FLOAT_CODES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"}
DTYPE_BYTES = {
    "float64": 8, "double": 8, "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
}
CODE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
UNITS = {
    "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")


def parse_memory_size(value: str | int) -> int:
    """Bytes in a size such as "80GiB", "24GB", "512MiB", "1.5TiB" (an int is taken as bytes).

    GB/MB are decimal, GiB/MiB binary. Raises UsageError naming the value otherwise.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    unit = match.group(2).upper() if match else None
    if match is None or unit not in UNITS or float(match.group(1)) <= 0:
        raise UsageError(
            f"invalid memory size {value!r}: use a positive number and a unit, e.g. 80GiB, 24GB or 512MiB"
        )
    return int(float(match.group(1)) * UNITS[unit])


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a floating dtype name ("float32", "bf16", "torch.float16" ...)."""
    name = str(dtype).removeprefix("torch.").lower()
    if name not in DTYPE_BYTES:
        raise UsageError(f"unknown dtype {dtype!r}: use one of float32, float16, bfloat16")
    return DTYPE_BYTES[name]


def format_bytes(count: float) -> str:
    """Human-readable binary size: "1.50 GiB", "12.00 MiB", "512 B"."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model folder (the shards named in the index when there is one);
    without safetensors, its pickle weights (pytorch_model.bin or the shards its index names),
    which registration accepted only with --allow-pickle."""
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file() and not any(model_dir.glob("*.safetensors")):
        pickle_index = model_dir / "pytorch_model.bin.index.json"
        if pickle_index.is_file():
            index = pickle_index
        elif (model_dir / "pytorch_model.bin").is_file():
            return [model_dir / "pytorch_model.bin"]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ModelReferenceError(f"{index}: not a valid weight index") from None
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelReferenceError(f"{model_dir}: no weight files (*.safetensors, or pytorch_model.bin with "
                                  "--allow-pickle)")
    return files


# torch dtypes of a pickle checkpoint -> the safetensors dtype codes sized above
TORCH_DTYPE_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
                     "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32",
                     "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def tensor_headers(path: Path) -> dict[str, dict[str, Any]]:
    """name -> {"dtype": safetensors code, "shape"} of one weight file: the safetensors header, or
    for a pickle file the tensors torch.load(weights_only=True, mmap=True) maps without reading."""
    if path.suffix == ".safetensors":
        return {name: info for name, info in read_safetensors_header(path).items() if name != "__metadata__"}
    from specreg.runtime.loading import load_pickle_weights

    return {name: {"dtype": TORCH_DTYPE_CODES.get(str(tensor.dtype).removeprefix("torch."), str(tensor.dtype)),
                   "shape": list(tensor.shape)}
            for name, tensor in load_pickle_weights(path, path).items()}


def weight_bytes(model_dir: str | Path, dtype: str | None = None) -> dict[str, Any]:
    """Weight memory of a model folder from its safetensors headers (pickle: see tensor_headers).

    dtype: None counts tensors as stored; a name ("float32", "bf16") recounts every floating
    tensor at that size (integer/quantized tensors keep theirs), as loading with dtype= does.
    Returns {"bytes", "stored_bytes", "tensors", "files", "stored_dtypes": {code: bytes}}.
    """
    model_dir = Path(model_dir)
    new_size = dtype_bytes(dtype) if dtype is not None else None
    total = stored_total = 0.0
    tensors = 0
    by_dtype: dict[str, float] = {}
    files = weight_files(model_dir)
    for path in files:
        for name, info in tensor_headers(path).items():
            try:
                code, shape = info["dtype"], info["shape"]
                size = SAFETENSORS_DTYPE_BYTES[code]
            except (TypeError, KeyError):
                raise ModelReferenceError(f"{path}: tensor {name!r} has no known dtype/shape") from None
            elements = 1
            for dim in shape:
                elements *= dim
            stored = elements * size
            stored_total += stored
            by_dtype[code] = by_dtype.get(code, 0) + stored
            total += elements * new_size if (new_size is not None and code in FLOAT_CODES) else stored
            tensors += 1
    return {"bytes": int(total), "stored_bytes": int(stored_total), "tensors": tensors,
            "files": [p.name for p in files], "stored_dtypes": {k: int(v) for k, v in by_dtype.items()}}


def kv_cache_bytes(model_dir: str | Path, tokens: int, batch_size: int, bytes_per_element: float) -> dict[str, Any]:
    """KV-cache memory of one model: 2 x layers x kv_heads x head_dim x bytes x tokens x batch.

    Reads config.json (text_config for multimodal wrappers); sliding windows and cache
    quantization are ignored, so the figure is an upper bound. Returns the factors and "bytes".
    """
    config = _text_config(Path(model_dir))
    path = Path(model_dir) / "config.json"
    layers = _config_int(config, "num_hidden_layers", path)
    heads = _config_int(config, "num_attention_heads", path)
    kv_heads = config_value(config, "num_key_value_heads") or heads  # absent: plain multi-head attention
    head_dim = config_value(config, "head_dim") or _config_int(config, "hidden_size", path) // heads
    per_token = 2 * layers * kv_heads * head_dim * bytes_per_element
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
            "bytes_per_element": bytes_per_element, "bytes_per_token": per_token,
            "bytes": int(per_token * tokens * batch_size)}


def check_memory_headroom(draft_dir: str | Path | None, target_dir: str | Path, *,
                          gpu_memory: str | int | None = None, max_context_tokens: int | None = None,
                          batch_size: int = 1, dtype: str | None = None,
                          headroom: float = DEFAULT_HEADROOM, device: int | str | None = None) -> CheckResult:
    """Do both models' weights plus both KV caches fit the device memory budget with headroom?

    draft_dir None: model-free drafting (ngram), only the target is counted.

    gpu_memory: budget as "80GiB"/"24GB"/bytes; None uses the CUDA device's total memory
        (device picks which) and skips the check when there is no CUDA device.
    max_context_tokens: tokens per sequence in the caches (default: the target's
        max_position_embeddings). batch_size: sequences held at once.
    dtype: the dtype the models run in (None: as stored; the KV cache then uses the largest
        floating weight dtype). headroom: fraction of the budget kept free, in [0, 1).
    Returns a CheckResult "memory" with every figure in bytes.
    """
    target_dir = Path(target_dir)
    max_context_tokens = context_tokens(target_dir, max_context_tokens, batch_size, headroom)
    budget, budget_source, device_free = _budget(gpu_memory, device)
    models = model_memory(draft_dir, target_dir, dtype, max_context_tokens, batch_size)
    total = sum(m["weights"]["bytes"] + m["kv_cache"]["bytes"] for m in models.values())

    no_model = {"weights": {"bytes": 0}, "kv_cache": {"bytes": 0}}
    figures: dict[str, float] = {
        "draft_weight_bytes": models.get("draft", no_model)["weights"]["bytes"],
        "target_weight_bytes": models["target"]["weights"]["bytes"],
        "draft_kv_cache_bytes": models.get("draft", no_model)["kv_cache"]["bytes"],
        "target_kv_cache_bytes": models["target"]["kv_cache"]["bytes"],
        "total_bytes": total,
        "max_context_tokens": max_context_tokens,
        "batch_size": batch_size,
        "headroom_fraction": headroom,
    }
    evidence: dict[str, Any] = {
        "dtype": dtype or "as stored",
        "budget_source": budget_source,
        "models": models,
        "not_counted": "activations, CUDA context, allocator fragmentation (covered by the headroom)",
    }
    if budget is None:
        return CheckResult(CHECK_NAME, SKIP,
                           f"no device memory budget given and no CUDA device found; models and caches "
                           f"need {format_bytes(total)} (give a budget such as 80GiB)", evidence, figures)

    usable = budget * (1 - headroom)
    figures.update({"budget_bytes": budget, "usable_bytes": int(usable),
                    "free_after_bytes": math.floor(usable - total), "budget_utilization": total / budget})
    if device_free is not None:
        figures["device_free_bytes"] = device_free
    parts = (f"weights {format_bytes(figures['draft_weight_bytes'] + figures['target_weight_bytes'])} + "
             f"KV caches {format_bytes(figures['draft_kv_cache_bytes'] + figures['target_kv_cache_bytes'])} "
             f"at {max_context_tokens} tokens x batch {batch_size}")
    if total > usable:
        summary = (f"does not fit: needs {format_bytes(total)} ({parts}) but only {format_bytes(usable)} "
                   f"of {format_bytes(budget)} is usable with {headroom:.0%} headroom")
        return CheckResult(CHECK_NAME, FAIL, summary, evidence, figures)
    summary = (f"fits: needs {format_bytes(total)} ({parts}) of {format_bytes(usable)} usable "
               f"({format_bytes(budget)} with {headroom:.0%} headroom)")
    return CheckResult(CHECK_NAME, PASS, summary, evidence, figures)


def context_tokens(target_dir: Path, max_context_tokens: int | None, batch_size: int, headroom: float) -> int:
    """The tokens per sequence the caches hold (default: the target's max_position_embeddings),
    after the check's inputs are checked (UsageError naming a bad one)."""
    if not 0 <= headroom < 1:
        raise UsageError(f"invalid memory headroom {headroom!r}: use a fraction in [0, 1), e.g. 0.1")
    if batch_size < 1:
        raise UsageError(f"invalid batch size {batch_size!r}: must be at least 1")
    if max_context_tokens is None:
        max_context_tokens = config_value(_text_config(target_dir), "max_position_embeddings")
        if not max_context_tokens:
            raise UsageError(f"{target_dir / 'config.json'}: no max_position_embeddings; give the max context length")
    if max_context_tokens < 1:
        raise UsageError(f"invalid max context length {max_context_tokens!r}: must be at least 1")
    return max_context_tokens


def model_memory(draft_dir: str | Path | None, target_dir: Path, dtype: str | None, tokens: int,
                 batch_size: int) -> dict[str, dict[str, Any]]:
    """{side: {"weights", "kv_cache"}} of each model counted (the target only without a draft)."""
    models = {}
    sides = [("target", target_dir)] if draft_dir is None else [("draft", Path(draft_dir)), ("target", target_dir)]
    for side, model_dir in sides:
        weights = weight_bytes(model_dir, dtype)
        element = dtype_bytes(dtype) if dtype is not None else _widest_float(weights["stored_dtypes"])
        models[side] = {"weights": weights, "kv_cache": kv_cache_bytes(model_dir, tokens, batch_size, element)}
    return models


def _budget(gpu_memory, device) -> tuple[int | None, str, int | None]:
    """(budget bytes or None, where it came from, free bytes on the device or None)."""
    if gpu_memory is not None:
        return parse_memory_size(gpu_memory), f"given: {gpu_memory}", None
    import torch

    if device is not None and torch.device(device).type != "cuda":
        return None, f"none: no budget given and device {device} is not a CUDA device", None
    if not torch.cuda.is_available():
        return None, "none: no budget given and no CUDA device", None
    index = torch.cuda.current_device() if device is None else (torch.device(device).index or 0)
    free, total = torch.cuda.mem_get_info(index)
    return total, f"cuda:{index} ({torch.cuda.get_device_name(index)}) total memory", free


def _widest_float(stored_dtypes: dict[str, float]) -> float:
    sizes = [SAFETENSORS_DTYPE_BYTES[code] for code in stored_dtypes if code in FLOAT_CODES]
    return max(sizes) if sizes else 2  # no float weights at all (fully quantized): fp16 cache


def config_value(config: dict, name: str):
    """``config[name]`` under its standard transformers name or the architecture's own one:
    GPT-2 says ``n_layer`` for ``num_hidden_layers``. The renames come from the config class's
    ``attribute_map`` (PretrainedConfig), looked up by ``model_type`` without instantiating it."""
    if config.get(name) is not None:
        return config[name]
    own_name = attribute_map(config.get("model_type")).get(name)
    return config.get(own_name) if own_name else None


def attribute_map(model_type) -> dict[str, str]:
    """Standard name -> this architecture's name, from transformers' config class (empty for a
    model_type transformers does not know)."""
    if not isinstance(model_type, str) or not model_type:
        return {}
    from transformers import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type]
    except (KeyError, ValueError):
        return {}
    mapping = getattr(config_class, "attribute_map", None)
    return {k: v for k, v in mapping.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(mapping, dict) else {}


def _text_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelReferenceError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise ModelReferenceError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelReferenceError(f"{path}: not a JSON object")
    text_config = config.get("text_config")
    if isinstance(text_config, dict) and config_value(text_config, "num_hidden_layers") is not None:
        return text_config
    return config


def _config_int(config: dict, key: str, path: Path) -> int:
    value = config_value(config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        own_name = attribute_map(config.get("model_type")).get(key)
        named = f"'{key}'" + (f" ('{own_name}' in {config.get('model_type')} configs)" if own_name else "")
        raise ModelReferenceError(f"{path}: field {named} missing or not a positive integer")
    return value


def run(context: CheckContext) -> CheckResult:
    """The memory check of a validation, on the pair's files and the options' budget."""
    options, device = context.options, context.device
    # a head's weights are a fraction of one target layer's: the check counts the target
    draft_dir = None if context.config.method.has_head else context.draft_dir
    return check_memory_headroom(draft_dir, context.target_dir, gpu_memory=options.gpu_memory,
                                 max_context_tokens=options.max_context_tokens, batch_size=options.batch_size,
                                 dtype=options.dtype, device=device if device.startswith("cuda") else None)


CHECK = Check(CHECK_NAME, run, announce=True)
