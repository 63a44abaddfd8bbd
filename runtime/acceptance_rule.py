"""The acceptance rule of speculative decoding (docs/design.md §2), pure functions over tensors.

Sampling: accept draft token x_i with probability min(1, p_i(x_i) / q_i(x_i)) (q_i(x_i) = 0 ->
reject); at the first rejection emit a *recovered* token from norm(max(0, p_i - q_i)); if all
k are accepted emit a *bonus* token from p_{k+1}. This keeps the output distributed exactly as p.
Greedy: accept while x_i == argmax p_i, then emit the target's argmax at the first mismatch
(or the bonus argmax).
"""

from __future__ import annotations

from specreg.runtime.sampling import sample


def rejection_sample(draft_probs, target_probs, draft_token_ids, uniforms, generator=None):
    """Sampling branch, for one decoding step or for n independent steps at once.

    draft_probs      # [k, vocab] or [n, k, vocab]      q_i, after temperature/top-k/top-p
    target_probs     # [k+1, vocab] or [n, k+1, vocab]  p_i, same processing; row k is the bonus distribution
    draft_token_ids  # [k] or [n, k]                    x_i, drawn from q_i
    uniforms         # [k] or [n, k]                    u_i ~ U[0, 1), one per draft token
    One step returns (num_accepted, emitted # [num_accepted + 1]): the accepted drafts then the
    recovered or bonus token. n steps (their laws given once for all, or one set per step) return
    (num_accepted # [n], emitted # [n, k+1], -1 after each step's num_accepted + 1 tokens), each
    step's recovered or bonus token drawn from ``generator`` in step order: the same tokens as n
    one-step calls in a row. One step is n = 1, so the decode loop and the distribution check,
    which draws thousands of steps at a prefix, run the same code.
    """
    import torch

    if draft_token_ids.dim() == 1:
        counts, emitted = rejection_sample(draft_probs, target_probs, draft_token_ids.view(1, -1),
                                           uniforms.view(1, -1), generator)
        num_accepted = int(counts[0])
        return num_accepted, emitted[0, :num_accepted + 1]
    n, k = draft_token_ids.shape
    q_all = draft_probs.expand(n, *draft_probs.shape[-2:])  # [n, k, vocab]
    p_all = target_probs.expand(n, *target_probs.shape[-2:])  # [n, k+1, vocab]
    ids = draft_token_ids.unsqueeze(-1)  # [n, k, 1]
    p = p_all[:, :k].gather(-1, ids).squeeze(-1)  # [n, k]
    q = q_all.gather(-1, ids).squeeze(-1)  # [n, k]
    # u < p/q written without division; q == 0 means the draft could not have proposed x: reject
    accepted = (q > 0) & (uniforms * q < p)
    num_accepted = accepted.to(torch.int64).cumprod(-1).sum(-1)  # [n]
    steps = torch.arange(n, device=draft_token_ids.device)
    law = p_all[steps, num_accepted]  # [n, vocab]: p at the first rejection, or the bonus law
    if k > 0:
        residual = (law - q_all[steps, num_accepted.clamp_max(k - 1)]).clamp_min(0)  # [n, vocab]
        total = residual.sum(-1, keepdim=True)  # [n, 1]
        # residual == 0 only if p <= q everywhere, i.e. p == q: then p itself is the right law
        recover = (num_accepted < k).view(-1, 1) & (total > 0)
        law = torch.where(recover, residual / total.where(recover, 1), law)
    next_token = sample(law, generator)  # [n]
    kept = torch.arange(k, device=steps.device) < num_accepted.view(-1, 1)  # [n, k]
    emitted = torch.cat([draft_token_ids.where(kept, -1), torch.full_like(num_accepted, -1).view(-1, 1)], dim=-1)
    emitted[steps, num_accepted] = next_token
    return num_accepted, emitted


def greedy_accept(draft_token_ids, target_token_ids):
    """Greedy branch.

    draft_token_ids   # [k]    x_i
    target_token_ids  # [k+1]  argmax p_i
    Returns (num_accepted, emitted # [num_accepted + 1]); emitted is the target's own argmax
    sequence, so greedy speculative output equals greedy target-only output.
    """
    import torch

    k = draft_token_ids.shape[0]
    matches = (draft_token_ids == target_token_ids[:k]).to(torch.int64)
    num_accepted = int(matches.cumprod(0).sum())
    return num_accepted, target_token_ids[: num_accepted + 1]



