"""The safetensors header of a weight file, parsed and checked as strictly as the safetensors
library reads it, without loading a tensor: names, dtypes, shapes and data offsets."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from specreg.errors import ModelReferenceError
from specreg.core.documents import one_line

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
U64_LIMIT = 1 << 64  # safetensors reads shapes and offsets as usize


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
        raise ModelReferenceError(f"{path}: corrupt safetensors header ({one_line(str(exc), 200)})") from None
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
