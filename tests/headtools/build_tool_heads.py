"""Build EAGLE-3 heads for a target with the training tools' own code, in a process whose import
path holds speculators 0.9.0 and nvidia-modelopt 0.47.0 (headtool_env.prepare_tools):

    python build_tool_heads.py TARGET_DIR OUT_DIR

writes OUT_DIR/<name>/ for each head and OUT_DIR/heads.json ({name: what made it}). The heads are
untrained (each tool's own initialisation): what the tests check is that specreg reads, registers
and runs each as vLLM would, and decodes exactly what the target decodes alone.
- speculators-defaults: the trainer's defaults (TrainConfig resolved with no option but the
  verifier: llama layer, norm_before_fc, norm_output, norm_before_residual, every draft layer
  sliding_attention with a 2048 window), built by its create_transformer_layer_config and
  Eagle3DraftModel.from_training_args, saved by save_pretrained;
- speculators-qwen3: the same with draft_arch qwen3, two layers and explicit target layer ids;
- modelopt: ModelOpt's EAGLE-3 (mtsp.convert with EAGLE3_DEFAULT_CFG, sized for the target) saved
  by export_speculative_decoding (export/plugins/hf_spec_export.py);
- speculators-converted: that ModelOpt export converted by speculators' Eagle3Converter, told the
  layers ModelOpt trained on as vLLM numbers them (ModelOpt's ids + 1).
Beside each speculators head, <name>.reference.safetensors (outside the head's folder): what
speculators' own Eagle3DraftModel.forward computes on random aux states and tokens for two
training-time-test steps (the lm_head logits of each; the second step reads the first step's
output, normed with norm_output, and the next tokens).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch


def vocab_maps(vocab: int):
    """Every other target id as the draft vocabulary -> (d2t, t2d, draft_vocab_size)."""
    ids = torch.arange(0, vocab, 2)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(len(ids)), t2d, len(ids)


def speculators_head(target: str, out: Path, **options) -> dict:
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config
    from speculators.train.config.schema import TrainConfig

    args = TrainConfig.from_flat({"speculator_type": "eagle3", "verifier_name_or_path": target, **options}).flatten()
    layer_config = create_transformer_layer_config(
        verifier_name_or_path=target, num_layers=args["num_layers"], draft_arch=args["draft_arch"],
        hidden_act=args["draft_hidden_act"], sliding_window=args["sliding_window"],
        full_attention_indices=args["full_attention_indices"], mrope_full_head_hack=args["draft_mrope_full_head_hack"])
    d2t, t2d, draft_vocab = vocab_maps(layer_config.vocab_size)
    args.update(draft_vocab_size=draft_vocab, draft_attn_impl="sdpa")  # flex attention needs a GPU to train
    torch.manual_seed(0)
    model = Eagle3DraftModel.from_training_args(layer_config, t2d=t2d, d2t=d2t, **args)
    model.save_pretrained(str(out))
    return {"tool": "speculators 0.9.0", "options": options,
            "resolved": {key: args[key] for key in ("draft_arch", "num_layers", "norm_before_fc", "norm_output",
                                                    "norm_before_residual", "sliding_window")}}


def reference_steps(directory: Path, steps: int = 2, length: int = 7) -> None:
    """speculators' own forward of the head in `directory` (sdpa attention: flex attention needs
    a GPU) -> <directory>.reference.safetensors {hidden, input_ids, logits_<step>}."""
    from safetensors.torch import save_file
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel

    config = Eagle3SpeculatorConfig.from_pretrained(str(directory))
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(str(directory), config=config).eval()
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as weights:
        saved = set(weights.keys())
    if "embed_tokens.weight" not in saved:
        # speculators takes the verifier's embeddings only where its own read as NaN (model.py
        # _load_verifier_weights), so by what uninitialised memory holds; vLLM shares the target's
        model._load_verifier_weights(overwrite_embed_tokens=True)
    aux = len(config.eagle_aux_hidden_state_layer_ids or [0, 0, 0])
    width = config.target_hidden_size or config.transformer_layer_config.hidden_size
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, length, aux * width, generator=generator)
    input_ids = torch.randint(0, config.transformer_layer_config.vocab_size, (1, length), generator=generator)
    logits = []
    hook = model.lm_head.register_forward_hook(lambda module, args, output: logits.append(output.detach().clone()))
    with torch.no_grad():
        model(hidden_states=hidden, input_ids=input_ids, document_ids=torch.zeros(1, length, dtype=torch.long),
              ttt_steps=steps)
    hook.remove()
    save_file({"hidden": hidden, "input_ids": input_ids, **{f"logits_{i}": x for i, x in enumerate(logits)}},
              str(directory.parent / f"{directory.name}.reference.safetensors"))


def modelopt_head(target: str, out: Path) -> dict:
    import modelopt.torch.speculative as mtsp
    from modelopt.torch.export import export_speculative_decoding
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    config = copy.deepcopy(mtsp.config.EAGLE3_DEFAULT_CFG["config"])
    base = model.config
    config["eagle_architecture_config"].update(
        hidden_size=base.hidden_size, intermediate_size=base.intermediate_size,
        num_attention_heads=base.num_attention_heads, num_key_value_heads=base.num_key_value_heads,
        head_dim=base.head_dim, max_position_embeddings=base.max_position_embeddings, torch_dtype="float32",
        vocab_size=base.vocab_size, draft_vocab_size=base.vocab_size)
    torch.manual_seed(0)
    mtsp.convert(model, [("eagle", config)])
    export_speculative_decoding(model, export_dir=str(out))
    return {"tool": "nvidia-modelopt 0.47.0"}


def converted_head(target: str, modelopt_dir: Path, out: Path) -> dict:
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    trained = json.loads((modelopt_dir / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    ids = [i + 1 for i in trained]  # ModelOpt names layer outputs, vLLM layer inputs
    Eagle3Converter().convert(modelopt_dir, out, base_model=target, validate=False,
                              eagle_aux_hidden_state_layer_ids=ids)
    return {"tool": "speculators 0.9.0 Eagle3Converter", "eagle_aux_hidden_state_layer_ids": ids}


def main(target: str, out: str) -> None:
    out_dir = Path(out)
    made = {"speculators-defaults": speculators_head(target, out_dir / "speculators-defaults"),
            "speculators-qwen3": speculators_head(target, out_dir / "speculators-qwen3", draft_arch="qwen3",
                                                  num_layers=2, target_layer_ids=[1, 4, 7]),
            "modelopt": modelopt_head(target, out_dir / "modelopt")}
    made["speculators-converted"] = converted_head(target, out_dir / "modelopt", out_dir / "speculators-converted")
    for name in ("speculators-defaults", "speculators-qwen3", "speculators-converted"):
        reference_steps(out_dir / name)
    (out_dir / "heads.json").write_text(json.dumps(made, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
