"""Does a head fit this target: check_head_fits compares a HeadSpec with the target's config
(hidden size, aux layers, vocabulary, d2t/t2d, token strings) and with the verifier the head
declares (by fingerprint, name or architecture), and returns what the binding records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreg.core.heads.dflash_checkpoint import check_block_layers
from specreg.core.heads.eagle3_checkpoint import check_aux_layers
from specreg.core.heads.eagle3_variants import layers_fed, numbering_warnings, read_eagle3_variant
from specreg.core.heads.spec import HeadSpec, TargetShape, read_target_shape
from specreg.core.heads.vocabulary import TokenStrings, check_token_strings, check_vocab_map, read_vocab_map
from specreg.core.methods import HEAD_FORMATS
from specreg.errors import HeadMismatchError


@dataclass(frozen=True)
class HeadFit:
    """The outcome of check_head_fits: what the binding records beside the head."""

    aux_layer_ids: tuple[int, ...]  # the target layers the head reads (declared or the target default)
    verifier_matched: bool  # the declared verifier is the target (by fingerprint or name)
    compared_token_strings: int  # draft ids whose token strings were compared with the target's
    notes: tuple[str, ...] = field(default=())  # defaults, skipped comparisons, an allowed mismatch
    # what an engine runs but specreg's runtime does not (validation's runtime checks cannot run)
    warnings: tuple[str, ...] = field(default=())
    # EAGLE-3: the layers the head was trained on and each engine feeds it (eagle3_variants.layers_fed)
    layers_fed: dict | None = None



def _hub_id_from_cache_path(path: Path) -> str | None:
    """org/name for a snapshot in the Hugging Face cache (models--org--name/snapshots/<commit>)."""
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/")
    return None


def _verifier_names(target: TargetShape, target_reference: str | None) -> set[str]:
    names = {target.path}
    if target_reference:
        names.add(target_reference)
        if "@" in target_reference:
            names.add(target_reference.rsplit("@", 1)[0])
    hub_id = _hub_id_from_cache_path(Path(target.path))
    if hub_id:
        names.add(hub_id)
    if target.name_or_path:
        names.add(target.name_or_path)
    return {name.rstrip("/").casefold() for name in names}


def _declared_is_target(declared: str, target: TargetShape, target_reference: str | None) -> bool:
    if declared.rstrip("/").casefold() in _verifier_names(target, target_reference):
        return True
    local = Path(declared).expanduser()
    return local.is_dir() and local.resolve() == Path(target.path)


def _check_verifier(head: HeadSpec, target: TargetShape, target_reference: str | None, target_fingerprint: Any,
                    allow_verifier_mismatch: bool) -> tuple[bool, list[str]]:
    """(matched, notes). A head whose declared verifier is another model is refused unless
    allow_verifier_mismatch, which turns the mismatch into a note the binding records."""
    problems: list[str] = []
    notes: list[str] = []
    matched_by_fingerprint = False
    if head.verifier_fingerprint and target_fingerprint is None:
        notes.append("the head records its verifier's fingerprint; not compared (no target fingerprint given)")
    if head.verifier_fingerprint and target_fingerprint is not None:
        differing = [key for key, digest in head.verifier_fingerprint.items()
                     if getattr(target_fingerprint, key, None) != digest]
        for key in differing:
            problems.append(f"the head records verifier {key} {head.verifier_fingerprint[key][:12]}, the target's "
                            f"is {str(getattr(target_fingerprint, key, None))[:12]}")
        matched_by_fingerprint = not differing
    name = head.verifier_name_or_path
    if name and not matched_by_fingerprint and not problems and not _declared_is_target(name, target,
                                                                                         target_reference):
        problems.append(f"the head declares verifier {name!r}, the target is {target_reference or target.path!r}")
    if head.verifier_architectures and target.architectures \
            and not set(head.verifier_architectures) & set(target.architectures):
        problems.append(f"the head declares verifier architectures {list(head.verifier_architectures)}, the target "
                        f"is {list(target.architectures)}")
    if problems:
        if not allow_verifier_mismatch:
            raise HeadMismatchError("verifier: " + "; ".join(problems) + " (--allow-verifier-mismatch registers it "
                                    "anyway and records the mismatch)")
        return False, notes + ["verifier mismatch allowed: " + "; ".join(problems)]
    if not name and not head.verifier_fingerprint:
        return False, notes + ["the head declares no verifier"]
    return matched_by_fingerprint or bool(name), notes


# --- the fit ------------------------------------------------------------------------------

def check_head_fits(head: HeadSpec, target_directory: str | Path, *, target_reference: str | None = None,
                    target_fingerprint: Any = None, allow_verifier_mismatch: bool = False,
                    draft_token_strings: TokenStrings | None = None,
                    target_token_strings: TokenStrings | None = None) -> HeadFit:
    """Check that `head` fits the target in `target_directory`; raise HeadMismatchError naming the
    field when it does not. `target_reference` (what the user typed) and `target_fingerprint` (a
    ModelFingerprint) identify the target against the head's declared verifier. Token strings:
    draft id -> string and target id -> string (a mapping or a callable); by default both come
    from the tokenizer.json files (the head's is indexed by target ids)."""
    target = read_target_shape(target_directory)
    notes = list(head.notes)
    head_format = HEAD_FORMATS[head.method]
    if head_format.inside_target:
        if Path(head.path).resolve() != Path(target.path):
            raise HeadMismatchError(f"MTP layers: read from {head.path}, but the target is {target.path}; MTP "
                                    "layers belong to the target's own checkpoint")
        return HeadFit(aux_layer_ids=(), verifier_matched=True, compared_token_strings=0, notes=tuple(notes))
    # first: a head made for another model is named as such before its sizes are compared
    matched, verifier_notes = _check_verifier(head, target, target_reference, target_fingerprint,
                                              allow_verifier_mismatch)

    if head.target_hidden_size != target.hidden_size:
        source = "target_hidden_size" if head.target_hidden_size != head.hidden_size else "hidden_size"
        raise HeadMismatchError(f"hidden size: the head reads {head.target_hidden_size}-wide target states "
                                f"({source}) but the target's hidden_size is {target.hidden_size}")
    if not head.has_own_embeddings and head_format.shares_embeddings and head.hidden_size != target.hidden_size:
        raise HeadMismatchError(f"hidden size: the head has no embed_tokens of its own, so it shares the target's "
                                f"{target.hidden_size}-wide embeddings, but its hidden_size is {head.hidden_size}")

    aux: tuple[int, ...] = ()
    warnings: list[str] = []
    fed = None
    if head_format.aux_layers:
        aux, aux_notes, warnings = check_aux_layers(head, target)
        notes += aux_notes
        fed = _eagle3_layers_fed(head, target, warnings)
    if head_format.block:
        aux, aux_notes, warnings = check_block_layers(head, target)
        notes += aux_notes

    if head.target_vocab_size != target.vocab_size:
        field_name = head_format.vocab_size_field
        raise HeadMismatchError(f"vocabulary size: the head maps into {head.target_vocab_size} ids ({field_name}) "
                                f"but the target's vocab_size is {target.vocab_size}")
    vocab_map = read_vocab_map(head) if head.has_vocab_map else None
    check_vocab_map(head, vocab_map, target.vocab_size)
    compared, note = check_token_strings(head, vocab_map, target, draft_token_strings, target_token_strings)
    if note:
        notes.append(note)
    return HeadFit(aux_layer_ids=aux, verifier_matched=matched, compared_token_strings=compared,
                   notes=tuple(notes + verifier_notes), warnings=tuple(warnings), layers_fed=fed)


def _eagle3_layers_fed(head: HeadSpec, target: TargetShape, warnings: list[str]) -> dict:
    """The EAGLE-3 variant as vLLM 0.33 builds it, its layer tensors checked against its config
    (ModelReferenceError); the layers each engine feeds it, with a warning (appended to `warnings`)
    for each engine that reads the head's ids otherwise than the tool that trained it, for each
    flag of the config vLLM's class for its layers does not read, and when vLLM sizes its fc for
    another number of target states than its fc.weight reads."""
    variant = read_eagle3_variant(head.path)
    variant.check_tensors(head)
    fed = layers_fed(variant, target.num_hidden_layers)
    warnings.extend(variant.warnings)
    fc_width = variant.fc_width_refusal(head)
    if fc_width:  # registered all the same: SGLang and TensorRT-LLM size fc from the ids they are given
        warnings.append(f"{fc_width}; vLLM 0.33 cannot serve this head (its exports refuse it), another engine may")
    warnings.extend(numbering_warnings(fed))
    return fed
