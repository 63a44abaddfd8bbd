"""The pure acceptance rule, without models (docs/design.md §2 step 4)."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from specreg.runtime.acceptance_rule import greedy_accept, greedy_accept_stopping_at, rejection_sample
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


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("shared_laws", [True, False])
def test_n_steps_at_once_emit_what_one_call_per_step_emits(k, shared_laws):
    """The n-step form (the distribution check's) is n one-step calls (the decode loop's) in a
    row: same counts, same tokens (recovered and bonus ones drawn in step order), -1 after each
    step's tokens; with one set of laws for every step or one per step, p == q and disjoint
    supports among them."""
    n = 64
    generator = torch.Generator().manual_seed(11)
    draft_probs = torch.stack([random_distributions(k, seed=step) for step in range(n)])  # [n, k, vocab]
    target_probs = torch.stack([random_distributions(k + 1, seed=100 + step) for step in range(n)])  # [n, k+1, vocab]
    target_probs[::5, :k] = draft_probs[::5]  # p == q: everything accepted
    draft_probs[1::7, :, :3], draft_probs[1::7, :, 3:] = 1.0 / 3, 0.0  # disjoint supports: nothing accepted
    target_probs[1::7, :, :3] = 0.0
    target_probs[1::7] /= target_probs[1::7].sum(-1, keepdim=True)
    if shared_laws:  # one step's laws, neither equal nor disjoint
        draft_probs, target_probs = draft_probs[2:3], target_probs[2:3]
    laws = lambda step: (draft_probs[0 if shared_laws else step], target_probs[0 if shared_laws else step])
    draft_ids = torch.stack([torch.multinomial(laws(step)[0], 1, generator=generator).squeeze(-1) if k else
                             torch.empty(0, dtype=torch.long) for step in range(n)])  # [n, k]
    uniforms = torch.rand(n, k, generator=generator)
    stepwise_generator, batched_generator = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    one_by_one = [rejection_sample(*laws(step), draft_ids[step], uniforms[step], stepwise_generator)
                  for step in range(n)]
    counts, emitted = rejection_sample(draft_probs, target_probs, draft_ids, uniforms, batched_generator)
    assert counts.tolist() == [count for count, _ in one_by_one]
    assert emitted.tolist() == [tokens.tolist() + [-1] * (k - count) for count, tokens in one_by_one]
    if k:  # rejections and full acceptances both ran
        assert {0, k} <= set(counts.tolist()) if not shared_laws else len(set(counts.tolist())) > 1


def test_greedy_branch():
    target_ids = torch.tensor([5, 7, 9, 11])  # [k+1]
    assert [x if not torch.is_tensor(x) else x.tolist() for x in greedy_accept(torch.tensor([5, 7, 9]), target_ids)] == [3, [5, 7, 9, 11]]
    num_accepted, emitted = greedy_accept(torch.tensor([5, 8, 9]), target_ids)
    assert num_accepted == 1 and emitted.tolist() == [5, 7]
    num_accepted, emitted = greedy_accept(torch.tensor([4, 7, 9]), target_ids)
    assert num_accepted == 0 and emitted.tolist() == [5]


# ---- tree rules (acceptance_rule.tree_*), trees from runtime/tree.py -------------------------------

from specreg.runtime.acceptance_rule import tree_greedy_accept, tree_rejection_sample  # noqa: E402
from specreg.runtime.sampling import sample  # noqa: E402
from specreg.runtime.tree import parse_tree  # noqa: E402

TREE_N = 8_000


def draw_tree(tree, first_draft, next_draft, scheme, rng):
    """Draft every node's token -> (node_token_ids # [nodes+1], draft_probs # [nodes+1, vocab]).

    first_draft # [vocab] drafts depth 1; next_draft # [vocab, vocab] drafts a child of token y.
    scheme: "iid" (siblings drawn independently from q), "without_replacement" (q renormalised
    without the earlier siblings' tokens) or "top_k" (deterministic: the i-th most likely token
    under q, a point mass). rng: a seeded random.Random (plain Python draws keep the test fast).
    """
    tokens, rows = [0], [first_draft[0]]
    drawn = {}  # parent node -> tokens drawn for its earlier children
    for node in range(1, tree.num_nodes + 1):
        parent = tree.parents[node]
        q = first_draft[0] if parent == 0 else next_draft[tokens[parent]]
        earlier = drawn.setdefault(parent, [])
        if scheme == "without_replacement":
            q = [0.0 if t in earlier else w for t, w in enumerate(q)]
            q = [w / sum(q) for w in q]
        if scheme == "top_k":
            token = sorted(range(VOCAB), key=lambda t: -q[t])[len(earlier)]
            q = [1.0 if t == token else 0.0 for t in range(VOCAB)]
        else:
            token = rng.choices(range(VOCAB), weights=q)[0]
        earlier.append(token)
        tokens.append(token)
        rows.append(q)
    return torch.tensor(tokens), torch.tensor(rows)


def run_tree_rule(tree, scheme, seed=0, trials=TREE_N, first_target=None):
    """Target: p1 at the root, p2[y] after token y, p3[y] after a depth-2 token y
    -> (p1, p2, emitted lists)."""
    import random

    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    first_target = random_distributions(1, seed=11)[0] if first_target is None else first_target  # [vocab]
    next_target = random_distributions(VOCAB, seed=12)  # [vocab, vocab]
    table = torch.cat([first_target[None], next_target, random_distributions(VOCAB, seed=13)])  # [1 + 2 vocab, vocab]
    first_draft = random_distributions(1, seed=14).tolist()
    next_draft = random_distributions(VOCAB, seed=15).tolist()
    parent_ids = torch.tensor(tree.parents)
    emitted_all = []
    for _ in range(trials):
        node_tokens, draft_probs = draw_tree(tree, first_draft, next_draft, scheme, rng)
        rows = [0] + [(1 if tree.depths[n] == 1 else 1 + VOCAB) + int(node_tokens[n]) for n in range(1, len(node_tokens))]
        target_probs = table[rows]  # [nodes+1, vocab]
        uniforms = torch.rand(tree.num_nodes + 1, generator=generator)
        accepted, emitted = tree_rejection_sample(draft_probs, target_probs, node_tokens, parent_ids, uniforms,
                                                  generator)
        assert node_tokens[accepted].tolist() == emitted[:-1].tolist()
        emitted_all.append(emitted.tolist())
    return first_target, next_target, emitted_all


TREES = {
    "wide": [(0,), (1,), (2,), (3,)],
    "medusa": [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)],
    "chain": [(0,), (0, 0)],
}


@pytest.mark.parametrize("tree_name, scheme", [("wide", "iid"), ("medusa", "without_replacement"),
                                               ("medusa", "top_k"), ("chain", "iid")])
def test_tree_rule_keeps_the_target_distribution(tree_name, scheme):
    """First token ~ p1; given the first token y was an accepted node, the second ~ p2[y]."""
    tree = parse_tree(TREES[tree_name])
    first_target, next_target, emitted = run_tree_rule(tree, scheme)
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=VOCAB).double()
    assert chi_square_pvalue(first, first_target) > 0.001
    if tree.depth >= 2:
        longer = [e for e in emitted if len(e) >= 2]
        y = max(range(VOCAB), key=lambda t: sum(1 for e in longer if e[0] == t))
        second = [e[1] for e in longer if e[0] == y]
        assert len(second) > 800
        observed = torch.bincount(torch.tensor(second), minlength=VOCAB).double()
        assert chi_square_pvalue(observed, next_target[y]) > 0.001


def test_tree_rule_with_every_candidate_accepted_wrongly_is_caught():
    """Power: always taking the first child gives the draft's law, and the same test rejects it."""
    tree = parse_tree(TREES["wide"])
    generator = torch.Generator().manual_seed(2)
    first_draft = random_distributions(1, seed=14)[0]
    first_target = random_distributions(1, seed=11)[0]
    draws = torch.multinomial(first_draft, TREE_N, replacement=True, generator=generator)
    assert tree.num_nodes == 4
    assert chi_square_pvalue(torch.bincount(draws, minlength=VOCAB).double(), first_target) < 1e-6


