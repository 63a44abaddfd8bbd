"""Safe loading of Hugging Face causal LMs: safetensors only, never remote code."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
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


def load_model(path, device: str = "cpu", dtype="float32", expected=None):
    """A model directory -> AutoModelForCausalLM in eval mode on `device` in `dtype`, with the
    runtime's attention (attention.py) where it would run transformers' sdpa.

    Refuses remote code, and pickle weights unless the model was registered with them
    (``expected.weight_format`` "pickle", i.e. --allow-pickle), which are then read with
    torch.load(weights_only=True) (load_pickle_weights). ``expected`` (the
    ModelFingerprint recorded at registration): config and weights are read once into memory,
    hashed and compared with it, and the model is built from those very bytes, so a file
    swapped after the integrity check is never loaded as the registered one
    (ModelReferenceError naming the file).
    """
    from transformers import AutoModelForCausalLM

    from specreg.runtime.attention import use_runtime_attention

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelReferenceError(f"{path}: no config.json, not a Hugging Face model directory")
    pickle_registered = expected is not None and expected.weight_format == "pickle"
    if not any(path.glob("*.safetensors")) and not pickle_registered:
        raise ModelReferenceError(f"{path}: no *.safetensors weights (pickle weights are refused)")
    try:
        if expected is None:
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=resolve_dtype(dtype), trust_remote_code=False, use_safetensors=True
            )
        else:
            model = load_verified_model(path, expected, resolve_dtype(dtype))
    except (OSError, ValueError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelReferenceError(f"{path}: cannot load model: {message}") from exc
    use_runtime_attention(model)
    return model.to(resolve_device(device)).eval()


def load_target(path, device: str = "cpu", dtype="float32", expected=None):
    """A target directory -> (tokenizer, model), both checked against `expected` (the target's
    registered ModelFingerprint) when given; the tokenizer first, which is quick to refuse."""
    tokenizer = load_tokenizer(path, expected=expected)
    return tokenizer, load_model(path, device, dtype, expected=expected)


def read_verified(path: Path, digest: str | None, what: str) -> bytes:
    """The bytes of one file, read once, whose sha256 must be ``digest`` (None: not recorded); a
    file this process hashed before and that has not changed since is not hashed again
    (digests.read_digested)."""
    from specreg.core.digests import read_digested

    try:
        if digest is None:
            return path.read_bytes()
        data, actual = read_digested(path)
    except OSError as exc:
        raise ModelReferenceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if actual != digest:
        raise ModelReferenceError(f"{path}: {what} changed since the model was fingerprinted; not loading it")
    return data


def load_verified_model(path: Path, expected, torch_dtype):
    """Build the model from config and safetensors bytes checked against ``expected``, reading the
    weight files weight_names gives."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config_path = path / "config.json"
    config_dict, names = weight_names(path, expected)
    state_dict = {}
    for name in names:
        # a pickle file is in the fingerprint only when it was registered with --allow-pickle
        data = read_verified(path / name, expected.weight_files[name], f"weight file {name}")
        state_dict.update(safetensors_tensors(data, path / name) if name.endswith(".safetensors")
                          else load_pickle_weights(data, path / name))
        del data
    model_type = config_dict.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ModelReferenceError(f"{config_path}: unknown model_type {model_type!r}")
    config = CONFIG_MAPPING[model_type].from_dict(config_dict)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if model_class is None:
        raise ModelReferenceError(f"{config_path}: model_type {model_type!r} has no causal LM in transformers")
    return model_class.from_pretrained(None, config=config, state_dict=state_dict, dtype=torch_dtype)


