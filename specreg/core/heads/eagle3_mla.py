"""EAGLE-3 heads with DeepSeek (MLA) decoder layers, as vLLM 0.33 builds them
(Eagle3DeepseekV2ForCausalLM, registry.py:712-713): which configs it can run, what it reads of the
head's flags, and which tensors it loads.

What we followed (vLLM is the released 0.33.0 wheel):
- The layers' config is the head's config.json read by transformers' AutoConfig
  (config/speculative.py:1515-1531 wraps it in EAGLEConfig), so a field it omits has transformers'
  DeepseekV2Config / DeepseekV3Config default (DEFAULTS); other model types give no MLA fields and
  vLLM would build the attention with getattr(config, ..., 0) widths (deepseek_eagle3.py:64-77).
- deepseek_eagle3.py: layers.N has MLA attention over 2H inputs for the first layer (line 82), a
  dense silu MLP (lines 85-92; DeepseekV2MLP raises on another activation, deepseek_v2.py:279-282),
  input_layernorm, post_attention_layernorm and hidden_norm (lines 94-99); the model has fc,
  fc_norm.N (fc_norm), norm, embed_tokens and no input_norm (lines 152-226: norm_before_fc is
  never read); lm_head; d2t; t2d is skipped (lines 370-398). midlayer.* is layers.0.* (line 260).
  Its load_weights returns nothing, so vLLM's check that every parameter was loaded
  (model_loader/default_loader.py:520-571) does not run: a missing tensor is left unset, while a
  tensor no module has raises (models/utils.py:443 "There is no module or parameter named").
- DeepseekV2MLAAttention (deepseek_v2.py:1049-1113): q_a_proj [q_lora_rank, in], q_a_layernorm,
  q_b_proj [heads * (nope + rope), q_lora_rank] with q_lora_rank, else q_proj [heads * (nope +
  rope), in]; kv_a_proj_with_mqa [kv_lora_rank + rope, in]; kv_a_layernorm [kv_lora_rank];
  kv_b_proj [heads * (nope + v), kv_lora_rank]; o_proj [H, heads * v]; no biases.
- index_topk (DeepSeek sparse attention, deepseek_v2.py:1138) builds an Indexer whose
  wk_weights_proj reads hidden_size-wide inputs (lines 712-718), fed the first layer's 2H input
  (layers/mla.py:232-233).
"""

from __future__ import annotations

import re
from pathlib import Path

from specreg.core.heads.spec import HeadSpec
from specreg.errors import ModelReferenceError

# transformers' configuration_deepseek_v2.py / configuration_deepseek_v3.py defaults of what the layers read
_SHARED = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "qk_nope_head_dim": 128, "hidden_act": "silu"}
DEFAULTS = {"deepseek_v2": {**_SHARED, "intermediate_size": 11008, "num_attention_heads": 32},
            "deepseek_v3": {**_SHARED, "intermediate_size": 18432, "num_attention_heads": 128}}
EAGLE3_MODEL = "model_executor/models/deepseek_eagle3.py"


def mla_config_refusal(fields: dict, architecture: str) -> str | None:
    """Why vLLM 0.33 cannot run these DeepSeek layer fields as their head (None: it can)."""
    model_type = fields.get("model_type")
    if model_type not in DEFAULTS:
        return (f"model_type {model_type!r}: vLLM 0.33 builds {architecture}'s MLA layers from a DeepSeek config's "
                f"kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim ({EAGLE3_MODEL}:64-77), read by "
                f"model_type: {' or '.join(DEFAULTS)}")
    if "index_topk" in fields:
        return ("index_topk (DeepSeek sparse attention): vLLM 0.33 builds an Indexer reading hidden_size-wide inputs "
                "(model_executor/models/deepseek_v2.py:712-718, 1138) and feeds it the first EAGLE-3 layer's "
                "2 * hidden_size input (model_executor/layers/mla.py:232-233), so it cannot run this head")
    activation = fields.get("hidden_act", DEFAULTS[model_type]["hidden_act"])
    if activation != "silu":
        return (f"hidden_act {activation!r}: vLLM 0.33's DeepSeek EAGLE-3 MLP runs silu only "
                f"(model_executor/models/deepseek_v2.py:279-282 raises on another)")
    return None


# vLLM 0.33 builds every draft's ModelConfig through SpeculativeConfig.hf_config_override
# (config/speculative.py:1403-1428), which turns model_type deepseek_v3 into DeepSeek's MTP drafter
# (lines 749-763, architectures DeepSeekMTPModel) whatever the method; EAGLEConfig then names it
# Eagle3DeepSeekMTPModel (transformers_utils/configs/eagle.py:55-64), which its registry lacks.
MTP_REWRITTEN_MODEL_TYPES = ("deepseek_v3",)


