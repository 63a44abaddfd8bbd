"""The draft-model method: a separate small causal LM with the target's tokenizer drafts k tokens
autoregressively with its own KV cache (vLLM `method: draft_model`)."""

from __future__ import annotations

from specreg.errors import RuntimeConfigError
from specreg.runtime.methods.base import DraftRequest, Method, Proposal
from specreg.runtime.sampling import DraftSampler, draft_token


class DraftModelDrafter:
    """A small causal LM decoding k tokens autoregressively with its own KV cache, for many rows at
    once (one RowCache; each row its own sampling settings and random generator, drawn from in the
    order one row alone would)."""

    hidden_state_ids = ()  # reads no target state

    def __init__(self, model, vocab_size: int, temperature: float = 0.0, top_k=None, top_p=None,
                 generator=None, *, rows: list[tuple] | None = None):
        """rows: a sampling.DraftSampler (or its fields) per row; default one row of the arguments,
        with the default draft sampling."""
        self.model = model
        # a draft step feeds one position past the verified sequence per draft
        self.position_limit = getattr(model.config, "max_position_embeddings", None)
        self.vocab_size = vocab_size
        self.rows = [DraftSampler(*row) for row in rows] if rows is not None else [
            DraftSampler(temperature, top_k, top_p, generator)]
        self.cache = None
        self.cached_lengths = [0] * len(self.rows)  # per row: verified tokens whose keys/values are cached
        self.forwards = 0
        self.last_forwards = [0] * len(self.rows)  # per row: forwards it took part in at the last propose

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        """Per row its verified sequence and k (0: none) -> per row (draft_token_ids # [k_r],
        draft_probs # [k_r, vocab] or None when greedy); k_r is k capped at the draft's
        max_position_embeddings."""
        import torch

        from specreg.runtime.row_cache import RowCache

        tokens = [request.tokens for request in requests]
        ks = [request.k for request in requests]
        if self.position_limit is not None:
            ks = [max(0, min(k, self.position_limit - len(request.token_list) + 1))
                  for k, request in zip(ks, requests)]
        if max(ks) == 0:
            self.last_forwards = [0] * len(ks)
            return [Proposal(torch.empty(0, dtype=torch.long, device=tokens[0].device)) for _ in ks]
        device = tokens[0].device
        if self.cache is None:
            self.cache = RowCache(self.model.config, len(self.rows), device)
        # the first forward feeds what each row's cache lacks (the prompt at first, then 1 or 2
        # tokens), right-aligned; then one token per row still drafting
        new = [row_tokens[0, self.cached_lengths[r]:] if ks[r] > 0 else row_tokens[0, :0]
               for r, row_tokens in enumerate(tokens)]
        input_ids, query_valid, offsets = right_aligned(new, device)
        draft_ids = [[] for _ in new]
        draft_probs = [[] for _ in new]
        self.last_forwards = [0] * len(new)
        for index in range(max(ks)):
            logits = self.cache.forward(self.model, input_ids, query_valid, offsets)[:, -1, : self.vocab_size]  # [b, vocab]
            self.cache.keep(query_valid)
            self.forwards += 1
            for r, sampler in enumerate(self.rows):
                if index < ks[r]:
                    self.last_forwards[r] += 1
                    token, probs = draft_token(logits[r:r + 1], sampler)  # [1]
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
            proposals.append(Proposal(
                torch.cat(draft_ids[r]) if draft_ids[r] else torch.empty(0, dtype=torch.long, device=device),
                torch.cat(draft_probs[r]) if draft_probs[r] else None))
        return proposals

    def prefill(self, requests: list[DraftRequest]) -> None:
        """Feed each speculating row's verified tokens but the last (which its next draft step
        feeds) into the draft cache, in one forward of these rows: rows joining a batch on the
        engines' schedule have drafted nothing yet, and their prompts fed inside the batch's next
        draft step would pad every row of it to a prompt's width."""
        from specreg.runtime.row_cache import RowCache

        pieces = [request.tokens[0, self.cached_lengths[r]:-1] for r, request in enumerate(requests)]
        # one or two tokens behind is every draft step's own catching up
        pieces = [piece if request.k > 0 and piece.shape[0] > 1 else piece[:0]
                  for piece, request in zip(pieces, requests)]
        if max(piece.shape[0] for piece in pieces) == 0:
            return
        device = requests[0].tokens.device
        if self.cache is None:
            self.cache = RowCache(self.model.config, len(self.rows), device)
        input_ids, query_valid, offsets = right_aligned(pieces, device)
        self.cache.forward(self.model, input_ids, query_valid, offsets)
        self.cache.keep(query_valid)
        self.forwards += 1
        self.cached_lengths = [cached + piece.shape[0] for cached, piece in zip(self.cached_lengths, pieces)]

    def rollback(self, valid_lengths: list[int], hidden_states=None) -> None:
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

    def extend(self, other: "DraftModelDrafter") -> None:
        """Append other's rows (and their draft cache: a drafter that has not drafted yet has none)."""
        from specreg.runtime.row_cache import joined

        self.cache = joined(self.cache, other.cache, self.model.config, len(self.rows), len(other.rows))
        self.rows += other.rows
        self.cached_lengths += other.cached_lengths
        self.last_forwards += other.last_forwards


