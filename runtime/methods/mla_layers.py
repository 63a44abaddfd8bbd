"""The DeepSeek decoder layers of an EAGLE-3 head (multi-head latent attention, MLA), computed as
vLLM 0.33 computes them for Eagle3DeepseekV2ForCausalLM / Eagle3DeepseekV3ForCausalLM
(runtime/methods/eagle3.py builds the head around them).

What we followed (vLLM is the released 0.33.0 wheel):
- model_executor/models/deepseek_eagle3.py:38-148: every layer's MLP is dense (DeepseekV2MLP, silu
  only: deepseek_v2.py:279-282), never MoE; the first layer's attention reads 2H inputs
  (input_size=2 * hidden_size, line 82), the later layers H.
- deepseek_v2.py:1000-1136 DeepseekV2MLAAttention and layers/mla.py:160-256 its forward: with
  q_lora_rank, q = q_b_proj(q_a_layernorm(q_a_proj(x))), else q = q_proj(x); kv_a_proj_with_mqa(x)
  splits into the latent kv_c (kv_lora_rank, normed by kv_a_layernorm) and k_pe (qk_rope_head_dim,
  one head shared by all); kv_b_proj(kv_c) splits per head into k_nope (qk_nope_head_dim) and v
  (v_head_dim); rope rotates the last qk_rope_head_dim of q and k_pe; o_proj over the heads' v.
  No projection has a bias. The softmax scale is qk_head_dim ** -0.5, times mscale ** 2 when the
  rope is deepseek_yarn (lines 1130-1136).
- The rope (deepseek_v2.py:1115-1127): is_neox_style=False, so pairs (x0, x1), (x2, x3), ... rotate
  together (layers/rotary_embedding/common.py ApplyRotaryEmb, base.py forward_static); any
  rope_type other than default becomes deepseek_yarn, or deepseek_llama_scaling when
  attention_factor is 1.0; both are DeepseekScalingRotaryEmbedding (rotary_embedding/__init__.py:
  284-312; deepseek_scaling_rope.py:48-113: YaRN's inv_freq over original_max_position_embeddings,
  beta_fast 32, beta_slow 1, cos/sin times yarn_get_mscale(factor, mscale) /
  yarn_get_mscale(factor, mscale_all_dim)); default is the plain rope over rope_theta.

The cache holds each entry's keys (k_nope + k_pe) and values per head, as transformers' cache layers
expect; the attention they give is vLLM's (its MLA kernels keep the latent, the same product).
This module imports torch at import time: import it lazily.
"""

from __future__ import annotations

import math

import torch
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP
from transformers.models.llama.modeling_llama import LlamaRMSNorm

# the config classes vLLM reads a DeepSeek head's config.json with (transformers' AutoConfig by model_type)
DEEPSEEK_CONFIGS = {"deepseek_v2": DeepseekV2Config, "deepseek_v3": DeepseekV3Config}


def yarn_get_mscale(scale: float, mscale: float) -> float:
    """vLLM's rotary_embedding/common.py:73-76."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_type(config) -> str:
    """The rope vLLM builds from the head's rope_parameters: default, deepseek_yarn or
    deepseek_llama_scaling (deepseek_v2.py:1115-1120)."""
    parameters = config.rope_parameters
    if parameters.get("rope_type", "default") == "default":
        return "default"
    return "deepseek_llama_scaling" if parameters.get("attention_factor") == 1.0 else "deepseek_yarn"


class MLARotaryEmbedding(torch.nn.Module):
    """position_ids # [b, n] -> (cos, sin) # [b, n, qk_rope_head_dim // 2], one angle per rotated pair."""

    def __init__(self, config):
        super().__init__()
        dim, parameters = config.qk_rope_head_dim, config.rope_parameters
        base = parameters.get("rope_theta", 10000)
        pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
        self.mscale = 1.0
        if rope_type(config) == "default":
            inv_freq = 1.0 / pos_freqs
        else:  # deepseek_scaling_rope.py:73-101
            factor = parameters["factor"]
            original = parameters["original_max_position_embeddings"]
            beta_fast, beta_slow = parameters.get("beta_fast", 32), parameters.get("beta_slow", 1)

            def correction_dim(rotations):  # common.py:34-42
                return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

            low = max(math.floor(correction_dim(beta_fast)), 0)
            high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
            if low == high:
                high += 0.001
            ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float) - low) / (high - low), 0, 1)
            extrapolated = 1 - ramp  # the share of each pair's frequency left as it is
            inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated
            self.mscale = float(yarn_get_mscale(factor, float(parameters.get("mscale", 1)))
                                / yarn_get_mscale(factor, float(parameters.get("mscale_all_dim", 0))))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)  # [b, n, dim // 2]
        return (freqs.cos() * self.mscale).to(x.dtype), (freqs.sin() * self.mscale).to(x.dtype)