def vllm_model_type_refusal(model_type: str | None, architecture: str) -> str | None:
    """Why vLLM 0.33 cannot build a DeepSeek-layer head whose config has ``model_type`` (None: it can)."""
    if model_type not in MTP_REWRITTEN_MODEL_TYPES:
        return None
    return (f"the head's config has model_type {model_type!r}: vLLM 0.33 rewrites every draft config of that "
            f"model_type into DeepSeek's MTP drafter (config/speculative.py:749-763, applied to drafts at 1403-1428) "
            f"and refuses it (\"Model architectures ['Eagle3DeepSeekMTPModel'] are not supported\"); it builds "
            f"{architecture} from model_type deepseek_v2 only")


def mla_ignored_flags(flags: dict) -> list[str]:
    """A warning for each norm flag the head's config sets that vLLM's DeepSeek class never reads."""
    if not flags.get("norm_before_fc"):
        return []
    return [f"norm_before_fc: the head's config sets it, but vLLM 0.33's Eagle3DeepseekV2ForCausalLM has no "
            f"input_norm and never reads the flag ({EAGLE3_MODEL}:152-226): vLLM, and specreg's runtime as it, "
            f"run fc on the un-normed aux states"]


def layer_shapes(fields: dict, layer: int, input_width: int) -> dict[str, tuple[int, ...]]:
    """The tensors vLLM loads for decoder layer `layer` of a DeepSeek head: name after the layer's
    prefix -> shape."""
    def get(key):  # the config's value (q_lora_rank null: no q LoRA), else transformers' default
        return fields[key] if key in fields else DEFAULTS[fields["model_type"]][key]

    hidden, heads = fields["hidden_size"], get("num_attention_heads")
    nope, rope, v_dim = get("qk_nope_head_dim"), get("qk_rope_head_dim"), get("v_head_dim")
    kv_rank, q_rank, intermediate = get("kv_lora_rank"), get("q_lora_rank"), get("intermediate_size")
    shapes = {"self_attn.kv_a_proj_with_mqa.weight": (kv_rank + rope, input_width),
              "self_attn.kv_a_layernorm.weight": (kv_rank,),
              "self_attn.kv_b_proj.weight": (heads * (nope + v_dim), kv_rank),
              "self_attn.o_proj.weight": (hidden, heads * v_dim),
              "mlp.gate_proj.weight": (intermediate, hidden), "mlp.up_proj.weight": (intermediate, hidden),
              "mlp.down_proj.weight": (hidden, intermediate),
              "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,)}
    if q_rank is not None:
        shapes.update({"self_attn.q_a_proj.weight": (q_rank, input_width), "self_attn.q_a_layernorm.weight": (q_rank,),
                       "self_attn.q_b_proj.weight": (heads * (nope + rope), q_rank)})
    else:
        shapes["self_attn.q_proj.weight"] = (heads * (nope + rope), input_width)
    if layer == 0:
        shapes["hidden_norm.weight"] = (hidden,)
    return shapes


MODEL_TENSORS = re.compile(r"(fc\.weight|fc_norm\.\d+\.weight|norm\.weight|lm_head\.weight|embed_tokens\.weight"
                           r"|d2t|t2d)")


def check_mla_tensors(head: HeadSpec, fields: dict, num_layers: int) -> None:
    """Raise ModelReferenceError naming the file and tensor when the head's tensors are not those
    vLLM 0.33 loads for its DeepSeek layers (fields: the layers' config; layer_shapes)."""
    directory = Path(head.path)
    tensors = {(f"layers.0.{t.name[len('midlayer.'):]}" if t.name.startswith("midlayer.") else t.name): t
               for t in head.tensors}
    hidden = fields["hidden_size"]
    for layer in range(num_layers):
        for name, shape in layer_shapes(fields, layer, 2 * hidden if layer == 0 else hidden).items():
            tensor = tensors.get(f"layers.{layer}.{name}")
            if tensor is None:
                raise ModelReferenceError(
                    f"{directory}: no tensor layers.{layer}.{name}: vLLM 0.33 builds it for the head's DeepSeek "
                    f"layer {layer} ({EAGLE3_MODEL}:38-99) and would leave it unset")
            if tensor.shape != shape:
                raise ModelReferenceError(
                    f"{directory / tensor.file}: tensor {tensor.name} has shape {list(tensor.shape)}, expected "
                    f"{list(shape)} (from the config's hidden_size, num_attention_heads, q_lora_rank, kv_lora_rank, "
                    f"qk_nope_head_dim, qk_rope_head_dim, v_head_dim, intermediate_size)")
    for name, tensor in tensors.items():
        match = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        # hidden_norm exists in every layer (vLLM leaves it unread after the first)
        known = (int(match.group(1)) < num_layers and match.group(2) in layer_shapes(fields, 0, hidden)
                 if match else MODEL_TENSORS.fullmatch(name) is not None)
        if not known:
            raise ModelReferenceError(
                f"{directory / tensor.file}: tensor {tensor.name}: vLLM 0.33's Eagle3DeepseekV2ForCausalLM has no "
                f"such parameter and refuses to load it (model_executor/models/utils.py:443 \"There is no module or "
                f"parameter named\"; its modules: {EAGLE3_MODEL}:38-226)")
