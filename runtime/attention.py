"""The runtime's attention: transformers' SDPA attention, with grouped-query attention kept inside
the kernel for a block of queries over a cache on CPU.

transformers' "sdpa" keeps grouped-query attention (GQA) inside the kernel only for one query
without a mask. A verification block (k+1 queries over the cache, under a causal mask) goes
through repeat_kv instead, which copies every cached key and value once per layer per forward.
On CPU, torch's SDPA takes the mask and the grouped heads together (enable_gqa): the same
attention without the copies, bit for bit. On the demo target a k+1 = 5 token verification
went from 1.29x to 1.18-1.22x the cost of a one-token step (A/B, 1 thread).
Elsewhere (one query, no mask, no GQA, or CUDA, whose masked kernels lack GQA and would fall
back to the math kernel) this is transformers' sdpa as is.
"""

from __future__ import annotations

NAME = "specreg_sdpa"


def specreg_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                 is_causal=None, **kwargs):
    """An AttentionInterface function: query # [b, heads, q, d], key/value # [b, kv_heads, kv, d]
    -> (output # [b, q, heads, d], None)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (query.device.type == "cpu" and getattr(module, "num_key_value_groups", 1) > 1
            and attention_mask is not None and query.shape[2] > 1
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and not kwargs.get("output_attentions", False)):
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
        return output.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def use_runtime_attention(model) -> None:
    """Switch a model that runs transformers' "sdpa" to specreg_sdpa (registered on first use);
    any other attention implementation is left as it is."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if can_set is None or not can_set():  # a model class outside transformers' AttentionInterface
        return
    # class-wide mappings (registering again is a no-op); without a mask function of its own
    # transformers would build no mask at all for a custom attention name
    AttentionInterface.register(NAME, specreg_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