def test_tree_rule_never_emits_a_zero_probability_token():
    first_target = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])  # tokens 0, 2, 5 impossible
    for scheme in ("iid", "top_k"):
        _, _, emitted = run_tree_rule(parse_tree(TREES["medusa"]), scheme, trials=1000, first_target=first_target)
        assert {e[0] for e in emitted} <= {1, 3, 4}


def test_tree_rule_runs_repeat_exactly_with_a_seed():
    tree = parse_tree(TREES["medusa"])
    runs = [run_tree_rule(tree, "iid", seed=seed, trials=200)[2] for seed in (4, 4, 5)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def walk_tree(draft_probs, target_probs, node_token_ids, parent_ids, uniforms, generator):
    """The tree rule as its docstring states it, one node at a time (the reference for its tensor
    form): children in node order, accept on u * q < p, else p <- norm(max(0, p - q))."""
    tokens, parents = node_token_ids.tolist(), parent_ids.tolist()
    accepted, node, law = [], 0, target_probs[0]
    while True:
        for child in [c for c, parent in enumerate(parents) if parent == node]:
            p, q = law[tokens[child]], draft_probs[child, tokens[child]]
            if q > 0 and uniforms[child] * q < p:
                accepted.append(child)
                node, law = child, target_probs[child]
                break
            residual = (law - draft_probs[child]).clamp_min(0)
            law = residual / residual.sum() if residual.sum() > 0 else law
        else:
            return accepted, [tokens[n] for n in accepted] + sample(law.view(1, -1), generator).tolist()


@pytest.mark.parametrize("tree_name", sorted(TREES))
def test_tree_rule_draws_exactly_as_a_walk_of_the_tree(tree_name):
    """One step, and n draws at once (laws shared, or one set per draw): every draw's accepted nodes
    and tokens those of the node-by-node walk, the last token drawn in draw order, -1 padding after."""
    tree = parse_tree(TREES[tree_name])
    parent_ids, nodes = torch.tensor(tree.parents), tree.num_nodes + 1
    generator = torch.Generator().manual_seed(3)
    per_draw = []
    for draw in range(300):
        draft = random_distributions(nodes, seed=100 + draw)
        if draw % 3 == 0:  # point masses, as a deterministic top-k drafts
            draft = torch.nn.functional.one_hot(draft.argmax(-1), VOCAB).float()
        target = draft.clone() if draw % 7 == 0 else random_distributions(nodes, seed=1000 + draw)
        target[:, draw % VOCAB] = 0  # a token the target never emits
        target = target / target.sum(-1, keepdim=True)
        per_draw.append((draft, target, torch.multinomial(draft, 1, generator=generator).squeeze(-1),
                         torch.rand(nodes, generator=generator)))
    drafts, targets, tokens, uniforms = (torch.stack(column) for column in zip(*per_draw))
    expected = [walk_tree(draft, target, node_tokens, parent_ids, u, torch.Generator().manual_seed(draw))
                for draw, (draft, target, node_tokens, u) in enumerate(per_draw)]
    for draw, (draft, target, node_tokens, u) in enumerate(per_draw):  # one step, as the decode loop calls it
        accepted, emitted = tree_rejection_sample(draft, target, node_tokens, parent_ids, u,
                                                  torch.Generator().manual_seed(draw))
        assert (accepted.tolist(), emitted.tolist()) == expected[draw]
    # n draws at once, each with its own laws and tokens, against the walk drawing in the same order
    in_order, walked = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    counts, accepted, emitted = tree_rejection_sample(drafts, targets, tokens, parent_ids, uniforms, in_order)
    assert accepted.shape == (300, tree.depth) and emitted.shape == (300, tree.depth + 1)
    for draw, (draft, target, node_tokens, u) in enumerate(per_draw):
        nodes_taken, tokens_out = walk_tree(draft, target, node_tokens, parent_ids, u, walked)
        assert int(counts[draw]) == len(nodes_taken)
        assert accepted[draw].tolist() == nodes_taken + [-1] * (tree.depth - len(nodes_taken))
        assert emitted[draw].tolist() == tokens_out + [-1] * (tree.depth + 1 - len(tokens_out))
    assert 0 < int(counts.sum()) and int((counts == 0).sum()) > 0  # both accepting and rejecting draws
    # laws and tokens given once for all the draws
    draft, target, node_tokens, _ = per_draw[1]
    shared = tree_rejection_sample(draft, target, node_tokens, parent_ids, uniforms, torch.Generator().manual_seed(4))
    walked = torch.Generator().manual_seed(4)
    for draw in range(300):
        nodes_taken, tokens_out = walk_tree(draft, target, node_tokens, parent_ids, uniforms[draw], walked)
        assert shared[2][draw, :len(tokens_out)].tolist() == tokens_out and int(shared[0][draw]) == len(nodes_taken)


def test_tree_greedy_branch_takes_the_longest_matching_path():
    tree = parse_tree(TREES["medusa"])  # nodes: 1 (0) 2 (1) 3 (2) 4 (0,0) 5 (0,1) 6 (1,0) 7 (0,0,0)
    retrieve = tree.buffers("cpu").retrieve_indices
    assert retrieve.tolist() == [[0, 1, 4, 7], [0, 1, 5, -1], [0, 2, 6, -1], [0, 3, -1, -1]]
    node_tokens = torch.tensor([9, 5, 6, 7, 1, 2, 3, 4])
    # the target's argmax at each node: after the root 6 (node 2), after node 2 3 (node 6), then 8
    target_tokens = torch.tensor([6, 1, 3, 0, 0, 0, 8, 0])
    accepted, emitted = tree_greedy_accept(node_tokens, target_tokens, retrieve)
    assert accepted.tolist() == [2, 6] and emitted.tolist() == [6, 3, 8]
    # nothing matches: the target's own next token only
    accepted, emitted = tree_greedy_accept(node_tokens, torch.tensor([0] * 8), retrieve)
    assert accepted.tolist() == [] and emitted.tolist() == [0]
    # the whole depth-3 path
    accepted, emitted = tree_greedy_accept(node_tokens, torch.tensor([5, 1, 0, 0, 4, 0, 0, 7]), retrieve)
    assert accepted.tolist() == [1, 4, 7] and emitted.tolist() == [5, 1, 4, 7]


@pytest.mark.parametrize("draft, target, expected_accepted, expected_emitted", [
    # the SmolLM2 default-set case (summary-02): EOS (2) drafted first and matched, 3 drafts after it
    # that the target "agrees" with: llama.cpp counts 0 accepted and emits EOS as the target's token
    ([2, 1, 4093, 198], [2, 1, 4093, 198, 9], 0, [2]),
    ([5, 2, 7, 8], [5, 2, 7, 8, 9], 1, [5, 2]),       # EOS matched at position 1 of 4
    ([5, 6, 7, 2], [5, 6, 7, 2, 9], 4, [5, 6, 7, 2, 9]),  # a trailing EOS draft is still accepted
    ([5, 6, 2, 8], [5, 3, 2, 8, 9], 1, [5, 3]),       # a mismatch before the EOS: greedy_accept's result
    ([5, 6, 7, 8], [5, 6, 7, 8, 2], 4, [5, 6, 7, 8, 2]),  # EOS as the bonus token: nothing changes
])
def test_llamacpp_count_at_a_stop_token(draft, target, expected_accepted, expected_emitted):
    rule = greedy_accept_stopping_at({2})
    draft_ids, target_ids = torch.tensor(draft), torch.tensor(target)
    accepted, emitted = rule(draft_ids, target_ids)
    assert (accepted, emitted.tolist()) == (expected_accepted, expected_emitted)
    plain_accepted, plain_emitted = greedy_accept(draft_ids, target_ids)
    # the same tokens up to and including the stop token: only the count differs
    stop = plain_emitted.tolist().index(2) + 1 if 2 in plain_emitted.tolist() else None
    assert emitted.tolist()[:stop] == plain_emitted.tolist()[:stop]
