"""Medusa heads: config.json `medusa_num_heads`, `medusa_num_layers` (default 1),
`base_model_name_or_path` (FasterDecoding/Medusa medusa/model/medusa_model.py MedusaConfig);
TGI reads medusa_lm_head.safetensors with head i = ResBlocks `{i}.{j}.linear.{weight,bias}`
(H x H) then `{i}.{medusa_num_layers}.weight` (vocab x H) (text-generation-inference
server/text_generation_server/layers/medusa.py, models/__init__.py); Medusa's training saves
exactly `medusa_head.state_dict()` there, and a whole-model save holds the same names under
`medusa_head.` (MedusaModel.medusa_head, medusa_model.py). vLLM 0.33 has no Medusa.
(Read from their GitHub sources.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specreg.core.heads.spec import HeadSpec, optional_str, positive_int, shown
from specreg.core.heads.tensors import expect_shape, list_weight_files, read_tensors
from specreg.errors import ModelReferenceError


def read_medusa(directory: Path, config_path: Path, config: dict[str, Any]) -> HeadSpec:
    heads = positive_int(config.get("medusa_num_heads"), f"{config_path}: medusa_num_heads")
    # MedusaConfig's default; medusa_num_layers = 0 would be a bare linear head per position
    layers_value = config.get("medusa_num_layers", 1)
    if isinstance(layers_value, bool) or not isinstance(layers_value, int) or layers_value < 0:
        raise ModelReferenceError(f"{config_path}: medusa_num_layers must be a non-negative integer, "
                                  f"got {shown(layers_value)}")
    name = optional_str(config.get("base_model_name_or_path"), f"{config_path}: base_model_name_or_path")
    tensors = read_tensors(list_weight_files(directory))
    prefix = "medusa_head." if any(n.startswith("medusa_head.") for n in tensors) else ""
    out = tensors.get(f"{prefix}0.{layers_value}.weight")
    if out is None or len(out.shape) != 2:
        raise ModelReferenceError(f"{directory}: no 2-D tensor {prefix}0.{layers_value}.weight (head 0's output "
                                  f"layer after {layers_value} ResBlock(s))")
    vocab, hidden = out.shape
    for head in range(heads):
        for block in range(layers_value):
            for suffix, shape in (("linear.weight", (hidden, hidden)), ("linear.bias", (hidden,))):
                tensor_name = f"{prefix}{head}.{block}.{suffix}"
                if tensor_name not in tensors:
                    raise ModelReferenceError(f"{directory}: no tensor {tensor_name} (medusa_num_heads = {heads}, "
                                              f"medusa_num_layers = {layers_value})")
                expect_shape(tensors[tensor_name], shape, directory, "a ResBlock of the target's hidden size")
        tensor_name = f"{prefix}{head}.{layers_value}.weight"
        if tensor_name not in tensors:
            raise ModelReferenceError(f"{directory}: no tensor {tensor_name} (medusa_num_heads = {heads})")
        expect_shape(tensors[tensor_name], (vocab, hidden), directory, "every head has the same output layer shape")
    notes = [] if "medusa_num_layers" in config else ["medusa_num_layers absent: 1 (MedusaConfig's default)"]
    return HeadSpec(method="medusa", layout="medusa", path=str(directory.resolve()), hidden_size=hidden,
                    target_hidden_size=hidden, draft_vocab_size=vocab, target_vocab_size=vocab, aux_layer_ids=None,
                    num_heads=heads, num_layers=layers_value, verifier_name_or_path=name, verifier_architectures=(),
                    verifier_fingerprint={}, speculative_tokens=heads, has_own_embeddings=False, has_vocab_map=False,
                    tensors=tuple(sorted(tensors.values(), key=lambda t: t.name)),
                    weight_files=tuple(sorted({t.file for t in tensors.values()})), notes=tuple(notes))

