"""forward_logits, the runtime's one cached forward, gives model()'s logits bit for bit."""

from __future__ import annotations

import pytest


def run_both(model, prompt_ids, blocks):
    """Prefill, then feed each block after cropping: (forward_logits outputs, model() outputs)."""
    import torch
    from transformers import DynamicCache

    from specreg.runtime.pair import forward_logits

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
            reference.append(model(input_ids=ids, cache=reference_cache, use_cache=True,
                                   logits_to_keep=keep).logits)
    return ours, reference


@pytest.mark.parametrize("hooked", [False, True])
def test_forward_logits_equals_model_call(target, hooked):
    from specreg.runtime.pair import is_plain_llama

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
