"""Safe loading of Hugging Face causal LMs: safetensors only, never remote code."""

from __future__ import annotations

from pathlib import Path

from specreg.core.fingerprint import TOKENIZER_FILES
from specreg.errors import ModelReferenceError, RuntimeConfigError

DTYPES = ("float32", "bfloat16", "float16")


def resolve_device(device: str = "auto") -> str:
    """'auto' | 'cpu' | 'cuda[:n]' | 'mps' -> a device string that exists on this machine."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeConfigError(f"device {device!r} requested but CUDA is not available")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise RuntimeConfigError("device 'mps' requested but MPS is not available")
    if device != "cpu" and not device.startswith("cuda") and device != "mps":
        raise RuntimeConfigError(f"unknown device {device!r}: use auto, cpu, cuda or mps")
    return device


def resolve_dtype(dtype):
    """'float32' | 'bfloat16' | 'float16' (or a torch.dtype) -> torch.dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise RuntimeConfigError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def has_tokenizer(path) -> bool:
    """True when the model directory carries tokenizer files of its own."""
    return any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def load_model(path, device: str = "cpu", dtype="float32"):
    """A model directory -> AutoModelForCausalLM in eval mode on `device` in `dtype`, with the
    runtime's attention (attention.py) where it would run transformers' sdpa.

    Refuses remote code and pickle weights: only safetensors are read.
    """
    from transformers import AutoModelForCausalLM

    from specreg.runtime.attention import use_runtime_attention

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelReferenceError(f"{path}: no config.json, not a Hugging Face model directory")
    if not any(path.glob("*.safetensors")):
        raise ModelReferenceError(f"{path}: no *.safetensors weights (pickle weights are refused)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=resolve_dtype(dtype), trust_remote_code=False, use_safetensors=True
        )
    except (OSError, ValueError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelReferenceError(f"{path}: cannot load model: {message}") from exc
    use_runtime_attention(model)
    return model.to(resolve_device(device)).eval()


def load_tokenizer(path, tokenizer_class=None):
    """A local model directory -> its tokenizer (no hub, never remote code).

    tokenizer_class: read the directory's tokenizer files with this class (e.g. the target's,
    as an engine does for a draft) instead of the one AutoTokenizer picks, which in
    transformers 5 may follow config.json's model_type rather than the files.
    Raises ModelReferenceError naming the directory when it, its tokenizer files or the
    tokenizer itself cannot be read.
    """
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ModelReferenceError(f"{path}: model directory not found")
    if not has_tokenizer(path):
        raise ModelReferenceError(f"{path}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")
    try:
        if tokenizer_class is not None:
            return tokenizer_class.from_pretrained(path, local_files_only=True)
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a broken tokenizer folder
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ModelReferenceError(f"{path}: cannot load tokenizer: {reason}") from None
