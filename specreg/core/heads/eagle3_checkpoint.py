"""EAGLE-3 heads, in the speculators format or as an original EAGLE checkpoint, and EAGLE(-1/2)
heads; and the target layers an EAGLE-3 head reads (its aux hidden-state layer ids).

What we followed (vLLM is the released 0.33.0 wheel, speculators is
vllm-project/speculators main at c05b95b, the others their GitHub sources):
- speculators format: config.json `speculators_model_type` ("eagle3"), `transformer_layer_config`
  (the head's own decoder layer: hidden_size, vocab_size = the verifier's vocabulary),
  `draft_vocab_size`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids`,
  `speculators_config` {algorithm, proposal_methods[{proposal_type, speculative_tokens}],
  default_proposal_method, verifier {name_or_path, architectures}} (speculators
  src/speculators/config.py:40-148, models/eagle3/config.py:27-56). vLLM requires
  speculators_config.proposal_methods[0].speculative_tokens, verifier.name_or_path and a dict
  transformer_layer_config (vllm/transformers_utils/configs/speculators/base.py:77-94), copies
  draft_vocab_size, target_hidden_size and eagle_aux_hidden_state_layer_ids from the top level
  (speculators/algos.py:15-50) and knows no other speculators type than eagle3, peagle, dflash,
  dflash2, dspark (algos.py:15, 53, 90, 129, 152).
  VerifierConfig has no model_config, so pydantic ignores extra keys: specreg's export may add
  the verifier's fingerprint under VERIFIER_FINGERPRINT_KEY (speculators config.py:40-113).
- Original EAGLE-3 layout: a LlamaConfig of the head with `draft_vocab_size` (SafeAILab/EAGLE
  eagle/traineagle3/config.json), weights midlayer.*/fc/norm/lm_head/d2t/t2d; vLLM maps
  LlamaForCausalLMEagle3 to Eagle3LlamaForCausalLM (model_executor/models/registry.py:702),
  reads the aux ids at the top level or in `eagle_config` (v1/worker/gpu_model_runner.py:
  5207-5219), sizes fc as target_hidden_size x (num_aux_hidden_states, else len(eagle_config ids),
  else 3) (llama_eagle3.py:209-221; eagle3_variants.vllm_fc_states), defaults draft_vocab_size to vocab_size (llama_eagle3.py:314-316).
- Aux layer id L is the residual stream entering layer L: 0 = the embeddings, N = the last
  layer's output before the final norm (vLLM llama.py:428-441 with interfaces.py:1640-1650);
  without ids the target's default is (2, N // 2, N - 3) (interfaces.py:1771,
  speculators models/utils.py:52).
- vLLM shares the target's embed_tokens with a head that has none (v1/spec_decode/
  llm_base_proposer.py:1437-1441), so such a head must have the target's hidden size.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from specreg.core.heads.spec import (
    HeadSpec,
    HeadTensor,
    TargetShape,
    json_object,
    optional_positive_int,
    optional_str,
    positive_int,
    read_layer_ids,
    shown,
    str_list,
)
from specreg.core.heads.peagle_checkpoint import read_peagle
from specreg.core.heads.tensors import expect_shape, find_tensor, list_weight_files, read_tensors
from specreg.core.heads.vocabulary import D2T_DTYPES, T2D_DTYPES
from specreg.errors import HeadMismatchError, ModelReferenceError

# Where specreg's export of a speculators directory records the verifier's identity, inside
# speculators_config.verifier (speculators itself records only name_or_path + architectures).
VERIFIER_FINGERPRINT_KEY = "specreg"
FINGERPRINT_FIELDS = ("weights_sha256", "config_sha256", "tokenizer_sha256", "chat_template_sha256")
# vLLM sizes an EAGLE-3 fc for this many aux layers when the config names none.
DEFAULT_AUX_LAYER_COUNT = 3


@dataclasses.dataclass(frozen=True)
class SpeculatorsKind:
    """How vLLM 0.33 reads a speculators EAGLE-3 head of one speculators_model_type
    (transformers_utils/configs/speculators/algos.py, its update_<kind> function)."""

    architectures: dict[str, str]  # transformer_layer_config.model_type -> the architecture vLLM builds
    norm_before_residual: bool  # what an absent norm_before_residual reads as
    # the top-level norm flags it copies into the head's config; the others are read from
    # transformer_layer_config (its starting point) or not at all
    top_level_flags: tuple[str, ...]


SPECULATORS_KINDS = {
    # algos.py:15-50 update_eagle3
    "eagle3": SpeculatorsKind({"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}, True,
                              ("norm_before_fc", "fc_norm", "norm_output")),
    # algos.py:53-86 update_peagle: P-EAGLE, served as eagle3 with parallel_drafting (base.py:133-134)
    "peagle": SpeculatorsKind({"llama": "PeagleLlamaForCausalLM", "qwen3": "PeagleQwen3ForCausalLM"}, False,
                              ("norm_before_fc",)),
}


def eagle_architectures(architectures) -> list[str]:
    """The names in a config's `architectures` that say EAGLE (EAGLE-1/2 or EAGLE-3 checkpoints)."""
    return [str(name) for name in architectures if "eagle" in str(name).lower()]


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """The aux layers an EAGLE-3 head reads when it names none (vLLM and speculators default)."""
    return (2, num_layers // 2, num_layers - 3)


def check_aux_layers(head: HeadSpec, target: TargetShape) -> tuple[tuple[int, ...], list[str], list[str]]:
    """The target layers an EAGLE-3 head reads (declared, or the target's default) -> (ids, notes,
    warnings). Raises HeadMismatchError when one lies outside the target's layers, or when the
    target's default names a layer twice: vLLM 0.33 collects each layer once
    (model_executor/models/interfaces.py:1617 `tuple(sorted(set(layers)))`) and feeds fc fewer
    states than it sized fc for (llama_eagle3.py:210-221, 3 without ids), so the head cannot run.
    Id N (the last layer's output before the final norm) is valid: vLLM and specreg's runtime read
    it. No warnings today; the list is kept for the callers."""
    layers = target.num_hidden_layers
    declared = head.aux_layer_ids is not None
    aux = head.aux_layer_ids if declared else default_aux_layer_ids(layers)
    # vLLM 0.33 (models/interfaces.py _maybe_add_hidden_state, llama.py): id 0 is the embeddings,
    # id i + 1 the residual stream after layer i, so 0..N; it sorts and dedups the ids
    outside = [i for i in aux if not 0 <= i <= layers]
    if outside:
        what = "eagle_aux_hidden_state_layer_ids" if declared else "the default aux layer ids"
        raise HeadMismatchError(f"aux layer ids: {what} {list(aux)} name layer(s) {outside} outside the "
                                f"target's {layers} layers (valid: 0 = embeddings .. {layers} = last layer output)")
    if len(set(aux)) != len(aux):  # only the default can repeat: read_layer_ids refuses a declared repeat
        repeated = sorted({i for i in aux if aux.count(i) > 1})
        raise HeadMismatchError(
            f"aux layer ids: the head names none, and the target's default (2, N // 2, N - 3) = {list(aux)} "
            f"names layer {repeated[0]} twice on this {layers}-layer target; vLLM 0.33 collects each layer once "
            f"(models/interfaces.py:1617) and feeds fc {len(set(aux))} states where the head sized it for "
            f"{DEFAULT_AUX_LAYER_COUNT} (models/llama_eagle3.py:210-221), so the head cannot run: name "
            "eagle_aux_hidden_state_layer_ids in the head's config.json")
    notes = [] if declared else [f"aux layer ids: the target's default {list(aux)} (the head names none)"]
    warnings: list[str] = []
    return aux, notes, warnings


# --- reading a head -----------------------------------------------------------------------

def read_speculators(directory: Path, config_path: Path, config: dict[str, Any]) -> HeadSpec:
    kind = config["speculators_model_type"]
    if not isinstance(kind, str) or kind not in SPECULATORS_KINDS:
        raise ModelReferenceError(f"{config_path}: speculators_model_type {shown(kind)} is not a head kind "
                                  f"specreg registers ({', '.join(SPECULATORS_KINDS)})")
    layer = json_object(config.get("transformer_layer_config"), f"{config_path}: transformer_layer_config")
    speculators = json_object(config.get("speculators_config"), f"{config_path}: speculators_config")
    verifier = json_object(speculators.get("verifier"), f"{config_path}: speculators_config.verifier")
    if "name_or_path" not in verifier:
        raise ModelReferenceError(f"{config_path}: speculators_config.verifier.name_or_path is missing")
    name = optional_str(verifier["name_or_path"], f"{config_path}: speculators_config.verifier.name_or_path")
    architectures = str_list(verifier.get("architectures"),
                              f"{config_path}: speculators_config.verifier.architectures")
    fingerprint = _verifier_fingerprint(verifier.get(VERIFIER_FINGERPRINT_KEY), config_path)
    methods = speculators.get("proposal_methods")
    if not isinstance(methods, list) or not methods:
        raise ModelReferenceError(f"{config_path}: speculators_config.proposal_methods must be a non-empty list")
    first = json_object(methods[0], f"{config_path}: speculators_config.proposal_methods[0]")
    tokens = positive_int(first.get("speculative_tokens"),
                           f"{config_path}: speculators_config.proposal_methods[0].speculative_tokens")
    ids = read_layer_ids(config.get("eagle_aux_hidden_state_layer_ids"),
                     f"{config_path}: eagle_aux_hidden_state_layer_ids")
    spec = _eagle3_spec(directory, config_path, "speculators", config, layer, "transformer_layer_config.", ids,
                        verifier=(name, architectures, fingerprint), speculative_tokens=tokens)
    residual = SPECULATORS_KINDS[kind].norm_before_residual
    if "norm_before_residual" not in config and residual:
        # vLLM reads true (speculators/algos.py:33-35), speculators' config false (eagle3/config.py:43-46)
        spec = dataclasses.replace(spec, notes=(*spec.notes, "norm_before_residual absent: vLLM reads true, "
                                                             "speculators false"))
    if kind == "peagle":
        spec = read_peagle(spec, config_path, config)
    return spec


def _verifier_fingerprint(value: Any, config_path: Path) -> dict[str, str]:
    if value is None:
        return {}
    where = f"{config_path}: speculators_config.verifier.{VERIFIER_FINGERPRINT_KEY}"
    value = json_object(value, where)
    recorded = {key: value[key] for key in FINGERPRINT_FIELDS if value.get(key) is not None}
    for key, digest in recorded.items():
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ModelReferenceError(f"{where}.{key} must be a sha256 hex digest, got {shown(digest)}")
    return recorded


def read_eagle_checkpoint(directory: Path, config_path: Path, config: dict[str, Any]) -> HeadSpec:
    """The original EAGLE / EAGLE-3 layout: the head's own LlamaConfig next to its weights."""
    tensors = read_tensors(list_weight_files(directory))
    fc = find_tensor(tensors, "fc.weight", directory)
    eagle3_signs = ("draft_vocab_size" in config or "eagle_config" in config
                    or "eagle_aux_hidden_state_layer_ids" in config
                    or any("Eagle3" in arch for arch in str_list(config.get("architectures"),
                                                                  f"{config_path}: architectures"))
                    or find_tensor(tensors, "d2t", directory) is not None
                    or any(name.startswith("midlayer.") for name in tensors))
    if eagle3_signs:
        eagle_config = config.get("eagle_config")
        eagle_config = {} if eagle_config is None else json_object(eagle_config, f"{config_path}: eagle_config")
        # vLLM reads the top-level ids first, then eagle_config's (gpu_model_runner.py:5207-5219)
        ids = read_layer_ids(config.get("eagle_aux_hidden_state_layer_ids"),
                         f"{config_path}: eagle_aux_hidden_state_layer_ids")
        if ids is None:
            ids = read_layer_ids(eagle_config.get("eagle_aux_hidden_state_layer_ids"),
                             f"{config_path}: eagle_config.eagle_aux_hidden_state_layer_ids")
        return _eagle3_spec(directory, config_path, "eagle", config, config, "", ids, tensors=tensors,
                            eagle_config=eagle_config)
    if fc is None:
        raise ModelReferenceError(f"{directory}: not a head directory: config.json has no speculators_model_type "
                                  "or medusa_num_heads and the weights have no EAGLE fc.weight (for the MTP "
                                  "layers inside a target, use method mtp)")
    # EAGLE(-1/2): fc reads cat(embeds, hidden) # [.., 2H] (vLLM llama_eagle.py:110-130)
    hidden = positive_int(config.get("hidden_size"), f"{config_path}: hidden_size")
    if len(fc.shape) == 2 and fc.shape[1] != 2 * hidden and fc.shape[1] % 3 == 0:
        # an EAGLE-3 fc (three target states) under an EAGLE config: engines pick the method from
        # the config and would run it as EAGLE (SGLang: acceptance length exactly 1.0, no warning)
        raise ModelReferenceError(
            f"{config_path}: declares an EAGLE (1/2) head (architectures "
            f"{list(str_list(config.get('architectures'), f'{config_path}: architectures'))}, no draft_vocab_size "
            f"or eagle_aux_hidden_state_layer_ids) but {directory / fc.file}: fc.weight {list(fc.shape)} reads "
            f"{fc.shape[1] // hidden if fc.shape[1] % hidden == 0 else 3} target states: an EAGLE-3 head, which "
            f"engines would serve as EAGLE; declare it as EAGLE-3 (architectures [\"LlamaForCausalLMEagle3\"], "
            f"draft_vocab_size, eagle_aux_hidden_state_layer_ids) and register it with --method eagle3")
    vocab = positive_int(config.get("vocab_size"), f"{config_path}: vocab_size")
    layers = positive_int(config.get("num_hidden_layers"), f"{config_path}: num_hidden_layers")
    expect_shape(fc, (hidden, 2 * hidden), directory, "EAGLE's fc maps [embeds, hidden] to hidden_size")
    embed = find_tensor(tensors, "embed_tokens.weight", directory)
    expect_shape(embed, (vocab, hidden), directory, "vocab_size x hidden_size")
    lm_head = find_tensor(tensors, "lm_head.weight", directory)
    expect_shape(lm_head, (vocab, hidden), directory, "vocab_size x hidden_size")
    return HeadSpec(method="eagle", layout="eagle", path=str(directory.resolve()), hidden_size=hidden,
                    target_hidden_size=hidden, draft_vocab_size=vocab, target_vocab_size=vocab, aux_layer_ids=None,
                    num_heads=1, num_layers=layers, verifier_name_or_path=None, verifier_architectures=(),
                    verifier_fingerprint={}, speculative_tokens=None, has_own_embeddings=embed is not None,
                    has_vocab_map=False, tensors=tuple(sorted(tensors.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in tensors.values()})),
                    layer_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None)


