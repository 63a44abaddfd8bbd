"""Content fingerprints of a model directory, computed without loading any tensor.

Weights: sha256 of each weight file, streamed. Config: sha256 of a canonical JSON form
(sorted keys, without the fields that only record who saved it). Tokenizer: sha256 of a
canonical form of vocab, merges, added/special tokens and the normalizer / pre-tokenizer /
post-processor / decoder settings, so that re-saving or re-indenting changes nothing. Chat
template: sha256 of the template string. Shapes, dtype and parameter count come from the
safetensors headers. Nothing here imports torch or transformers and no code from the model
directory is ever run (the equivalent of ``trust_remote_code=False``). The content hashes and
their caches live in specreg.core.digests, the header parser in specreg.core.safetensors_header, the
tokenizer's canonical form in specreg.core.tokenizer_form.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from specreg.errors import ModelReferenceError
from specreg.core.digests import canonical_json, sha256_file, sha256_hex
from specreg.core.files import read_json_file
from specreg.core.safetensors_header import SAFETENSORS_DTYPE_NAMES, read_safetensors_header
from specreg.core.tokenizer_form import canonical_tokenizer, read_chat_template, tokenizer_length
from specreg.core.types import ModelFingerprint, ModelRef

# A directory holds a tokenizer when it has one of these (tokenizer_config.json alone is not one).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spm.model")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl")
# Fields that record the saving library, not the model.
CONFIG_VOLATILE_KEYS = ("transformers_version", "_name_or_path")
# What a scheme-2 fingerprint covers beyond weights, config, tokenizer and chat template: every
# file transformers reads that changes tokenization (options, special tokens, added tokens, the
# slow tokenizers' vocabularies) or generation (eos, sampling defaults), and the shard indexes
# that decide which weights load. Scheme 1 (recorded without ``scheme``) had none of these.
FINGERPRINT_SCHEME = 2
BEHAVIOUR_JSON_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                        "generation_config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")
BEHAVIOUR_RAW_FILES = ("tokenizer.model", "spm.model", "vocab.json", "merges.txt", "vocab.txt")
SHARD_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# config.json fields read as sizes (by the memory check, the runtime, engines): positive integers
CONFIG_SIZE_KEYS = ("vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "intermediate_size", "head_dim")
# above these no released model goes (late 2026: at most ~200 layers, hidden 32k, vocabularies
# ~1M, contexts 10M): a config beyond one describes no weights that could be validated, and the
# memory check and the runtime would spend minutes on its sizes before judging nothing
CONFIG_SIZE_LIMITS = {"num_hidden_layers": 4096, "hidden_size": 1 << 18, "vocab_size": 1 << 24,
                      "intermediate_size": 1 << 20, "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14,
                      "head_dim": 1 << 14, "max_position_embeddings": 1 << 27}
LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


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


# --- config and weight files --------------------------------------------------------------

def config_sha256(config: dict[str, Any]) -> str:
    """Digest of config.json as parsed, without the fields that only record who saved it."""
    return sha256_hex(canonical_json({key: value for key, value in config.items() if key not in CONFIG_VOLATILE_KEYS}))


def check_config(config: dict[str, Any], path: Path) -> None:
    """Refuse a config.json whose fields the registry, the checks or an engine read as sizes or
    names when they are not: ``architectures`` a list of names, ``text_config`` an object, and
    each of CONFIG_SIZE_KEYS (at the top or in ``text_config``) a positive integer."""
    architectures = config.get("architectures")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(name, str) for name in architectures)):
        raise ModelReferenceError(f"{path}: field 'architectures' must be a list of names, got {architectures!r:.60}")
    for key in ("model_type", "transformers_weights"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise ModelReferenceError(f"{path}: field '{key}' must be a string, got {config[key]!r:.60}")
    text_config = config.get("text_config")
    if text_config is not None and not isinstance(text_config, dict):
        raise ModelReferenceError(f"{path}: field 'text_config' must be an object, got {type(text_config).__name__}")
    for prefix, section in (("", config), ("text_config.", text_config or {})):
        for key in CONFIG_SIZE_KEYS:
            value = section.get(key)
            if value is not None and not (type(value) is int and 0 < value < 1 << 63):
                raise ModelReferenceError(f"{path}: field '{prefix}{key}' must be a positive integer, got {value!r:.60}")
            if value is not None and value > CONFIG_SIZE_LIMITS[key]:
                raise ModelReferenceError(f"{path}: field '{prefix}{key}' is {value}, above any real model's "
                                          f"({CONFIG_SIZE_LIMITS[key]} at most): it describes no weights to validate")


def check_config_against_weights(config: dict[str, Any], path: Path, headers: dict[str, Any]) -> None:
    """Refuse a config.json that claims more than its weights hold, read from the safetensors
    ``headers`` (tensor name -> info): more layers than the highest ``layers.N`` of any tensor, a
    hidden size or vocabulary wider or longer than the token embedding (``*embed_tokens.weight``).
    Only "more than" is refused: weights may hold more (an MTP layer past num_hidden_layers)."""
    layers = [int(found.group(1)) for name in headers if (found := LAYER_INDEX.search(name))]
    embeddings = [info["shape"] for name, info in headers.items()
                  if name.endswith("embed_tokens.weight") and len(info.get("shape") or ()) == 2]
    for prefix, section in (("", config), ("text_config.", config.get("text_config") or {})):
        claimed = section.get("num_hidden_layers")
        if layers and claimed is not None and claimed > max(layers) + 1:
            raise ModelReferenceError(f"{path}: field '{prefix}num_hidden_layers' is {claimed}, but the weights hold "
                                      f"{max(layers) + 1} layer(s) (layers.0 to layers.{max(layers)})")
        for key, axis, what in (("vocab_size", 0, "rows"), ("hidden_size", 1, "columns")):
            claimed = section.get(key)
            if embeddings and claimed is not None and claimed > max(shape[axis] for shape in embeddings):
                raise ModelReferenceError(f"{path}: field '{prefix}{key}' is {claimed}, but the token embedding has "
                                          f"{max(shape[axis] for shape in embeddings)} {what}")


def _inside_model(directory: Path, path: Path) -> bool:
    """True when ``path`` (followed through symlinks) stays in the model folder, or, for a
    Hugging Face cache snapshot (snapshots/COMMIT/), in that repository's blobs/ folder."""
    root = directory.resolve()
    target = path.resolve()
    roots = [root]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return any(target == r or r in target.parents for r in roots)


