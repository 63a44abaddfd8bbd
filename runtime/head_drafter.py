"""One drafter for heads that draft from the target's own hidden states: EAGLE-3 heads
(eagle3.py) and MTP layers inside the target (mtp.py).

The head keeps a small KV cache (one row_cache.RowCache for the batch's rows) with one entry
per verified position of each row, each seeded from the
target: the token there and a target state (EAGLE-3: the aux states entering the layers it
names, projected by fc; MTP: the final normed state). propose() first feeds the positions
verified since the last call (their states came with rollback()), then drafts: each draft is fed
back with the head's own output (recycled: as is for EAGLE-3, through shared_head.norm for MTP)
in place of the target's state. Those speculative entries are dropped at the next call, so
accepted drafts are re-seeded from the target's states, as EAGLE and vLLM's MTP proposer do.

HeadDrafter is the Drafter (methods/base.py) of both methods: one head forward per draft
position or tree depth serves every row of the batch. A head provides: hidden_state_ids (what
the decode loop asks the target for), config (its cache's), position_shift (EAGLE-3 puts the
entry of token x_j at position j, vLLM's MTP at j - 1), seed_input(states) (the target's states
-> the head's input), recycle(output), draft_logits(output) and __call__(input_ids, hidden,
cache, start_position, attention_mask=None, position_ids=None) -> its pre-norm outputs, for
rows # [b, n] at positions # [b, n].

This module imports torch at import time: import it lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specreg.runtime.sampling import DraftSampler, draft_token


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
    """Drafts chains or static trees with a head for the rows of one batch: one head forward per
    draft position (a chain) or per tree depth serves every row. The head's KV cache is one
    row_cache.RowCache; each row keeps its own seeded length, pending target states and sampling
    settings, and draws from its own random generator in the order it would alone."""

    def __init__(self, head, vocab_size: int, rows: list[tuple]):
        """rows: per row a sampling.DraftSampler (or its fields)."""
        self.head = head
        self.hidden_state_ids = tuple(head.hidden_state_ids)  # what the decode loop asks the target for
        self.vocab_size = vocab_size
        self.rows = [DraftSampler(*row) for row in rows]
        self.cache = None  # RowCache, made at the first seed
        self.seeded = [0] * len(self.rows)  # per row: entries of x_1 .. x_seeded hold target-seeded states
        self.features = [None] * len(self.rows)  # per row: [1, m, A*H] target states not fed yet
        self.last_forwards = [0] * len(self.rows)

    def positions(self, position_ids):
        """The cache's positions (count of a row's entries before a query) -> the head's: the entry of
        token x_j holds position j + position_shift, and entry 0 is token x_1's."""
        return position_ids + 1 + self.head.position_shift

    def seed(self, requests) -> object:
        """Drop the rows' speculative entries (fed with the head's own states at the last propose),
        feed each drafting row's positions verified since -> the head's output at each row's last
        one # [b, 1, H], which predicts the token after its verified sequence (rows not drafting:
        padding)."""
        from specreg.runtime.methods.draft_model import right_aligned
        from specreg.runtime.row_cache import RowCache

        device = requests[0].tokens.device
        if self.cache is None:
            self.cache = RowCache(self.head.config, len(self.rows), device)
        self.cache.truncate(self.seeded)
        drafting = [request.k > 0 and self.features[r] is not None for r, request in enumerate(requests)]
        # x_{seeded+1} .. x_{n-1}, each with the target state of the position before it
        pieces = [request.tokens[0, self.seeded[r] + 1:] if drafting[r] else request.tokens[0, :0]
                  for r, request in enumerate(requests)]
        input_ids, query_valid, offsets = right_aligned(pieces, device)
        states = self.head.seed_input(torch.cat([self.features[r][0] for r in range(len(requests)) if drafting[r]]))
        hidden = states.new_zeros(*input_ids.shape, states.shape[-1])  # [b, W, H]
        hidden[query_valid] = states  # right-aligned rows in order, as the features were concatenated
        mask, position_ids = self.cache.attention(query_valid, offsets, dtype=states.dtype)
        output = self.head(input_ids, hidden, self.cache.cache, 0, attention_mask=mask,
                           position_ids=self.positions(position_ids))  # [b, W, H]
        self.cache.keep(query_valid)
        for r, request in enumerate(requests):
            if drafting[r]:
                self.seeded[r], self.features[r] = request.tokens.shape[1] - 1, None
                self.last_forwards[r] += 1
        return output[:, -1:]

    def propose(self, requests):
        """Per row a methods.base.DraftRequest -> its Proposal: a tree's nodes when the request
        carries a tree (propose_trees), else a chain of request.k (propose_chains). A row asked for
        none, or with no target states yet (before the target's first forward), gets none."""
        from specreg.runtime.methods.base import Proposal

        drafting, proposals = self.start_proposals(requests)
        if not any(drafting):
            return proposals
        requests = [request if drafting[r] else replace(request, k=0, tree=None) for r, request in enumerate(requests)]
        output = self.seed(requests)  # [b, 1, H]
        trees = any(request.tree is not None for request in requests)
        drafted = self.propose_trees(requests, output) if trees else self.propose_chains(requests, output)
        for r, proposal in drafted.items():
            proposals[r] = Proposal(*proposal)
        return proposals

    def start_proposals(self, requests) -> tuple[list[bool], list]:
        """(which rows draft this step: asked for some and holding the target's states, an empty
        Proposal per row to fill); this step's head forwards counted from zero."""
        from specreg.runtime.methods.base import Proposal

        drafting = [request.k > 0 and self.features[r] is not None for r, request in enumerate(requests)]
        self.last_forwards = [0] * len(requests)
        empty = Proposal(torch.empty(0, dtype=torch.long, device=requests[0].tokens.device))
        return drafting, [empty] * len(requests)

    def propose_chains(self, requests, output) -> dict:
        """Each drafting row's chain of request.k -> {row: (draft_token_ids # [k], draft_probs
        # [k, vocab] or None when greedy)}: one head forward per position for every row still
        drafting, each draft fed back with the head's recycled output."""
        device = output.device
        ks = [request.k for request in requests]
        draft_ids = {r: [] for r, k in enumerate(ks) if k > 0}
        draft_probs = {r: [] for r in draft_ids}
        for index in range(max(ks)):
            logits = self.head.draft_logits(output[:, 0])[:, : self.vocab_size]  # [b, vocab]
            for r in draft_ids:
                if index < ks[r]:
                    token, probs = draft_token(logits[r:r + 1], self.rows[r])  # [1]
                    draft_ids[r].append(token)
                    if probs is not None:
                        draft_probs[r].append(probs)
            going = [index + 1 < k for k in ks]  # the rows that feed this draft back for the next
            if not any(going):
                break
            query_valid = torch.tensor(going, dtype=torch.bool, device=device).view(-1, 1)  # [b, 1]
            input_ids = torch.stack([draft_ids[r][-1] if going[r] else torch.zeros(1, dtype=torch.long, device=device)
                                     for r in range(len(ks))])  # [b, 1]
            mask, position_ids = self.cache.attention(query_valid, torch.zeros_like(input_ids), dtype=output.dtype)
            output = self.head(input_ids, self.head.recycle(output), self.cache.cache, 0, attention_mask=mask,
                               position_ids=self.positions(position_ids))  # [b, 1, H]
            self.cache.keep(query_valid)
            for r in draft_ids:
                self.last_forwards[r] += int(going[r])
        return {r: (torch.cat(ids), torch.cat(draft_probs[r]) if draft_probs[r] else None)
                for r, ids in draft_ids.items()}

    def propose_trees(self, requests, output) -> dict:
        """Static-tree drafting (EAGLE's tree, top-k at every node), each drafting row its own tree
        (request.tree, pruned near its budget) -> {row: (node_token_ids # [nodes+1] root first,
        draft_probs # [nodes+1, vocab] point masses, or None when greedy)}. A node at depth d with
        last rank r gets rank r of the head's distribution at its parent; each depth is one head
        forward over every row's nodes of the depth above that have children, each attending to
        its row's seeded entries, its ancestors' entries and itself, at the position of token
        n - 1 + depth (tree_plan). The candidates are the top-k, deterministic: a point-mass q per
        node keeps the tree rule exact (EAGLE's tree sampling). The tree's entries leave the cache
        at the end: none is ever verified."""
        device = output.device
        rows = [r for r, request in enumerate(requests) if request.tree is not None]
        plans = {r: tree_plan(requests[r].tree, device) for r in rows}
        outputs = {r: output.new_zeros(requests[r].tree.num_nodes + 1, output.shape[-1]) for r in rows}
        node_ids = {r: torch.empty(requests[r].tree.num_nodes + 1, dtype=torch.long, device=device) for r in rows}
        for r in rows:
            outputs[r][0] = output[r, -1]  # [nodes+1, H] each node's head output
            node_ids[r][0] = requests[r].tokens[0, -1]
        seeded_columns = self.cache.valid  # [b, C0] the entries every tree node sees
        entry_columns = {r: [] for r in rows}  # per row: each of its tree entries' column after the seeded ones
        tree_columns = 0
        batch = len(requests)
        for depth in range(1, max(len(plan) for plan in plans.values()) + 1):
            at_depth = [r for r in rows if depth <= len(plans[r])]
            parents = [outputs[r][plans[r][depth - 1].parents] for r in at_depth]
            logits = self.head.draft_logits(torch.cat(parents))[:, : self.vocab_size]  # [parents, vocab]
            for r, row_logits in zip(at_depth, logits.split([len(p) for p in parents])):
                step = plans[r][depth - 1]
                ranked = torch.topk(row_logits, requests[r].tree.width, dim=-1).indices  # [parents, width]
                node_ids[r][step.children] = ranked[step.child_parent_rows, step.child_ranks]
            feeding = [r for r in at_depth if plans[r][depth - 1].feed.numel() > 0]
            if not feeding:
                break
            width = max(plans[r][depth - 1].feed.numel() for r in feeding)
            input_ids = torch.zeros(batch, width, dtype=torch.long, device=device)
            hidden = output.new_zeros(batch, width, output.shape[-1])
            query_valid = torch.zeros(batch, width, dtype=torch.bool, device=device)
            sees_tree = torch.zeros(batch, width, tree_columns, dtype=torch.bool, device=device)
            new_mask = torch.zeros(batch, width, width, dtype=torch.bool, device=device)
            for r in feeding:
                step = plans[r][depth - 1]
                feed = step.feed.numel()
                input_ids[r, :feed] = node_ids[r][step.feed]
                hidden[r, :feed] = self.head.recycle(outputs[r][step.feed_parents])
                query_valid[r, :feed] = True
                earlier = len(entry_columns[r])  # this row's entries of the depths above
                if earlier:
                    columns = torch.tensor(entry_columns[r], dtype=torch.long, device=device)
                    sees_tree[r, :feed, columns] = step.tree_mask[:, :earlier]
                new_mask[r, :feed, :feed] = step.tree_mask[:, earlier:]
            sees = torch.cat([seeded_columns[:, None, :].expand(batch, width, -1), sees_tree], dim=2)
            offsets = torch.full((batch, width), depth - 1, dtype=torch.long, device=device)
            mask, position_ids = self.cache.attention(query_valid, offsets, new_mask, output.dtype, sees_columns=sees)
            out = self.head(input_ids, hidden, self.cache.cache, 0, attention_mask=mask,
                            position_ids=self.positions(position_ids))  # [b, width, H]
            for r in feeding:
                step = plans[r][depth - 1]
                outputs[r][step.feed] = out[r, :step.feed.numel()]
                self.last_forwards[r] += 1
                entry_columns[r] += range(tree_columns, tree_columns + step.feed.numel())
            tree_columns += width
        if tree_columns:
            self.cache.cache.crop(-tree_columns)
        drafted = {}
        for r in rows:
            sampling = self.rows[r].temperature > 0
            drafted[r] = (node_ids[r], torch.nn.functional.one_hot(node_ids[r], self.vocab_size).to(output.dtype)
                          if sampling else None)
        return drafted

    def rollback(self, valid_lengths: list[int], hidden_states: list | None = None) -> None:
        """Per row, the target kept its first valid_lengths[r] positions; hidden_states[r] # [1, m,
        A*H] are the states the head reads of the last m of them (those verified this step), kept
        for the row's next propose()."""
        if hidden_states is None:
            return
        for r, states in enumerate(hidden_states):
            if states is None or states.shape[1] == 0:
                continue
            self.features[r] = states if self.features[r] is None else torch.cat([self.features[r], states], dim=1)

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (the others finished)."""
        self.rows = [self.rows[r] for r in rows]
        self.seeded = [self.seeded[r] for r in rows]
        self.features = [self.features[r] for r in rows]
        self.last_forwards = [self.last_forwards[r] for r in rows]
        if self.cache is not None:
            self.cache.select(rows)

    def prefill(self, requests) -> None:
        """Nothing: a row's head entries are fed from the target states handed at rollback, at its
        next propose."""

    def extend(self, other: "HeadDrafter") -> None:
        """Append other's rows (and their head cache: a drafter that has not drafted yet has none)."""
        from specreg.runtime.row_cache import joined

        self.cache = joined(self.cache, other.cache, self.head.config, len(self.rows), len(other.rows))
        self.rows += other.rows
        self.seeded += other.seeded
        self.features += other.features
        self.last_forwards += other.last_forwards
