"""One step of the decode loop for every row of a batch (step), as its parts, in order: fall_back
(rows that stop speculating), draft (the method's Drafter, runtime/methods/), verify (one target
forward), accept_rows (acceptance_rule.py's rules), roll_back (the target cache and the drafter),
emit (tokens, stops, metrics), leave (finished rows). No part knows which method drafts. The first
step's target forward is the prefill: it runs over the prompt and the first k drafts at once, so
no forward is spent on the prompt alone.

With a candidate tree (DecodeConfig.tree: Medusa, EAGLE-3 top-k) the drafts are a tree: the same
step, with the tree's mask and per-depth positions in the verification forward (tree.py) and the
tree acceptance rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from specreg.runtime.clock import PassClock, synchronize
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.methods.base import DraftRequest, Proposal
from specreg.runtime.pair import ModelPair
from specreg.runtime.rows import Batch, Row, charge, leave
from specreg.runtime.tree import CandidateTree


def line_up(rows: list[Row], proposals: list[tuple], ks: list[int], tree, device):
    """The verification forward's inputs: per row what the target cache lacks (the whole prompt on
    the first step, then the last emitted token) right-aligned to the longest, then its drafts (a
    chain, or the tree's nodes after the root, the last pending token), shorter rows padded.
    -> (input_ids # [b, P + N], query_valid # [b, P + N] bool, offsets # [b, P + N] positions
    after each row's cached tokens, new_mask # [P + N, P + N] bool for a tree else None, P)."""
    import torch

    pending = [row.tokens[0, row.cached_length:] for row in rows]
    width = max(piece.shape[0] for piece in pending)  # P
    drafts = tree.num_nodes if tree is not None else max(ks)  # N
    queries = width + drafts
    input_ids = torch.zeros(len(rows), queries, dtype=torch.long, device=device)  # [b, P + N]
    query_valid = torch.zeros(len(rows), queries, dtype=torch.bool, device=device)  # [b, P + N]
    offsets = torch.zeros(len(rows), queries, dtype=torch.long, device=device)  # [b, P + N]
    node_offsets = (tree.buffers(device).depths[1:] if tree is not None
                    else torch.arange(1, drafts + 1, device=device))  # [N] positions after the root
    for r, (piece, (draft_ids, _)) in enumerate(zip(pending, proposals)):
        n = piece.shape[0]
        input_ids[r, width - n:width] = piece
        query_valid[r, width - n:width] = True
        offsets[r, width - n:width] = torch.arange(n, device=device)
        offsets[r, width:] = n - 1 + node_offsets
        if ks[r]:
            nodes = draft_ids.shape[0] - (1 if tree is not None else 0)  # a tree's node ids start with the root
            input_ids[r, width:width + nodes] = draft_ids[-nodes:]
            query_valid[r, width:width + nodes] = True
    new_mask = None
    if tree is not None:
        # the nodes see the pending tokens and their own ancestors, root included (a pruned tree's
        # nodes are the first of the whole tree's: same mask, the rest is padding)
        new_mask = torch.ones(queries, queries, dtype=torch.bool, device=device).tril()
        new_mask[width - 1:, :width - 1] = True
        new_mask[width - 1:, width - 1:] = tree.buffers(device).attention_mask
    return input_ids, query_valid, offsets, new_mask, width


def accept(row: Row, logits, proposal: tuple, k: int, step_tree, rules: tuple):
    """One row's acceptance: logits # [N + 1, vocab] of its root and drafts; proposal
    (draft_ids, draft_probs); rules (acceptance_rule, greedy_rule, tree_acceptance_rule,
    tree_greedy_rule) -> (num_accepted, emitted # [num_accepted + 1], accepted draft columns after
    the root # [num_accepted] long: 1.. for a chain, the accepted nodes for a tree)."""
    import torch

    acceptance_rule, greedy_rule, tree_acceptance_rule, tree_greedy_rule = rules
    draft_ids, draft_probs = proposal
    device = logits.device
    if k == 0:
        return 0, row.next_tokens(logits[:1]), torch.empty(0, dtype=torch.long, device=device)
    if step_tree is not None:
        nodes = step_tree.num_nodes
        buffers = step_tree.buffers(device)
        if row.sampling:
            target_probs = row.probs(logits[:nodes + 1])  # [nodes+1, vocab]
            uniforms = torch.rand(nodes + 1, generator=row.generator, device=device)  # [nodes+1]
            accepted_nodes, emitted = tree_acceptance_rule(draft_probs, target_probs, draft_ids, buffers.parent_ids,
                                                           uniforms, row.generator)
        else:
            accepted_nodes, emitted = tree_greedy_rule(draft_ids, logits[:nodes + 1].argmax(dim=-1),
                                                       buffers.retrieve_indices)
        return accepted_nodes.shape[0], emitted, accepted_nodes
    if row.sampling:
        target_probs = row.probs(logits[:k + 1])  # [k+1, vocab]
        uniforms = torch.rand(k, generator=row.generator, device=device)  # [k]
        num_accepted, emitted = acceptance_rule(draft_probs, target_probs, draft_ids, uniforms, row.generator)
    else:
        num_accepted, emitted = greedy_rule(draft_ids, logits[:k + 1].argmax(dim=-1))
    return num_accepted, emitted, torch.arange(1, num_accepted + 1, device=device)


def stop_of(pair: ModelPair, row: Row, token: int) -> str | None:
    """Why the row ends at `token` just emitted (EOS, a stop string, its budget), or None."""
    if token in row.eos_ids:
        return "eos"
    stop_strings = row.config.stop_strings or ()
    if stop_strings:
        window = max(len(s) for s in stop_strings) + 8
        if any(s in pair.tokenizer.decode(row.generated[-window:]) for s in stop_strings):
            return "stop_string"
    if len(row.token_list) >= row.max_length:
        return "max_new_tokens" if len(row.generated) >= row.config.max_new_tokens else "max_position"
    return None


@dataclass
class Step:
    """One step's drafts, per row: the drafts asked and verified (k, 0: none; a tree's depth), the
    candidate tree pruned to them (None for a chain) and what the drafter proposed."""

    tree: CandidateTree | None  # the batch's whole tree: the verification forward's layout
    ks: list[int]
    trees: list
    proposals: list  # Proposal per row


def fall_back(rows: list[Row], config: DecodeConfig, memory_probe) -> None:
    """Switch rows to target-only for the rest of their generation: free accelerator memory below
    config.min_free_memory_bytes, or a row's rolling tau below its acceptance_length_threshold."""
    if memory_probe is not None and config.min_free_memory_bytes is not None \
            and any(row.speculating for row in rows):
        free = memory_probe()
        if free < config.min_free_memory_bytes:
            for row in rows:
                if row.speculating:
                    row.metrics.record_fallback("low_memory", int(free))
                    row.speculating = False
    for row in rows:
        window = row.rolling_tau
        if (row.speculating and row.config.acceptance_length_threshold is not None
                and len(window) == window.maxlen
                and sum(window) / len(window) < row.config.acceptance_length_threshold):
            row.metrics.record_fallback("low_acceptance_length", sum(window) / len(window))
            row.speculating = False


def draft(drafter, rows: list[Row], config: DecodeConfig, step_start: float, device,
          clock: PassClock) -> tuple[Step, float]:
    """Ask the drafter for every speculating row's drafts: at most what its budget can still take
    after the bonus token (on vLLM's schedule, DecodeConfig.draft_past_budget, what the target's
    positions can), none on the engines' schedule's prefill -> (Step, the time drafting ended). A
    row given none (n-gram without a match, a head before the target's first states) verifies no
    drafts this step; a chain may come back shorter than asked."""
    ks = []
    for row in rows:
        limit = row.max_length
        if config.draft_past_budget:
            limit = row.position_limit if row.position_limit is not None else len(row.token_list) + config.k + 1
        k = min(config.k, limit - len(row.token_list) - 1) if row.speculating else 0
        if config.prefill_alone and row.cached_length == 0:
            k = 0
        ks.append(max(k, 0))
    tree = config.tree
    trees = [tree.pruned(k) if tree is not None and k > 0 else None for k in ks]
    proposals = [Proposal(None)] * len(rows)
    drafting = [k > 0 for k in ks]
    if any(drafting):
        proposals = drafter.propose([DraftRequest(row.tokens, row.token_list, k, row_tree)
                                     for row, k, row_tree in zip(rows, ks, trees)])
        synchronize(device)
    drafted = clock.now()
    for r, row in enumerate(rows):
        if not drafting[r]:
            continue
        row.metrics.draft_time_s += drafted - step_start
        row.metrics.draft_forwards += drafter.last_forwards[r]
        draft_ids = proposals[r].draft_token_ids
        if draft_ids.shape[0] == 0:
            ks[r], trees[r], proposals[r] = 0, None, Proposal(None)
        elif trees[r] is None:
            ks[r] = draft_ids.shape[0]
    return Step(tree, ks, trees, proposals), drafted


def verify(pair: ModelPair, cache, rows: list[Row], step: Step, hidden_state_ids: tuple[int, ...], device):
    """One target forward per row over what its cache lacks (the whole prompt on the first step,
    so the prefill verifies the first drafts too; then the last emitted token) followed by its
    drafts (a chain, or the tree's nodes; the root is the last token before them). Rows line up:
    pending tokens right-aligned, drafts after them, shorter rows padded; only the root and draft
    positions need logits -> (logits # [b, N + 1, vocab] the root's then each draft's, hidden
    # [b, P + N, A * H] the states the drafter reads or None, query_valid # [b, P + N], P)."""
    input_ids, query_valid, offsets, new_mask, width = line_up(rows, step.proposals, step.ks, step.tree, device)
    drafts = input_ids.shape[1] - width  # N: the longest chain, or the tree's nodes
    logits = cache.forward(pair.target, input_ids, query_valid, offsets, new_mask, drafts + 1, hidden_state_ids)
    hidden = None
    if hidden_state_ids:
        logits, hidden = logits
    return logits[:, :, :pair.vocab_size], hidden, query_valid, width


def accept_rows(rows: list[Row], logits, step: Step, query_valid, width: int, rules: tuple):
    """Each row's acceptance, with its own rule and random stream -> (per row (num_accepted,
    emitted # [num_accepted + 1]), kept # [b, P + N] bool: the columns that stay, the verified
    tokens and the accepted drafts)."""
    kept = query_valid.clone()
    kept[:, width:] = False  # drafts off the accepted path are not kept
    accepted = []
    for r, row in enumerate(rows):
        num_accepted, emitted, accepted_columns = accept(row, logits[r], step.proposals[r], step.ks[r],
                                                         step.trees[r], rules)
        kept[r, width - 1 + accepted_columns] = True
        accepted.append((num_accepted, emitted))
    return accepted, kept


def roll_back(cache, drafter, rows: list[Row], accepted: list[tuple], kept, hidden) -> None:
    """Keep the verified tokens and the accepted drafts in the target cache, drop the rest (the
    emitted recovered/bonus token is fed with the next step); the drafter rolls back to the same
    lengths, given the kept positions' target states when it reads them."""
    cache.keep(kept)
    for row, (num_accepted, _) in zip(rows, accepted):
        row.cached_length = len(row.token_list) + num_accepted
    if drafter is not None:
        hiddens = [hidden[r:r + 1, kept[r]] for r in range(len(rows))] if hidden is not None else None
        drafter.rollback([row.cached_length for row in rows], hiddens)


def emit(pair: ModelPair, rows: list[Row], step: Step, accepted: list[tuple], step_start: float,
         verify_start: float, clock: PassClock) -> Iterator[tuple[int, int]]:
    """Yield each row's verified tokens (row index, token id), stopping a row at EOS, a stop string
    or its budget, and record the step in its metrics."""
    import torch

    emitted_lists = [emitted.tolist() for _, emitted in accepted]  # syncs, so the verify time is honest
    now = clock.now()
    for r, (row, (num_accepted, emitted), emitted_list) in enumerate(zip(rows, accepted, emitted_lists)):
        k, step_tree = step.ks[r], step.trees[r]
        row.metrics.verify_time_s += now - verify_start
        # a tree counts its depth as the positions drafted: per-position acceptance is per depth
        row.metrics.record_step(k if step_tree is None else step_tree.depth, num_accepted, len(emitted_list))
        if k > 0:
            row.rolling_tau.append(num_accepted + 1)
        first_step = row.metrics.ttft_s is None
        if first_step:
            row.metrics.ttft_s = now - row.start
        share = (now - step_start) / len(emitted_list)
        for position, token in enumerate(emitted_list):
            row.generated.append(token)
            row.token_list.append(token)
            row.metrics.generated_tokens += 1
            if first_step:
                row.metrics.ttft_tokens += 1
            row.metrics.token_latencies_s.append(share)
            yield row.index, token
            row.stop = stop_of(pair, row, token)
            if row.stop == "eos" and step_tree is None and position < min(num_accepted, k - 1):
                # an accepted draft ended the generation before the step's last draft:
                # llama.cpp counts only the drafts before it (metrics.stop_draft_counts)
                row.metrics.stop_draft = (position, num_accepted)
            if row.stop:
                row.unemitted = emitted_list[position + 1:]
                break
        if row.stop:
            row.metrics.stop_reason = row.stop
            row.metrics.total_time_s = clock.now() - row.start
        else:
            row.tokens = torch.cat([row.tokens, emitted.view(1, -1)], dim=1)  # [1, length]


def step(pair: ModelPair, batch: Batch, config: DecodeConfig, memory_probe, rules: tuple, device,
         clock: PassClock, finished: Callable[[int], None] | None = None) -> Iterator[tuple[int, int]]:
    """One step of every row of the batch, yielding (row index, token) as emit does; the rows that
    finished leave it (finished(row index) for each)."""
    step_start = clock.now()
    fall_back(batch.rows, config, memory_probe)
    drafts, verify_start = draft(batch.drafter, batch.rows, config, step_start, device, clock)
    hidden_state_ids = batch.drafter.hidden_state_ids if batch.drafter is not None else ()
    logits, hidden, query_valid, width = verify(pair, batch.cache, batch.rows, drafts, hidden_state_ids, device)
    accepted, kept = accept_rows(batch.rows, logits, drafts, query_valid, width, rules)
    roll_back(batch.cache, batch.drafter, batch.rows, accepted, kept, hidden)
    yield from emit(pair, batch.rows, drafts, accepted, step_start, verify_start, clock)
    charge(batch.rows, clock.now() - step_start)
    for row in batch.rows:
        if row.stop and finished is not None:
            finished(row.index)
    batch.rows = leave(batch.rows, batch.cache, batch.drafter)
