"""One drafter for heads that draft from the target's own hidden states: EAGLE-3 heads
(eagle3.py) and MTP layers inside the target (mtp.py).

The head keeps a small KV cache with one entry per verified position, each seeded from the
target: the token there and a target state (EAGLE-3: the aux states entering the layers it
names, projected by fc; MTP: the final normed state). propose() first feeds the positions
verified since the last call (their states came with rollback()), then drafts: each draft is fed
back with the head's own output (recycled: as is for EAGLE-3, through shared_head.norm for MTP)
in place of the target's state. Those speculative entries are dropped at the next call, so
accepted drafts are re-seeded from the target's states, as EAGLE and vLLM's MTP proposer do.

HeadDrafter is the RowDrafter (methods/base.py) of both methods. A head provides: hidden_state_ids (what the decode loop asks the target for), config (its
cache's), position_shift (EAGLE-3 puts the entry of token x_j at position j, vLLM's MTP at
j - 1), seed_input(states) (the target's states -> the head's input), recycle(output),
draft_logits(output) and __call__(input_ids, hidden, cache, start_position, attention_mask=None,
position_ids=None) -> its pre-norm outputs.

This module imports torch at import time: import it lazily.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specreg.runtime.sampling import draft_token


def head_inputs(rotary_emb, hidden, cache, start_position: int, length: int, attention_mask=None,
                position_ids=None):
    """What a head's layer needs beside its inputs, for `length` new entries # hidden [b, length, H]:
    (position_ids # [1, length], default consecutive from start_position; the rotary position
    embeddings; the attention mask, default block_causal_mask over `cache`)."""
    if position_ids is None:
        position_ids = torch.arange(start_position, start_position + length, device=hidden.device).view(1, -1)
    if attention_mask is None:
        attention_mask = block_causal_mask(cache, length, hidden.device)
    return position_ids, rotary_emb(hidden, position_ids), attention_mask


def block_causal_mask(cache, length: int, device):
    """The causal mask of `length` new queries over `cache` # [1, 1, length, past + length] bool,
    or None for one query (SDPA runs unmasked)."""
    if length <= 1:
        return None
    past = cache.get_seq_length() if cache is not None else 0
    keys = torch.arange(past + length, device=device)
    queries = torch.arange(past, past + length, device=device)
    return (keys[None, :] <= queries[:, None]).view(1, 1, length, past + length)


@dataclass(frozen=True)
class TreeStep:
    """One depth of drafting a tree with a head (tree_plan); node ids index the tree's nodes."""

    parents: object  # [p] long: nodes of the depth above with children, whose outputs rank them
    children: object  # [c] long: the nodes of this depth
    child_parent_rows: object  # [c] long: each child's parent's row in `parents`
    child_ranks: object  # [c] long: each child's rank among its parent's top-k
    feed: object  # [f] long: this depth's nodes with children, fed to the head next
    feed_parents: object  # [f] long: their parents, whose outputs they are fed with
    tree_mask: object  # [f, entries + f] bool: which tree entries of the head cache each sees


def tree_plan(tree, device) -> list[TreeStep]:
    """The per-depth index tensors and masks of drafting `tree` with a head, built once per tree
    and device (kept with the tree's other buffers). The head's cache holds the tree entries in
    the order they are fed: depth 1's fed nodes, then depth 2's, ..."""
    key = ("head_plan", str(device))
    if key in tree._buffers:
        return tree._buffers[key]
    has_children = set(tree.parents)
    entry_of: dict[int, int] = {}
    steps = []
    for depth in range(1, tree.depth + 1):
        parents = [node for node in range(tree.num_nodes + 1) if tree.depths[node] == depth - 1 and node in has_children]
        children = [node for node in range(1, tree.num_nodes + 1) if tree.depths[node] == depth]
        feed = [node for node in children if node in has_children]
        entries = len(entry_of)
        mask = torch.zeros(len(feed), entries + len(feed), dtype=torch.bool)
        for query, node in enumerate(feed):
            mask[query, entries + query] = True
            ancestor = tree.parents[node]
            while ancestor > 0:
                mask[query, entry_of[ancestor]] = True
                ancestor = tree.parents[ancestor]
        for query, node in enumerate(feed):
            entry_of[node] = entries + query
        row = {node: index for index, node in enumerate(parents)}

        def longs(values):
            return torch.tensor(values, dtype=torch.long, device=device)

        steps.append(TreeStep(parents=longs(parents), children=longs(children),
                              child_parent_rows=longs([row[tree.parents[node]] for node in children]),
                              child_ranks=longs([tree.paths[node - 1][-1] for node in children]),
                              feed=longs(feed), feed_parents=longs([tree.parents[node] for node in feed]),
                              tree_mask=mask.to(device)))
    tree._buffers[key] = steps
    return steps


