"""An EAGLE-3 head's vocabulary: its d2t/t2d map into the target's ids, and the token strings
each draft id spells against the target's (read from tokenizer.json as JSON).

d2t holds int64 offsets, target id = i + d2t[i] (speculators train/vocab_mapping.py:88-91,
SafeAILab/EAGLE traineagle3/cnets.py scandata, vLLM 0.33 llama_eagle3.py:385-394, SGLang
srt/models/llama_eagle3.py:350-352); t2d is a bool mask over the target vocabulary with
draft_vocab_size entries set (speculators model.py:104-119). vLLM keeps d2t only when
draft_vocab_size differs from the target's vocabulary and ignores t2d (llama_eagle3.py:
338-345, 426-427); without d2t in the checkpoint its map stays all zeros (llama_eagle3.py:
458-459), i.e. draft id i = target id i.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from specreg.core.files import read_json_file
from specreg.core.heads.spec import HeadSpec, TargetShape, shown
from specreg.core.heads.tensors import read_tensor_bytes
from specreg.core.methods import HEAD_FORMATS
from specreg.errors import HeadMismatchError, ModelReferenceError

D2T_DTYPES = {"I64": "q", "I32": "i"}  # little-endian struct codes
T2D_DTYPES = ("BOOL", "U8")
MAX_SHOWN = 3  # mismatching entries quoted in one message


@dataclass(frozen=True)
class VocabMap:
    """An EAGLE-3 head's draft -> target vocabulary map, read from its d2t / t2d tensors."""

    draft_to_target: tuple[int, ...]  # target id of draft id i (i + d2t[i])
    t2d_length: int | None  # entries of the t2d mask; None when the head has no t2d
    t2d_marked: tuple[int, ...] | None  # target ids t2d marks, ascending



def read_vocab_map(head: HeadSpec) -> VocabMap | None:
    """An EAGLE-3 head's d2t (and t2d, when present) read from the safetensors bytes; None when
    the head has no d2t."""
    directory = Path(head.path)
    d2t = next((t for t in head.tensors if t.name == "d2t" or t.name.endswith(".d2t")), None)
    if d2t is None:
        return None
    dtype, shape, data = read_tensor_bytes(directory / d2t.file, d2t.name)
    if dtype not in D2T_DTYPES or shape != [head.draft_vocab_size]:
        raise ModelReferenceError(f"{directory / d2t.file}: tensor {d2t.name} is {dtype} {shape}, expected "
                                  f"int64 [{head.draft_vocab_size}]")
    offsets = struct.unpack(f"<{head.draft_vocab_size}{D2T_DTYPES[dtype]}", data)
    draft_to_target = tuple(index + offset for index, offset in enumerate(offsets))
    t2d = next((t for t in head.tensors if t.name == "t2d" or t.name.endswith(".t2d")), None)
    if t2d is None:
        return VocabMap(draft_to_target, None, None)
    dtype, shape, data = read_tensor_bytes(directory / t2d.file, t2d.name)
    if dtype not in T2D_DTYPES or len(shape) != 1:
        raise ModelReferenceError(f"{directory / t2d.file}: tensor {t2d.name} is {dtype} {shape}, expected a bool mask")
    if any(byte > 1 for byte in data):
        raise ModelReferenceError(f"{directory / t2d.file}: tensor {t2d.name} holds values other than 0 and 1")
    marked = tuple(index for index, byte in enumerate(data) if byte)
    return VocabMap(draft_to_target, len(data), marked)


def check_vocab_fit(head: HeadSpec, vocabulary: int) -> None:
    """The vocabulary part of check_head_fits against a target vocabulary size alone (the runtime
    checks a loaded target model with it): d2t into the target's ids, one to one, t2d agreeing.
    Raises HeadMismatchError naming the field."""
    check_vocab_map(head, read_vocab_map(head) if head.has_vocab_map else None, vocabulary)


