"""Every export read back as its engine reads it, before the lock binds it.

Each engine module's ``read_back(export, files)`` parses the files the export is about to write the
way that engine parses them (its argument parser's flags, its config loader's keys, the head's
config.json as its loader reads it, a GGUF's metadata through gguf-py) and returns what it found as
``ReadValue``s: the method, k, the target layers an EAGLE-3 head is fed (in the registered
numbering: the state entering layer i), the head's draft-to-target vocabulary map and the target it
serves. ``check`` compares each with the registration and refuses the export in one line naming the
file and key, the value read and the registered one (ReadBackError, exit 1). The use case reads the
files back before anything is written or signed (usecases/export.py); llama.cpp's GGUF files are
read back in the conversion cache, before they are copied into the export folder.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specreg.core.methods import HEAD_FORMATS
from specreg.errors import ReadBackError
from specreg.registry.store.entities import PairVersion

FIELDS = ("method", "k", "aux_layers", "vocab_map", "target", "target_revision", "dtype", "draft_sampling")


@dataclass(frozen=True)
class ReadValue:
    """One value an engine will run with, read from a written file."""

    field: str  # one of FIELDS
    value: Any
    where: str  # the file and key it was read from, as the engine names it


def registered(pair_version: PairVersion, target_source: str | None = None) -> dict[str, Any]:
    """What an export must read back as: the registered method and k; for an EAGLE-3 head the
    aux layers registration recorded (config.head.fit.aux_layer_ids) and the head's vocabulary
    map (vocab_map()); the target as the export names it (``target_source``) and its registered
    revision."""
    from specreg.registry.deploy.engines.common import trained_aux_layers

    config = pair_version.config
    values: dict[str, Any] = {"method": config.method.value, "k": config.num_speculative_tokens,
                              "target_revision": pair_version.target.revision}
    if target_source is not None:
        values["target"] = target_source
    head_format = HEAD_FORMATS.get(config.method.value)
    if head_format is not None and head_format.aux_layers:  # EAGLE-3: the layers it reads, its d2t map
        values["aux_layers"] = list(trained_aux_layers(pair_version))
        values["vocab_map"] = registered_vocab_map(pair_version)
    return values


def registered_vocab_map(pair_version: PairVersion) -> list[int] | None:
    """The registered head's draft id -> target id map (i + d2t[i]) from its files (checked against
    their fingerprints before an export), None without d2t or where it is the identity."""
    from specreg.core.heads import read_head
    from specreg.core.heads.vocabulary import read_vocab_map

    head = read_head(pair_version.draft.path, method=pair_version.config.method.value)
    found = read_vocab_map(head) if head.has_vocab_map else None
    return vocab_map(found.draft_to_target if found is not None else None)


def vocab_map(draft_to_target) -> list[int] | None:
    """A draft id -> target id map in one form: None for none or the identity (draft id i is target id i)."""
    if draft_to_target is None:
        return None
    ids = [int(i) for i in draft_to_target]
    return None if ids == list(range(len(ids))) else ids


def check(export, read: list[ReadValue]) -> None:
    """ReadBackError (one line) at the first value of an export's files read back that differs from
    the registered one, or from the dtype and draft sampling its baselines were measured with
    (common.served_dtype, common.served_draft_sampling)."""
    from specreg.registry.deploy.engines.common import served_draft_sampling, served_dtype

    check_values(f"{export.fmt} export", export.pair_version, read, export.target_source,
                 served={"dtype": served_dtype(export), "draft_sampling": served_draft_sampling(export.baselines)})


def check_values(what: str, pair_version: PairVersion, read: list[ReadValue], target_source: str | None = None,
                 served: dict[str, Any] | None = None) -> None:
    """ReadBackError naming ``what`` (e.g. "vllm export") at the first value read back that differs
    from the registered one (registered()) or from how it is to be ``served`` (the dtype, the draft sampling)."""
    expected = {**registered(pair_version, target_source), **(served or {})}
    for item in read:
        if item.field not in expected or item.value == expected[item.field]:
            continue
        raise ReadBackError(f"{what} of {pair_version.label} refused: {item.where} reads back "
                            f"{difference(item.field, item.value, expected[item.field])}; the lock binds only what "
                            f"reads back as registered")


def difference(field: str, value: Any, expected: Any) -> str:
    """``value`` against ``expected`` in a few words (a vocabulary map by its first differing id)."""
    if field == "vocab_map":
        if value is None or expected is None or len(value) != len(expected):
            def size(ids):
                return "the identity (draft id i = target id i)" if ids is None else f"a map of {len(ids)} draft ids"

            return f"{size(value)}, registered {size(expected)}"
        first = next(i for i, (a, b) in enumerate(zip(value, expected)) if a != b)
        return f"draft id {first} -> target id {value[first]}, registered {expected[first]}"
    return f"{value!r}, registered {expected!r}"


def exec_argv(script: str, name: str) -> list[str]:
    """The argument vector of a written shell script's ``exec`` line (with its backslash
    continuations), split as /bin/sh splits quoted words; ReadBackError when it has none."""
    lines = script.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("exec "):
            command = line
            while command.endswith("\\") and index + 1 < len(lines):
                index += 1
                command = command[:-1] + " " + lines[index]
            return shlex.split(command)[1:]
    raise ReadBackError(f"{name}: no exec line to read back")


def flag_values(argv: list[str], flags: set[str]) -> dict[str, str]:
    """The value of each of ``flags`` in ``argv`` (``--flag value`` or ``--flag=value``), the last
    one given winning, as argparse and llama.cpp's common/arg.cpp both read a repeated option."""
    found: dict[str, str] = {}
    for index, word in enumerate(argv):
        name, equals, value = word.partition("=")
        if name in flags:
            if equals:
                found[name] = value
            elif index + 1 < len(argv):
                found[name] = argv[index + 1]
    return found


def as_int(value: Any, where: str) -> int | None:
    """``value`` as an engine's integer option reads it, or ReadBackError naming ``where``."""
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ReadBackError(f"{where}: {value!r} is not an integer") from None


def target_layer_count(pair_version: PairVersion) -> int:
    from specreg.core.heads.spec import read_target_shape

    return read_target_shape(pair_version.target.path).num_hidden_layers


def d2t_in(folder: Path, draft_vocab: int, where: str) -> list[int] | None:
    """The d2t of the head's weight files in ``folder`` as a draft id -> target id map (i + d2t[i]),
    as the engines' weight loaders read it (vLLM llama_eagle3.py:385-394, SGLang
    llama_eagle3.py:350-352, llama.cpp conversion/llama.py:343-345), or None without one."""
    import struct

    from specreg.core.heads.tensors import list_weight_files, read_tensor_bytes, read_tensors
    from specreg.core.heads.vocabulary import D2T_DTYPES

    tensors = read_tensors(list_weight_files(folder))
    d2t = next((t for t in tensors.values() if t.name == "d2t" or t.name.endswith(".d2t")), None)
    if d2t is None:
        return None
    dtype, shape, data = read_tensor_bytes(folder / d2t.file, d2t.name)
    if dtype not in D2T_DTYPES or shape != [draft_vocab]:
        raise ReadBackError(f"{where}: tensor {d2t.name} is {dtype} {shape}, not int64 [{draft_vocab}]")
    offsets = struct.unpack(f"<{draft_vocab}{D2T_DTYPES[dtype]}", data)
    return [index + offset for index, offset in enumerate(offsets)]
