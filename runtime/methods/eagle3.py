"""EAGLE-3: a draft head reading the target's own hidden states, in each variant vLLM 0.33 serves
with Llama, Qwen3 or DeepSeek (MLA) decoder layers (specreg.core.heads.eagle3_variants says which a
directory holds; runtime.methods.mla_layers holds the MLA layers).

What we followed:
- vllm-project/speculators src/speculators/models/eagle3/{core,model_definitions,config}.py:
  the head's modules and saved names (fc, layers.0.* with q/k/v over 2H inputs and hidden_norm,
  norm, lm_head, d2t, t2d; embed_tokens optional), the first layer's forward (split
  cat([embeds, hidden]), input_layernorm on the embeddings, hidden_norm on the hidden state,
  the residual is the un-normed hidden unless norm_before_residual), input_norm over the 3H aux
  states when norm_before_fc, and the config fields (speculators_model_type "eagle3",
  transformer_layer_config, draft_vocab_size, eagle_aux_hidden_state_layer_ids,
  norm_before_residual, target_hidden_size). Training alignment (eagle3/data.py shift_batch):
  the head's entry for token x_{j} reads the target's state g_{j-1} and sits at position j.
- vLLM vllm/model_executor/models/llama_eagle3.py: the original EAGLE-3 layout's `midlayer.*`
  is `layers.0.*`; t2d is not needed to draft; target id = i + d2t[i] (logits scattered into the
  target vocabulary, -inf elsewhere); fc is (3 * target_hidden_size) -> hidden_size; the step
  after the first feeds the layers' pre-norm output (hidden_prenorm) back in, or the normed one with
  norm_output (aux_output, llama_eagle3.py:252-286); layers after the first are plain decoder
  layers over the hidden state; input_norm (norm_before_fc) or one RMSNorm per aux state (fc_norm)
  before fc; qwen3_eagle3.py: the same with Qwen3 layers (q_norm / k_norm); deepseek_eagle3.py: the
  same with MLA layers and dense MLPs, no input_norm (norm_before_fc is not read: lines 152-226).
  compute_logits multiplies the draft logits by the config's logit_scale before scattering them
  (LogitsProcessor(scale=logit_scale): llama_eagle3.py:328-336, layers/logits_processor.py:118-119);
  the proposer argmaxes them, or samples softmax(logits / temperature) (v1/spec_decode/
  llm_base_proposer.py:449-506, 1824-1855): the scale comes before the temperature.
- vLLM vllm/model_executor/models/llama.py: the aux states are `hidden_states + residual`
  entering layer idx (transformers' hidden_states[idx]); default (2, N // 2, N - 3).

This module imports torch at import time (its classes are nn.Modules): import it lazily.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

from specreg.core.heads.eagle3_checkpoint import default_aux_layer_ids  # vLLM's get_eagle3_aux_hidden_state_layers
from specreg.runtime.methods.mla_layers import DEEPSEEK_CONFIGS, MLAAttention, MLADecoderLayer, MLARotaryEmbedding
from specreg.errors import ModelReferenceError, RuntimeConfigError, RuntimeUnsupportedError
from specreg.runtime.forward import LAST_LAYER_OUTPUT, cache_keyword
from specreg.runtime.head_drafter import HeadDrafter, head_inputs
from specreg.runtime.methods.base import Method
from specreg.runtime.sampling import DraftSampler


# the decoder layers vLLM 0.33 builds for a head (specreg.core.heads.eagle3_variants): (its config class,
# by model_type for DeepSeek's; the layer after the first; the RMSNorm; the rotary embedding)
LAYER_CLASSES = {"llama": (LlamaConfig, LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding),
                 "qwen3": (Qwen3Config, Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding),
                 "deepseek_v2": (DEEPSEEK_CONFIGS, MLADecoderLayer, LlamaRMSNorm, MLARotaryEmbedding)}


@dataclass
class Eagle3Spec:
    """What the runtime reads from a head's config.json (speculators or original EAGLE layout)."""

    layer_config: object  # the head's decoder layers' config (LlamaConfig / Qwen3Config: hidden_size, vocab_size ...)
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...] | None  # None: the verifier's default, known once it is loaded
    target_hidden_size: int | None = None
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    head: object = None  # the specreg.core.heads.spec.HeadSpec read from the directory (None: built here)
    layer_kind: str = "llama"  # a key of LAYER_CLASSES
    fc_norm: bool = False  # one RMSNorm per aux state before fc
    norm_output: bool = False  # the next draft step reads the normed output (Eagle 3.1)
    sliding_window: int | None = None  # the layers attend within this many positions
    logit_scale: float = 1.0  # the draft logits are multiplied by it (vLLM's LogitsProcessor scale)


