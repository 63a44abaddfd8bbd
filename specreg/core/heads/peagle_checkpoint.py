"""P-EAGLE heads (speculators' `peagle`): an EAGLE-3 head trained to draft all k tokens of a step
in one forward, the k - 1 slots after the last verified token fed a mask token and a learned
hidden state in place of the target's. eagle3_checkpoint.read_speculators reads the EAGLE-3 part;
this module the fields parallel drafting adds and what vLLM 0.33 would refuse of them.

What we followed (vLLM is the released 0.33.0 wheel, speculators vllm-project/speculators main at
c05b95b):
- speculators models/peagle/config.py: PEagleSpeculatorConfig is Eagle3SpeculatorConfig with
  speculators_model_type "peagle", architectures ["PEagleSpeculator"] and mask_token_id (default
  None); models/peagle/core.py:43-51 adds the parameter mask_hidden # [1, 1, A * hidden_size]
  (A aux layers) and feeds it, through input_norm / fc_norm and fc, with mask_token_id's
  embedding at every depth past the first (core.py:108-135); from_training_args writes
  speculative_tokens = num_depths (default 8).
- vLLM transformers_utils/configs/speculators/algos.py:53-86 update_peagle: architectures
  PeagleLlamaForCausalLM / PeagleQwen3ForCausalLM (model_executor/models/registry.py:699, 706: the
  EAGLE-3 classes), norm_before_residual absent = false, norm_before_fc copied, fc_norm and
  norm_output not copied, pard_token = config_dict["mask_token_id"] (a KeyError without it);
  base.py:133-134 serves it as method eagle3 with parallel_drafting true.
- vLLM model_executor/models/llama_eagle3.py:347-353 (qwen3_eagle3.py:326-332) registers
  mask_hidden as a [1, fc_input_size] buffer and load_weights (llama_eagle3.py:420-455) copies the
  file's mask_hidden into it (a tensor of another size fails the copy) and raises without one;
  v1/spec_decode/llm_base_proposer.py:355-386 takes the placeholder token from mask_token_id or
  pard_token and projects mask_hidden with combine_hidden_states (llm_base_proposer.py:1402-1416).
- vLLM's weight loader raises on a tensor it has no parameter for (model_executor/models/
  utils.py:442-448): fc_norm.* weights, since update_peagle builds no fc_norm.
"""

from __future__ import annotations

import dataclasses
from math import prod
from pathlib import Path
from typing import Any

from specreg.core.heads.spec import HeadSpec, shown
from specreg.errors import ModelReferenceError

MASK_HIDDEN = "mask_hidden"  # the tensor's name in speculators' checkpoints and vLLM's loader


def read_peagle(spec: HeadSpec, config_path: Path, config: dict[str, Any]) -> HeadSpec:
    """The EAGLE-3 HeadSpec of a speculators `peagle` directory -> its P-EAGLE HeadSpec (method
    "peagle", parallel = {"mask_token_id"}). ModelReferenceError naming the file and field for
    what vLLM 0.33 could not load or would run otherwise than the head was trained."""
    directory = config_path.parent
    mask = config.get("mask_token_id")
    if mask is None:
        raise ModelReferenceError(f"{config_path}: mask_token_id is missing: vLLM 0.33 reads the token of the "
                                  "parallel-drafting slots from it (transformers_utils/configs/speculators/"
                                  "algos.py:83 config_dict[\"mask_token_id\"])")
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < spec.target_vocab_size:
        raise ModelReferenceError(f"{config_path}: mask_token_id {shown(mask)} is not a token id of the "
                                  f"{spec.target_vocab_size}-token vocabulary the head reads "
                                  "(transformer_layer_config.vocab_size, the target's)")
    tensor = spec.tensor(MASK_HIDDEN)
    if tensor is None:
        raise ModelReferenceError(f"{directory}: no {MASK_HIDDEN} tensor: vLLM 0.33 raises \"mask_hidden not found "
                                  "in weights\" for a parallel-drafting head (model_executor/models/"
                                  "llama_eagle3.py:450-455)")
    aux_count = len(spec.aux_layer_ids) if spec.aux_layer_ids else 3
    width = aux_count * spec.target_hidden_size
    if prod(tensor.shape) != width:
        raise ModelReferenceError(f"{directory / tensor.file}: tensor {MASK_HIDDEN} has shape {list(tensor.shape)}, "
                                  f"expected {width} values ({aux_count} aux states of width "
                                  f"{spec.target_hidden_size}): vLLM 0.33 copies it into a [1, {width}] buffer "
                                  "(model_executor/models/llama_eagle3.py:347-353, 440)")
    layer = config.get("transformer_layer_config") or {}
    if not layer.get("fc_norm") and any(t.name.startswith("fc_norm.") for t in spec.tensors):
        raise ModelReferenceError(f"{config_path}: the head carries fc_norm.* weights, but vLLM 0.33 reads no "
                                  "fc_norm for a peagle head (transformers_utils/configs/speculators/algos.py:53-86 "
                                  "copies only norm_before_fc), builds none and its weight loader raises on them "
                                  "(model_executor/models/utils.py:442-448)")
    return dataclasses.replace(spec, method="peagle", parallel={"mask_token_id": mask})
