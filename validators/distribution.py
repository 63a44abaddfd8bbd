"""Distribution preservation (docs/design.md §3): speculative sampling must emit tokens distributed
exactly as the target's own sampling.

For each golden prompt with temperature > 0, at a few fixed prefixes (the prompt, and the
prompt followed by the first tokens of its greedy continuation), the real next-token
distributions of the target (p) and the draft (q) are computed once, with the prompt's
temperature / top-k / top-p applied to both. Then, with fixed seeds, ``samples`` single-step
draws go through the runtime's acceptance rule (draft token x ~ q, a uniform, the rule's
accepted-or-recovered token) and as many draws come from p directly (target-only sampling).
Two chi-square tests per prefix: speculative vs target-only counts (homogeneity) and
speculative counts vs the exact p (goodness of fit). Sparse tokens are pooled into one bin so
every expected count is large enough for the chi-square approximation. A p-value below
``alpha`` / number of tests fails, as does any emitted token whose target probability is 0.

One step per draw (not whole generations) keeps this cheap enough for a CPU while each draw
still exercises the full rule: acceptance test, recovery from norm(max(0, p - q)). The draws go
through the rule many at a time (its n-step form, or the tree rule's n-draw form: the same code
the decode loop runs on one step, drawing the same tokens as one call per draw would).

q is the pair's own drafter at the prefix: the draft model's distribution; for a head (EAGLE-3,
MTP) the head's distribution drafted from the target's hidden states of a prefill over the
prefix, as the decode loop drafts it; for a tree method (Medusa) the tree's first-depth
candidates, each a point mass (the heads' deterministic top-k), through the tree rule: recursive
rejection over the siblings. ngram proposals are looked up, not drawn: q is a point mass on the
target's top token there.
"""

from __future__ import annotations

from typing import Callable

from specreg.core.types import FAIL, PASS, SKIP, CheckResult
from specreg.validators.context import Check, CheckContext

CHECK_NAME = "distribution"
DEFAULT_SAMPLES = 4000
DEFAULT_ALPHA = 1e-3
PREFIX_OFFSETS = (0, 4, 8)  # tokens of the greedy continuation appended to the prompt
MAX_RECORDS = 4
MIN_TWO_SAMPLE_BIN = 10  # pooled count a+b per kept bin (expected 5 per side)
MIN_EXPECTED = 5.0
# draws per call of the acceptance rule x the laws' support: its float64 running sums stay near 32 MB
DRAW_ELEMENTS = 1 << 22


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularized upper incomplete gamma."""
    import torch

    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(statistic / 2.0, dtype=torch.float64)))


def two_sample_chi2(counts_a, counts_b) -> tuple[float, int, float]:
    """Chi-square homogeneity test of two count vectors with equal totals # [vocab] each ->
    (statistic, degrees of freedom, p-value). Bins with a+b < MIN_TWO_SAMPLE_BIN are pooled."""
    import torch

    a, b = counts_a.double(), counts_b.double()
    total = a + b
    keep = total >= MIN_TWO_SAMPLE_BIN
    a_bins, b_bins = [a[keep]], [b[keep]]
    if (~keep).any() and total[~keep].sum() > 0:
        a_bins.append(a[~keep].sum().view(1))
        b_bins.append(b[~keep].sum().view(1))
    a, b = torch.cat(a_bins), torch.cat(b_bins)
    n_a, n_b = a.sum(), b.sum()
    # the general two-sample form (also right when the totals differ)
    statistic = float((((a * (n_b / n_a).sqrt() - b * (n_a / n_b).sqrt()) ** 2) / (a + b)).sum())
    dof = int(a.shape[0]) - 1
    return statistic, dof, chi2_sf(statistic, dof)


def goodness_of_fit_chi2(counts, probs) -> tuple[float, int, float]:
    """Chi-square goodness of fit of counts # [vocab] to exact probs # [vocab] ->
    (statistic, degrees of freedom, p-value). Tokens with expected count < 5 are pooled."""
    import torch

    counts, probs = counts.double(), probs.double()
    expected = probs * counts.sum()
    keep = expected >= MIN_EXPECTED
    observed_bins, expected_bins = [counts[keep]], [expected[keep]]
    rest_expected = expected[~keep].sum()
    if rest_expected > 0:
        observed_bins.append(counts[~keep].sum().view(1))
        expected_bins.append(rest_expected.view(1))
    observed, expected = torch.cat(observed_bins), torch.cat(expected_bins)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = int(observed.shape[0]) - 1
    return statistic, dof, chi2_sf(statistic, dof)


def next_token_probs(model, token_ids: list[int], vocab_size: int, record):
    """probs # [vocab] of ``model`` after token_ids, with the record's sampling settings."""
    import torch

    from specreg.runtime.sampling import logits_to_probs

    with torch.inference_mode():
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=next(model.parameters()).device)
        logits = model(input_ids=input_ids, use_cache=False).logits[0, -1:, :vocab_size]  # [1, vocab]
    return logits_to_probs(logits.float(), record.temperature, record.top_k, record.top_p)[0]