def _shard_file(directory: Path, name: Any, source: str, allow_pickle: bool) -> Path:
    """A weight file named by an index or by config.json's ``transformers_weights``, checked:
    a plain file name in the model folder (no '..', no absolute path, no subfolder, no symlink
    out), present, and safetensors unless pickle is allowed."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or Path(name).is_absolute():
        raise ModelReferenceError(f"{directory / source}: names weight file {name!r:.80}, which is not a file "
                                  "inside the model folder")
    path = directory / name
    if not name.endswith(".safetensors") and not name.endswith(".safetensors.index.json"):
        if not allow_pickle:
            raise ModelReferenceError(f"{directory / source}: names weight file {name!r}, which is not safetensors "
                                      "(pickle weights can run code when loaded); pass --allow-pickle to accept it")
    if not path.is_file():
        raise ModelReferenceError(f"{directory / source}: names weight file {name!r}, which does not exist")
    if not _inside_model(directory, path):
        raise ModelReferenceError(f"{directory / source}: weight file {name!r} is a symlink to "
                                  f"{path.resolve()}, outside the model folder")
    return path


def loaded_weight_files(directory: Path, config: dict[str, Any], allow_pickle: bool) -> list[Path]:
    """The weight files transformers would read from this folder beyond its top-level
    ``*.safetensors``: what config.json's ``transformers_weights`` and the shard indexes
    (model.safetensors.index.json, pytorch_model.bin.index.json) name. transformers
    (modeling_utils._get_resolved_checkpoint_files, utils/hub.get_checkpoint_shard_files) joins
    index entries to the folder unchecked, so each is checked here (see _shard_file)."""
    named: list[Path] = []
    indexes = []
    if (directory / "model.safetensors.index.json").is_file():
        indexes.append("model.safetensors.index.json")
    elif not any(directory.glob("*.safetensors")) and (directory / "pytorch_model.bin.index.json").is_file():
        indexes.append("pytorch_model.bin.index.json")  # read by transformers only without safetensors
    explicit = config.get("transformers_weights")
    if explicit is not None:
        path = _shard_file(directory, explicit, "config.json", allow_pickle)
        if explicit.endswith(".index.json"):
            indexes.append(explicit)
        else:
            named.append(path)
    for index_name in dict.fromkeys(indexes):
        index_path = _shard_file(directory, index_name, index_name, allow_pickle=True)
        weight_map = read_json_file(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(key, str) for key in weight_map):
            raise ModelReferenceError(f"{index_path}: field 'weight_map' must map tensor names to file names")
        for shard in dict.fromkeys(weight_map.values()):
            named.append(_shard_file(directory, shard, index_name, allow_pickle))
    return named


def behaviour_files(directory: Path) -> dict[str, str]:
    """File name -> digest of each file of BEHAVIOUR_JSON_FILES (canonical JSON, without the
    saving library's version) and BEHAVIOUR_RAW_FILES (bytes) present in the folder."""
    digests = {}
    for name in BEHAVIOUR_JSON_FILES:
        path = directory / name
        if path.is_file():
            digests[name] = config_sha256(read_json_file(path))
    for name in BEHAVIOUR_RAW_FILES:
        path = directory / name
        if path.is_file():
            digests[name] = sha256_file(path)
    return digests


# --- the fingerprint ----------------------------------------------------------------------

def fingerprint_model(directory: Path, allow_pickle: bool = False, require_tokenizer: bool = True) -> ModelFingerprint:
    """Fingerprint a Hugging Face model directory (scheme FINGERPRINT_SCHEME). Raises
    ModelReferenceError naming the file, field or value that is wrong.

    require_tokenizer=False for a speculative head (EAGLE-3, Medusa), which drafts in the target's
    vocabulary and usually ships no tokenizer of its own."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelReferenceError(f"{directory}: no config.json (not a Hugging Face model directory)")
    config = read_json_file(config_path)
    check_config(config, config_path)
    if require_tokenizer and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ModelReferenceError(f"{directory}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")

    safetensors_files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    pickle_files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES
                          and not p.name.startswith("training_args"))
    named_files = loaded_weight_files(directory, config, allow_pickle)
    if safetensors_files:
        weight_files, weight_format = safetensors_files, "safetensors"
    elif pickle_files:
        if not allow_pickle:
            raise ModelReferenceError(
                f"{directory}: weights are only pickle files ({', '.join(p.name for p in pickle_files)}), "
                f"which can run code when loaded; convert them (specreg convert-weights {directory} NEW_FOLDER)"
                # a head is read from safetensors only (core/heads/tensors.py): --allow-pickle would not help
                + (" or pass --allow-pickle" if require_tokenizer else "")
            )
        weight_files, weight_format = pickle_files, "pickle"
    else:
        raise ModelReferenceError(f"{directory}: no weight files (*.safetensors)")
    for path in weight_files:
        if not _inside_model(directory, path):
            raise ModelReferenceError(f"{path}: a symlink to {path.resolve()}, outside the model folder")
    # every file an index names is hashed too (e.g. a .bin shard accepted with --allow-pickle)
    weight_files = sorted(set(weight_files) | set(named_files))

    parameter_count: int | None = None
    dtype: str | None = None
    if weight_format == "safetensors":
        parameter_count = 0
        dtype_elements: Counter[str] = Counter()
        tensors: dict[str, Any] = {}
        for path in weight_files:
            if path.suffix != ".safetensors":
                continue
            for name, info in read_safetensors_header(path).items():
                if name == "__metadata__":
                    continue
                tensors[name] = info
                elements = 1
                for dim in info["shape"]:
                    elements *= int(dim)
                parameter_count += elements
                dtype_elements[info["dtype"]] += elements
        if dtype_elements:
            dominant = dtype_elements.most_common(1)[0][0]
            dtype = SAFETENSORS_DTYPE_NAMES.get(dominant, dominant.lower())
        check_config_against_weights(config, config_path, tensors)

    file_digests = {path.name: sha256_file(path) for path in weight_files}
    tokenizer_form = canonical_tokenizer(directory)
    chat_template = read_chat_template(directory)
    architectures = config.get("architectures") or [None]
    text_config = config.get("text_config") or {}
    return ModelFingerprint(
        weights_sha256=sha256_hex(canonical_json(sorted(file_digests.items()))),
        weight_files=file_digests,
        weight_format=weight_format,
        config_sha256=config_sha256(config),
        tokenizer_sha256=sha256_hex(canonical_json(tokenizer_form)) if tokenizer_form is not None else None,
        chat_template_sha256=sha256_hex(chat_template.encode()) if chat_template else None,
        architecture=architectures[0],
        model_type=config.get("model_type"),
        vocab_size=config.get("vocab_size", text_config.get("vocab_size")),
        tokenizer_length=tokenizer_length(directory),
        parameter_count=parameter_count,
        dtype=dtype or config.get("torch_dtype") or config.get("dtype"),
        max_position_embeddings=config.get("max_position_embeddings", text_config.get("max_position_embeddings")),
        scheme=FINGERPRINT_SCHEME,
        behaviour_files=behaviour_files(directory),
    )


def recorded_reference(reference: str, revision: str | None) -> str:
    """The reference as the registry records it: a hub id stays ``ORG/NAME@REVISION``; a local
    folder becomes its absolute path (symlinks kept as named), so that a relative ``tiny/target``
    neither depends on the folder it was typed in nor reads like a hub id in `show` and exports."""
    if revision is not None:
        return reference
    return os.path.normpath(Path(reference).expanduser().absolute())


def fingerprint_reference(reference: str, allow_pickle: bool = False, require_tokenizer: bool = True) -> ModelRef:
    """Resolve a reference (local dir or cached hub id@revision) and fingerprint it; a local
    folder is recorded by its absolute path (recorded_reference)."""
    directory, revision = resolve_reference(reference)
    return ModelRef(
        reference=recorded_reference(reference, revision),
        path=str(directory),
        revision=revision,
        fingerprint=fingerprint_model(directory, allow_pickle=allow_pickle, require_tokenizer=require_tokenizer),
    )


def compare_fingerprints(recorded: ModelFingerprint, current: ModelFingerprint) -> list[str]:
    """Human-readable differences between two fingerprints (empty when identical).

    Only what the recorded fingerprint's scheme covered is compared: a version registered
    under scheme 1 (no ``scheme`` recorded) still verifies against a scheme-2 fingerprint of
    the same files; from scheme 2 on, every file of ``behaviour_files`` is compared too.
    """
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
    scheme = recorded.scheme or 1
    if scheme > FINGERPRINT_SCHEME:
        changes.append(f"recorded with fingerprint scheme {scheme}, this specreg knows up to {FINGERPRINT_SCHEME}: "
                       "upgrade specreg to verify it")
    elif scheme >= 2:
        before, now = recorded.behaviour_files or {}, current.behaviour_files or {}
        for name in sorted(before.keys() | now.keys()):
            if name not in now:
                changes.append(f"{name} is missing")
            elif name not in before:
                changes.append(f"{name} was added")
            elif before[name] != now[name]:
                changes.append(f"{name} changed")
    return changes


def metadata_changes(recorded: ModelFingerprint, directory: Path) -> list[str]:
    """What changed in a folder's config, tokenizer, chat template and (scheme >= 2) behaviour
    files since ``recorded`` (weights are not read): compare_fingerprints' messages.

    The shard indexes (SHARD_INDEX_FILES) are left out: they decide which weights load, so the
    weight loader checks the one it reads (runtime.loading.load_verified_model), and a folder
    holding only the tokenizer's files (load_tokenizer's private copy) is not missing them."""
    directory = Path(directory)
    tokenizer_form = canonical_tokenizer(directory)
    chat_template = read_chat_template(directory)

    def without_indexes(files: dict[str, str] | None) -> dict[str, str] | None:
        return None if files is None else {name: digest for name, digest in files.items()
                                           if name not in SHARD_INDEX_FILES}

    recorded = replace(recorded, behaviour_files=without_indexes(recorded.behaviour_files))
    current = replace(
        recorded,
        config_sha256=config_sha256(read_json_file(directory / "config.json")),
        tokenizer_sha256=sha256_hex(canonical_json(tokenizer_form)) if tokenizer_form is not None else None,
        chat_template_sha256=sha256_hex(chat_template.encode()) if chat_template else None,
        behaviour_files=without_indexes(behaviour_files(directory)),
    )
    return compare_fingerprints(recorded, current)