def rotate_pairs(x, cos, sin):
    """x # [b, n, heads, d] with (x0, x1), (x2, x3), ... each rotated by one angle (vLLM's gptj style)."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


class MLAAttention(torch.nn.Module):
    """DeepseekV2MLAAttention over `input_size`-wide inputs, under the checkpoint's tensor names."""

    def __init__(self, config, layer_idx: int, input_size: int | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        heads, width = config.num_attention_heads, input_size or config.hidden_size
        self.heads, self.q_lora_rank, self.kv_lora_rank = heads, config.q_lora_rank, config.kv_lora_rank
        self.nope, self.rope, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        qk_head_dim = self.nope + self.rope
        if self.q_lora_rank is not None:
            self.q_a_proj = torch.nn.Linear(width, self.q_lora_rank, bias=False)
            self.q_a_layernorm = LlamaRMSNorm(self.q_lora_rank, eps=config.rms_norm_eps)
            self.q_b_proj = torch.nn.Linear(self.q_lora_rank, heads * qk_head_dim, bias=False)
        else:
            self.q_proj = torch.nn.Linear(width, heads * qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = torch.nn.Linear(width, self.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = LlamaRMSNorm(self.kv_lora_rank, eps=config.rms_norm_eps)
        self.kv_b_proj = torch.nn.Linear(self.kv_lora_rank, heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = torch.nn.Linear(heads * self.v_dim, config.hidden_size, bias=False)
        self.scaling = qk_head_dim ** -0.5
        if rope_type(config) == "deepseek_yarn":  # deepseek_v2.py:1130-1136
            parameters = config.rope_parameters
            mscale = yarn_get_mscale(parameters["factor"], float(parameters.get("mscale_all_dim", False)))
            self.scaling = self.scaling * mscale * mscale

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        """hidden_states # [b, n, in] -> (output # [b, n, H], None); the new keys and values join the
        cache given as `cache` or `past_key_values` (forward.cache_keyword: transformers' name for it)."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        batch, length = hidden_states.shape[:2]
        if self.q_lora_rank is not None:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        else:
            q = self.q_proj(hidden_states)
        q = q.view(batch, length, self.heads, self.nope + self.rope)  # [b, n, heads, qk]
        kv_c, k_pe = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(kv_c)).view(batch, length, self.heads, self.nope + self.v_dim)
        k_nope, value = kv.split([self.nope, self.v_dim], dim=-1)
        cos, sin = position_embeddings
        q_pe = rotate_pairs(q[..., self.nope:], cos, sin)
        k_pe = rotate_pairs(k_pe[:, :, None, :], cos, sin).expand(-1, -1, self.heads, -1)  # one head, shared
        query = torch.cat([q[..., :self.nope], q_pe], dim=-1).transpose(1, 2)  # [b, heads, n, qk]
        key = torch.cat([k_nope, k_pe], dim=-1).transpose(1, 2)
        value = value.transpose(1, 2)  # [b, heads, n, v]
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        attended = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                                    scale=self.scaling)
        return self.o_proj(attended.transpose(1, 2).reshape(batch, length, self.heads * self.v_dim)), None


class MLADecoderLayer(torch.nn.Module):
    """A head's DeepSeek layer after the first: pre-norm MLA and a dense MLP over the hidden state
    (vLLM's fused add + norm pairs give the same sums: deepseek_eagle3.py:132-148)."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.self_attn = MLAAttention(config, layer_idx)
        self.mlp = DeepseekV3MLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, position_embeddings=None,
                use_cache=True, **kwargs):
        """hidden_states # [b, n, H] -> the layer's output # [b, n, H]; the cache under either keyword."""
        attended, _ = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask, **kwargs)
        hidden_states = hidden_states + attended
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
