"""A model or head folder with pickle weights copied into a new folder with safetensors weights.

Heads and models are still released as pickle files: SafeAILab's EAGLE-3 heads are a config.json
beside pytorch_model.bin, FasterDecoding's Medusa heads a medusa_lm_head.pt. specreg registers a
head only from safetensors (nothing it reads at registration can run code) and a model from
pickle only with --allow-pickle; every engine it exports to loads safetensors. The conversion
reads each pickle with torch.load(weights_only=True) (loading.load_pickle_weights: no
code runs, a pickle that would run some is refused), writes every tensor unchanged under its own
name, re-reads what it wrote and compares each tensor bit for bit, and only then moves the folder
into place: OUTPUT is whole or absent.

File names follow the loaders': pytorch_model.bin -> model.safetensors and its shards
pytorch_model-XXXXX-of-YYYYY.bin -> model-XXXXX-of-YYYYY.safetensors with
model.safetensors.index.json (transformers' names); any other single weight file keeps its stem
(medusa_lm_head.pt -> medusa_lm_head.safetensors, the name TGI reads).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specreg.core.fingerprint import PICKLE_SUFFIXES
from specreg.errors import ModelReferenceError, UsageError

PICKLE_INDEX = "pytorch_model.bin.index.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# pickle files a trainer leaves beside the weights: not weights, never converted or copied
NOT_WEIGHTS = re.compile(r"^(training_args|optimizer|scheduler|rng_state|scaler)\b")


@dataclass(frozen=True)
class ConvertedFile:
    source: str  # the pickle file's name in SOURCE
    written: str  # the safetensors file's name in OUTPUT
    tensors: int
    bytes: int  # the tensors' data


@dataclass(frozen=True)
class Conversion:
    source: Path
    output: Path
    converted: list[ConvertedFile]
    copied: list[str]  # the other files, as they were
    left_out: list[str] = field(default_factory=list)  # pickle files that are not weights

    def to_dict(self) -> dict:
        return {"source": str(self.source), "output": str(self.output),
                "converted": [vars(item) for item in self.converted], "copied": self.copied,
                "left_out": self.left_out}


def safetensors_name(pickle_name: str, sharded: bool) -> str:
    """The safetensors name a loader looks for in place of `pickle_name`."""
    if pickle_name == "pytorch_model.bin":
        return "model.safetensors"
    if sharded and pickle_name.startswith("pytorch_model-"):
        return "model-" + pickle_name[len("pytorch_model-"):].rsplit(".", 1)[0] + ".safetensors"
    return pickle_name.rsplit(".", 1)[0] + ".safetensors"


def weight_files(source: Path) -> tuple[list[str], dict | None]:
    """The pickle weight files of `source` in order, and the pickle index's weight map (None
    without an index). UsageError / ModelReferenceError naming the file for a folder there is
    nothing to convert in, or whose index names a file that is not there."""
    present = sorted(p.name for p in source.iterdir() if p.is_file() and p.suffix == ".safetensors")
    if present:
        raise UsageError(f"{source}: already has safetensors weights ({', '.join(present)}): nothing to convert")
    index_path = source / PICKLE_INDEX
    if index_path.is_file():
        from specreg.core.files import read_json_file

        weight_map = read_json_file(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelReferenceError(f"{index_path}: weight_map is missing or empty")
        names = list(dict.fromkeys(weight_map.values()))
        for name in names:
            if not isinstance(name, str) or "/" in name or not (source / name).is_file():
                raise ModelReferenceError(f"{index_path}: weight_map names {name!r}, which is not a file in {source}")
        return names, weight_map
    names = sorted(p.name for p in source.iterdir()
                   if p.is_file() and p.suffix in PICKLE_SUFFIXES and not NOT_WEIGHTS.match(p.name))
    if not names:
        raise UsageError(f"{source}: no pickle weight files ({', '.join('*' + s for s in PICKLE_SUFFIXES)}) to convert")
    if "pytorch_model.bin" in names:
        names = ["pytorch_model.bin"]
    elif len(names) > 1:
        raise UsageError(f"{source}: several pickle files ({', '.join(names)}) and no {PICKLE_INDEX} saying "
                         "which hold the weights")
    return names, None


def check_output(output: Path) -> None:
    if output.exists() or output.is_symlink():
        raise UsageError(f"{output}: already exists; give a new folder")
    if not output.parent.is_dir():
        raise UsageError(f"{output.parent}: no such folder")


def convert_weights(source: str | Path, output: str | Path) -> Conversion:
    """Copy the model or head folder `source` into the new folder `output` with its pickle weights
    converted to safetensors (see the module docstring) -> what was converted and copied.
    UsageError / ModelReferenceError in one line naming the file; `output` is not created then."""
    from specreg.runtime.loading import load_pickle_weights

    source, output = Path(source), Path(output).absolute()
    if not source.is_dir():
        raise UsageError(f"{source}: not a folder")
    if not (source / "config.json").is_file():
        raise ModelReferenceError(f"{source}: no config.json (not a Hugging Face model or head folder)")
    check_output(output)
    names, weight_map = weight_files(source)
    sharded = weight_map is not None
    written_names = {name: safetensors_name(name, sharded) for name in names}
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        converted = [write_safetensors(load_pickle_weights(pickle_source(source / name), source / name), staging,
                                       name, written_names[name]) for name in names]
        if sharded:
            index = {"metadata": {"total_size": sum(item.bytes for item in converted)},
                     "weight_map": {tensor: written_names[name] for tensor, name in weight_map.items()}}
            (staging / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        copied, left_out = copy_other_files(source, staging, set(names) | {PICKLE_INDEX})
        check_output(output)  # taken while converting: keep what is there
        os.rename(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Conversion(source=source, output=output, converted=converted, copied=copied, left_out=left_out)


def pickle_source(path: Path):
    """What load_pickle_weights reads: the path of a zip-format file (memory-mapped), else the
    bytes of a file torch.save wrote in its legacy format, which cannot be memory-mapped."""
    import zipfile

    return path if zipfile.is_zipfile(path) else path.read_bytes()


def write_safetensors(state: dict, folder: Path, source_name: str, name: str) -> ConvertedFile:
    """Write `state` as folder/name, re-read it and compare every tensor bit for bit."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors, seen = {}, set()
    for key, tensor in state.items():
        storage = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        # safetensors stores no shared storage (tied embeddings, views of one buffer): a copy each
        tensors[key] = tensor.clone().contiguous() if storage in seen else tensor.contiguous()
        if storage is not None:
            seen.add(storage)
    save_file(tensors, str(folder / name), metadata={"format": "pt"})
    reread = load_file(str(folder / name))
    for key, tensor in state.items():
        if key not in reread or not same_bits(reread[key], tensor):
            raise ModelReferenceError(f"{folder / name}: tensor {key} reads back otherwise than {source_name} holds it")
    return ConvertedFile(source=source_name, written=name, tensors=len(tensors),
                         bytes=sum(t.numel() * t.element_size() for t in tensors.values()))


def same_bits(a, b) -> bool:
    """Equal dtype, shape and bytes (NaN payloads included, which == would call unequal)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.numel() == 0 or torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                         b.contiguous().reshape(-1).view(torch.uint8))


def copy_other_files(source: Path, staging: Path, converted: set[str]) -> tuple[list[str], list[str]]:
    """Copy every file of `source` but the converted weights and their index (config, tokenizer,
    generation config, chat template ...) -> (copied, left out: pickle files that are not weights).
    A subfolder is refused: what an engine would read in it is not known here."""
    copied, left_out = [], []
    for path in sorted(source.iterdir()):
        if path.name in converted:
            continue
        if path.is_dir():
            raise UsageError(f"{path}: a subfolder; convert-weights copies a flat model or head folder only")
        if path.suffix in PICKLE_SUFFIXES:
            left_out.append(path.name)
            continue
        if path.is_symlink() and source.resolve() not in path.resolve().parents:
            raise ModelReferenceError(f"{path}: a symlink to {path.resolve()}, outside the folder")
        shutil.copyfile(path, staging / path.name)
        copied.append(path.name)
    return copied, left_out
