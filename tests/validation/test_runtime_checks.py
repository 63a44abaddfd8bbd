"""The runtime checks against deliberately broken runtimes: a broken acceptance rule must fail
the distribution check, a broken greedy rule the equivalence check; a divergence at a real
near-tie of the target is a warning only below the tolerance."""

from __future__ import annotations

import pytest

from helpers import each_draw  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture(scope="module")
def runtime(models, golden_path):
    """(pair, golden, decodes) of the tiny target + random draft, k = 3."""
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.methods import load_pair
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.validators.equivalence import decode_golden

    pair = load_pair(models["target"], models["draft"], device="cpu")
    golden = load_golden_set(golden_path)
    return pair, golden, decode_golden(pair, golden, DecodeConfig(k=3))


def test_decode_golden_decodes_each_record_once_per_kind(runtime):
    """The latency prompts decode alone and count as any other run: each record is decoded once
    target-only and once speculative (a sampled one once more), never again for the latency."""
    from specreg.validators.equivalence import LATENCY_SHARE, decoded_rows

    pair, golden, decodes = runtime
    runs = decodes.runs
    assert [run.record_id for run in runs] == [record.id for record in golden]
    assert decodes.single == runs[:len(decodes.single)] and decodes.batched == runs[len(decodes.single):]
    assert len(decodes.single) == max(1, round(len(runs) * LATENCY_SHARE)) and decodes.batch_size > 1
    assert all(run.speculative.metrics.batch_size == 1 == run.target_only.metrics.batch_size for run in decodes.single)
    assert all(run.speculative.metrics.batch_size == decodes.batch_size for run in decodes.batched)
    sampled = [run for run in runs if run.sampled is not None]
    assert sampled and all(run.sampled.metrics.batch_size == decodes.batch_size for run in sampled)
    assert 2 * len(runs) + len(sampled) == decoded_rows(golden)


def each_step(rule):
    """A one-step rule (the form the decode loop calls) that also takes the acceptance rule's
    n-step form, as the distribution check calls it: the steps one after another, -1 padded."""
    def both(draft_probs, target_probs, draft_token_ids, uniforms, generator=None):
        import torch

        if draft_token_ids.dim() == 1:
            return rule(draft_probs, target_probs, draft_token_ids, uniforms, generator)
        n, k = draft_token_ids.shape
        q_all, p_all = draft_probs.expand(n, k, -1), target_probs.expand(n, k + 1, -1)
        counts, emitted = torch.zeros(n, dtype=torch.long), torch.full((n, k + 1), -1, dtype=torch.long)
        for step in range(n):
            count, tokens = rule(q_all[step], p_all[step], draft_token_ids[step], uniforms[step], generator)
            counts[step], emitted[step, :count + 1] = count, tokens
        return counts, emitted

    return both


@each_step
def recover_from_target(draft_probs, target_probs, draft_token_ids, uniforms, generator=None):
    """A classic bug: on rejection resample from p instead of norm(max(0, p - q)). Emits
    min(p, q) + (1 - alpha) p, not p."""
    import torch

    k = draft_token_ids.shape[0]
    positions = torch.arange(k)
    p, q = target_probs[positions, draft_token_ids], draft_probs[positions, draft_token_ids]
    num_accepted = int(((q > 0) & (uniforms * q < p)).to(torch.int64).cumprod(0).sum())
    next_token = torch.multinomial(target_probs[num_accepted], 1, generator=generator)
    return num_accepted, torch.cat([draft_token_ids[:num_accepted], next_token])


@each_step
def accept_every_draft(draft_probs, target_probs, draft_token_ids, uniforms, generator=None):
    """Another bug: no acceptance test at all (emits q, including tokens top-p removed from p)."""
    import torch

    bonus = torch.multinomial(target_probs[-1], 1, generator=generator)
    return draft_token_ids.shape[0], torch.cat([draft_token_ids, bonus])


def test_the_batched_passes_decode_side_by_side(runtime, monkeypatch):
    """The target-only and speculative batched passes go to one generate_interleaved (which
    tests/runtime/test_interleave.py shows takes turns between them), so a load that comes or goes
    during validation slows both; the warm-up and the latency prompts decode alone."""
    from specreg.runtime import generate
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.validators.equivalence import decode_golden

    pair, golden, decodes = runtime
    calls, real = [], generate.generate_interleaved

    def spy(pair, passes):
        calls.append([(len(one.prompts), one.speculate) for one in passes])
        return real(pair, passes)

    monkeypatch.setattr(generate, "generate_interleaved", spy)
    again = decode_golden(pair, golden, DecodeConfig(k=3))
    batched = len(decodes.batched)
    sampled = sum(1 for record in golden if not record.is_greedy)
    assert calls == [[(1, False)], [(1, True)]] * (1 + len(decodes.single)) + [[(batched, False),
                                                                              (batched + sampled, True)]]
    assert [run.speculative.token_ids for run in again.runs] == [run.speculative.token_ids for run in decodes.runs]