def layer_config(kind: str, fields: dict):
    """The config of a head's decoder layers of `kind` from its config fields. Layers named
    sliding_attention are built as full attention: the runtime's own masks cover every entry of
    the head's cache, and Eagle3Head refuses a position at or past the window instead."""
    config_class = LAYER_CLASSES[kind][0]
    if isinstance(config_class, dict):  # DeepSeek: eagle3_variants admits only the model types it names
        config_class = config_class[fields.get("model_type")]
    fields = {key: value for key, value in fields.items()
              if key not in ("model_type", "architectures", "draft_vocab_size", "eagle_config", "layer_types",
                             "sliding_window", "use_sliding_window", "max_window_layers", "logit_scale")}
    return config_class(**fields)


def read_eagle3_config(path, method: str = "eagle3") -> Eagle3Spec:
    """A head directory -> Eagle3Spec. What registration reads (layout, draft vocabulary, aux layer
    ids, target hidden size, tensor shapes) comes from specreg.core.heads.read_head, the one reader of
    the layouts (ModelReferenceError naming the file and field); the layers and flags as vLLM 0.33
    builds them from specreg.core.heads.eagle3_variants.read_eagle3_variant, its layer tensors checked
    as registration checks them."""
    from specreg.core.heads import read_head
    from specreg.core.heads.eagle3_variants import read_eagle3_variant

    head = read_head(path, method=method)
    variant = read_eagle3_variant(path)
    variant.check_tensors(head)
    return Eagle3Spec(layer_config=layer_config(variant.layer_kind, variant.layer_fields),
                      draft_vocab_size=head.draft_vocab_size, aux_layer_ids=head.aux_layer_ids,
                      target_hidden_size=head.target_hidden_size, norm_before_residual=variant.norm_before_residual,
                      norm_before_fc=variant.norm_before_fc, head=head, layer_kind=variant.layer_kind,
                      fc_norm=variant.fc_norm, norm_output=variant.norm_output, sliding_window=variant.sliding_window,
                      logit_scale=variant.logit_scale)


class Eagle3FirstLayerMixin:
    """A decoder layer whose q/k/v read cat([norm(embeds), hidden_norm(hidden)]) # [.., 2H]."""

    def __init__(self, config, norm_before_residual: bool = False):
        super().__init__(config, layer_idx=0)
        self.widen_attention(config)
        self.hidden_norm = type(self.input_layernorm)(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def widen_attention(self, config):
        """q/k/v over 2H inputs (Llama's and Qwen3's attention)."""
        hidden, head_dim, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.self_attn.q_proj = torch.nn.Linear(2 * hidden, config.num_attention_heads * head_dim, bias=bias)
        self.self_attn.k_proj = torch.nn.Linear(2 * hidden, config.num_key_value_heads * head_dim, bias=bias)
        self.self_attn.v_proj = torch.nn.Linear(2 * hidden, config.num_key_value_heads * head_dim, bias=bias)

    def forward(self, embeds, hidden, attention_mask, position_embeddings, cache):
        """embeds, hidden # [1, n, H] -> the layer's output (pre-norm) # [1, n, H]."""
        residual = hidden
        hidden = self.hidden_norm(hidden)
        if self.norm_before_residual:
            residual = hidden
        attention_input = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)  # [1, n, 2H]
        attended, _ = self.self_attn(hidden_states=attention_input, position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, **{cache_keyword(): cache})
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3FirstLayer(Eagle3FirstLayerMixin, LlamaDecoderLayer):
    """The first layer of a head with Llama layers."""


class Eagle3Qwen3FirstLayer(Eagle3FirstLayerMixin, Qwen3DecoderLayer):
    """The first layer of a head with Qwen3 layers (q_norm / k_norm over each attention head)."""


class Eagle3MLAFirstLayer(Eagle3FirstLayerMixin, MLADecoderLayer):
    """The first layer of a head with DeepSeek layers: MLA over 2H inputs (deepseek_eagle3.py:82)."""

    def widen_attention(self, config):
        self.self_attn = MLAAttention(config, 0, input_size=2 * config.hidden_size)


