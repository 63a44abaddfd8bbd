"""Turn logits into the probabilities both draft and target sample from (gpt-fast style)."""

from __future__ import annotations


def logits_to_probs(logits, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None):
    """logits # [n, vocab] -> probs # [n, vocab] after temperature, top-k and top-p.

    Applied identically to target and draft, so the rejection rule compares like with like.
    Masked tokens get probability exactly 0 and can never be sampled.
    """
    import torch

    logits = logits.float() / max(float(temperature), 1e-5)
    vocab = logits.shape[-1]
    if top_k is not None and 0 < top_k < vocab:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token once the mass before it already reaches top_p; the top-1 is always kept
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, sorted_ids, sorted_logits)
    return torch.softmax(logits, dim=-1)


def sample(probs, generator=None):
    """probs # [n, vocab] -> token ids # [n], one draw per row, by the inverse of the running
    sum (float64; float32 on MPS): one uniform u per row, the first token whose running sum exceeds u x total.
    A token of probability 0 has an empty interval and is never drawn. (torch.multinomial draws
    one exponential per vocabulary entry per call on the CPU: over SmolLM2's 49152 tokens 2.2-2.8 ms
    a draw against 0.7 ms here on this project's 2-core machine under load; sampling is called for
    every drafted and every emitted token.)"""
    import torch

    # float64 where the device has it (MPS has none: float32 there)
    precision = torch.float32 if probs.device.type == "mps" else torch.float64
    cdf = probs.to(precision).cumsum(-1)  # [n, vocab]
    total = cdf[:, -1:]  # [n, 1]
    uniforms = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device, dtype=precision)
    ids = torch.searchsorted(cdf, uniforms * total, right=True).squeeze(-1)  # [n]
    # u x total can round up to the total itself: then the first token where the sum reaches it
    # (one of probability > 0)
    return torch.minimum(ids, (cdf < total).sum(-1))


def draft_token(logits, temperature: float, top_k=None, top_p=None, generator=None):
    """One drafted token from logits # [1, vocab] -> (token # [1], probs # [1, vocab] or None when
    greedy): what every drafter does per step, sampled under the same warping as the target."""
    if temperature > 0:
        probs = logits_to_probs(logits, temperature, top_k, top_p)  # [1, vocab]
        return sample(probs, generator), probs
    return logits.argmax(dim=-1), None