def drafter_proposal(pair, method: str, token_ids: list[int], record, tree=None, draft_sampling: str = "greedy"):
    """What the pair's own drafter proposes first at the prefix token_ids, with the record's
    sampling settings and ``draft_sampling`` (DecodeConfig's): (node_token_ids # [nodes+1] or None for a chain, draft_probs # [vocab] for a
    chain, [nodes+1, vocab] over the tree's first depth for a tree method). token_ids: >= 2 tokens."""
    import torch
    from transformers import DynamicCache

    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.forward import forward_logits
    from specreg.runtime.methods import drafting_method
    from specreg.runtime.methods.base import DraftRequest

    device = pair.device
    first_depth = tree.pruned(1) if tree is not None else None  # tree: a runtime.tree.CandidateTree
    config = DecodeConfig(method=method, k=1, tree=first_depth, temperature=record.temperature, top_k=record.top_k,
                          top_p=record.top_p, draft_sampling=draft_sampling)
    drafter = drafting_method(method).drafter(pair, [config], [torch.Generator(device=device).manual_seed(0)])
    tokens = torch.tensor([token_ids], dtype=torch.long, device=device)  # [1, n]
    with torch.inference_mode():
        if drafter.hidden_state_ids:
            # a head drafts the token after x_n from the target's state that predicted x_n (position
            # n - 1) and x_n itself: in the loop x_n is the target's own token of the last step
            _, hidden = forward_logits(pair.target, tokens[:, :-1], DynamicCache(config=pair.target.config), 1,
                                       drafter.hidden_state_ids)  # hidden # [1, n - 1, A * H]
            drafter.rollback([len(token_ids) - 1], [hidden])
        proposal = drafter.propose([DraftRequest(tokens, list(token_ids), 1, first_depth)])[0]
    if first_depth is not None:
        return proposal.draft_token_ids, proposal.draft_probs.float()
    return None, proposal.draft_probs[0].float()


def on_support(*laws):
    """The tokens any of ``laws`` (each # [..., vocab]) gives probability > 0, and each law cut to
    them -> (support_ids # [s], cut laws # [..., s]). Draws through the acceptance rule on the cut
    laws, mapped back with support_ids, are the draws on the whole vocabulary: outside the support
    every law is 0 there, so no correct rule can emit such a token, and the rule's tests and
    residuals are the same numbers. After top-k / top-p a real vocabulary (49152 tokens for
    SmolLM2) shrinks to tens or hundreds, and each of the thousands of draws costs that much less.
    A rule that emitted a token outside the support could not show it here, but it would have to
    emit one that every law gives probability 0: the decode loop's tests catch that."""
    import torch

    support = torch.zeros(laws[0].shape[-1], dtype=torch.bool, device=laws[0].device)
    for law in laws:
        support |= (law > 0).reshape(-1, law.shape[-1]).any(0)
    ids = support.nonzero().squeeze(-1)  # [s]
    return ids, [law[..., ids] for law in laws]