def weight_names(path: Path, expected) -> tuple[dict, list[str]]:
    """A model directory's config.json, checked against its fingerprint ``expected``, and the weight
    files to build it from: those transformers' from_pretrained would read
    (modeling_utils._get_resolved_checkpoint_files): config.json's ``transformers_weights``,
    else model.safetensors, else the shards model.safetensors.index.json names; for a model
    registered with pickle weights (no safetensors): pytorch_model.bin, else the shards
    pytorch_model.bin.index.json names. ModelReferenceError for a changed config or index, or a
    file the fingerprint does not cover."""
    from specreg.core.files import read_json_file
    from specreg.core.fingerprint import config_sha256

    config_path = path / "config.json"
    config_dict = read_json_file(config_path, data=read_verified(config_path, None, "config.json"))
    if config_sha256(config_dict) != expected.config_sha256:
        raise ModelReferenceError(f"{config_path}: config.json changed since the model was fingerprinted; "
                                  "not loading it")
    explicit = config_dict.get("transformers_weights")
    if explicit and not explicit.endswith(".index.json"):
        names = [explicit]
    elif not explicit and (path / "model.safetensors").is_file():
        names = ["model.safetensors"]
    elif not explicit and expected.weight_format == "pickle" and (path / "pytorch_model.bin").is_file():
        names = ["pytorch_model.bin"]
    else:
        index_name = explicit or ("pytorch_model.bin.index.json" if expected.weight_format == "pickle"
                                  else "model.safetensors.index.json")
        index_digest = (expected.behaviour_files or {}).get(index_name) if expected.scheme else None
        index_bytes = read_verified(path / index_name, None, index_name)
        index = read_json_file(path / index_name, data=index_bytes)
        if index_digest is not None and config_sha256(index) != index_digest:
            raise ModelReferenceError(f"{path / index_name}: {index_name} changed since the model was fingerprinted; "
                                      "not loading it")
        names = list(dict.fromkeys((index.get("weight_map") or {}).values()))
    for name in names:
        if not isinstance(name, str) or name not in expected.weight_files:
            raise ModelReferenceError(f"{path}: weight file {name!r} is not one the fingerprint covers; not loading it")
    return config_dict, names


