"""Speculative heads that draft from the target's own states: EAGLE-3 (and EAGLE), Medusa, MTP,
DFlash and DSpark.

`read_head` (here) recognises a head directory (for MTP: the target's own directory) and returns a
HeadSpec; `fit.check_head_fits` checks it against the target and raises HeadMismatchError naming
the field (hidden size, aux layer ids inside the target's layers, vocabulary, the d2t/t2d map,
the draft token strings, the declared verifier). A head directory that cannot be read raises
ModelReferenceError naming the file and field. Nothing here imports torch or transformers:
configs are JSON, shapes come from the safetensors headers, d2t/t2d are read as raw bytes.

One module per concern; each names the engine and format sources it follows:
- spec.py: HeadSpec, HeadTensor, TargetShape and the config-field readers every format uses;
- tensors.py: weight files and tensors from safetensors headers (and one tensor's raw bytes);
- eagle3_checkpoint.py: EAGLE-3 heads (speculators format and original EAGLE checkpoints) and
  EAGLE(-1/2), the aux layer ids;
- medusa_checkpoint.py: Medusa heads (FasterDecoding/Medusa, TGI);
- mtp_checkpoint.py: the MTP layers inside a target (vLLM's MTP families);
- dflash_checkpoint.py: block drafters (DFlash, DSpark) in the speculators and engine-native
  layouts, their block and their target layers in each project's numbering;
- vocabulary.py: the d2t/t2d vocabulary map and the draft token strings against the target's;
- fit.py: the declared verifier and check_head_fits, which binds a head to a target.
"""

from __future__ import annotations

from pathlib import Path

from specreg.core.files import read_json_file
from specreg.core.heads.dflash_checkpoint import block_drafter_kind, read_block_drafter
from specreg.core.heads.eagle3_checkpoint import eagle_architectures, read_eagle_checkpoint, read_speculators
from specreg.core.heads.medusa_checkpoint import read_medusa
from specreg.core.heads.mtp_checkpoint import read_mtp
from specreg.core.heads.spec import HeadSpec
from specreg.core.methods import HEAD_FORMATS
from specreg.errors import ModelReferenceError, UsageError

HEAD_METHODS = tuple(HEAD_FORMATS)


def read_head(directory: str | Path, method: str | None = None) -> HeadSpec:
    """Recognise the head in `directory`: an EAGLE-3 head (speculators format or the original
    EAGLE layout), an EAGLE head, or Medusa heads; with method="mtp", `directory` is the target
    itself and its MTP layers are read (read_mtp). `method`, when given, must be what the
    directory holds. Raises ModelReferenceError naming the file and field when it cannot be read."""
    if method is not None and method not in HEAD_METHODS:
        raise UsageError(f"unknown head method {method!r}: use one of {', '.join(HEAD_METHODS)}")
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelReferenceError(f"{directory}: no such head directory")
    if method is not None and HEAD_FORMATS[method].inside_target:
        return read_mtp(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelReferenceError(f"{directory}: no config.json (not a head directory)")
    config = read_json_file(config_path)
    if block_drafter_kind(config) is not None:
        spec = read_block_drafter(directory, config_path, config)
    elif "speculators_model_type" in config:
        spec = read_speculators(directory, config_path, config)
    elif "medusa_num_heads" in config:
        spec = read_medusa(directory, config_path, config)
    else:
        spec = read_eagle_checkpoint(directory, config_path, config)
    if method is not None and spec.method != method:
        raise ModelReferenceError(f"{directory}: holds {spec.method} head(s) ({spec.layout} layout), not {method}")
    return spec



def head_in_place_of_a_model(directory: str | Path) -> tuple[str, str | None] | None:
    """(what speculative head `directory` holds, the method that registers it or None), or None
    for a causal LM; for a folder registered as a draft model. A head folder may carry tokenizer
    files beside the head (speculators copies the verifier's), which let it pass for a draft model
    until its config is read field by field;
    what says head is its config.json: speculators_model_type, medusa_num_heads, an EAGLE
    architecture, or draft_vocab_size on a one-layer model (as llama.cpp's converter detects
    EAGLE-3, conversion/llama.py LlamaModel.__init__)."""
    config_path = Path(directory) / "config.json"
    if not config_path.is_file():
        return None
    try:
        config = read_json_file(config_path)
    except ModelReferenceError:
        return None
    architectures = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    block_kind = block_drafter_kind(config)
    if block_kind is not None:
        return f"a {block_kind} block drafter (architectures {architectures})", block_kind
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        known = HEAD_FORMATS.get(kind)
        return (f"a speculators {kind!r} head (speculators_model_type; architectures {architectures})",
                known.method if known is not None else None)
    if "medusa_num_heads" in config:
        return "Medusa heads (medusa_num_heads)", "medusa"
    eagle = eagle_architectures(architectures)
    if eagle and not any("3" in name for name in eagle):
        return f"an EAGLE (1/2) head (architectures {architectures})", None
    if eagle or ("draft_vocab_size" in config and config.get("num_hidden_layers") == 1):
        return (f"an EAGLE-3 head (architectures {architectures}, draft_vocab_size {config.get('draft_vocab_size')})",
                "eagle3")
    return None