FIRST_LAYERS = {"llama": Eagle3FirstLayer, "qwen3": Eagle3Qwen3FirstLayer, "deepseek_v2": Eagle3MLAFirstLayer}


class Eagle3Head(torch.nn.Module):
    """The head's modules under the speculators names; embed_tokens is the target's unless the
    checkpoint ships its own (vLLM shares it the same way)."""

    def __init__(self, spec: Eagle3Spec, aux_layer_ids: tuple[int, ...], target_vocab_size: int,
                 target_hidden_size: int, embed_tokens=None, target_layers: int | None = None):
        """target_layers: the target's layer count, for an aux id N (its last layer's output)."""
        super().__init__()
        self.target_layers = target_layers
        config = spec.layer_config
        config._attn_implementation = "sdpa"
        self.config = config
        self.aux_layer_ids = tuple(aux_layer_ids)
        _, layer_class, norm_class, rotary_class = LAYER_CLASSES[spec.layer_kind]
        hidden = config.hidden_size
        aux_width = len(self.aux_layer_ids) * target_hidden_size
        self.input_norm = norm_class(aux_width, eps=config.rms_norm_eps) if spec.norm_before_fc else None
        # vLLM 0.33 sizes each of these for target_hidden_size (llama_eagle3.py combine_hidden_states)
        self.fc_norm = torch.nn.ModuleList([norm_class(target_hidden_size, eps=config.rms_norm_eps)
                                            for _ in self.aux_layer_ids]) if spec.fc_norm else None
        self.fc = torch.nn.Linear(aux_width, hidden, bias=False)
        # layers after the first are plain decoder layers over the hidden state alone, as in vLLM
        later = [layer_class(config, index) for index in range(1, config.num_hidden_layers)]
        self.layers = torch.nn.ModuleList([FIRST_LAYERS[spec.layer_kind](config, spec.norm_before_residual), *later])
        self.norm = norm_class(hidden, eps=config.rms_norm_eps)
        self.norm_output = spec.norm_output
        self.layer_kind = spec.layer_kind
        self.sliding_window = spec.sliding_window
        self.lm_head = torch.nn.Linear(hidden, spec.draft_vocab_size, bias=False)
        self.logit_scale = spec.logit_scale
        self.rotary_emb = rotary_class(config)
        self.embed_tokens = embed_tokens if embed_tokens is not None else torch.nn.Embedding(target_vocab_size, hidden)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(target_vocab_size, dtype=torch.bool))
        self.target_vocab_size = target_vocab_size

    def project(self, aux_hidden):
        """The target's aux states # [1, n, A*H_target] -> the head's input hidden # [1, n, H]."""
        if self.input_norm is not None:
            aux_hidden = self.input_norm(aux_hidden)
        if self.fc_norm is not None:
            chunks = aux_hidden.chunk(len(self.fc_norm), dim=-1)
            aux_hidden = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(aux_hidden)

    def forward(self, input_ids, hidden, cache, start_position: int, attention_mask=None, position_ids=None):
        """input_ids # [1, n], hidden # [1, n, H] at positions start_position.. -> pre-norm # [1, n, H].

        attention_mask: None builds the causal mask of a block over the cache (training and tree
        drafting pass their own); position_ids # [1, n]: positions other than consecutive ones (tree
        nodes of one depth share theirs).
        """
        position_ids, position_embeddings, attention_mask = head_inputs(
            self.rotary_emb, hidden, cache, start_position, input_ids.shape[1], attention_mask, position_ids)
        if self.sliding_window is not None and int(position_ids.max()) >= self.sliding_window:
            raise RuntimeUnsupportedError(
                f"the head's layers attend within a sliding window of {self.sliding_window} positions (vLLM 0.33 "
                f"models/llama.py:185-204); this runtime attends to all of them, so it drafts only below position "
                f"{self.sliding_window}, and this sequence reaches {int(position_ids.max())}")
        hidden = self.layers[0](self.embed_tokens(input_ids), hidden, attention_mask, position_embeddings, cache)
        for layer in self.layers[1:]:
            hidden = layer(hidden, attention_mask=attention_mask, position_ids=position_ids,
                           position_embeddings=position_embeddings, use_cache=True, **{cache_keyword(): cache})
        return hidden

    # what head_drafter.HeadDrafter needs beside forward and draft_logits
    position_shift = 0  # the entry of token x_j sits at position j

    @property
    def hidden_state_ids(self) -> tuple[int, ...]:
        """forward.forward_logits' indices of the aux states: id N is the last layer's output before
        the final norm (vLLM's), not transformers' normed hidden_states[N]."""
        return tuple(LAST_LAYER_OUTPUT if i == self.target_layers else i for i in self.aux_layer_ids)

    def seed_input(self, aux_hidden):
        return self.project(aux_hidden)

    def file_weights(self, weights: dict) -> dict:
        """A checkpoint's tensors by name -> those load_state_dict takes (a subclass reshapes its own)."""
        return weights

    def recycle(self, output):
        """The next draft step reads the layers' pre-norm output as is (vLLM: hidden_prenorm), or the
        normed one with norm_output (llama_eagle3.py: aux_output)."""
        return self.norm(output) if self.norm_output else output

    def draft_logits(self, hidden):
        """Pre-norm hidden # [n, H] -> logits over the target vocabulary # [n, V_target], scaled by
        logit_scale, -inf off the draft vocabulary (target id = i + d2t[i]), as vLLM's compute_logits."""
        logits = self.lm_head(self.norm(hidden))  # [n, V_draft]
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        full = logits.new_full((logits.shape[0], self.target_vocab_size), float("-inf"))
        full[:, torch.arange(logits.shape[1], device=logits.device) + self.d2t] = logits
        return full