def safetensors_tensors(data, path: Path) -> dict:
    """A safetensors file's bytes (a writable buffer), read and verified -> {name: tensor}, each a
    view of those bytes (no copy: from_pretrained keeps the tensors it is given, so a model's
    weights are the buffer read once). The header is checked as strictly as the safetensors
    library checks it (safetensors_header.read_safetensors_header); ModelReferenceError naming the file
    for a dtype torch has no type for."""
    import torch

    from specreg.core.safetensors_header import SAFETENSORS_DTYPE_NAMES, read_safetensors_header

    header = read_safetensors_header(path, data=data)
    base = 8 + int.from_bytes(data[:8], "little")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = getattr(torch, SAFETENSORS_DTYPE_NAMES.get(info["dtype"], ""), None)
        if not isinstance(dtype, torch.dtype):
            raise ModelReferenceError(f"{path}: tensor {name}: dtype {info['dtype']} has no torch type to load it as")
        start, end = info["data_offsets"]
        if start == end:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        tensor = torch.frombuffer(data, dtype=dtype, count=(end - start) // dtype.itemsize, offset=base + start)
        # a tensor after one of an odd size may start off its type's alignment: a copy is aligned
        tensors[name] = (tensor if (base + start) % dtype.itemsize == 0 else tensor.clone()).view(info["shape"])
    return tensors


def load_pickle_weights(source, where: Path) -> dict:
    """A PyTorch pickle weight file -> {name: tensor}, read with torch.load(weights_only=True):
    torch's restricted unpickler rebuilds tensors and plain containers and refuses anything else
    (no code runs). source: the file's bytes (read and verified by the caller), or its path,
    memory-mapped (sizes without reading the data). ModelReferenceError naming the file when it
    is not a plain state dict."""
    import io

    import torch

    try:
        if isinstance(source, Path):
            state = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
        else:
            state = torch.load(io.BytesIO(source), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError ... for a bad file
        reason = " ".join(" ".join(unpickler_detail(str(exc))).split())[:200] or type(exc).__name__
        raise ModelReferenceError(f"{where}: cannot load with torch.load(weights_only=True): {reason}") from None
    if not isinstance(state, dict) or not all(isinstance(key, str) and isinstance(value, torch.Tensor)
                                              for key, value in state.items()):
        raise ModelReferenceError(f"{where}: not a state dict of named tensors")
    return state


def unpickler_detail(message: str) -> list[str]:
    """torch's weights-only refusal without its advice (re-running with weights_only=False, which
    is the code execution this load refuses; filing an issue; the docs link): what it refused."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    paragraphs = [part.strip() for part in message.split("\n\n") if part.strip()]
    kept = [part for part in paragraphs if not part.startswith(boilerplate)]
    if len(kept) < len(paragraphs):  # the refusal of the restricted unpickler itself
        kept = [part.removeprefix("WeightsUnpickler error:").strip() for part in kept]
    return kept or paragraphs


# Files a tokenizer (and AutoTokenizer's choice of class) may read: copied, then checked.
TOKENIZER_READS = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "generation_config.json", "chat_template.jinja", "chat_template.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spm.model")


def load_tokenizer(path, expected=None, tokenizer_class=None):
    """A local model directory -> its tokenizer (no hub, never remote code).

    tokenizer_class: read the directory's tokenizer files with this class (e.g. the target's,
    as an engine does for a draft) instead of the one AutoTokenizer picks, which in
    transformers 5 may follow config.json's model_type rather than the files.

    ``expected`` (the registered ModelFingerprint): the tokenizer's files are copied into a
    private folder, checked there against it (config, tokenizer, chat template and, from
    fingerprint scheme 2, the option files) and loaded from that copy, so files swapped after
    the check are never used. Raises ModelReferenceError naming the directory when it, its
    tokenizer files or the tokenizer itself cannot be read, or a file changed.
    """
    path = Path(path)
    if not path.is_dir():
        raise ModelReferenceError(f"{path}: model directory not found")
    if not has_tokenizer(path):
        raise ModelReferenceError(f"{path}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")
    if expected is None:
        return _load_tokenizer_from(path, path, tokenizer_class)
    import tempfile

    from specreg.core.fingerprint import metadata_changes

    with tempfile.TemporaryDirectory(prefix="specreg-tokenizer-") as private:
        copy = Path(private)
        read = hashlib.sha256()
        for name in TOKENIZER_READS:
            if (path / name).is_file():
                data = read_verified(path / name, None, name)
                (copy / name).write_bytes(data)
                read.update(f"{name}\0{len(data)}\0".encode() + data)
        try:
            changes = metadata_changes(expected, copy)
        except ModelReferenceError as exc:  # name the model's files, not the private copy
            raise ModelReferenceError(str(exc).replace(str(copy), str(path))) from None
        if changes:
            raise ModelReferenceError(f"{path}: {changes[0]} since the model was fingerprinted; not loading it")
        directory, digest = str(path.resolve()), read.hexdigest()
        key = (directory, tokenizer_class, digest)
        if _SHARED_TOKENIZERS is not None and key in _SHARED_TOKENIZERS:
            return _SHARED_TOKENIZERS[key]
        tokenizer = _load_tokenizer_from(copy, path, tokenizer_class)
        if _SHARED_TOKENIZERS is not None:
            _SHARED_TOKENIZERS[key] = tokenizer
            if tokenizer_class is None:
                # AutoTokenizer ends in the class it picked, called as load_tokenizer calls it
                # (from_pretrained on the folder, local files only): a later load of the same files
                # with that class is this build
                _SHARED_TOKENIZERS.setdefault((directory, type(tokenizer), digest), tokenizer)
        return tokenizer


# While shared_tokenizers() is open: (directory, class, digest of the files read) -> the tokenizer
# built from those files. None: every load builds its own.
_SHARED_TOKENIZERS: dict | None = None


@contextlib.contextmanager
def shared_tokenizers() -> Iterator[None]:
    """Within: a checked load (``load_tokenizer`` with ``expected``) of the same directory, with
    the same class (or with the class AutoTokenizer picked in an earlier load without one), whose
    files read the same bytes as an earlier one, returns that load's tokenizer instead of building
    another (0.2-0.9 s per build of SmolLM2's tokenizer on a 2-core machine). A validation loads
    the pair's tokenizers for its checks and again in the runtime; the files are still read and
    checked against the fingerprint each time, so a file changed in between is caught as before.
    The checks and the runtime read tokenizers, never change them."""
    global _SHARED_TOKENIZERS
    if _SHARED_TOKENIZERS is not None:  # already inside one
        yield
        return
    _SHARED_TOKENIZERS = {}
    try:
        yield
    finally:
        _SHARED_TOKENIZERS = None


def _load_tokenizer_from(directory: Path, path: Path, tokenizer_class=None):
    from transformers import AutoTokenizer

    try:
        if tokenizer_class is not None:
            tokenizer = tokenizer_class.from_pretrained(directory, local_files_only=True)
        else:
            tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a broken tokenizer folder
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ModelReferenceError(f"{path}: cannot load tokenizer: {reason}") from None
    if directory != path:
        tokenizer.name_or_path = str(path)  # messages name the model, not the private copy
    return tokenizer
