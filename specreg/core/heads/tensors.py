"""A head's weights as safetensors headers: which files, which tensors with which dtype and
shape, and one tensor's raw bytes located by its header offsets (nothing is loaded with torch).
Pickle-only directories are refused, naming the files (specreg does not open them here)."""

from __future__ import annotations

import struct
from pathlib import Path

from specreg.core.fingerprint import PICKLE_SUFFIXES
from specreg.core.safetensors_header import read_safetensors_header
from specreg.core.heads.spec import HeadTensor, shown
from specreg.errors import ModelReferenceError


def list_weight_files(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    if files:
        return files
    pickles = sorted(p.name for p in directory.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelReferenceError(f"{directory}: weights are only pickle files ({', '.join(pickles)}), which "
                                  f"specreg does not open for a head; convert them: specreg convert-weights "
                                  f"{directory} NEW_FOLDER")
    raise ModelReferenceError(f"{directory}: no weight files (*.safetensors)")


def read_tensors(files: list[Path]) -> dict[str, HeadTensor]:
    tensors: dict[str, HeadTensor] = {}
    for path in files:
        for name, info in read_safetensors_header(path).items():
            if name == "__metadata__":
                continue
            shape = info["shape"]
            if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                      for d in shape):
                raise ModelReferenceError(f"{path}: tensor {name}: shape {shown(shape)} is not a list of sizes")
            if name in tensors:
                raise ModelReferenceError(f"{path}: tensor {name} is also in {tensors[name].file}")
            tensors[name] = HeadTensor(name, path.name, info["dtype"], tuple(shape))
    return tensors


def read_tensor_bytes(path: Path, name: str) -> tuple[str, list[int], bytes]:
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


def expect_shape(tensor: HeadTensor | None, shape: tuple[int, ...], directory: Path, why: str) -> None:
    if tensor is None:
        return
    if tensor.shape != shape:
        raise ModelReferenceError(f"{directory / tensor.file}: tensor {tensor.name} has shape {list(tensor.shape)}, "
                                  f"expected {list(shape)} ({why})")


def find_tensor(tensors: dict[str, HeadTensor], name: str, directory: Path) -> HeadTensor | None:
    """A tensor stored as `name` or under a module prefix (`model.name`); vLLM matches by substring."""
    found = [t for key, t in tensors.items() if key == name or key.endswith("." + name)]
    if len(found) > 1:
        raise ModelReferenceError(f"{directory}: more than one tensor named {name}: "
                                  f"{', '.join(t.name for t in found)}")
    return found[0] if found else None