def check_head_fits(spec: Eagle3Spec, target_config, target_vocab_size: int, name: str) -> tuple:
    """RuntimeConfigError / HeadMismatchError with a one-line reason when this runtime cannot draft
    for the loaded target with the head; else the aux layer ids to collect, in vLLM's order. The
    head's own consistency (tensor shapes against its config) was checked by read_head; its
    vocabulary map by specreg.core.heads.vocabulary.check_vocab_fit, as at registration. Runs on the config
    and tensor headers only, before any forward pass."""
    from specreg.core.heads.vocabulary import check_vocab_fit

    num_layers, target_hidden = target_config.num_hidden_layers, target_config.hidden_size
    ids = spec.aux_layer_ids if spec.aux_layer_ids is not None else default_aux_layer_ids(num_layers)
    if len(set(ids)) != len(ids):  # the target's default on 4..6 layers (a declared repeat is refused earlier)
        raise RuntimeConfigError(f"{name}: the head names no aux layer ids and the target's default {list(ids)} "
                                 f"names a layer twice on a {num_layers}-layer target: vLLM collects each layer once "
                                 f"and the head's fc, sized for {len(ids)} states, cannot read them")
    # vLLM 0.33 collects the aux states in layer order, each once (interfaces.py
    # _set_aux_hidden_state_layers: tuple(sorted(set(layers)))): fc reads them in that order
    ids = tuple(sorted(set(ids)))
    bad = [i for i in ids if not 0 <= i <= num_layers]
    if not ids or bad:
        raise RuntimeConfigError(f"{name}: eagle_aux_hidden_state_layer_ids {list(ids)} out of range on a "
                                 f"{num_layers}-layer target (each must be in 0..{num_layers})")
    # fc reads as many states as fc.weight is wide (read_head checked it against the ids fed here), even
    # where vLLM 0.33 sizes fc for another count (eagle3_variants.Eagle3Variant.fc_width_refusal): vLLM
    # never serves such a head otherwise, its weight loader stops at fc (layers/linear.py:404-412), so
    # the tensors' reading is the only one an engine runs (SGLang and TensorRT-LLM size fc from the ids
    # their exports give them); registration warns and the vLLM exports refuse it
    declared = spec.target_hidden_size or spec.layer_config.hidden_size
    if declared != target_hidden:
        raise RuntimeConfigError(f"{name}: head is for hidden size {declared} (fc reads {len(ids)} aux states of "
                                 f"that width), target hidden_size is {target_hidden}")
    if spec.head.has_own_embeddings and spec.layer_config.vocab_size != target_vocab_size:
        raise RuntimeConfigError(f"{name}: embed_tokens has {spec.layer_config.vocab_size} rows, the target "
                                 f"vocabulary {target_vocab_size}")
    check_vocab_fit(spec.head, target_vocab_size)
    return ids


