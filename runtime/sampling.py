"""Turn logits into the probabilities both draft and target sample from (gpt-fast style)."""

from __future__ import annotations

from typing import Any, NamedTuple


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


# How a chain drafter draws its token when the row is sampled (DecodeConfig.draft_sampling):
# "greedy" drafts the argmax and hands the rule a point mass on it (vLLM 0.33's default,
# SpeculativeConfig.draft_sample_method, vllm/config/speculative.py:634-640; SGLang 0.5.23's EAGLE
# top-1 with target-only verification and llama.cpp's argmax draft run the same rule);
# "probabilistic" samples the draft from q and hands the rule q itself (vLLM's opt-in).
DRAFT_SAMPLING = ("greedy", "probabilistic")


class DraftSampler(NamedTuple):
    """How one row draws its drafts: the target's warping (temperature 0: greedy row), its random
    generator (None when greedy) and the draft sampling of a sampled row (DRAFT_SAMPLING)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    generator: Any = None
    draft_sampling: str = "greedy"

    @classmethod
    def of(cls, config, generator) -> "DraftSampler":
        """A row's DecodeConfig and random generator -> its DraftSampler."""
        return cls(config.temperature, config.top_k, config.top_p, generator, config.draft_sampling)


def draft_token(logits, sampler: DraftSampler):
    """One drafted token from logits # [1, vocab] -> (token # [1], draft_probs # [1, vocab] or None
    for a greedy row): what every chain drafter does per step. A sampled row drafts the argmax with
    a point-mass q under "greedy" draft sampling, or a draw from q (the target's warping applied to
    the draft's logits, so the rule compares like with like) under "probabilistic"."""
    import torch

    if sampler.temperature <= 0:
        return logits.argmax(dim=-1), None
    if sampler.draft_sampling == "greedy":
        token = logits.argmax(dim=-1)  # [1]; the warping keeps the top-1, so this is q's mode too
        return token, torch.nn.functional.one_hot(token, logits.shape[-1]).float()  # point mass q
    probs = logits_to_probs(logits, sampler.temperature, sampler.top_k, sampler.top_p)  # [1, vocab]
    return sample(probs, sampler.generator), probs
