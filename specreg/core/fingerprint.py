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

import contextlib
import hashlib
import json
import mmap
import os
import re
import struct
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specreg.errors import ModelReferenceError
from specreg.core.documents import depth_problem
from specreg.core.files import read_bounded, read_text_bounded
from specreg.core.types import ModelFingerprint, ModelRef

if TYPE_CHECKING:
    from concurrent.futures import Future

# A directory holds a tokenizer when it has one of these (tokenizer_config.json alone is not one).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spm.model")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl")
# Fields that record the saving library, not the model.
CONFIG_VOLATILE_KEYS = ("transformers_version", "_name_or_path")
# safetensors dtype name -> bits per element: the dtypes the safetensors library (0.8) reads
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}
SAFETENSORS_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                           "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                           "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's MAX_HEADER_SIZE
MAX_JSON_BYTES = 256 * 1024 * 1024  # a tokenizer.json of a 256k vocabulary is ~30 MB
MAX_JSON_DEPTH = 64
U64_LIMIT = 1 << 64  # safetensors reads shapes and offsets as usize
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


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> bytes:
    """The one canonical serialisation used for every content hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    if (known := read_ahead_digest(path)) is not None:
        return known
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        before = os.fstat(handle.fileno())
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
        after = os.fstat(handle.fileno())
    hexdigest = digest.hexdigest()
    remember_digest(before, after, hexdigest)
    return hexdigest


# Digests this process computed, by the identity of the file hashed (device, inode, size, mtime and
# ctime to the nanosecond): the weight files a validation fingerprints (integrity check) are read
# again to build the models, and a file whose identity has not changed since is not hashed twice
# (1 GB of weights costs about 0.6 s a pass; a 16 GB model 10 s). Any write, rename or copy over
# it changes the inode, size, mtime or ctime (ctime cannot be set back by a user). As git does
# with "racily clean" entries, a file changed less than RACY_NS before it was hashed is never
# remembered: a write in the same timestamp tick would keep its identity.
_DIGESTS: dict[tuple[int, ...], str] = {}
RACY_NS = 2_000_000_000


def file_identity(stat: os.stat_result) -> tuple[int, ...]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def remember_digest(before: os.stat_result, after: os.stat_result, digest: str) -> None:
    """Keep the digest of a file whose identity was the same before and after it was read."""
    import time

    identity = file_identity(after)
    settled = time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) > RACY_NS
    if file_identity(before) == identity and settled:
        _DIGESTS[identity] = digest


def read_digested(path: Path) -> tuple[bytearray | mmap.mmap, str]:
    """A file's bytes, read once into a buffer of their own (tensors can be built over it without
    a copy: runtime/loading.safetensors_tensors), and their sha256: remembered from this process's
    earlier read when the file's identity is unchanged, else computed from the bytes read. A file
    read ahead (read_ahead) whose identity has not changed since is taken from there."""
    ahead = _READ_AHEAD.pop(str(path), None)
    if ahead is not None:
        with contextlib.suppress(Exception):  # a read that failed or was cancelled: read it now
            data, digest, identity = ahead.result()
            with contextlib.suppress(OSError):
                if file_identity(os.stat(path)) == identity:
                    return data, digest
    data, digest, _ = read_now(path)
    return data, digest


def read_now(path: Path) -> tuple[bytearray | mmap.mmap, str, tuple[int, ...]]:
    """read_digested's read -> (bytes, sha256, the file's identity after the read). The buffer is an
    anonymous mapping: a zero-filled bytearray would touch every page once more, holding the GIL
    (0.4 s for 540 MB), where reading into fresh pages faults them in with the GIL released."""
    with open(path, "rb") as handle:
        before = os.fstat(handle.fileno())
        data = mmap.mmap(-1, max(before.st_size, 1))
        view, filled = memoryview(data), 0
        try:
            while filled < before.st_size and (count := handle.readinto(view[filled:before.st_size])):
                filled += count
        finally:
            view.release()
        rest = handle.read()
        after = os.fstat(handle.fileno())
    if filled < before.st_size or rest or not before.st_size:  # shrank, grew or empty: its identity says so
        data = bytearray(data[:filled]) + rest
    known = _DIGESTS.get(file_identity(after)) if file_identity(before) == file_identity(after) else None
    if known is None:
        known = sha256_hex(data)
        remember_digest(before, after, known)
    return data, known, file_identity(after)


# Files read ahead (read_ahead): path -> the future of read_now's result, taken by read_digested.
_READ_AHEAD: dict[str, Future] = {}


@contextlib.contextmanager
def read_ahead(paths: Iterable[Path]) -> Iterator[None]:
    """Read and hash ``paths`` on a thread of their own, in order, while the caller goes on: a
    validation imports torch and transformers and checks tokenizers (work that holds one core and
    the GIL) before it fingerprints and loads the weights, and reading and hashing release the GIL.
    The integrity check's sha256_file then waits for the file's read instead of hashing it again,
    and read_digested takes its bytes while the file's identity is unchanged. What was not taken is
    dropped on leaving."""
    from concurrent.futures import ThreadPoolExecutor

    names = [str(path) for path in dict.fromkeys(paths) if str(path) not in _READ_AHEAD]
    if not names:
        yield
        return
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specreg-read-ahead")
    try:
        for name in names:
            _READ_AHEAD[name] = executor.submit(read_now, Path(name))
        yield
    finally:
        for name in names:
            if (future := _READ_AHEAD.pop(name, None)) is not None:
                future.cancel()
        executor.shutdown(wait=True, cancel_futures=True)


def read_ahead_digest(path: Path) -> str | None:
    """The sha256 of a file being read ahead, once read, when it is remembered for the file's
    identity now (remember_digest's rules); None when the file is not read ahead."""
    ahead = _READ_AHEAD.get(str(path))
    if ahead is None:
        return None
    with contextlib.suppress(Exception):
        ahead.result()
    try:
        return _DIGESTS.get(file_identity(os.stat(path)))
    except OSError:
        return None


def read_json_file(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """A JSON object from a model file (or its already read bytes); ModelReferenceError naming
    the file for anything else: unreadable, too large, not JSON, nested too deeply."""
    try:
        if data is None:
            data = read_bounded(path, MAX_JSON_BYTES, "", ModelReferenceError)
        parsed = json.loads(data.decode("utf-8"))
    except OSError as exc:
        raise ModelReferenceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except RecursionError:
        raise ModelReferenceError(f"{path}: not readable JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        reason = " ".join(str(exc).split())[:160]
        raise ModelReferenceError(f"{path}: not readable JSON ({exc.__class__.__name__}: {reason})") from None
    if not isinstance(parsed, dict):
        raise ModelReferenceError(f"{path}: expected a JSON object, got {type(parsed).__name__}")
    problem = depth_problem(parsed, MAX_JSON_DEPTH)
    if problem:
        raise ModelReferenceError(f"{path}: JSON {problem}")
    return parsed


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

def read_safetensors_header(path: Path, data: bytes | bytearray | None = None) -> dict[str, Any]:
    """Parse and check a safetensors header: {tensor name: {dtype, shape, data_offsets}}; data:
    the file's bytes when already read (nothing is read again; messages still name path).

    As strict as the safetensors library's reader (safetensors/src/tensor.rs ``read_metadata``
    and ``Metadata::validate``), without loading a tensor: header length <= 100,000,000 and
    inside the file; a UTF-8 JSON object; ``__metadata__`` a map of strings; every tensor a
    known dtype, a shape of non-negative integers and two non-negative integer offsets; tensors,
    sorted by offsets, tile the data from 0 with no gap or overlap, each exactly shape x dtype
    bytes (no overflow past 64 bits); and the last one ends where the file ends.
    """
    try:
        if data is None:
            size = path.stat().st_size
            with open(path, "rb") as handle:
                header_len = safetensors_header_length(handle.read(8), size)
                raw = handle.read(header_len)
        else:
            size = len(data)
            header_len = safetensors_header_length(bytes(data[:8]), size)
            raw = bytes(data[8:8 + header_len])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("header is not UTF-8") from None
        try:
            header = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
        except json.JSONDecodeError:
            raise ValueError("not JSON") from None
        if not text.startswith("{"):
            raise ValueError("header does not start with '{'")
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        metadata = header.get("__metadata__")
        if metadata is not None and (not isinstance(metadata, dict)
                                     or not all(isinstance(v, str) for v in metadata.values())):
            raise ValueError("__metadata__ must map strings to strings")
        spans = []
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(info, dict):
                raise ValueError(f"tensor {name}: expected an object with dtype, shape, data_offsets")
            for key in ("dtype", "shape", "data_offsets"):
                if key not in info:
                    raise ValueError(f"tensor {name}: missing {key}")
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
                raise ValueError(f"tensor {name}: unknown dtype {dtype!r}")
            if not isinstance(shape, list) or not all(_is_u64(dim) for dim in shape):
                raise ValueError(f"tensor {name}: shape {shape!r} is not a list of non-negative integers")
            if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_u64(o) for o in offsets):
                raise ValueError(f"tensor {name}: data_offsets {offsets!r} are not two non-negative integers")
            elements = 1
            for dim in shape:
                elements *= dim
                if elements >= U64_LIMIT:
                    raise ValueError(f"tensor {name}: shape {shape} overflows 64 bits")
            bits = elements * SAFETENSORS_DTYPE_BITS[dtype]
            if bits >= U64_LIMIT * 8:
                raise ValueError(f"tensor {name}: shape {shape} x {dtype} overflows 64 bits")
            if bits % 8:
                raise ValueError(f"tensor {name}: {elements} x {dtype} does not end on a byte boundary")
            spans.append((offsets[0], offsets[1], name, bits // 8))
        spans.sort()
        position = 0
        for start, end, name, nbytes in spans:
            if start != position or end < start:
                raise ValueError(f"tensor {name}: data offsets [{start}, {end}] overlap or leave a gap "
                                 f"(expected to start at {position})")
            if end - start != nbytes:
                raise ValueError(f"tensor {name}: data offsets [{start}, {end}] hold {end - start} bytes, "
                                 f"its shape and dtype need {nbytes}")
            position = end
        if position + 8 + header_len != size:
            raise ValueError(f"tensors cover {position} data bytes, the file has {size - 8 - header_len}")
    except OSError as exc:
        raise ModelReferenceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ModelReferenceError(f"{path}: corrupt safetensors header ({_one_line(str(exc))})") from None
    return header


def safetensors_header_length(prefix: bytes, size: int) -> int:
    """A safetensors file's first 8 bytes and its size -> the header's length (ValueError when it
    cannot be one)."""
    if len(prefix) < 8:
        raise ValueError("file shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len > size - 8:
        raise ValueError(f"header length {header_len} exceeds the file")
    if header_len > MAX_HEADER_BYTES:
        raise ValueError(f"header length {header_len} is over the library's limit of {MAX_HEADER_BYTES}")
    return header_len


def _is_u64(value: Any) -> bool:
    return type(value) is int and 0 <= value < U64_LIMIT


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # serde keeps one of two equal keys, Python the last: a header that says two things is corrupt
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- tokenizer and chat template ----------------------------------------------------------

# tokenizer.json parsed and checked, by the sha256 of its bytes: one validate reads each model's
# file in both fingerprints of the integrity check and in the check of every tokenizer load
# (metadata_changes), a few MB of JSON parsed and walked each time. The bytes are read and hashed
# on every call, so a changed file is parsed and checked anew; a few entries at most are kept.
PARSED_TOKENIZER_JSON: dict[str, dict[str, Any]] = {}
PARSED_TOKENIZER_JSON_ENTRIES = 4


def read_tokenizer_json(path: Path) -> dict[str, Any]:
    """tokenizer.json, with the fields the fingerprint reads checked for type: ``model`` an
    object whose ``merges`` are strings or string pairs and whose ``vocab`` maps tokens to
    integer ids (or lists [token, score]), ``added_tokens`` objects with an integer ``id``.

    The object returned is shared by every call that reads the same bytes: read it, never
    modify it."""
    try:
        raw = read_bounded(path, MAX_JSON_BYTES, "", ModelReferenceError)
    except OSError as exc:
        raise ModelReferenceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    digest = sha256_hex(raw)
    if digest in PARSED_TOKENIZER_JSON:
        return PARSED_TOKENIZER_JSON[digest]
    data = check_tokenizer_json(read_json_file(path, data=raw), path)
    while len(PARSED_TOKENIZER_JSON) >= PARSED_TOKENIZER_JSON_ENTRIES:
        del PARSED_TOKENIZER_JSON[next(iter(PARSED_TOKENIZER_JSON))]
    PARSED_TOKENIZER_JSON[digest] = data
    return data


def check_tokenizer_json(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """read_tokenizer_json's checks of the parsed file -> the same object; ModelReferenceError
    naming the file and field otherwise."""
    model = data.get("model")
    if model is not None and not isinstance(model, dict):
        raise ModelReferenceError(f"{path}: field 'model' must be an object, got {type(model).__name__}")
    model = model or {}
    merges = model.get("merges")
    if merges is not None and not (isinstance(merges, list) and all(
            isinstance(m, str) or (isinstance(m, list) and all(isinstance(part, str) for part in m)) for m in merges)):
        raise ModelReferenceError(f"{path}: field 'model.merges' must be a list of strings or string pairs")
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        bad = next((token for token, token_id in vocab.items() if type(token_id) is not int or token_id < 0), None)
        if bad is not None:
            raise ModelReferenceError(f"{path}: field 'model.vocab': token {bad[:40]!r} has id {vocab[bad]!r}, "
                                      "not a non-negative integer")
    elif vocab is not None and not isinstance(vocab, list):
        raise ModelReferenceError(f"{path}: field 'model.vocab' must be an object or a list")
    added = data.get("added_tokens")
    if added is not None and not (isinstance(added, list) and all(
            isinstance(t, dict) and type(t.get("id", 0)) is int and t.get("id", 0) >= 0 for t in added)):
        raise ModelReferenceError(f"{path}: field 'added_tokens' must be a list of objects with a "
                                  "non-negative integer 'id'")
    return data


def canonical_tokenizer(directory: Path) -> dict[str, Any] | None:
    """What defines tokenization, independent of file formatting; None when there is none."""
    form: dict[str, Any] = {}
    tokenizer_json = directory / "tokenizer.json"
    if tokenizer_json.is_file():
        data = read_tokenizer_json(tokenizer_json)
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
    data = read_tokenizer_json(path)
    vocab = (data.get("model") or {}).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else []
    ids += [token.get("id", -1) for token in data.get("added_tokens") or []]
    return max(ids) + 1 if ids else None


def read_chat_template(directory: Path) -> str | None:
    """The chat template string, wherever this transformers generation saved it."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return read_text_bounded(jinja, MAX_JSON_BYTES, "", ModelReferenceError)
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
        if template is not None and not isinstance(template, str):
            raise ModelReferenceError(f"{config_path}: field 'chat_template' must be a string or a list of "
                                      f"named templates, got {type(template).__name__}")
        return template
    return None


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
                f"which can run code when loaded; convert to safetensors or pass --allow-pickle"
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