class HeadDrafter:
    """Drafts a chain (propose) or a static tree (propose_tree) with a head and its own KV cache."""

    def __init__(self, head, vocab_size: int, temperature: float = 0.0, top_k=None, top_p=None, generator=None):
        from transformers import DynamicCache

        self.head = head
        self.hidden_state_ids = head.hidden_state_ids  # what the decode loop asks the target for
        self.vocab_size = vocab_size
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator = generator
        self.cache = DynamicCache(config=head.config)
        self.seeded = 0  # entries of tokens x_1 .. x_seeded hold target-seeded states
        self.features = None  # [1, m, A*H] target states not fed yet
        self.forwards = 0

    def seed(self, tokens):
        """Drop the last step's speculative entries, feed the positions verified since -> the head's
        output at the last one # [1, 1, H], which predicts the token after tokens # [1, n]."""
        length = tokens.shape[1]
        speculative = self.cache.get_seq_length() - self.seeded  # last step's entries fed with own states
        if speculative > 0:
            self.cache.crop(-speculative)
        new_tokens = tokens[:, self.seeded + 1:length]  # [1, m] x_{seeded+1} .. x_{n-1}
        output = self.head(new_tokens, self.head.seed_input(self.features), self.cache,
                           self.seeded + 1 + self.head.position_shift)
        self.forwards += 1
        self.seeded, self.features = length - 1, None
        return output[:, -1:]

    def propose(self, request):
        """A methods.base.DraftRequest -> Proposal: a tree's nodes (propose_tree) when the request
        carries a tree, else a chain of request.k (propose_chain)."""
        from specreg.runtime.methods.base import Proposal

        if request.tree is not None:
            return Proposal(*self.propose_tree(request.tokens, request.tree))
        return Proposal(*self.propose_chain(request.tokens, request.k))

    def propose_chain(self, tokens, k: int):
        """tokens # [1, n] the verified sequence -> (draft_token_ids # [<=k], draft_probs # [<=k, vocab]
        or None when greedy). Empty before the target has run once (no states yet)."""
        if self.features is None:
            return torch.empty(0, dtype=torch.long, device=tokens.device), None
        length = tokens.shape[1]
        output = self.seed(tokens)  # [1, 1, H] predicts x_{n+1}
        draft_ids, draft_probs = [], []
        for index in range(k):
            logits = self.head.draft_logits(output[0])[:, : self.vocab_size]  # [1, vocab]
            token, probs = draft_token(logits, self.temperature, self.top_k, self.top_p, self.generator)  # [1]
            if probs is not None:
                draft_probs.append(probs)
            draft_ids.append(token)
            if index < k - 1:
                output = self.head(token.view(1, 1), self.head.recycle(output), self.cache,
                                   length + index + self.head.position_shift)
                self.forwards += 1
        return torch.cat(draft_ids), (torch.cat(draft_probs) if draft_probs else None)

    def propose_tree(self, tokens, tree):
        """Static-tree drafting (EAGLE's tree, top-k at every node): tokens # [1, n] the verified
        sequence, tree: a tree.CandidateTree of rank paths -> (node_token_ids # [nodes+1] root first,
        draft_probs # [nodes+1, vocab] point masses, or None when greedy); empty before the target
        has run once. A node at depth d with last rank r gets rank r of the head's distribution at
        its parent; each depth is one head forward over the nodes of the depth above that have
        children, each attending to the seeded entries, its ancestors' entries and itself, at the
        position of token n - 1 + depth (tree_plan). The candidates are the top-k, deterministic: a
        point-mass q per node keeps the tree rule exact (EAGLE's tree sampling)."""
        device = tokens.device
        if self.features is None:
            return torch.empty(0, dtype=torch.long, device=device), None
        length = tokens.shape[1]
        output = self.seed(tokens)  # [1, 1, H]
        outputs = output.new_zeros(tree.num_nodes + 1, output.shape[-1])  # [nodes+1, H] each node's head output
        outputs[0] = output[0, -1]
        node_token_ids = torch.empty(tree.num_nodes + 1, dtype=torch.long, device=device)  # [nodes+1]
        node_token_ids[0] = tokens[0, -1]
        for depth, step in enumerate(tree_plan(tree, device), start=1):
            logits = self.head.draft_logits(outputs[step.parents])[:, : self.vocab_size]  # [parents, vocab]
            ranked = torch.topk(logits, tree.width, dim=-1).indices  # [parents, width]
            node_token_ids[step.children] = ranked[step.child_parent_rows, step.child_ranks]
            if step.feed.numel() == 0:
                break
            feed = step.feed.numel()
            seeded = torch.ones(feed, length - 1, dtype=torch.bool, device=device)  # the entries of x_1 .. x_{n-1}
            mask = torch.cat([seeded, step.tree_mask], dim=1).view(1, 1, feed, -1)
            positions = torch.full((1, feed), length - 1 + depth + self.head.position_shift, device=device)
            out = self.head(node_token_ids[step.feed].view(1, -1), self.head.recycle(outputs[step.feed_parents]).unsqueeze(0),
                            self.cache, 0, attention_mask=mask, position_ids=positions)  # [1, feed, H]
            self.forwards += 1
            outputs[step.feed] = out[0]
        if self.temperature <= 0:
            return node_token_ids, None
        return node_token_ids, torch.nn.functional.one_hot(node_token_ids, self.vocab_size).to(output.dtype)

    def rollback(self, valid_length: int, hidden_states=None) -> None:
        """The target kept its first `valid_length` positions; hidden_states # [1, m, A*H] are the
        states the head reads of the last m of them (those verified this step), kept for the next
        propose()."""
        if hidden_states is None or hidden_states.shape[1] == 0:
            return
        if self.features is None:
            self.features = hidden_states
        else:
            self.features = torch.cat([self.features, hidden_states], dim=1)
