"""The n-gram method (prompt lookup, vLLM `method: ngram`): no model, drafts are the continuation
of the longest earlier occurrence of the sequence's last tokens."""

from __future__ import annotations

from specreg.runtime.methods.base import DraftRequest, Method, PerRowDrafter, Proposal, point_mass_proposal


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
        max_model_len minus the sequence length; the decode loop caps k at the token budget before asking.
        """
        length = len(token_list)
        for n in range(min(self.prompt_lookup_max, length - 1), self.prompt_lookup_min - 1, -1):
            tail = token_list[length - n:]
            # earliest start first (vLLM keeps the last match in its reversed scan, ngram_proposer.py:263-265)
            for start in range(length - n):
                if token_list[start:start + n] == tail:
                    return token_list[start + n:start + n + k]
        return []

    def propose(self, request: DraftRequest) -> Proposal:
        """The lookup's continuation of request.token_list -> (draft_token_ids # [<=k], draft_probs
        # [<=k, vocab] point masses, or None when greedy)."""
        return point_mass_proposal(self.lookup(request.token_list, request.k), self.vocab_size, self.sampling, request.tokens.device)

    def rollback(self, valid_length: int, hidden_states=None) -> None:
        """Nothing cached: the lookup reads the verified sequence afresh each step."""


def load(target_path, draft_path, device, dtype, *, target_fingerprint=None, draft_fingerprint=None):
    """The target alone (draft_path is ignored: nothing but the sequence drafts) -> ModelPair."""
    from specreg.runtime.loading import load_target
    from specreg.runtime.pair import make_pair

    tokenizer, target = load_target(target_path, device, dtype, target_fingerprint)
    return make_pair(target, tokenizer)


def drafter(pair, configs, generators) -> PerRowDrafter:
    return PerRowDrafter([NgramDrafter(pair.vocab_size, c.prompt_lookup_min, c.prompt_lookup_max, c.temperature > 0)
                          for c in configs])


METHOD = Method(name="ngram", load=load, drafter=drafter)
