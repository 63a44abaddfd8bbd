"""forward_logits, the runtime's one cached forward, gives model()'s logits bit for bit."""

from __future__ import annotations

import pytest


def run_both(model, prompt_ids, blocks):
    """Prefill, then feed each block after cropping: (forward_logits outputs, model() outputs)."""
    import torch
    from transformers import DynamicCache

    from specreg.runtime.forward import cache_keyword, forward_logits

    ours, reference = [], []
    ours_cache, reference_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
    with torch.inference_mode():
        for crop, ids in [(0, prompt_ids)] + blocks:
            ids = torch.tensor([ids])  # [1, n]
            if crop:
                ours_cache.crop(-crop)
                reference_cache.crop(-crop)
            keep = min(3, ids.shape[1])
            ours.append(forward_logits(model, ids, ours_cache, keep))
            reference.append(model(input_ids=ids, **{cache_keyword(): reference_cache}, use_cache=True,
                                   logits_to_keep=keep).logits)
    return ours, reference


@pytest.mark.parametrize("hooked", [False, True])
def test_forward_logits_equals_model_call(target, hooked):
    from specreg.runtime.forward import is_plain_llama

    handle = target.register_forward_hook(lambda *args: None) if hooked else None
    try:
        assert is_plain_llama(target) is not hooked  # a hooked model takes the model() path
        # prefill; one token; a verification-shaped block over a cache; a block after a rollback
        ours, reference = run_both(target, [1, 17, 42, 99, 5, 23, 8], [(0, [31]), (0, [4, 60, 12, 9, 77]),
                                                                         (3, [50, 51])])
    finally:
        if handle is not None:
            handle.remove()
    for mine, theirs in zip(ours, reference):
        assert mine.shape == theirs.shape
        assert mine.equal(theirs)


def test_runtime_attention_equals_stock_sdpa_and_keeps_gqa_in_the_kernel(tiny_dir, target, monkeypatch):
    """load_model's attention (runtime/attention.py) gives stock sdpa's logits bit for bit, and
    a verification block over the cache runs grouped-query attention inside the kernel."""
    import torch
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(tiny_dir / "target", dtype=torch.float32).eval()
    assert stock.config._attn_implementation == "sdpa"
    assert target.config._attn_implementation == "specreg_sdpa"
    assert target.config.num_attention_heads > target.config.num_key_value_heads  # a GQA model

    sdpa = torch.nn.functional.scaled_dot_product_attention
    grouped_calls = []

    def spy(*args, **kwargs):
        if kwargs.get("enable_gqa") and kwargs.get("attn_mask") is not None:
            grouped_calls.append(args[0].shape)  # query # [b, heads, q, d]
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    blocks = [(0, [31]), (0, [4, 60, 12, 9, 77]), (3, [50, 51])]
    ours, _ = run_both(target, [1, 17, 42, 99, 5, 23, 8], blocks)
    layers = target.config.num_hidden_layers
    # the two blocks of more than one token over a cache, each through forward_logits and model();
    # the prefill (no mask: causal) and the single token take stock's paths
    assert [shape[2] for shape in grouped_calls] == [5] * 2 * layers + [2] * 2 * layers
    reference, _ = run_both(stock, [1, 17, 42, 99, 5, 23, 8], blocks)
    for mine, theirs in zip(ours, reference):
        assert mine.equal(theirs)


def test_runtime_attention_leaves_other_implementations_alone(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from specreg.runtime.attention import use_runtime_attention

    eager = AutoModelForCausalLM.from_pretrained(tiny_dir / "target", dtype=torch.float32,
                                                 attn_implementation="eager")
    use_runtime_attention(eager)
    assert eager.config._attn_implementation == "eager"