def load_eagle3_head(path, target, device=None, dtype=None, *, method: str = "eagle3", head_class=None) -> Eagle3Head:
    """An EAGLE-3 head directory (config.json + *.safetensors) checked against `target` -> Eagle3Head
    (or head_class, a subclass, for the `method` registered on such heads) in eval mode on the
    target's device and dtype. Raises RuntimeConfigError before any forward."""
    from safetensors.torch import load_file

    path = Path(path)
    spec = read_eagle3_config(path, method)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelReferenceError(f"{path}: no *.safetensors weights (pickle weights are refused)")
    weights = {}
    for file in files:
        for key, value in load_file(file).items():
            weights[key.replace("midlayer.", "layers.0.", 1) if key.startswith("midlayer.") else key] = value
    target_vocab = int(target.get_output_embeddings().weight.shape[0])
    ids = check_head_fits(spec, target.config, target_vocab, str(path))
    parameter = next(target.parameters())
    embed = None if "embed_tokens.weight" in weights else target.get_input_embeddings()
    head = (head_class or Eagle3Head)(spec, ids, target_vocab, target.config.hidden_size, embed_tokens=embed,
                                      target_layers=target.config.num_hidden_layers)
    weights = head.file_weights(weights)
    if spec.layer_kind == "deepseek_v2":  # vLLM builds a hidden_norm in every DeepSeek layer and reads the first's
        weights = {key: value for key, value in weights.items()
                   if not (key.endswith(".hidden_norm.weight") and not key.startswith("layers.0."))}
    weights["d2t"] = weights.get("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long)).long()
    if "t2d" not in weights:  # drafting never reads it (vLLM skips it); kept for a faithful round trip
        weights["t2d"] = torch.zeros(target_vocab, dtype=torch.bool)
        weights["t2d"][torch.arange(spec.draft_vocab_size) + weights["d2t"]] = True
    weights["t2d"] = weights["t2d"].bool()
    expected = set(head.state_dict()) - ({"embed_tokens.weight"} if embed is not None else set())
    missing, unexpected = expected - set(weights), set(weights) - expected - {"embed_tokens.weight"}
    if missing or unexpected:
        raise RuntimeConfigError(f"{path}: head weights do not match the EAGLE-3 layout: missing "
                                 f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    head.load_state_dict(weights, strict=False)
    return head.to(device=device or parameter.device, dtype=dtype or parameter.dtype).eval()


def new_eagle3_head(target, draft_token_ids=None, aux_layer_ids=None, seed: int = 0,
                    intermediate_size: int | None = None, *, layer_kind: str = "llama", num_layers: int = 1,
                    norm_before_fc: bool = False, fc_norm: bool = False, norm_output: bool = False,
                    norm_before_residual: bool = False, layer_fields: dict | None = None, head_class=None,
                    logit_scale: float = 1.0, **head_options) -> Eagle3Head:
    """A freshly initialised head for `target` (its shape, `num_layers` decoder layers of
    `layer_kind`, its embeddings shared), with the norm flags and logit_scale given; head_class (a subclass) built
    with head_options for a method drafting with such heads. layer_fields: config fields of the
    layers beside the target's shape (DeepSeek's: model_type, q_lora_rank, kv_lora_rank, the head dims,
    rope_parameters).

    draft_token_ids: the target ids of the draft vocabulary (any order; stored sorted, so d2t >= 0
    as in EAGLE-3's frequency-selected vocabularies); None drafts over the whole vocabulary.
    """
    config = target.config
    target_vocab = int(target.get_output_embeddings().weight.shape[0])
    ids = sorted(set(int(i) for i in draft_token_ids)) if draft_token_ids is not None else list(range(target_vocab))
    fields = dict(hidden_size=config.hidden_size, intermediate_size=intermediate_size or config.intermediate_size,
                  num_hidden_layers=num_layers, num_attention_heads=config.num_attention_heads,
                  num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
                  rms_norm_eps=config.rms_norm_eps, vocab_size=target_vocab,
                  max_position_embeddings=config.max_position_embeddings,
                  rope_parameters=dict(config.rope_parameters),
                  bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                  pad_token_id=config.pad_token_id, tie_word_embeddings=False,
                  **({"model_type": "deepseek_v2"} if layer_kind == "deepseek_v2" else {}))
    fields.update(layer_fields or {})
    spec = Eagle3Spec(layer_config=layer_config(layer_kind, fields), draft_vocab_size=len(ids), aux_layer_ids=None,
                      layer_kind=layer_kind, norm_before_fc=norm_before_fc, fc_norm=fc_norm, norm_output=norm_output,
                      norm_before_residual=norm_before_residual, logit_scale=logit_scale)
    aux = tuple(aux_layer_ids) if aux_layer_ids is not None else default_aux_layer_ids(config.num_hidden_layers)
    aux = tuple(sorted(set(aux)))  # the order vLLM collects them in (check_head_fits)
    torch.manual_seed(seed)
    head = (head_class or Eagle3Head)(spec, aux, target_vocab, config.hidden_size,
                                      embed_tokens=target.get_input_embeddings(),
                                      target_layers=config.num_hidden_layers, **head_options)
    draft_to_target = torch.tensor(ids, dtype=torch.long)
    head.d2t.copy_(draft_to_target - torch.arange(len(ids)))
    head.t2d.zero_()
    head.t2d[draft_to_target] = True
    parameter = next(target.parameters())
    return head.to(device=parameter.device, dtype=parameter.dtype)


def save_eagle3_head(head: Eagle3Head, directory, verifier_name_or_path: str, verifier_architectures=(),
                     speculative_tokens: int = 3) -> Path:
    """Write `head` as a speculators-format EAGLE-3 directory (config.json + model.safetensors;
    the target's embeddings are not saved: vLLM shares them when embed_tokens is absent). A head
    with DeepSeek layers is written in the original layout (the layers' config at the top level,
    architectures Eagle3DeepseekV3ForCausalLM, the ids at the top level as layer inputs): vLLM 0.33
    reads speculators heads with llama or qwen3 layers only (transformers_utils/configs/speculators/
    algos.py update_eagle3)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().contiguous().cpu() for key, value in head.state_dict().items()
             if key != "embed_tokens.weight"}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    layer = head.config.to_dict()
    for key in ("_attn_implementation", "_attn_implementation_internal", "architectures", "dtype", "torch_dtype",
                "transformers_version", "output_attentions", "output_hidden_states", "return_dict"):
        layer.pop(key, None)
    flags = {"norm_before_residual": bool(head.layers[0].norm_before_residual), "fc_norm": head.fc_norm is not None,
             "norm_output": bool(head.norm_output)}
    if head.logit_scale != 1.0:  # vLLM reads it with the layers' fields (a speculators head's transformer_layer_config)
        layer["logit_scale"] = head.logit_scale
    if head.layer_kind == "deepseek_v2":
        config = {**layer, "architectures": ["Eagle3DeepseekV3ForCausalLM"], **flags,
                  "draft_vocab_size": int(head.lm_head.weight.shape[0]),
                  "eagle_aux_hidden_state_layer_ids": list(head.aux_layer_ids)}
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return directory
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": int(head.lm_head.weight.shape[0]),
        "eagle_aux_hidden_state_layer_ids": list(head.aux_layer_ids),
        "norm_before_residual": bool(head.layers[0].norm_before_residual),
        "norm_before_fc": head.input_norm is not None,
        "fc_norm": head.fc_norm is not None,
        "norm_output": bool(head.norm_output),
        "target_hidden_size": None,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": str(verifier_name_or_path), "architectures": list(verifier_architectures)},
        },
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def load(target_path, draft_path, device, dtype, *, target_fingerprint=None, draft_fingerprint=None):
    """The target and the EAGLE-3 head in draft_path, checked against it before any forward
    (check_head_fits) -> ModelPair. A head's weights are not re-checked against draft_fingerprint
    here (registration binds them, specreg.core.heads)."""
    from specreg.runtime.loading import load_target
    from specreg.runtime.pair import ModelPair, output_vocab_size

    tokenizer, target = load_target(target_path, device, dtype, target_fingerprint)
    if draft_path is None:
        raise RuntimeConfigError("method 'eagle3' needs the EAGLE-3 head's directory")
    return ModelPair(target=target, tokenizer=tokenizer, draft=load_eagle3_head(draft_path, target),
                     vocab_size=output_vocab_size(target))


def drafter(pair, configs, generators):
    """One HeadDrafter for the batch: each head forward serves every row."""
    if not isinstance(pair.draft, Eagle3Head):
        raise RuntimeConfigError("method 'eagle3' needs an EAGLE-3 head (load_pair(..., method='eagle3'))")
    return HeadDrafter(pair.draft, pair.vocab_size, [DraftSampler.of(c, generator)
                                                     for c, generator in zip(configs, generators)])


METHOD = Method(name="eagle3", load=load, drafter=drafter)