def test_the_performance_check_says_when_other_work_shared_the_machine(runtime):
    """The batched passes' throughputs came from a machine where other work kept cores busy: the
    figure goes with them, and from half a core on the summary says so."""
    import dataclasses

    from specreg.validators.performance import check_performance

    pair, golden, decodes = runtime
    assert decodes.other_work_cores is not None and decodes.other_work_cores >= 0.0
    busy = check_performance(pair, dataclasses.replace(decodes, other_work_cores=1.3), k=3, cost_ratio=0.1)
    quiet = check_performance(pair, dataclasses.replace(decodes, other_work_cores=0.2), k=3, cost_ratio=0.1)
    assert busy.figures["other_work_cores"] == 1.3 and quiet.figures["other_work_cores"] == 0.2
    assert "measured beside other work that kept 1.3 cores busy" in busy.summary
    assert "other work" not in quiet.summary
    assert busy.figures["speedup"] == quiet.figures["speedup"]


def test_the_draws_go_through_the_rule_as_one_call_per_draw_would(monkeypatch):
    """The check hands the rule thousands of draws at once (in chunks): the tokens are exactly
    those of one one-step call per draw, chunk boundaries included."""
    import torch

    from specreg.runtime.acceptance_rule import rejection_sample
    from specreg.runtime.sampling import logits_to_probs
    from specreg.validators import distribution

    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(5)) * 2
    draft_probs, target_probs = logits_to_probs(logits, 0.9, None, 0.95)  # [vocab] each
    one_call_per_draw = each_step(lambda *args: rejection_sample(*args))
    for elements in (1 << 22, 997):  # every draw in one call; chunks that do not divide the draws
        monkeypatch.setattr(distribution, "DRAW_ELEMENTS", elements)
        batched, target_only = distribution.sample_one_step(draft_probs, target_probs, 1500, 3, rejection_sample)
        stepwise, same_target = distribution.sample_one_step(draft_probs, target_probs, 1500, 3, one_call_per_draw)
        assert torch.equal(batched, stepwise) and torch.equal(target_only, same_target)
    assert (target_probs[batched] > 0).all() and batched.unique().numel() > 5


def test_the_tree_draws_go_through_the_rule_as_one_call_per_draw_would(monkeypatch):
    """For a tree's first depth the check also hands the tree rule its draws at once (in chunks):
    the tokens are exactly those of one one-step call per draw, chunk boundaries included."""
    import torch

    from specreg.runtime.acceptance_rule import tree_rejection_sample
    from specreg.runtime.sampling import logits_to_probs
    from specreg.validators import distribution

    logits = torch.randn(300, generator=torch.Generator().manual_seed(6)) * 2
    target_probs = logits_to_probs(logits.view(1, -1), 0.9, None, 0.95)[0]  # [vocab]
    node_token_ids = torch.cat([torch.tensor([7]), target_probs.topk(4).indices.flip(0)])  # root, 4 candidates
    draft_probs = torch.nn.functional.one_hot(node_token_ids, 300).float()  # point masses, as the heads'

    one_call_per_draw = each_draw(lambda *args: tree_rejection_sample(*args))
    for elements in (1 << 22, 997):  # every draw in one call; chunks that do not divide the draws
        monkeypatch.setattr(distribution, "DRAW_ELEMENTS", elements)
        batched, target_only = distribution.sample_one_step_tree(node_token_ids, draft_probs, target_probs, 1500, 3)
        stepwise, same_target = distribution.sample_one_step_tree(node_token_ids, draft_probs, target_probs, 1500, 3,
                                                                  one_call_per_draw)
        assert torch.equal(batched, stepwise) and torch.equal(target_only, same_target)
    assert (target_probs[batched] > 0).all() and batched.unique().numel() > 5
    # the candidates are emitted as accepted drafts, and other tokens as recovered ones
    assert set(node_token_ids[1:].tolist()) <= set(batched.tolist()) < set(target_probs.nonzero().view(-1).tolist())


@pytest.mark.parametrize("draft_sampling", ["greedy", "probabilistic"])
def test_correct_rule_passes_distribution(runtime, draft_sampling):
    from specreg.validators.distribution import check_distribution

    pair, golden, decodes = runtime
    result = check_distribution(pair, golden, decodes, samples=4000, draft_sampling=draft_sampling)
    assert result.status == "pass", result.summary
    assert result.evidence["draft_law"] == {"greedy": "a point mass on the argmax of the draft model's distribution "
                                                      "(greedy draft sampling)",
                                            "probabilistic": "the draft model's distribution"}[draft_sampling]
    assert result.figures["prefixes"] == 3 and result.figures["zero_probability_emitted"] == 0


def test_resampling_from_target_on_rejection_fails_distribution(runtime):
    from specreg.validators.distribution import check_distribution

    pair, golden, decodes = runtime
    # drafts drawn from the draft's law: the tiny random target's near-uniform p leaves a point-mass q's
    # draws (an argmax of probability ~1/vocab) too close to p for 4000 draws to tell the rules apart
    result = check_distribution(pair, golden, decodes, samples=4000, acceptance_rule=recover_from_target,
                                draft_sampling="probabilistic")
    assert result.status == "fail", result.summary
    assert "does not match the target's distribution" in result.summary


