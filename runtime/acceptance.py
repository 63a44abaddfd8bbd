"""The acceptance rule of speculative decoding (DESIGN.md §2), pure functions over tensors.

Sampling: accept draft token x_i with probability min(1, p_i(x_i) / q_i(x_i)) (q_i(x_i) = 0 ->
reject); at the first rejection emit a *recovered* token from norm(max(0, p_i - q_i)); if all
k are accepted emit a *bonus* token from p_{k+1}. This keeps the output distributed exactly as p.
Greedy: accept while x_i == argmax p_i, then emit the target's argmax at the first mismatch
(or the bonus argmax).
"""

from __future__ import annotations


def rejection_sample(draft_probs, target_probs, draft_token_ids, uniforms, generator=None):
    """Sampling branch.

    draft_probs      # [k, vocab]    q_i, after temperature/top-k/top-p
    target_probs     # [k+1, vocab]  p_i, same processing; row k is the bonus distribution
    draft_token_ids  # [k]           x_i, drawn from q_i
    uniforms         # [k]           u_i ~ U[0, 1), one per draft token
    Returns (num_accepted, emitted # [num_accepted + 1]): the accepted drafts then the
    recovered or bonus token.
    """
    import torch

    k = draft_token_ids.shape[0]
    positions = torch.arange(k, device=draft_token_ids.device)
    p = target_probs[positions, draft_token_ids]  # [k]
    q = draft_probs[positions, draft_token_ids]  # [k]
    # u < p/q written without division; q == 0 means the draft could not have proposed x: reject
    accepted = (q > 0) & (uniforms * q < p)
    num_accepted = int(accepted.to(torch.int64).cumprod(0).sum())
    if num_accepted < k:
        residual = (target_probs[num_accepted] - draft_probs[num_accepted]).clamp_min(0)
        total = residual.sum()
        # residual == 0 only if p <= q everywhere, i.e. p == q: then p itself is the right law
        distribution = residual / total if total > 0 else target_probs[num_accepted]
    else:
        distribution = target_probs[k]
    next_token = torch.multinomial(distribution, 1, generator=generator)  # [1]
    return num_accepted, torch.cat([draft_token_ids[:num_accepted], next_token])


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