def sample_one_step_tree(node_token_ids, draft_probs, target_probs, samples: int, seed: int,
                         tree_acceptance_rule: Callable | None = None):
    """As sample_one_step for a depth-1 tree: the root's children tried in order with the tree rule,
    called on many draws at once (its n-draw form, in chunks as sample_one_step's).

    node_token_ids  # [nodes+1] root first
    draft_probs     # [nodes+1, vocab] each child's point mass (row 0 unused)
    target_probs    # [vocab] p at the prefix
    tree_acceptance_rule: default acceptance_rule.tree_rejection_sample (tests inject a broken one).
    """
    import torch

    from specreg.runtime.acceptance_rule import tree_rejection_sample

    rule = tree_acceptance_rule or tree_rejection_sample
    generator = torch.Generator(device=target_probs.device).manual_seed(seed)
    nodes = node_token_ids.shape[0]
    parent_ids = torch.tensor([-1] + [0] * (nodes - 1), device=target_probs.device)  # [nodes+1]
    # the candidates' tokens stay in the support even where a law is 0 for them
    marks = torch.zeros_like(target_probs)
    marks[node_token_ids[1:]] = 1.0
    support_ids, (q, p, _) = on_support(draft_probs[1:], target_probs, marks)
    position = torch.full_like(marks, -1, dtype=torch.long)
    position[support_ids] = torch.arange(support_ids.shape[0], device=support_ids.device)
    cut_nodes = position[node_token_ids]  # [nodes+1] (the root's entry is unused)
    q = torch.cat([q[:1], q])  # [nodes+1, s]: row 0 unused
    # rows past the root are the laws after an accepted child: they only matter after the first token
    p = p.view(1, -1).expand(nodes, -1)  # [nodes+1, s]
    uniforms = torch.rand(samples, nodes, generator=generator, device=target_probs.device)  # [samples, nodes+1]
    chunk = max(1, DRAW_ELEMENTS // support_ids.shape[0])
    speculative = torch.empty(samples, dtype=torch.long)
    for start in range(0, samples, chunk):
        end = min(samples, start + chunk)
        _, _, emitted = rule(q, p, cut_nodes, parent_ids, uniforms[start:end], generator)  # emitted # [draws, 2]
        speculative[start:end] = support_ids[emitted[:, 0]].cpu()
    target_generator = torch.Generator(device=target_probs.device).manual_seed(seed + 1)
    target_only = torch.multinomial(target_probs, samples, replacement=True, generator=target_generator)
    return speculative, target_only.cpu()


def sample_one_step(draft_probs, target_probs, samples: int, seed: int, acceptance_rule: Callable):
    """Draw ``samples`` first tokens through the acceptance rule and as many from the target.

    draft_probs   # [vocab] q at the prefix
    target_probs  # [vocab] p at the prefix
    acceptance_rule: called on many draws at once (rejection_sample's n-step form, in chunks of
    at most DRAW_ELEMENTS laws' entries), in draw order, as the decode loop calls it on one step.
    Returns (speculative_tokens # [samples], target_only_tokens # [samples]).
    """
    import torch

    generator = torch.Generator(device=target_probs.device).manual_seed(seed)
    support_ids, (q, p) = on_support(draft_probs, target_probs)  # [s], [s], [s]
    draft_ids = torch.multinomial(q, samples, replacement=True, generator=generator)  # [samples] on the support
    uniforms = torch.rand(samples, generator=generator, device=target_probs.device)  # [samples]
    q = q.view(1, 1, -1)  # [1, k=1, s]: the same law for every draw
    # row 1 (the bonus distribution) only matters after the first token; any law will do there
    p = torch.stack([p, p]).unsqueeze(0)  # [1, k+1=2, s]
    chunk = max(1, DRAW_ELEMENTS // support_ids.shape[0])
    speculative = torch.empty(samples, dtype=torch.long)
    for start in range(0, samples, chunk):
        end = min(samples, start + chunk)
        _, emitted = acceptance_rule(q, p, draft_ids[start:end].view(-1, 1), uniforms[start:end].view(-1, 1),
                                     generator)  # emitted # [draws, 2]
        speculative[start:end] = support_ids[emitted[:, 0]].cpu()
    target_generator = torch.Generator(device=target_probs.device).manual_seed(seed + 1)
    target_only = torch.multinomial(target_probs, samples, replacement=True, generator=target_generator)
    return speculative, target_only.cpu()


def check_distribution(pair, golden, decodes, *, method: str = "draft_model", samples: int = DEFAULT_SAMPLES,
                       alpha: float = DEFAULT_ALPHA, seed: int = 0, acceptance_rule: Callable | None = None,
                       max_records: int = MAX_RECORDS, tree=None,
                       tree_acceptance_rule: Callable | None = None, draft_sampling: str = "greedy",
                       progress: Callable[[int, int], None] | None = None) -> CheckResult:
    """Statistical check that speculative sampling preserves the target's distribution.

    pair: runtime ModelPair; golden: the GoldenSet; decodes: GoldenDecodes of decode_golden
    (their greedy continuations give the fixed prefixes); method and tree: the pair's (q comes from
    its own drafter, drafter_proposal, drafting as ``draft_sampling`` says; ngram: one-hot on the
    target's top token);
    acceptance_rule / tree_acceptance_rule: the runtime's rules (defaults in
    runtime/acceptance_rule.py; tests inject broken ones); progress(done, total) after each prefix. Returns a CheckResult
    "distribution"; skip when no prompt samples.
    """
    from specreg.runtime.acceptance_rule import rejection_sample

    rules = (acceptance_rule or rejection_sample, tree_acceptance_rule)
    records = {record.id: record for record in golden}
    sampled = [run for run in decodes.runs if run.temperature > 0][:max_records]
    if not sampled:
        return CheckResult(CHECK_NAME, SKIP, f"golden set '{golden.name}' has no prompt with temperature > 0",
                           {"prefixes": []}, {"prefixes": 0})
    prefixes = golden_prefixes(sampled)
    tests = 2 * len(prefixes)
    threshold = alpha / tests
    results = []
    for index, (run, offset, token_ids) in enumerate(prefixes):
        record = records[run.record_id]
        target_probs = next_token_probs(pair.target, token_ids, pair.vocab_size, record)  # [vocab]
        node_token_ids, draft_probs = draft_law(pair, method, token_ids, record, tree, target_probs, draft_sampling)
        result = test_prefix(node_token_ids, draft_probs, target_probs, samples, seed + 1000 * index, rules)
        results.append({"record": run.record_id, "category": run.category, "prefix_tokens": len(token_ids),
                        "continuation_offset": offset, **result,
                        "ok": result["zero_probability_emitted"] == 0
                        and min(result["p_value_vs_target_sampling"], result["p_value_vs_target_probs"]) >= threshold})
        if progress:
            progress(index + 1, len(prefixes))
    evidence = {"prefixes": results, "alpha": alpha, "tests": tests,
                "method": "single-step draws through the acceptance rule vs target sampling, chi-square",
                "draft_law": draft_law_description(pair, method, tree, draft_sampling)}
    return verdict(results, evidence, samples, threshold)


def golden_prefixes(sampled: list) -> list[tuple]:
    """The fixed prefixes of the sampled prompts: each prompt and the prompt followed by the first
    PREFIX_OFFSETS tokens of its greedy continuation -> [(run, offset, token_ids)]."""
    prefixes = []
    for run in sampled:
        continuation = run.target_only.token_ids
        for offset in PREFIX_OFFSETS:
            if offset <= len(continuation) - 1 or offset == 0:
                prefixes.append((run, offset, run.prompt_ids + continuation[:offset]))
    return prefixes


def draft_law(pair, method: str, token_ids: list[int], record, tree, target_probs, draft_sampling: str = "greedy"):
    """q at the prefix as the pair's drafter proposes it -> (node_token_ids # [nodes+1] or None for
    a chain, draft_probs # [vocab] or [nodes+1, vocab]). A model-free method looks its proposals
    up, deterministically: a point mass on the target's top token, as for a head before it has the
    target's state before the last token. A chain drafter under "greedy" draft sampling proposes
    a point mass on its argmax (runtime.sampling.draft_token)."""
    import torch

    from specreg.core.methods import method_descriptor

    descriptor = method_descriptor(method)
    if not descriptor.model_free and not descriptor.has_head and pair.draft is not None:
        law = next_token_probs(pair.draft, token_ids, pair.vocab_size, record)  # [vocab]
        if draft_sampling == "greedy":
            law = torch.nn.functional.one_hot(law.argmax(), law.shape[-1]).to(law.dtype)
        return None, law
    if descriptor.model_free or pair.draft is None or len(token_ids) < 2:
        draft_probs = torch.zeros_like(target_probs)
        draft_probs[target_probs.argmax()] = 1.0
        return None, draft_probs
    return drafter_proposal(pair, method, token_ids, record, tree, draft_sampling)


def draft_law_description(pair, method: str, tree, draft_sampling: str = "greedy") -> str:
    """What q was, in words, for the evidence."""
    from specreg.core.methods import method_descriptor

    descriptor = method_descriptor(method)
    if descriptor.model_free or pair.draft is None:
        return f"a point mass on the target's top token ({descriptor.name if descriptor.model_free else 'ngram'})"
    if tree is not None:
        return "the tree's first-depth candidates (point masses), tree rule"
    law = descriptor.draft_law + (" from the target's hidden states" if descriptor.has_head else "")
    return f"a point mass on the argmax of {law} (greedy draft sampling)" if draft_sampling == "greedy" else law


def test_prefix(node_token_ids, draft_probs, target_probs, samples: int, seed: int, rules: tuple) -> dict:
    """``samples`` draws at one prefix through the acceptance rule (rules: (chain rule, tree rule))
    and from the target, with both chi-square tests -> the prefix's figures."""
    import torch

    vocab = target_probs.shape[-1]
    if node_token_ids is not None:
        speculative, target_only = sample_one_step_tree(node_token_ids, draft_probs, target_probs, samples, seed,
                                                        rules[1])
        # the chance that one of the candidates is accepted
        expected_acceptance = float(target_probs[node_token_ids[1:].unique()].sum())
    else:
        speculative, target_only = sample_one_step(draft_probs, target_probs, samples, seed, rules[0])
        expected_acceptance = float(torch.minimum(target_probs, draft_probs).sum())
    target_cpu = target_probs.double().cpu()
    spec_counts = torch.bincount(speculative, minlength=vocab)[:vocab]
    target_counts = torch.bincount(target_only, minlength=vocab)[:vocab]
    _, _, p_homogeneity = two_sample_chi2(spec_counts, target_counts)
    statistic, dof, p_fit = goodness_of_fit_chi2(spec_counts, target_cpu)
    empirical = spec_counts.double() / samples
    return {"samples": samples, "p_value_vs_target_sampling": p_homogeneity, "p_value_vs_target_probs": p_fit,
            "chi2_vs_target_probs": statistic, "dof": dof,
            "total_variation": float((empirical - target_cpu).abs().sum() / 2),
            "expected_acceptance": expected_acceptance,
            "zero_probability_emitted": int(spec_counts[target_cpu == 0].sum())}


def verdict(results: list[dict], evidence: dict, samples: int, threshold: float) -> CheckResult:
    """The check's result over every prefix: any zero-probability token fails, as does any p-value
    below the threshold."""
    zero_probability = sum(r["zero_probability_emitted"] for r in results)
    min_p = min(min(r["p_value_vs_target_sampling"], r["p_value_vs_target_probs"]) for r in results)
    figures = {"prefixes": len(results), "samples_per_prefix": samples, "min_p_value": min_p,
               "threshold": threshold, "zero_probability_emitted": zero_probability,
               "max_total_variation": max(r["total_variation"] for r in results)}
    if zero_probability:
        bad = next(r for r in results if r["zero_probability_emitted"])
        return CheckResult(CHECK_NAME, FAIL, f"speculative sampling emitted {zero_probability} token(s) the target "
                           f"gives probability 0 ('{bad['record']}', prefix of {bad['prefix_tokens']} tokens)",
                           evidence, figures)
    failing = [r for r in results if not r["ok"]]
    if failing:
        bad = failing[0]
        return CheckResult(CHECK_NAME, FAIL, f"speculative sampling does not match the target's distribution: "
                           f"'{bad['record']}' prefix of {bad['prefix_tokens']} tokens, p = "
                           f"{min(bad['p_value_vs_target_sampling'], bad['p_value_vs_target_probs']):.2e} < "
                           f"{threshold:.1e} ({len(failing)} of {len(results)} prefixes fail)", evidence, figures)
    return CheckResult(CHECK_NAME, PASS, f"{len(results)} prefixes x {samples} draws: speculative sampling matches "
                       f"the target (min p = {min_p:.3g} >= {threshold:.1e}), no zero-probability token",
                       evidence, figures)


def run(context: CheckContext) -> CheckResult:
    """The distribution check of a validation, at prefixes of the runtime's golden decodes."""
    pair, decodes = context.runtime()
    settings, options, hooks = context.settings, context.options, context.hooks
    return check_distribution(
        pair, context.golden, decodes, method=settings.method, samples=options.distribution_samples,
        seed=options.seed, acceptance_rule=hooks.get("acceptance_rule"), tree=settings.tree,
        tree_acceptance_rule=hooks.get("tree_acceptance_rule"), draft_sampling=settings.draft_sampling,
        progress=lambda done, total: context.report(f"check {CHECK_NAME}", done, total + 1, "prefixes sampled"))


CHECK = Check(CHECK_NAME, run, announce=True, runtime=True)