def right_aligned(pieces: list, device):
    """Per row a token tensor # [n_r] -> (input_ids # [b, W], query_valid # [b, W] bool, offsets
    # [b, W]) with each row's tokens at the right end, W the longest; offsets count from 0 per row."""
    import torch

    width = max(piece.shape[0] for piece in pieces)
    input_ids = torch.zeros(len(pieces), width, dtype=torch.long, device=device)  # [b, width]
    query_valid = torch.zeros(len(pieces), width, dtype=torch.bool, device=device)
    offsets = torch.zeros(len(pieces), width, dtype=torch.long, device=device)
    for r, piece in enumerate(pieces):
        if piece.shape[0]:
            input_ids[r, width - piece.shape[0]:] = piece
            query_valid[r, width - piece.shape[0]:] = True
            offsets[r, width - piece.shape[0]:] = torch.arange(piece.shape[0], device=device)
    return input_ids, query_valid, offsets


def load(target_path, draft_path, device, dtype, *, target_fingerprint=None, draft_fingerprint=None):
    """The target and the draft model, their tokenizers checked to map every token to the same id
    before the draft's weights are read -> ModelPair; without draft_path the target alone."""
    from specreg.runtime.loading import has_tokenizer, load_model, load_target, load_tokenizer
    from specreg.runtime.pair import check_same_vocabulary, make_pair

    tokenizer, target = load_target(target_path, device, dtype, target_fingerprint)
    if draft_path is None:
        return make_pair(target, tokenizer)
    if not has_tokenizer(draft_path):
        raise RuntimeConfigError(f"{draft_path}: the draft model has no tokenizer files")
    # Engines tokenize with the target's tokenizer and feed the draft those ids (vLLM's draft
    # ModelConfig takes tokenizer=target's): read the draft's files with the target's class, so
    # that a class transformers picks from the draft's model_type adds no phantom tokens.
    draft_tokenizer = load_tokenizer(draft_path, expected=draft_fingerprint, tokenizer_class=type(tokenizer))
    # check tokenizers before spending time on the draft's weights
    check_same_vocabulary(tokenizer, draft_tokenizer, str(draft_path))
    draft = load_model(draft_path, device, dtype, expected=draft_fingerprint)
    return make_pair(target, tokenizer, draft, draft_tokenizer, draft_name=str(draft_path))


def drafter(pair, configs, generators) -> DraftModelDrafter:
    """Every row of the batch in one draft forward per position."""
    if pair.draft is None or not hasattr(pair.draft, "get_output_embeddings"):
        raise RuntimeConfigError(f"method {configs[0].method!r} needs a draft model; none was given")
    return DraftModelDrafter(pair.draft, pair.vocab_size, rows=[
        DraftSampler.of(c, generator) for c, generator in zip(configs, generators)])


METHOD = Method(name="draft_model", load=load, drafter=drafter)
