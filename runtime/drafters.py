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
    """A small causal LM decoding k tokens autoregressively with its own KV cache, for many rows at
    once (one RowCache; each row its own sampling settings and random generator, drawn from in the
    order one row alone would). The single-row interface (propose / rollback) is the batch of one."""

    def __init__(self, model, vocab_size: int, temperature: float = 0.0, top_k=None, top_p=None,
                 generator=None, *, rows: list[tuple] | None = None):
        """rows: (temperature, top_k, top_p, generator) per row; default one row of the arguments."""
        self.model = model
        self.vocab_size = vocab_size
        self.rows = list(rows) if rows is not None else [(temperature, top_k, top_p, generator)]
        self.cache = None
        self.cached_lengths = [0] * len(self.rows)  # per row: verified tokens whose keys/values are cached
        self.forwards = 0
        self.last_forwards = [0] * len(self.rows)  # per row: forwards it took part in at the last propose

    def propose_rows(self, tokens: list, token_lists: list, ks: list[int], trees=None) -> list[tuple]:
        """tokens: per row the verified sequence # [1, n_r]; ks: drafts wanted per row (0: none) ->
        per row (draft_token_ids # [k_r], draft_probs # [k_r, vocab] or None when greedy)."""
        import torch

        from specreg.runtime.row_cache import RowCache

        device = tokens[0].device
        if self.cache is None:
            self.cache = RowCache(self.model.config, len(self.rows), device)
        # the first forward feeds what each row's cache lacks (the prompt at first, then 1 or 2
        # tokens), right-aligned; then one token per row still drafting
        new = [row_tokens[0, self.cached_lengths[r]:] if ks[r] > 0 else row_tokens[0, :0]
               for r, row_tokens in enumerate(tokens)]
        width = max(piece.shape[0] for piece in new)
        input_ids = torch.zeros(len(new), width, dtype=torch.long, device=device)  # [b, width]
        query_valid = torch.zeros(len(new), width, dtype=torch.bool, device=device)
        offsets = torch.zeros(len(new), width, dtype=torch.long, device=device)
        for r, piece in enumerate(new):
            if piece.shape[0]:
                input_ids[r, width - piece.shape[0]:] = piece
                query_valid[r, width - piece.shape[0]:] = True
                offsets[r, width - piece.shape[0]:] = torch.arange(piece.shape[0], device=device)
        draft_ids = [[] for _ in new]
        draft_probs = [[] for _ in new]
        self.last_forwards = [0] * len(new)
        for index in range(max(ks)):
            logits = self.cache.forward(self.model, input_ids, query_valid, offsets)[:, -1, : self.vocab_size]  # [b, vocab]
            self.cache.keep(query_valid)
            self.forwards += 1
            for r, (temperature, top_k, top_p, generator) in enumerate(self.rows):
                if index < ks[r]:
                    self.last_forwards[r] += 1
                    token, probs = draft_token(logits[r:r + 1], temperature, top_k, top_p, generator)  # [1]
                    draft_ids[r].append(token)
                    if probs is not None:
                        draft_probs[r].append(probs)
            query_valid = torch.tensor([[index + 1 < k] for k in ks], dtype=torch.bool, device=device)  # [b, 1]
            input_ids = torch.stack([ids[-1] if ids else torch.zeros(1, dtype=torch.long, device=device)
                                     for ids in draft_ids])  # [b, 1]
            offsets = torch.zeros(len(new), 1, dtype=torch.long, device=device)
        proposals = []
        for r, k in enumerate(ks):
            if k > 0:
                self.cached_lengths[r] = tokens[r].shape[1] + k - 1  # x_k itself was never fed
            proposals.append((torch.cat(draft_ids[r]) if draft_ids[r] else torch.empty(0, dtype=torch.long, device=device),
                              torch.cat(draft_probs[r]) if draft_probs[r] else None))
        return proposals

    def rollback_rows(self, valid_lengths: list[int], hidden_states=None) -> None:
        """Drop each row's cached positions past the first valid_lengths[r] tokens of its sequence."""
        if self.cache is None:
            return
        self.cached_lengths = [min(cached, valid) for cached, valid in zip(self.cached_lengths, valid_lengths)]
        self.cache.truncate(self.cached_lengths)

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (the others finished)."""
        self.rows = [self.rows[r] for r in rows]
        self.cached_lengths = [self.cached_lengths[r] for r in rows]
        self.last_forwards = [self.last_forwards[r] for r in rows]
        if self.cache is not None:
            self.cache.select(rows)

    def propose(self, tokens, k: int):
        """tokens # [1, n] the verified sequence -> (draft_token_ids # [k], draft_probs # [k, vocab])."""
        return self.propose_rows([tokens], [None], [k])[0]

    def rollback(self, valid_length: int, hidden_states=None) -> None:
        """Drop cached positions past the first `valid_length` tokens of the new sequence."""
        self.rollback_rows([valid_length])


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


class RowDrafters:
    """Drafters that hold one row each (n-gram, EAGLE-3 and MTP heads, Medusa), asked row by row
    through the batch interface the decode loop uses (as DraftModelDrafter's rows): a head is a
    fraction of one target layer, so its per-row steps cost little beside the batched target."""

    def __init__(self, drafters: list):
        self.drafters = drafters
        self.hidden_state_ids = getattr(drafters[0], "hidden_state_ids", ())
        self.last_forwards = [0] * len(drafters)

    def propose_rows(self, tokens: list, token_lists: list, ks: list[int], trees: list) -> list[tuple]:
        """Per row: tokens # [1, n_r], its token list, k_r (0: nothing), its tree (tree methods) ->
        per row (draft_token_ids or tree node ids, draft_probs or None); (None, None) where k_r is 0."""
        proposals = []
        for r, drafter in enumerate(self.drafters):
            before = drafter.forwards
            if ks[r] == 0:
                proposals.append((None, None))
            elif trees[r] is not None:
                proposals.append(drafter.propose_tree(tokens[r], trees[r]))
            elif isinstance(drafter, NgramDrafter):
                proposals.append(drafter.propose(tokens[r], ks[r], token_lists[r]))
            else:
                proposals.append(drafter.propose(tokens[r], ks[r]))
            self.last_forwards[r] = drafter.forwards - before
        return proposals

    def rollback_rows(self, valid_lengths: list[int], hidden_states: list | None = None) -> None:
        for r, drafter in enumerate(self.drafters):
            drafter.rollback(valid_lengths[r], hidden_states[r] if hidden_states is not None else None)

    def select(self, rows: list[int]) -> None:
        self.drafters = [self.drafters[r] for r in rows]
        self.last_forwards = [self.last_forwards[r] for r in rows]


def make_row_drafters(pair, configs, generators):
    """The drafter of a batch: configs and generators per row (one method for all) -> an object
    with propose_rows / rollback_rows / select / last_forwards / hidden_state_ids. A draft model
    drafts every row in one forward per position; other methods keep a drafter per row."""
    config = configs[0]
    if config.method == "draft_model":
        check = make_drafter(pair, config, generators[0])  # the pair's checks and errors, built once
        return DraftModelDrafter(check.model, check.vocab_size, rows=[
            (c.temperature, c.top_k, c.top_p, generator) for c, generator in zip(configs, generators)])
    return RowDrafters([make_drafter(pair, c, generator) for c, generator in zip(configs, generators)])


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