def greedy_accept_stopping_at(stop_ids):
    """The greedy rule as llama.cpp's server counts it (common/sampling.cpp
    common_sampler_sample_and_accept_n): a draft token that matches the target and is a stop
    (end-of-generation) token ends acceptance there unless it is the last draft: it is emitted as
    the target's own token, not counted as accepted, and nothing after it is accepted. The output
    is the same as greedy_accept's (decoding ends at that token either way); only the counts
    differ (greedy_accept counts the drafts after a stop token the target happens to agree with).
    -> a rule with greedy_accept's signature, for `validate --engine llamacpp`'s runtime pass."""
    stop_ids = frozenset(int(i) for i in stop_ids)

    def rule(draft_token_ids, target_token_ids):
        num_accepted, emitted = greedy_accept(draft_token_ids, target_token_ids)
        k = draft_token_ids.shape[0]
        for i in range(min(num_accepted, k - 1)):
            if int(draft_token_ids[i]) in stop_ids:
                return i, target_token_ids[: i + 1]
        return num_accepted, emitted

    return rule

# ---- tree verification (tree.py): many candidates per position, one target forward ----------
#
# A candidate tree has node 0 = the root (the last verified token, its keys not yet cached) and
# nodes 1..n, each a candidate token whose parent is an earlier node; siblings are tried in node
# order (the drafter's rank order). Both rules are the chain rules above walked down the tree.


def tree_greedy_accept(node_token_ids, target_token_ids, retrieve_indices):
    """Greedy branch over a tree: the longest root-to-leaf path whose tokens equal the target's
    argmax chain, then the target's argmax after it (Medusa's evaluate_posterior, temperature 0).

    node_token_ids    # [nodes+1]            x at each node (row 0 the root)
    target_token_ids  # [nodes+1]            argmax p at each node: the target's next token there
    retrieve_indices  # [leaves, depth+1]    node indices of each root-to-leaf path, root first, -1 padded
    Returns (accepted_nodes # [num_accepted] the kept path's nodes, emitted # [num_accepted + 1]);
    emitted is the target's own argmax sequence, so greedy tree output equals target-only output.
    """
    import torch

    valid = retrieve_indices >= 0  # [leaves, depth+1]
    paths = retrieve_indices.clamp_min(0)
    matches = (node_token_ids[paths[:, 1:]] == target_token_ids[paths[:, :-1]]) & valid[:, 1:]  # [leaves, depth]
    lengths = matches.to(torch.int64).cumprod(1).sum(1)  # [leaves]
    best = int(lengths.argmax())  # the first longest: retrieve_indices lists the higher ranks first
    num_accepted = int(lengths[best])
    accepted_nodes = paths[best, 1:num_accepted + 1]  # [num_accepted]
    last = paths[best, num_accepted]
    return accepted_nodes, torch.cat([node_token_ids[accepted_nodes], target_token_ids[last].view(1)])