def test_accepting_every_draft_emits_zero_probability_tokens(runtime):
    from specreg.validators.distribution import check_distribution

    pair, golden, decodes = runtime
    result = check_distribution(pair, golden, decodes, samples=1000, acceptance_rule=accept_every_draft,
                                draft_sampling="probabilistic")  # q's draws reach tokens p gives 0
    assert result.status == "fail" and result.figures["zero_probability_emitted"] > 0


def test_broken_rule_through_validate_fails_the_pair(registry, models, golden_path):
    registry.register("broken", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    outcome = registry.validate("broken@1", golden=str(golden_path), device="cpu", checks="distribution",
                                hooks={"acceptance_rule": recover_from_target}, draft_sampling="probabilistic")
    assert outcome.checks[0].status == "fail" and not outcome.passed


def test_broken_greedy_rule_fails_equivalence_with_the_divergence(runtime):
    import torch

    from specreg.runtime.decode_config import DecodeConfig
    from specreg.validators.equivalence import check_equivalence, decode_golden

    def accept_all_drafts(draft_token_ids, target_token_ids):
        k = draft_token_ids.shape[0]
        return k, torch.cat([draft_token_ids, target_token_ids[k:]])

    pair, golden, _ = runtime
    decodes = decode_golden(pair, golden, DecodeConfig(k=3), hooks={"greedy_rule": accept_all_drafts})
    result = check_equivalence(pair, decodes, tolerance=1e-3)
    assert result.status == "fail", result.summary
    divergence = result.evidence["divergences"][0]
    assert divergence["speculative_token_id"] != divergence["target_only_token_id"]
    assert divergence["margin"] >= 0 and not divergence["near_tie"]
    assert "diverges at token" in result.summary


def test_divergence_to_the_runner_up_is_a_near_tie_only_below_the_tolerance(runtime):
    from copy import deepcopy

    from specreg.validators.equivalence import GoldenDecodes, check_equivalence, plain_next_token_logits

    pair, _, decodes = runtime
    run = deepcopy(decodes.runs[1])
    position = 2
    prefix = run.prompt_ids + run.target_only.token_ids[:position]
    top = plain_next_token_logits(pair, prefix).topk(2)
    margin = float(top.values[0] - top.values[1])
    assert run.target_only.token_ids[position] == int(top.indices[0])
    run.speculative.token_ids = run.target_only.token_ids[:position] + [int(top.indices[1])]
    one = GoldenDecodes(runs=[run])
    assert check_equivalence(pair, one, tolerance=margin * 2 + 1e-6).status == "warn"
    strict = check_equivalence(pair, one, tolerance=margin / 2)
    assert strict.status == "fail" and strict.evidence["divergences"][0]["position"] == position


def test_a_golden_set_of_one_record_is_judged_without_a_batched_pass(models, tmp_path):
    """One record decodes alone (batch 1): no batched pass ran, so no other-work figure was read;
    the performance check judges the speed all the same and leaves that figure out."""
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.methods import load_pair
    from specreg.validators.equivalence import decode_golden
    from specreg.validators.performance import check_performance

    path = tmp_path / "one.yaml"
    path.write_text("name: one\nversion: 1\nrecords:\n  - id: raw-1\n    category: code\n"
                    "    prompt: \"def add(a, b):\\n\"\n    max_new_tokens: 6\n")
    pair = load_pair(models["target"], models["draft"], device="cpu")
    decodes = decode_golden(pair, load_golden_set(path), DecodeConfig(k=3))
    assert decodes.batch_size == 1 and len(decodes.runs) == 1 and decodes.other_work_cores is None
    result = check_performance(pair, decodes, k=3, cost_ratio=0.1)
    assert result.status in ("pass", "warn") and result.figures["speedup"] > 0
    assert "other_work_cores" not in result.figures and "other work" not in result.summary


def test_the_summary_says_when_no_k_is_expected_to_beat_the_target(runtime):
    """The random draft of the tiny pair accepts almost nothing: with a draft step as costly as a
    target step no k pays, and the summary says so with the expectation at the recommended k;
    with a free draft it names the expectation only."""
    from specreg.validators.performance import check_performance

    pair, golden, decodes = runtime
    costly = check_performance(pair, decodes, k=3, cost_ratio=1.04)
    expected = costly.figures["expected_speedup_at_recommended_k"]
    assert expected < 1.0
    assert f"recommended k={costly.figures['recommended_k']} (expected about {expected:.2f}x; cost ratio 1.04)" \
        in costly.summary
    assert ("no k is expected to beat the target alone here (a draft step costs 1.04 of a target step): a cheaper "
            "draft or a head would") in costly.summary
    free = check_performance(pair, decodes, k=3, cost_ratio=0.0)
    assert free.figures["expected_speedup_at_recommended_k"] >= 1.0 and "no k is expected" not in free.summary