def _eagle3_spec(directory: Path, config_path: Path, layout: str, config: dict[str, Any], layer: dict[str, Any],
                 layer_prefix: str, ids: tuple[int, ...] | None, *, verifier=(None, (), {}),
                 speculative_tokens: int | None = None, tensors: dict[str, HeadTensor] | None = None,
                 eagle_config: dict[str, Any] | None = None) -> HeadSpec:
    """The checks and sizes both EAGLE-3 layouts share. `layer` holds the head's decoder-layer
    fields (transformer_layer_config, or the whole config in the original layout)."""
    if tensors is None:
        tensors = read_tensors(list_weight_files(directory))
    notes: list[str] = []
    hidden = positive_int(layer.get("hidden_size"), f"{config_path}: {layer_prefix}hidden_size")
    vocab = positive_int(layer.get("vocab_size"), f"{config_path}: {layer_prefix}vocab_size")
    target_hidden = optional_positive_int(config.get("target_hidden_size"), f"{config_path}: target_hidden_size")
    target_hidden = target_hidden or hidden
    declared_draft_vocab = optional_positive_int(config.get("draft_vocab_size"), f"{config_path}: draft_vocab_size")
    draft_vocab = declared_draft_vocab or vocab  # vLLM llama_eagle3.py:314-316
    if declared_draft_vocab is None:
        notes.append(f"draft_vocab_size absent: the vocab_size {vocab} (vLLM's default)")
    layers = layer.get("num_hidden_layers")
    if layers is None:
        indices = {int(m.group(1)) for name in tensors if (m := re.match(r"(?:model\.)?layers\.(\d+)\.", name))}
        layers = len(indices) or (1 if any(name.startswith("midlayer.") for name in tensors) else 0)
        if not layers:
            raise ModelReferenceError(f"{config_path}: {layer_prefix}num_hidden_layers is missing and the weights "
                                      "hold no decoder layer")
    layers = positive_int(layers, f"{config_path}: {layer_prefix}num_hidden_layers")

    lm_head = find_tensor(tensors, "lm_head.weight", directory)
    if lm_head is None:
        raise ModelReferenceError(f"{directory}: no lm_head.weight tensor (an EAGLE-3 head has its own output layer)")
    expect_shape(lm_head, (draft_vocab, hidden), directory, "draft_vocab_size x hidden_size")
    embed = find_tensor(tensors, "embed_tokens.weight", directory)
    expect_shape(embed, (vocab, hidden), directory, f"{layer_prefix}vocab_size x hidden_size")
    use_aux = (eagle_config or {}).get("use_aux_hidden_state", True)
    if not isinstance(use_aux, bool):
        raise ModelReferenceError(f"{config_path}: eagle_config.use_aux_hidden_state must be true or false")
    fc = find_tensor(tensors, "fc.weight", directory)
    if use_aux:
        if fc is None:
            raise ModelReferenceError(f"{directory}: no fc.weight tensor (EAGLE-3 projects the aux states with fc)")
        aux_count = len(ids) if ids else DEFAULT_AUX_LAYER_COUNT
        expected = (hidden, aux_count * target_hidden)
        if fc.shape != expected:
            named = (f"{len(ids)} aux layer ids" if ids else
                     f"no aux layer ids, so {DEFAULT_AUX_LAYER_COUNT} aux layers (vLLM's default)")
            raise ModelReferenceError(f"{directory / fc.file}: tensor {fc.name} has shape {list(fc.shape)}, expected "
                                      f"{list(expected)}: the config names {named} of width {target_hidden}")
    d2t = find_tensor(tensors, "d2t", directory)
    t2d = find_tensor(tensors, "t2d", directory)
    if d2t is not None:
        if d2t.dtype not in D2T_DTYPES or d2t.shape != (draft_vocab,):
            raise ModelReferenceError(f"{directory / d2t.file}: tensor {d2t.name} is {d2t.dtype} {list(d2t.shape)}, "
                                      f"expected int64 [{draft_vocab}] (one target-id offset per draft id)")
    if t2d is not None:
        if t2d.dtype not in T2D_DTYPES or t2d.shape != (vocab,):
            raise ModelReferenceError(f"{directory / t2d.file}: tensor {t2d.name} is {t2d.dtype} {list(t2d.shape)}, "
                                      f"expected bool [{vocab}] (a mask over the {layer_prefix}vocab_size ids)")
    name, architectures, fingerprint = verifier
    layer_type = layer.get("model_type") if isinstance(layer.get("model_type"), str) else None
    return HeadSpec(method="eagle3", layout=layout, path=str(directory.resolve()), hidden_size=hidden,
                    target_hidden_size=target_hidden, draft_vocab_size=draft_vocab, target_vocab_size=vocab,
                    aux_layer_ids=ids, num_heads=1, num_layers=layers, verifier_name_or_path=name,
                    verifier_architectures=architectures, verifier_fingerprint=fingerprint,
                    speculative_tokens=speculative_tokens, has_own_embeddings=embed is not None,
                    has_vocab_map=d2t is not None, tensors=tuple(sorted(tensors.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in tensors.values()})), layer_type=layer_type,
                    notes=tuple(notes))

