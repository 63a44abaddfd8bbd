"""Block drafters: DFlash and DSpark heads, which draft a whole block in one forward pass from the
target's hidden states, in each layout an engine or a trainer writes; and the target layers they
read, in each project's numbering.

What we followed (vLLM is the released 0.33.0 sdist, speculators vllm-project/speculators main at
c05b95b, ModelOpt the nvidia-modelopt 0.47.0 wheel, llama.cpp the llama-cpp-python 0.3.36 sdist):
- speculators layout: config.json `speculators_model_type` "dflash" | "dspark",
  `transformer_layer_config` (the draft's Qwen3 layers; vocab_size = the verifier's vocabulary),
  `draft_vocab_size`, `target_hidden_size`, `block_size`, `aux_hidden_state_layer_ids`,
  `mask_token_id`, `sample_from_anchor` (DFlash default false, DSpark default true),
  `sliding_window_non_causal`; DSpark adds `markov_rank`, `markov_head_type` ("vanilla", "gated",
  "rnn"), `enable_confidence_head` (speculators models/dflash/config.py:16-86,
  models/dspark/config.py:9-60). Slot k of a block of `block_size` predicts the token k + 1 after
  the anchor with sample_from_anchor, else the token k after it (slot 0, the anchor, predicts
  nothing): block_size or block_size - 1 drafts a step (models/dflash/core.py
  _build_base_config_kwargs). vLLM requires aux_hidden_state_layer_ids and mask_token_id and
  reads the ids as the states *entering* those target layers (EAGLE's numbering), writing
  `dflash_config.target_layer_ids` = id - 1 for its model (transformers_utils/configs/speculators/
  algos.py:90-126 dflash, 152-205 dspark, which reads sample_from_anchor false when absent).
- engine-native DFlash layout, written by z-lab and by ModelOpt (torch/export/plugins/
  hf_spec_export.py:331-450 DFlashExporter): a Qwen3 config with architectures
  ["DFlashDraftModel"], `block_size`, `dflash_config` {mask_token_id, target_layer_ids, causal},
  `num_target_layers`; target_layer_ids number a layer by its *output*: vLLM adds one
  (v1/worker/gpu_model_runner.py:5209-5216), llama.cpp's converter writes id + 1 as
  `dflash.target_layers` (conversion/qwen.py:735-738).
- engine-native DSpark layout (Qwen3DSparkModel, e.g. deepseek-ai/dspark_qwen3_8b_block7):
  top-level `block_size`, `target_layer_ids` (output numbering, vLLM adds one:
  v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:136-140), `mask_token_id`, `markov_rank`,
  `sample_from_anchor` (vLLM's speculator reads true when absent: v1/worker/gpu/spec_decode/
  dspark/speculator.py:47-49). vLLM's DSpark runs the vanilla Markov head only
  (model_executor/models/qwen3_dspark.py:48-93: bias = markov_w2(markov_w1(previous token))),
  and so does llama.cpp's converter (conversion/qwen.py:898-899).
- ModelOpt's DSpark export keeps architectures ["DFlashDraftModel"] with
  dflash_config.projector_type "dspark" (hf_spec_export.py:523-545): vLLM serves method dspark
  only for the DSpark architectures (config/speculative.py:1543-1560), so it is refused.
- Attention inside the block: vLLM runs a layer causal when `is_causal` says so, else
  dflash_config.causal, else when the layer is a sliding-window one
  (model_executor/models/qwen3_dflash.py _dflash_layer_causal); for a speculators head it sets
  dflash_config.causal = not sliding_window_non_causal (algos.py:123-126).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from specreg.core.heads.spec import (
    HeadSpec,
    TargetShape,
    json_object,
    optional_positive_int,
    optional_str,
    positive_int,
    read_layer_ids,
    shown,
    str_list,
)
from specreg.core.heads.tensors import expect_shape, find_tensor, list_weight_files, read_tensors
from specreg.errors import HeadMismatchError, ModelReferenceError

BLOCK_KINDS = ("dflash", "dspark")
DFLASH_ARCHITECTURES = ("DFlashDraftModel",)
DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "DSparkDraftModel")
MARKOV_HEAD_TYPES = ("vanilla",)  # what vLLM 0.33 and llama.cpp run
INPUT_NUMBERING = "layer inputs"  # id L: the state entering layer L (EAGLE's ids, vLLM's, llama.cpp's GGUF)
OUTPUT_NUMBERING = "layer outputs"  # id L: the output of layer L (DFlash/DSpark target_layer_ids)


def block_drafter_kind(config: dict[str, Any]) -> str | None:
    """"dflash" or "dspark" for a config.json that declares a block drafter in a layout read
    here, else None."""
    if config.get("speculators_model_type") in BLOCK_KINDS:
        return config["speculators_model_type"]
    architectures = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    if any(name in DSPARK_ARCHITECTURES for name in architectures):
        return "dspark"
    if any(name in DFLASH_ARCHITECTURES for name in architectures):
        dflash_config = config.get("dflash_config")
        projector = dflash_config.get("projector_type") if isinstance(dflash_config, dict) else None
        return "dspark" if projector == "dspark" else "dflash"
    return None


def read_block_drafter(directory: Path, config_path: Path, config: dict[str, Any]) -> HeadSpec:
    """A DFlash or DSpark head in the speculators or an engine-native layout -> HeadSpec, its
    block facts in HeadSpec.block and its target layers in layer-input numbering in
    aux_layer_ids. ModelReferenceError naming the file and field otherwise."""
    kind = config.get("speculators_model_type")
    if kind is not None:
        return _read_speculators(directory, config_path, config, kind)
    architectures = str_list(config.get("architectures"), f"{config_path}: architectures")
    dflash_config = config.get("dflash_config")
    dflash_config = {} if dflash_config is None else json_object(dflash_config, f"{config_path}: dflash_config")
    if any(name in DSPARK_ARCHITECTURES for name in architectures):
        return _read_native(directory, config_path, config, config, "dspark", "dspark", prefix="")
    if dflash_config.get("projector_type", "dflash") != "dflash":
        raise ModelReferenceError(
            f"{config_path}: dflash_config.projector_type {shown(dflash_config['projector_type'])} under "
            f"architectures {list(architectures)} is a variant specreg does not register: vLLM 0.33 serves "
            "method dspark only for Qwen3DSparkModel checkpoints (config/speculative.py:1543-1560) and "
            "runs DFlashDraftModel as plain DFlash (ModelOpt's DSpark export, hf_spec_export.py:523-545)")
    return _read_native(directory, config_path, config, dflash_config, "dflash", "dflash", prefix="dflash_config.")


def _read_speculators(directory: Path, config_path: Path, config: dict[str, Any], kind: Any) -> HeadSpec:
    if kind not in BLOCK_KINDS:
        raise ModelReferenceError(f"{config_path}: speculators_model_type {shown(kind)} is not a block drafter")
    layer = json_object(config.get("transformer_layer_config"), f"{config_path}: transformer_layer_config")
    speculators = json_object(config.get("speculators_config"), f"{config_path}: speculators_config")
    verifier = json_object(speculators.get("verifier"), f"{config_path}: speculators_config.verifier")
    # vLLM refuses a speculators config without these (transformers_utils/configs/speculators/base.py:77-94)
    if "name_or_path" not in verifier:
        raise ModelReferenceError(f"{config_path}: speculators_config.verifier.name_or_path is missing")
    name = optional_str(verifier["name_or_path"], f"{config_path}: speculators_config.verifier.name_or_path")
    architectures = str_list(verifier.get("architectures"), f"{config_path}: speculators_config.verifier.architectures")
    methods = speculators.get("proposal_methods")
    if not isinstance(methods, list) or not methods:
        raise ModelReferenceError(f"{config_path}: speculators_config.proposal_methods must be a non-empty list")
    first = json_object(methods[0], f"{config_path}: speculators_config.proposal_methods[0]")
    tokens = positive_int(first.get("speculative_tokens"),
                          f"{config_path}: speculators_config.proposal_methods[0].speculative_tokens")
    ids = read_layer_ids(config.get("aux_hidden_state_layer_ids"), f"{config_path}: aux_hidden_state_layer_ids")
    if ids is None:
        # vLLM indexes config_dict["aux_hidden_state_layer_ids"] (algos.py:114, 191): a KeyError at load
        raise ModelReferenceError(f"{config_path}: aux_hidden_state_layer_ids is missing; vLLM 0.33 requires it "
                                  "(transformers_utils/configs/speculators/algos.py:114)")
    if "sample_from_anchor" not in config and kind == "dspark":
        raise ModelReferenceError(f"{config_path}: sample_from_anchor is missing: speculators reads true for "
                                  "dspark (models/dspark/config.py), vLLM 0.33 false (speculators/algos.py:188), "
                                  "so the engines would draft different tokens; state it")
    sample_from_anchor = _bool(config.get("sample_from_anchor", False), f"{config_path}: sample_from_anchor")
    non_causal = _bool(config.get("sliding_window_non_causal", True), f"{config_path}: sliding_window_non_causal")
    block = _block(config_path, config.get("block_size"), "block_size", config.get("mask_token_id"),
                   "mask_token_id", sample_from_anchor, causal=not non_causal, declared=ids,
                   numbering=INPUT_NUMBERING)
    return _spec(directory, config_path, kind, "speculators", config, layer, "transformer_layer_config.", ids,
                 block, verifier=(name, architectures), speculative_tokens=tokens)


def _read_native(directory: Path, config_path: Path, config: dict[str, Any], fields: dict[str, Any], kind: str,
                 layout: str, *, prefix: str) -> HeadSpec:
    """The engine-native layouts: the draft's Qwen3 config at the top level, the block fields in
    `fields` (dflash_config for DFlash, the top level for DSpark) under `prefix`."""
    declared = read_layer_ids(fields.get("target_layer_ids", config.get("target_layer_ids")),
                              f"{config_path}: {prefix}target_layer_ids")
    if declared is None:
        raise ModelReferenceError(f"{config_path}: {prefix}target_layer_ids is missing (the target layers the "
                                  "drafter reads; without them vLLM 0.33 sizes fc for every target layer)")
    # vLLM 0.33: DFlash sample_from_anchor is false unless dflash_config says so; its DSpark
    # speculator reads true when absent (dspark/speculator.py:47-49)
    anchor_default = kind == "dspark"
    sample_from_anchor = _bool(fields.get("sample_from_anchor", config.get("sample_from_anchor", anchor_default)),
                               f"{config_path}: {prefix}sample_from_anchor")
    causal = config.get("is_causal", fields.get("causal"))
    block_size = fields.get("block_size", config.get("block_size", config.get("dspark_block_size")))
    block = _block(config_path, block_size, f"{prefix}block_size" if "block_size" in fields else "block_size",
                   fields.get("mask_token_id", config.get("mask_token_id")), f"{prefix}mask_token_id",
                   sample_from_anchor, causal=None if causal is None else _bool(causal, f"{config_path}: causal"),
                   declared=declared, numbering=OUTPUT_NUMBERING)
    ids = tuple(i + 1 for i in declared)  # the states entering the next layer: vLLM's and llama.cpp's +1
    return _spec(directory, config_path, kind, layout, config, config, "", ids, block)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ModelReferenceError(f"{where} must be true or false, got {shown(value)}")
    return value


def _block(config_path: Path, block_size: Any, block_field: str, mask_token_id: Any, mask_field: str,
           sample_from_anchor: bool, *, causal: bool | None, declared: tuple[int, ...], numbering: str) -> dict:
    block_size = positive_int(block_size, f"{config_path}: {block_field}")
    if mask_token_id is None:
        raise ModelReferenceError(f"{config_path}: {mask_field} is missing (the token that fills the block's "
                                  "masked slots; vLLM 0.33 requires it)")
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int) or mask_token_id < 0:
        raise ModelReferenceError(f"{config_path}: {mask_field} must be a token id, got {shown(mask_token_id)}")
    draft_length = block_size if sample_from_anchor else block_size - 1
    if draft_length < 1:
        raise ModelReferenceError(f"{config_path}: {block_field} {block_size} drafts no token (the anchor fills "
                                  "slot 0 when sample_from_anchor is false)")
    return {"block_size": block_size, "draft_length": draft_length, "sample_from_anchor": sample_from_anchor,
            "mask_token_id": mask_token_id, "causal": causal, "declared_layer_ids": list(declared),
            "numbering": numbering}


def _spec(directory: Path, config_path: Path, kind: str, layout: str, config: dict[str, Any],
          layer: dict[str, Any], layer_prefix: str, ids: tuple[int, ...], block: dict, *,
          verifier=(None, ()), speculative_tokens: int | None = None) -> HeadSpec:
    raw = read_tensors(list_weight_files(directory))
    # engine-native files may carry a "model." prefix; the readers strip it (llama.cpp filter_tensors)
    tensors = {name.removeprefix("model."): tensor for name, tensor in raw.items()}
    hidden = positive_int(layer.get("hidden_size"), f"{config_path}: {layer_prefix}hidden_size")
    vocab = positive_int(layer.get("vocab_size"), f"{config_path}: {layer_prefix}vocab_size")
    layers = positive_int(layer.get("num_hidden_layers"), f"{config_path}: {layer_prefix}num_hidden_layers")
    target_hidden = optional_positive_int(config.get("target_hidden_size"), f"{config_path}: target_hidden_size")
    target_hidden = target_hidden or hidden
    draft_vocab = optional_positive_int(config.get("draft_vocab_size"), f"{config_path}: draft_vocab_size") or vocab
    layer_types = layer.get("layer_types")
    if isinstance(layer_types, list) and "sliding_attention" in layer_types:
        block["sliding_window"] = layer.get("sliding_window")
    found = {int(m.group(1)) for name in tensors if (m := re.match(r"layers\.(\d+)\.", name))}
    if found != set(range(layers)):
        raise ModelReferenceError(f"{directory}: the weights hold decoder layers {sorted(found)}, the config "
                                  f"{layer_prefix}num_hidden_layers {layers}")
    fc = find_tensor(tensors, "fc.weight", directory)
    if fc is None:
        raise ModelReferenceError(f"{directory}: no fc.weight tensor (a block drafter projects the target's states "
                                  "with fc)")
    expect_shape(fc, (hidden, len(ids) * target_hidden), directory,
                 f"hidden_size x {len(ids)} target layers of width {target_hidden}")
    for name in ("hidden_norm.weight", "norm.weight"):
        if find_tensor(tensors, name, directory) is None:
            raise ModelReferenceError(f"{directory}: no {name} tensor")
    lm_head = find_tensor(tensors, "lm_head.weight", directory)
    expect_shape(lm_head, (draft_vocab, hidden), directory, "draft_vocab_size x hidden_size")
    embed = find_tensor(tensors, "embed_tokens.weight", directory)
    expect_shape(embed, (vocab, hidden), directory, f"{layer_prefix}vocab_size x hidden_size")
    d2t = find_tensor(tensors, "d2t", directory)
    if draft_vocab != vocab and (lm_head is None or d2t is None):
        raise ModelReferenceError(f"{directory}: draft_vocab_size {draft_vocab} differs from {layer_prefix}vocab_size "
                                  f"{vocab}, so the head needs its own lm_head.weight and a d2t map (vLLM 0.33 "
                                  "refuses it otherwise, model_executor/models/qwen3_dspark.py:340-354)")
    if kind == "dspark":
        block.update(_markov(directory, config_path, config, tensors, vocab, draft_vocab))
    name, architectures = verifier
    notes = [] if layout != "speculators" or "sliding_window_non_causal" in config else [
        "sliding_window_non_causal absent: vLLM reads true (block attention non-causal)"]
    return HeadSpec(method=kind, layout=layout, path=str(directory.resolve()), hidden_size=hidden,
                    target_hidden_size=target_hidden, draft_vocab_size=draft_vocab, target_vocab_size=vocab,
                    aux_layer_ids=ids, num_heads=1, num_layers=layers, verifier_name_or_path=name,
                    verifier_architectures=architectures, verifier_fingerprint={},
                    speculative_tokens=speculative_tokens, has_own_embeddings=embed is not None,
                    has_vocab_map=d2t is not None, tensors=tuple(sorted(raw.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in raw.values()})),
                    layer_type=layer.get("model_type") if isinstance(layer.get("model_type"), str) else None,
                    notes=tuple(notes), block=block)


def _markov(directory: Path, config_path: Path, config: dict[str, Any], tensors: dict, vocab: int,
            draft_vocab: int) -> dict:
    """DSpark's Markov head: rank and kind from the config, its two tensors' shapes checked."""
    rank = positive_int(config.get("markov_rank"), f"{config_path}: markov_rank")
    head_type = config.get("markov_head_type", "vanilla")
    if head_type not in MARKOV_HEAD_TYPES:
        raise ModelReferenceError(f"{config_path}: markov_head_type {shown(head_type)} is a DSpark variant no engine "
                                  "specreg targets runs: vLLM 0.33 (model_executor/models/qwen3_dspark.py:48-93) and "
                                  "llama.cpp (conversion/qwen.py:898-899) run 'vanilla' only")
    w1 = find_tensor(tensors, "markov_head.markov_w1.weight", directory)
    w2 = find_tensor(tensors, "markov_head.markov_w2.weight", directory)
    if w1 is None or w2 is None:
        raise ModelReferenceError(f"{directory}: no markov_head.markov_w1.weight / markov_w2.weight tensors (DSpark's "
                                  "Markov head)")
    expect_shape(w1, (vocab, rank), directory, "vocab_size x markov_rank")
    expect_shape(w2, (draft_vocab, rank), directory, "draft_vocab_size x markov_rank")
    return {"markov_rank": rank, "markov_head_type": head_type,
            "confidence_head": any(name.startswith("confidence_head.") for name in tensors)}


# --- binding the head to a target and to k ------------------------------------------------

def check_block_layers(head: HeadSpec, target: TargetShape) -> tuple[tuple[int, ...], list[str], list[str]]:
    """The target layers a block drafter reads and its mask token against the target -> (ids in
    layer-input numbering, notes, warnings). HeadMismatchError naming the field otherwise."""
    block = head.block
    layers = target.num_hidden_layers
    declared, numbering = block["declared_layer_ids"], block["numbering"]
    field_name = "aux_hidden_state_layer_ids" if numbering == INPUT_NUMBERING else "target_layer_ids"
    # a block drafter reads layer outputs 0..N-1, the states entering layers 1..N (id 0, the
    # embeddings, has no DFlash target_layer_id: SGLang, TensorRT-LLM and llama.cpp could not name it)
    lowest = 1 if numbering == INPUT_NUMBERING else 0
    outside = [d for d, i in zip(declared, head.aux_layer_ids) if not 1 <= i <= layers]
    if outside:
        raise HeadMismatchError(f"target layers: {field_name} {declared} ({numbering}) name layer(s) {outside} outside "
                                f"the target's {layers} layers (valid: {lowest} .. {layers - 1 + lowest})")
    mask = block["mask_token_id"]
    if not 0 <= mask < target.vocab_size:
        raise HeadMismatchError(f"mask_token_id {mask} is outside the target's vocabulary (vocab_size "
                                f"{target.vocab_size})")
    ids = list(head.aux_layer_ids)
    outputs = [i - 1 for i in ids]
    notes = [f"target layers: the head reads the outputs of target layers {outputs} (declared {field_name} "
             f"{declared}, {numbering}); vLLM eagle_aux_hidden_state_layer_ids {ids} and llama.cpp dflash.target_layers "
             f"{ids} (the states entering layers {ids}); dflash_config.target_layer_ids {outputs} for vLLM's "
             f"DFlash model, SGLang and TensorRT-LLM (layer outputs)"]
    warnings = []
    if layers in ids:
        warnings.append(f"target layers: {ids} include {layers}, the output of the target's last layer before the "
                        "final norm: engines read it, specreg's runtime does not, so validate's runtime checks cannot "
                        "run on this pair; its static checks do")
    return tuple(ids), notes, warnings


def block_draft_length(head: dict, num_speculative_tokens: int | None) -> int:
    """The drafts a step of this block drafter (a registered head's description) -> k: block_size
    - 1 (the anchor fills slot 0) or block_size (sample_from_anchor), the default when k is not
    given. HeadMismatchError in one line when a k given disagrees: the block is trained whole, every slot
    attending to every other, so a shorter block drafts other tokens."""
    block = head["block"]
    expected = block["draft_length"]
    if num_speculative_tokens is not None and num_speculative_tokens != expected:
        rule = ("block_size, sample_from_anchor true" if block["sample_from_anchor"]
                else "block_size - 1: the anchor fills slot 0")
        raise HeadMismatchError(f"num_speculative_tokens {num_speculative_tokens} disagrees with the head: block_size "
                         f"{block['block_size']} drafts {expected} tokens a step ({rule}); omit -k or pass "
                         f"-k {expected}")
    return expected
