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
    """probs # [n, vocab] -> token ids # [n], one draw per row."""
    import torch

    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def draft_token(logits, temperature: float, top_k=None, top_p=None, generator=None):
    """One drafted token from logits # [1, vocab] -> (token # [1], probs # [1, vocab] or None when
    greedy): what every drafter does per step, sampled under the same warping as the target."""
    if temperature > 0:
        probs = logits_to_probs(logits, temperature, top_k, top_p)  # [1, vocab]
        return sample(probs, generator), probs
    return logits.argmax(dim=-1), None
