"""The pure acceptance rule, without models (DESIGN.md §2 step 4)."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from specreg.runtime.acceptance import greedy_accept, rejection_sample
from specreg.runtime.sampling import logits_to_probs

VOCAB = 6
N = 30_000


def chi_square_pvalue(observed, probs):
    """observed counts # [vocab] against a distribution # [vocab] -> p-value."""
    probs = probs.double() / probs.double().sum()
    return chisquare(observed.double().numpy(), (probs * observed.sum().double()).numpy()).pvalue


def random_distributions(rows, seed, vocab=VOCAB):
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, vocab, generator=generator) * 1.5, dim=-1)  # [rows, vocab]


def run_rule(draft_probs, target_probs, trials, seed=0):
    """Draw drafts from q, apply the rule `trials` times -> (accepted counts, emitted lists)."""
    generator = torch.Generator().manual_seed(seed)
    k = draft_probs.shape[0]
    counts, emitted_all = [], []
    for _ in range(trials):
        draft_ids = torch.multinomial(draft_probs, 1, generator=generator).squeeze(-1)  # [k]
        uniforms = torch.rand(k, generator=generator)  # [k]
        num_accepted, emitted = rejection_sample(draft_probs, target_probs, draft_ids, uniforms, generator)
        counts.append(num_accepted)
        emitted_all.append(emitted.tolist())
    return counts, emitted_all


@pytest.fixture(scope="module")
def rule_run():
    draft_probs = random_distributions(2, seed=1)  # [k=2, vocab]
    target_probs = random_distributions(3, seed=2)  # [k+1, vocab]
    counts, emitted = run_rule(draft_probs, target_probs, N)
    return draft_probs, target_probs, counts, emitted


def test_emitted_tokens_follow_the_target_distribution(rule_run):
    draft_probs, target_probs, counts, emitted = rule_run
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=VOCAB).double()
    assert chi_square_pvalue(first, target_probs[0]) > 0.001
    # given the first draft was accepted, the next token follows p_1 (recovered or accepted)
    second = [e[1] for e, c in zip(emitted, counts) if c >= 1]
    observed = torch.bincount(torch.tensor(second), minlength=VOCAB).double()
    assert len(second) > 5000
    assert chi_square_pvalue(observed, target_probs[1]) > 0.001


def test_a_broken_rule_is_caught_by_the_same_test(rule_run):
    """The chi-square has power: accepting every draft gives q's law, and the test rejects it."""
    draft_probs, target_probs, _, _ = rule_run
    generator = torch.Generator().manual_seed(3)
    draws = torch.multinomial(draft_probs[0], N, replacement=True, generator=generator)
    observed = torch.bincount(draws, minlength=VOCAB).double()
    assert chi_square_pvalue(observed, target_probs[0]) < 1e-6


def test_acceptance_rate_equals_sum_of_min_p_q(rule_run):
    draft_probs, target_probs, counts, _ = rule_run
    alpha = torch.minimum(draft_probs[0], target_probs[0]).sum().item()
    measured = sum(1 for c in counts if c >= 1) / N
    half_width = 3.29 * math.sqrt(alpha * (1 - alpha) / N)  # 99.9% binomial interval
    assert abs(measured - alpha) < half_width


def test_equal_distributions_accept_everything():
    probs = random_distributions(4, seed=5)
    counts, emitted = run_rule(probs[:3], probs, 500)
    assert all(c == 3 for c in counts)
    assert all(len(e) == 4 for e in emitted)


def test_disjoint_supports_reject_everything():
    draft_probs = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 2)  # [2, 4]
    target_probs = torch.tensor([[0.0, 0.0, 0.3, 0.7]] * 3)  # [3, 4]
    counts, emitted = run_rule(draft_probs, target_probs, 500)
    assert all(c == 0 for c in counts)
    assert all(len(e) == 1 and e[0] in (2, 3) for e in emitted)


def test_zero_draft_probability_rejects():
    draft_probs = torch.tensor([[0.0, 1.0, 0.0]])  # q(0) = 0
    target_probs = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5]])
    for seed in range(50):
        generator = torch.Generator().manual_seed(seed)
        num_accepted, emitted = rejection_sample(draft_probs, target_probs, torch.tensor([0]),
                                                 torch.rand(1, generator=generator), generator)
        assert num_accepted == 0
        assert emitted.tolist() == [0]  # residual max(0, p - q) puts all mass on 0


def test_top_k_and_top_p_masks_are_respected():
    logits = torch.tensor([[3.0, 2.5, 2.0, 0.0, -1.0, -2.0]] * 3)  # [3, 6]
    top_k = logits_to_probs(logits, temperature=1.0, top_k=2)
    assert (top_k[:, 2:] == 0).all() and torch.allclose(top_k.sum(-1), torch.ones(3))
    top_p = logits_to_probs(logits, temperature=1.0, top_p=0.6)
    assert (top_p[:, 2:] == 0).all() and (top_p[:, :2] > 0).all()
    draft_logits = torch.tensor([[0.0, 0.0, 3.0, 3.0, 0.0, 0.0]] * 2)  # the draft prefers masked ids
    draft_probs = logits_to_probs(draft_logits, temperature=1.0, top_k=2)
    target_probs = logits_to_probs(logits, temperature=1.0, top_k=2)
    _, emitted = run_rule(draft_probs, target_probs, 2000)
    assert {token for e in emitted for token in e} <= {0, 1}


def test_seeded_runs_repeat_exactly():
    draft_probs, target_probs = random_distributions(3, seed=8), random_distributions(4, seed=9)
    assert run_rule(draft_probs, target_probs, 300, seed=4) == run_rule(draft_probs, target_probs, 300, seed=4)
    assert run_rule(draft_probs, target_probs, 300, seed=4) != run_rule(draft_probs, target_probs, 300, seed=5)


def test_greedy_branch():
    target_ids = torch.tensor([5, 7, 9, 11])  # [k+1]
    assert [x if not torch.is_tensor(x) else x.tolist() for x in greedy_accept(torch.tensor([5, 7, 9]), target_ids)] == [3, [5, 7, 9, 11]]
    num_accepted, emitted = greedy_accept(torch.tensor([5, 8, 9]), target_ids)
    assert num_accepted == 1 and emitted.tolist() == [5, 7]
    num_accepted, emitted = greedy_accept(torch.tensor([4, 7, 9]), target_ids)
    assert num_accepted == 0 and emitted.tolist() == [5]