def check_vocab_map(head: HeadSpec, vocab_map: VocabMap | None, vocabulary: int) -> None:
    if vocab_map is None:
        if HEAD_FORMATS[head.method].vocab_map_needed and head.draft_vocab_size != vocabulary:
            raise HeadMismatchError(f"vocabulary map: draft_vocab_size {head.draft_vocab_size} differs from the "
                                    f"target's vocab_size {vocabulary} but the head has no d2t tensor (an engine "
                                    "would then read draft id i as target id i)")
        return
    ids = vocab_map.draft_to_target
    outside = [(i, t) for i, t in enumerate(ids) if not 0 <= t < vocabulary]
    if outside:
        shown = ", ".join(f"draft id {i} -> {t}" for i, t in outside[:MAX_SHOWN])
        raise HeadMismatchError(f"vocabulary map: d2t maps {len(outside)} draft id(s) outside the target's "
                                f"{vocabulary} ids ({shown}); target id = i + d2t[i]")
    first_draft: dict[int, int] = {}
    for draft_id, target_id in enumerate(ids):
        if target_id in first_draft:
            raise HeadMismatchError(f"vocabulary map: d2t is not one to one: draft ids {first_draft[target_id]} and "
                                    f"{draft_id} both map to target id {target_id}")
        first_draft[target_id] = draft_id
    if head.draft_vocab_size == vocabulary and any(t != i for i, t in enumerate(ids)):
        raise HeadMismatchError(f"vocabulary map: d2t permutes the ids but draft_vocab_size equals the target's "
                                f"vocab_size {vocabulary}, where engines ignore d2t and read draft id i as target id i")
    if vocab_map.t2d_length is not None:
        if vocab_map.t2d_length != vocabulary:
            raise HeadMismatchError(f"vocabulary map: t2d has {vocab_map.t2d_length} entries but the target's "
                                    f"vocab_size is {vocabulary}")
        marked = set(vocab_map.t2d_marked or ())
        if marked != set(ids):
            extra = sorted(marked - set(ids))[:MAX_SHOWN]
            missing = sorted(set(ids) - marked)[:MAX_SHOWN]
            raise HeadMismatchError(f"vocabulary map: t2d marks {len(marked)} target ids but d2t maps to "
                                    f"{len(ids)}; t2d does not mark the same set (marked, not mapped: {extra}; "
                                    f"mapped, not marked: {missing})")


# --- token strings ------------------------------------------------------------------------

TokenStrings = Mapping[int, str] | Callable[[int], "str | None"]


def tokenizer_token_strings(directory: str | Path) -> dict[int, str] | None:
    """id -> token string from a directory's tokenizer.json (model vocab and added tokens), read as
    JSON; None when the directory has no tokenizer.json."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    data = read_json_file(path)
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    strings: dict[int, str] = {}
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        for token, index in vocab.items():
            if isinstance(index, bool) or not isinstance(index, int):
                raise ModelReferenceError(f"{path}: model.vocab[{shown(token)}] is not an integer id")
            strings[index] = token
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...] in id order
        for index, entry in enumerate(vocab):
            if not isinstance(entry, list) or not entry or not isinstance(entry[0], str):
                raise ModelReferenceError(f"{path}: model.vocab[{index}] is not a [piece, score] pair")
            strings[index] = entry[0]
    else:
        raise ModelReferenceError(f"{path}: model.vocab must be an object or a list")
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise ModelReferenceError(f"{path}: added_tokens must be a list")
    for number, token in enumerate(added):
        if not isinstance(token, dict) or not isinstance(token.get("content"), str) \
                or isinstance(token.get("id"), bool) or not isinstance(token.get("id"), int):
            raise ModelReferenceError(f"{path}: added_tokens[{number}] needs an integer id and a string content")
        strings[token["id"]] = token["content"]
    return strings


def _lookup(strings: TokenStrings) -> Callable[[int], str | None]:
    return strings.get if isinstance(strings, Mapping) else strings


def check_token_strings(head: HeadSpec, vocab_map: VocabMap | None, target: TargetShape,
                         draft_token_strings: TokenStrings | None,
                         target_token_strings: TokenStrings | None) -> tuple[int, str | None]:
    """Each draft id must spell what the target id it maps to spells. Returns (ids compared, a
    note when nothing could be compared)."""
    mapped = vocab_map.draft_to_target if vocab_map is not None else tuple(range(head.draft_vocab_size))
    if draft_token_strings is None:
        # the head's tokenizer is indexed by target ids: draft id i spells its token at i + d2t[i]
        head_strings = tokenizer_token_strings(head.path)
        if head_strings is None:
            return 0, "draft token strings not compared: the head ships no tokenizer.json"
        draft_lookup = lambda draft_id: head_strings.get(mapped[draft_id])  # noqa: E731
    else:
        draft_lookup = _lookup(draft_token_strings)
    if target_token_strings is None:
        target_token_strings = tokenizer_token_strings(target.path)
        if target_token_strings is None:
            return 0, "draft token strings not compared: the target has no tokenizer.json"
    target_lookup = _lookup(target_token_strings)
    differing = [(draft_id, target_id) for draft_id, target_id in enumerate(mapped)
                 if draft_lookup(draft_id) != target_lookup(target_id)]
    if differing:
        draft_id, target_id = differing[0]
        raise HeadMismatchError(f"draft vocabulary: draft id {draft_id} maps to target id {target_id}, spelled "
                                f"{shown(draft_lookup(draft_id))} by the head but {shown(target_lookup(target_id))} "
                                f"by the target ({len(differing)} of {len(mapped)} draft ids differ)")
    return len(mapped), None

