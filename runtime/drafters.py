"""Drafters propose k tokens past the current sequence; the target verifies them.

All keep the same small interface: propose(tokens, k) -> (draft_token_ids # [<=k],
draft_probs # [<=k, vocab] or None in greedy mode) and rollback(valid_length, hidden_states=None).
A drafter that reads the target's hidden states (head_drafter.HeadDrafter for EAGLE-3 heads,
eagle3.py, and MTP layers, mtp.py; medusa.MedusaDrafter) names them in `hidden_state_ids`; the
decode loop then hands it the kept positions' states after each verification. A tree drafter (Medusa, EAGLE-3 with a tree) proposes propose_tree(tokens, tree) ->
the tree's node tokens, root first.
make_drafter() builds the drafter of a method.
"""

from __future__ import annotations

from specreg.runtime.pair import forward_logits
from specreg.runtime.sampling import draft_token


class DraftModelDrafter:
    """A small causal LM decoding k tokens autoregressively with its own KV cache."""

    def __init__(self, model, vocab_size: int, temperature: float = 0.0, top_k=None, top_p=None,
                 generator=None):
        self.model = model
        self.vocab_size = vocab_size
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator = generator
        self.cache = None
        self.cached_length = 0  # tokens of the verified sequence whose keys/values are cached
        self.forwards = 0

    def propose(self, tokens, k: int):
        """tokens # [1, n] the verified sequence -> (draft_token_ids # [k], draft_probs # [k, vocab])."""
        import torch
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
        # feed what the cache lacks: the whole prompt at first, then 1 or 2 tokens per step
        next_input = tokens[:, self.cached_length:]
        draft_ids, draft_probs = [], []
        for _ in range(k):
            logits = forward_logits(self.model, next_input, self.cache)[0, :, : self.vocab_size]  # [1, vocab]
            self.forwards += 1
            token, probs = draft_token(logits, self.temperature, self.top_k, self.top_p, self.generator)  # [1]
            if probs is not None:
                draft_probs.append(probs)
            draft_ids.append(token)
            next_input = token.view(1, 1)
        self.cached_length = tokens.shape[1] + k - 1  # x_k itself was never fed
        probs = torch.cat(draft_probs) if draft_probs else None
        return torch.cat(draft_ids), probs

    def rollback(self, valid_length: int, hidden_states=None) -> None:
        """Drop cached positions past the first `valid_length` tokens of the new sequence."""
        if self.cache is not None and self.cached_length > valid_length:
            self.cache.crop(-(self.cached_length - valid_length))
            self.cached_length = valid_length


class NgramDrafter:
    """Prompt lookup as vLLM 0.33.0 proposes it (vllm/v1/spec_decode/ngram_proposer.py,
    _find_longest_matched_ngram_and_propose_tokens): the longest n in [prompt_lookup_min,
    prompt_lookup_max] whose last-n tokens occur earlier in the sequence (prompt and generated
    tokens alike), continued from its earliest occurrence.

    The draft distribution is a point mass on each proposed token, so sampling accepts x with
    probability p(x).
    """

    def __init__(self, vocab_size: int, prompt_lookup_min: int = 1, prompt_lookup_max: int = 3,
                 sampling: bool = False):
        self.vocab_size = vocab_size
        self.prompt_lookup_min, self.prompt_lookup_max = prompt_lookup_min, prompt_lookup_max
        self.sampling = sampling
        self.forwards = 0  # no model, kept for the metrics

    def lookup(self, token_list: list[int], k: int) -> list[int]:
        """The continuation (<= k tokens, fewer where the sequence ends first) of the earliest
        occurrence of the longest matching n-gram, or [] when no n >= prompt_lookup_min matches.

        An occurrence starts before the tail does (it may overlap it). vLLM also caps k at
        max_model_len minus the sequence length; decode.py caps k at the token budget before calling.
        """
        length = len(token_list)
        for n in range(min(self.prompt_lookup_max, length - 1), self.prompt_lookup_min - 1, -1):
            tail = token_list[length - n:]
            # earliest start first (vLLM keeps the last match in its reversed scan, ngram_proposer.py:263-265)
            for start in range(length - n):
                if token_list[start:start + n] == tail:
                    return token_list[start + n:start + n + k]
        return []

    def propose(self, tokens, k: int, token_list: list[int] | None = None):
        import torch

        if token_list is None:
            token_list = tokens[0].tolist()
        proposal = self.lookup(token_list, k)
        draft_ids = torch.tensor(proposal, dtype=torch.long, device=tokens.device)  # [<=k]
        if not self.sampling:
            return draft_ids, None
        draft_probs = torch.zeros(len(proposal), self.vocab_size, device=tokens.device)
        draft_probs[torch.arange(len(proposal)), draft_ids] = 1.0  # point mass q
        return draft_ids, draft_probs

    def rollback(self, valid_length: int, hidden_states=None) -> None:
        """Nothing cached: the lookup reads the verified sequence afresh each step."""


def make_drafter(pair, config, generator=None):
    """The drafter of config.method for `pair` (a ModelPair; pair.draft is the draft model for
    draft_model, the Eagle3Head for eagle3, the MedusaHeads for medusa, the MtpHead for mtp, unused for ngram). RuntimeConfigError when the pair
    lacks what the method needs."""
    from specreg.errors import RuntimeConfigError

    sampling = config.temperature > 0
    if config.method == "ngram":
        return NgramDrafter(pair.vocab_size, config.prompt_lookup_min, config.prompt_lookup_max, sampling)
    if config.method in ("eagle3", "mtp"):
        from specreg.runtime.eagle3 import Eagle3Head
        from specreg.runtime.head_drafter import HeadDrafter
        from specreg.runtime.mtp import MtpHead

        head_class, what = (Eagle3Head, "an EAGLE-3 head") if config.method == "eagle3" else \
            (MtpHead, "the target's MTP layers")
        if not isinstance(pair.draft, head_class):
            raise RuntimeConfigError(f"method {config.method!r} needs {what} "
                                     f"(load_pair(..., method={config.method!r}))")
        return HeadDrafter(pair.draft, pair.vocab_size, config.temperature, config.top_k, config.top_p, generator)
    if config.method == "medusa":
        from specreg.runtime.medusa import MedusaDrafter, MedusaHeads
        from specreg.runtime.tree import parse_tree

        if not isinstance(pair.draft, MedusaHeads):
            raise RuntimeConfigError("method 'medusa' needs Medusa heads (load_pair(..., method='medusa'))")
        return MedusaDrafter(pair.draft, parse_tree(config.tree), pair.vocab_size,
                             pair.target.config.num_hidden_layers, sampling)
    if pair.draft is None or not hasattr(pair.draft, "get_output_embeddings"):
        raise RuntimeConfigError(f"method {config.method!r} needs a draft model; none was given")
    return DraftModelDrafter(pair.draft, pair.vocab_size, config.temperature, config.top_k, config.top_p, generator)
