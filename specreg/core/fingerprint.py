"""Content fingerprints of a model directory, computed without loading any tensor.

Weights: sha256 of each weight file, streamed. Config: sha256 of a canonical JSON form
(sorted keys, without the fields that only record who saved it). Tokenizer: sha256 of a
canonical form of vocab, merges, added/special tokens and the normalizer / pre-tokenizer /
post-processor / decoder settings, so that re-saving or re-indenting changes nothing. Chat
template: sha256 of the template string. Shapes, dtype and parameter count come from the
safetensors headers. Nothing here imports torch or transformers and no code from the model
directory is ever run (the equivalent of ``trust_remote_code=False``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from specreg.errors import ModelReferenceError
from specreg.core.types import ModelFingerprint, ModelRef

# A directory holds a tokenizer when it has one of these (tokenizer_config.json alone is not one).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spm.model")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl")
# Fields that record the saving library, not the model.
CONFIG_VOLATILE_KEYS = ("transformers_version", "_name_or_path")
# safetensors dtype name -> bytes per element
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}
SAFETENSORS_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                           "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                           "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
MAX_HEADER_BYTES = 100 * 1024 * 1024


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> bytes:
    """The one canonical serialisation used for every content hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def read_json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelReferenceError(f"{path}: not readable JSON ({exc.__class__.__name__}: {exc})") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise ModelReferenceError(f"{path}: not readable JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ModelReferenceError(f"{path}: expected a JSON object")
    return data


# --- model references ---------------------------------------------------------------------

def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def resolve_reference(reference: str) -> tuple[Path, str | None]:
    """A local directory, or ``org/name@revision`` already in the local Hugging Face cache.

    Returns (directory, pinned commit or None). Never downloads.
    """
    local = Path(reference).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ModelReferenceError(f"model reference {reference}: not a directory")
        return local.resolve(), None
    if "@" in reference and "/" in reference and not reference.startswith((".", "/", "~")):
        repo_id, revision = reference.rsplit("@", 1)
        repo_dir = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
        commit = revision
        ref_file = repo_dir / "refs" / revision
        if ref_file.is_file():
            commit = ref_file.read_text().strip()
        snapshot = repo_dir / "snapshots" / commit
        if snapshot.is_dir():
            return snapshot.resolve(), commit
        raise ModelReferenceError(
            f"model reference {reference}: revision {revision} of {repo_id} is not in the local "
            f"Hugging Face cache ({hf_cache_dir()}); specreg never downloads"
        )
    if "/" in reference and not reference.startswith((".", "/", "~")) and not local.parent.exists():
        raise ModelReferenceError(
            f"model reference {reference}: no such directory; a hub id needs a pinned revision "
            f"(NAME@REVISION) already in the local cache"
        )
    raise ModelReferenceError(f"model reference {reference}: no such directory")


# --- safetensors headers ------------------------------------------------------------------

def read_safetensors_header(path: Path) -> dict[str, Any]:
    """Parse and check a safetensors header: {tensor name: {dtype, shape, data_offsets}}."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ValueError("file shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(size - 8, MAX_HEADER_BYTES):
                raise ValueError(f"header length {header_len} exceeds the file")
            try:
                header = json.loads(handle.read(header_len).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise ValueError("not JSON") from None
            except RecursionError:
                raise ValueError("JSON nested too deeply") from None
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        data_size = size - 8 - header_len
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if dtype not in SAFETENSORS_DTYPE_BYTES:
                raise ValueError(f"tensor {name}: unknown dtype {dtype}")
            elements = 1
            for dim in shape:
                elements *= int(dim)
            start, end = int(offsets[0]), int(offsets[1])
            if not 0 <= start <= end <= data_size or end - start != elements * SAFETENSORS_DTYPE_BYTES[dtype]:
                raise ValueError(f"tensor {name}: data offsets {offsets} do not fit the file")
    except OSError as exc:
        raise ModelReferenceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ModelReferenceError(f"{path}: corrupt safetensors header ({exc})") from None
    return header


# --- tokenizer and chat template ----------------------------------------------------------

def canonical_tokenizer(directory: Path) -> dict[str, Any] | None:
    """What defines tokenization, independent of file formatting; None when there is none."""
    form: dict[str, Any] = {}
    tokenizer_json = directory / "tokenizer.json"
    if tokenizer_json.is_file():
        data = read_json_file(tokenizer_json)
        model = dict(data.get("model") or {})
        merges = model.pop("merges", None) or []
        # merges are written as "a b" (old) or ["a", "b"] (new): one form for both
        model["merges"] = [m if isinstance(m, str) else " ".join(m) for m in merges]
        if isinstance(model.get("vocab"), dict):
            model["vocab"] = sorted(model["vocab"].items(), key=lambda item: (item[1], item[0]))
        form["model"] = model
        form["added_tokens"] = sorted(data.get("added_tokens") or [], key=lambda t: t.get("id", 0))
        for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
            form[part] = data.get(part)
    for name in ("vocab.json", "merges.txt", "tokenizer.model"):
        path = directory / name
        if path.is_file() and "model" not in form:
            form[name] = sha256_file(path)
    if not form:
        return None
    config_path = directory / "tokenizer_config.json"
    config = read_json_file(config_path) if config_path.is_file() else {}
    special_map_path = directory / "special_tokens_map.json"
    special_map = read_json_file(special_map_path) if special_map_path.is_file() else {}
    special: dict[str, Any] = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token", "cls_token", "sep_token", "mask_token"):
        value = config.get(key, special_map.get(key))
        special[key] = value.get("content") if isinstance(value, dict) else value
    form["special_tokens"] = special
    form["added_tokens_decoder"] = config.get("added_tokens_decoder")
    for key in ("add_bos_token", "add_eos_token", "clean_up_tokenization_spaces", "model_max_length_is_set"):
        if key in config:
            form[key] = config[key]
    return form


def tokenizer_length(directory: Path) -> int | None:
    """Number of ids the tokenizer can produce (max id + 1), read from tokenizer.json."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    data = read_json_file(path)
    ids = list((data.get("model") or {}).get("vocab", {}).values()) if isinstance(
        (data.get("model") or {}).get("vocab"), dict) else []
    ids += [token.get("id", -1) for token in data.get("added_tokens") or []]
    return max(ids) + 1 if ids else None


def read_chat_template(directory: Path) -> str | None:
    """The chat template string, wherever this transformers generation saved it."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    as_json = directory / "chat_template.json"
    if as_json.is_file():
        template = read_json_file(as_json).get("chat_template")
        if template:
            return template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    config_path = directory / "tokenizer_config.json"
    if config_path.is_file():
        template = read_json_file(config_path).get("chat_template")
        if isinstance(template, list):  # named templates: [{"name":..., "template":...}]
            return json.dumps(template, sort_keys=True)
        return template
    return None


# --- the fingerprint ----------------------------------------------------------------------

def fingerprint_model(directory: Path, allow_pickle: bool = False, require_tokenizer: bool = True) -> ModelFingerprint:
    """Fingerprint a Hugging Face model directory. Raises ModelReferenceError naming the problem.

    require_tokenizer=False for a speculative head (EAGLE-3, Medusa), which drafts in the target's
    vocabulary and usually ships no tokenizer of its own."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelReferenceError(f"{directory}: no config.json (not a Hugging Face model directory)")
    config = read_json_file(config_path)
    if require_tokenizer and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ModelReferenceError(f"{directory}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")

    safetensors_files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    pickle_files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES
                          and not p.name.startswith("training_args"))
    if safetensors_files:
        weight_files, weight_format = safetensors_files, "safetensors"
    elif pickle_files:
        if not allow_pickle:
            raise ModelReferenceError(
                f"{directory}: weights are only pickle files ({', '.join(p.name for p in pickle_files)}), "
                f"which can run code when loaded; convert to safetensors or pass --allow-pickle"
            )
        weight_files, weight_format = pickle_files, "pickle"
    else:
        raise ModelReferenceError(f"{directory}: no weight files (*.safetensors)")

    parameter_count: int | None = None
    dtype: str | None = None
    if weight_format == "safetensors":
        parameter_count = 0
        dtype_elements: Counter[str] = Counter()
        for path in weight_files:
            for name, info in read_safetensors_header(path).items():
                if name == "__metadata__":
                    continue
                elements = 1
                for dim in info["shape"]:
                    elements *= int(dim)
                parameter_count += elements
                dtype_elements[info["dtype"]] += elements
        if dtype_elements:
            dominant = dtype_elements.most_common(1)[0][0]
            dtype = SAFETENSORS_DTYPE_NAMES.get(dominant, dominant.lower())

    file_digests = {path.name: sha256_file(path) for path in weight_files}
    config_form = {key: value for key, value in config.items() if key not in CONFIG_VOLATILE_KEYS}
    tokenizer_form = canonical_tokenizer(directory)
    chat_template = read_chat_template(directory)
    architectures = config.get("architectures") or [None]
    text_config = config.get("text_config") or {}
    return ModelFingerprint(
        weights_sha256=sha256_hex(canonical_json(sorted(file_digests.items()))),
        weight_files=file_digests,
        weight_format=weight_format,
        config_sha256=sha256_hex(canonical_json(config_form)),
        tokenizer_sha256=sha256_hex(canonical_json(tokenizer_form)) if tokenizer_form is not None else None,
        chat_template_sha256=sha256_hex(chat_template.encode()) if chat_template else None,
        architecture=architectures[0],
        model_type=config.get("model_type"),
        vocab_size=config.get("vocab_size", text_config.get("vocab_size")),
        tokenizer_length=tokenizer_length(directory),
        parameter_count=parameter_count,
        dtype=dtype or config.get("torch_dtype") or config.get("dtype"),
        max_position_embeddings=config.get("max_position_embeddings", text_config.get("max_position_embeddings")),
    )


def fingerprint_reference(reference: str, allow_pickle: bool = False, require_tokenizer: bool = True) -> ModelRef:
    """Resolve a reference (local dir or cached hub id@revision) and fingerprint it."""
    directory, revision = resolve_reference(reference)
    return ModelRef(
        reference=reference,
        path=str(directory),
        revision=revision,
        fingerprint=fingerprint_model(directory, allow_pickle=allow_pickle, require_tokenizer=require_tokenizer),
    )


def compare_fingerprints(recorded: ModelFingerprint, current: ModelFingerprint) -> list[str]:
    """Human-readable differences between two fingerprints (empty when identical)."""
    changes: list[str] = []
    for name, digest in recorded.weight_files.items():
        now = current.weight_files.get(name)
        if now is None:
            changes.append(f"weight file {name} is missing")
        elif now != digest:
            changes.append(f"weight file {name} changed")
    for name in current.weight_files.keys() - recorded.weight_files.keys():
        changes.append(f"weight file {name} was added")
    for field, label in (("config_sha256", "config.json"), ("tokenizer_sha256", "tokenizer"),
                         ("chat_template_sha256", "chat template")):
        if getattr(recorded, field) != getattr(current, field):
            changes.append(f"{label} changed")
    return changes
