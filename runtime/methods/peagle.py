"""P-EAGLE: an EAGLE-3 head that drafts all k tokens of a step in one forward, as vLLM 0.33 serves
speculators' `peagle` heads (method eagle3 with parallel_drafting; specreg.core.heads.
peagle_checkpoint reads them).

What we followed (vLLM is the released 0.33.0 wheel):
- v1/spec_decode/llm_base_proposer.py:628-637 (propose): with parallel drafting the first head
  forward is the only one, and its k sampled slots are the drafts.
- llm_base_proposer.py:816-954 (set_inputs_first_pass) with v1/spec_decode/utils.py:429-575
  (copy_and_expand_eagle_inputs_kernel, shift_input_ids): per request, the tokens verified since
  the last forward shifted by one (token x_{j+1} at position j, with the target's state at j), then
  the target's latest token at the next position with the state of the last verified position,
  then k - 1 slots of the parallel-drafting token at the positions after it (utils.py:500-535),
  each with the one placeholder state (llm_base_proposer.py:919-931); the drafts are sampled at
  the latest token's slot and the k - 1 placeholder slots (utils.py:549-575). The attention is
  causal over the head's cache and the new slots.
- llm_base_proposer.py:355-386 and 1402-1416: the placeholder token is mask_token_id (speculators'
  pard_token) and the placeholder state combine_hidden_states(mask_hidden): the head's
  input_norm / fc_norm, then fc.
- llm_base_proposer.py:449-475 (_sample_from_logits): each slot drawn on its own from its logits
  (the request's temperature repeated over its k slots); greedy, the argmax.
- the head's KV cache keeps each verified position's entry; a step's placeholder slots sit at the
  positions the next step's verified entries overwrite, and rejected slots are never written
  (utils.py:363-392 compute_new_slot_mapping): HeadDrafter's cache keeps the seeded entries and
  drops the rest at each call, the same entries.

This module imports torch at import time (its classes are nn.Modules): import it lazily.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specreg.errors import RuntimeConfigError
from specreg.runtime.head_drafter import HeadDrafter
from specreg.runtime.methods.base import Method, Proposal
from specreg.runtime.methods.eagle3 import Eagle3Head, load_eagle3_head, new_eagle3_head, save_eagle3_head
from specreg.runtime.sampling import DraftSampler, draft_token


class PEagleHead(Eagle3Head):
    """An EAGLE-3 head with P-EAGLE's placeholder: mask_token_id and mask_hidden # [1, 1, A*H_target]
    (the aux states' width, as speculators saves it; vLLM reads any shape of that size,
    llama_eagle3.py:440). The entry of token x_j sits at position j - 1, as vLLM places it."""

    position_shift = -1

    def __init__(self, spec, aux_layer_ids, target_vocab_size: int, target_hidden_size: int, embed_tokens=None,
                 target_layers: int | None = None, mask_token_id: int | None = None):
        """mask_token_id: None reads it from the registered head (spec.head.parallel)."""
        super().__init__(spec, aux_layer_ids, target_vocab_size, target_hidden_size, embed_tokens, target_layers)
        self.mask_token_id = int(mask_token_id if mask_token_id is not None else spec.head.parallel["mask_token_id"])
        self.register_buffer("mask_hidden", torch.zeros(1, 1, len(self.aux_layer_ids) * target_hidden_size))

    def file_weights(self, weights: dict) -> dict:
        if "mask_hidden" in weights:
            weights["mask_hidden"] = weights["mask_hidden"].reshape(1, 1, -1)
        return weights

    def mask_state(self):
        """The hidden state of every placeholder slot # [1, H]: mask_hidden through the head's
        projection (vLLM's combine_hidden_states)."""
        return self.project(self.mask_hidden)[0]


class ParallelHeadDrafter(HeadDrafter):
    """Drafts each row's k tokens in one head forward for every row of the batch: the positions
    verified since the last call, then k - 1 placeholders; the drafts are sampled at the last
    verified position and at each placeholder."""

    def propose(self, requests):
        from specreg.runtime.methods.draft_model import right_aligned
        from specreg.runtime.row_cache import RowCache

        device = requests[0].tokens.device
        drafting, proposals = self.start_proposals(requests)
        if not any(drafting):
            return proposals
        if self.cache is None:
            self.cache = RowCache(self.head.config, len(self.rows), device)
        self.cache.truncate(self.seeded)  # the last forward's placeholders and unverified entries go
        rows = [r for r in range(len(requests)) if drafting[r]]
        placeholders = torch.full((max(requests[r].k for r in rows) - 1,), self.head.mask_token_id, device=device)
        # x_{seeded+1} .. x_{n-1}, each with the target state of the position before it, then k - 1 placeholders
        pieces = [torch.cat([request.tokens[0, self.seeded[r] + 1:], placeholders[:request.k - 1]]) if drafting[r]
                  else request.tokens[0, :0] for r, request in enumerate(requests)]
        input_ids, query_valid, offsets = right_aligned(pieces, device)
        seeded = self.head.seed_input(torch.cat([self.features[r][0] for r in rows]))  # [sum m, H]
        mask_state = self.head.mask_state()  # [1, H]
        parts = seeded.split([self.features[r].shape[1] for r in rows])
        states = torch.cat([torch.cat([part, mask_state.expand(requests[r].k - 1, -1)])
                            for r, part in zip(rows, parts)])  # [sum of each row's entries, H]
        hidden = states.new_zeros(*input_ids.shape, states.shape[-1])  # [b, W, H]
        hidden[query_valid] = states  # right-aligned rows in order
        mask, position_ids = self.cache.attention(query_valid, offsets, dtype=states.dtype)
        output = self.head(input_ids, hidden, self.cache.cache, 0, attention_mask=mask,
                           position_ids=self.positions(position_ids))  # [b, W, H]
        self.cache.keep(query_valid)
        for r in rows:
            request = requests[r]
            logits = self.head.draft_logits(output[r, -request.k:])[:, : self.vocab_size]  # [k, vocab]
            drawn = [draft_token(logits[slot:slot + 1], self.rows[r])
                     for slot in range(request.k)]  # each slot on its own, in order
            proposals[r] = Proposal(torch.cat([token for token, _ in drawn]),
                                    torch.cat([probs for _, probs in drawn]) if self.rows[r].temperature > 0 else None)
            self.seeded[r], self.features[r] = request.tokens.shape[1] - 1, None
            self.last_forwards[r] = 1
        return proposals


def new_peagle_head(target, mask_token_id: int, seed: int = 0, **options) -> PEagleHead:
    """A freshly initialised P-EAGLE head for `target` (new_eagle3_head's options), mask_hidden drawn
    at random as speculators initialises it (models/peagle/core.py:49-51)."""
    head = new_eagle3_head(target, seed=seed, head_class=PEagleHead, mask_token_id=mask_token_id, **options)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.mask_hidden.copy_(torch.randn(head.mask_hidden.shape, generator=generator))
    return head


def save_peagle_head(head: PEagleHead, directory, verifier_name_or_path: str, verifier_architectures=(),
                     speculative_tokens: int = 3) -> Path:
    """Write `head` as speculators writes a P-EAGLE directory: save_eagle3_head's files with
    speculators_model_type peagle, mask_token_id and the mask_hidden tensor (speculators
    models/peagle/config.py, core.py)."""
    directory = save_eagle3_head(head, directory, verifier_name_or_path, verifier_architectures, speculative_tokens)
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["PEagleSpeculator"], speculators_model_type="peagle",
                  mask_token_id=head.mask_token_id)
    config["speculators_config"]["algorithm"] = "peagle"
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def load(target_path, draft_path, device, dtype, *, target_fingerprint=None, draft_fingerprint=None):
    """The target and the P-EAGLE head in draft_path, checked against it before any forward."""
    from specreg.runtime.loading import load_target
    from specreg.runtime.pair import ModelPair, output_vocab_size

    tokenizer, target = load_target(target_path, device, dtype, target_fingerprint)
    if draft_path is None:
        raise RuntimeConfigError("method 'peagle' needs the P-EAGLE head's directory")
    head = load_eagle3_head(draft_path, target, method="peagle", head_class=PEagleHead)
    if head.mask_token_id >= head.embed_tokens.weight.shape[0]:
        raise RuntimeConfigError(f"{draft_path}: mask_token_id {head.mask_token_id} is past the "
                                 f"{head.embed_tokens.weight.shape[0]} embeddings the head reads")
    return ModelPair(target=target, tokenizer=tokenizer, draft=head, vocab_size=output_vocab_size(target))


def drafter(pair, configs, generators):
    """One ParallelHeadDrafter for the batch: each step's one head forward serves every row."""
    if not isinstance(pair.draft, PEagleHead):
        raise RuntimeConfigError("method 'peagle' needs a P-EAGLE head (load_pair(..., method='peagle'))")
    return ParallelHeadDrafter(pair.draft, pair.vocab_size, [DraftSampler.of(c, generator)
                                                             for c, generator in zip(configs, generators)])


METHOD = Method(name="peagle", load=load, drafter=drafter)