def tree_rejection_sample(draft_probs, target_probs, node_token_ids, parent_ids, uniforms, generator=None):
    """Sampling branch over a tree: recursive rejection sampling over siblings (SpecInfer's
    multi-step speculative sampling; EAGLE's tree sampling is the point-mass case), for one
    decoding step or for n independent draws at once.

    At a node, with p its target distribution, try its children in order: accept child x with
    probability min(1, p(x) / q(x)) (q(x) = 0 -> reject) and continue from that child with its own
    p; on rejection set p <- norm(max(0, p - q)) and try the next sibling; when every child is
    rejected (or there is none) emit a token from p (the recovered token, or the bonus one past an
    accepted leaf). By induction over siblings this emits exactly p as long as q is the law the
    child's token was drawn from given everything drawn before it: q for children drawn i.i.d.
    from q, q renormalised without the earlier siblings' tokens when drawn without replacement,
    a point mass for a deterministic top-k.

    draft_probs     # [nodes+1, vocab] or [n, nodes+1, vocab]  q of each node's token, given its parent and earlier siblings (row 0 unused)
    target_probs    # [nodes+1, vocab] or [n, nodes+1, vocab]  p at each node: the target's next-token law there
    node_token_ids  # [nodes+1] or [n, nodes+1]                x at each node (row 0 the root)
    parent_ids      # [nodes+1]         each node's parent (-1 for the root); siblings tried in node order
    uniforms        # [nodes+1] or [n, nodes+1]  u ~ U[0, 1), one per node (row 0 unused)
    One step returns (accepted_nodes # [num_accepted], emitted # [num_accepted + 1]) as
    tree_greedy_accept. n draws (laws and tokens given once for all, or one set per draw) return
    (num_accepted # [n], accepted_nodes # [n, depth], emitted # [n, depth + 1], both -1 padded),
    each draw's last token drawn from ``generator`` in draw order: the same tokens as n one-step
    calls in a row. One step is n = 1, so the decode loop and the distribution check, which draws
    thousands of first tokens at a prefix, run the same code.
    """
    import torch

    if uniforms.dim() == 1:
        counts, accepted, emitted = tree_rejection_sample(draft_probs, target_probs, node_token_ids, parent_ids,
                                                          uniforms.view(1, -1), generator)
        num_accepted = int(counts[0])
        return accepted[0, :num_accepted], emitted[0, :num_accepted + 1]
    n, device = uniforms.shape[0], uniforms.device
    children, depth = _children_table(parent_ids.tolist(), device)  # [nodes+1, widest], -1 padded
    q_all = draft_probs.expand(n, *draft_probs.shape[-2:])  # [n, nodes+1, vocab]
    p_all = target_probs.expand(n, *target_probs.shape[-2:])  # [n, nodes+1, vocab]
    tokens = node_token_ids.expand(n, node_token_ids.shape[-1])  # [n, nodes+1]
    draws = torch.arange(n, device=device)
    node = torch.zeros(n, dtype=torch.long, device=device)  # where each draw stands
    law = p_all[:, 0]  # [n, vocab] the law its next token must follow
    accepted = torch.full((n, depth), -1, dtype=torch.long, device=device)
    num_accepted = torch.zeros(n, dtype=torch.long, device=device)
    going = torch.ones(n, dtype=torch.bool, device=device)  # still descending
    for _ in range(depth):
        moved = torch.zeros(n, dtype=torch.bool, device=device)
        for rank in range(children.shape[1]):
            child = children[node, rank]  # [n] the rank-th child of each draw's node, -1: none
            # a draw tries its node's children in order until one is accepted: one with no child
            # at this rank has none at a later rank either
            trying = going & ~moved & (child >= 0)
            if not bool(trying.any()):
                break
            child = child.clamp_min(0)
            # a draw not trying reads any valid token (the root's may be a placeholder)
            token = tokens[draws, child].where(trying, 0)  # [n]
            p, q = law.gather(-1, token.view(-1, 1)).squeeze(-1), q_all[draws, child, token]  # [n]
            # u < p/q without division, as rejection_sample
            accept = trying & (q > 0) & (uniforms[draws, child] * q < p)
            rejected = trying & ~accept
            # the whole-vocabulary updates only where a draw needs them (one step: most children
            # are accepted or never tried)
            if bool(rejected.any()):
                residual = (law - q_all[draws, child]).clamp_min_(0)  # [n, vocab]
                total = residual.sum(-1, keepdim=True)  # [n, 1]
                # total == 0 only when p == q, where rejection has probability 0: keep p
                recover = rejected.view(-1, 1) & (total > 0)
                law = torch.where(recover, residual.div_(total.where(recover, 1)), law)
            if not bool(accept.any()):
                continue
            law = torch.where(accept.view(-1, 1), p_all[draws, child], law)
            slot = num_accepted.clamp_max(depth - 1)
            accepted[draws, slot] = torch.where(accept, child, accepted[draws, slot])
            num_accepted = num_accepted + accept.to(torch.long)
            node = torch.where(accept, child, node)
            moved |= accept
        going = moved
        if not bool(going.any()):
            break
    next_token = sample(law, generator)  # [n]
    emitted = torch.cat([tokens.gather(-1, accepted.clamp_min(0)).where(accepted >= 0, -1),
                         torch.full((n, 1), -1, dtype=torch.long, device=device)], dim=-1)  # [n, depth+1]
    emitted[draws, num_accepted] = next_token
    return num_accepted, accepted, emitted


def _children_table(parents: list[int], device):
    """parents (one per node, -1 for the root) -> (children # [nodes+1, widest] each node's
    children in node order, -1 padded; the tree's depth)."""
    import torch

    children: list[list[int]] = [[] for _ in parents]
    depths = [0] * len(parents)
    for node, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(node)
            depths[node] = depths[parent] + 1
    widest = max(1, max(len(kids) for kids in children))
    table = torch.tensor([kids + [-1] * (widest - len(kids)) for kids in children], dtype=torch.long, device=device)
    return table, max(depths)
