"""The engine-validation checks (validators/engine.py) on exact counts: the engines' tau and
per-position figures, parity against the tolerance, every difference in the engine listed and
judged a near-tie only with the evidence, throughput tiers."""

from __future__ import annotations

import pytest

from specreg.runtime.metrics import GenerationMetrics
from specreg.validators import engine


def test_runtime_row_counts_steps_with_drafts_only_as_the_engines_do():
    metrics = GenerationMetrics()
    # 4 steps: k=3 all accepted, k=3 one accepted, nothing drafted (an ngram miss), k=2 none accepted
    for drafted, accepted, emitted in ((3, 3, 4), (3, 1, 2), (0, 0, 1), (2, 0, 1)):
        metrics.record_step(drafted, accepted, emitted)
    metrics.generated_tokens = 8
    row = engine.runtime_row("r1", "code", metrics)
    assert row == {"record": "r1", "category": "code", "generated_tokens": 8, "drafted": 8, "accepted": 4,
                   "draft_steps": 3, "accepted_per_position": [2, 1, 1]}
    figures = engine.figures([row])
    assert figures["acceptance_rate"] == 0.5
    assert figures["mean_acceptance_length"] == pytest.approx(1 + 4 / 3)  # not 8 emitted / 4 forwards
    assert figures["per_position_acceptance"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])  # unconditional
    assert figures["mean_acceptance_length"] == metrics.mean_acceptance_length  # the runtime's tau, same terms
    assert metrics.tokens_per_target_forward == 2.0  # our runtime's other figure, kept apart


def test_baselines_pool_counts_per_category():
    rows = [{"record": "a", "category": "code", "generated_tokens": 10, "drafted": 8, "accepted": 6, "draft_steps": 2,
             "accepted_per_position": [2, 2, 1, 1]},
            {"record": "b", "category": "mail", "generated_tokens": 5, "drafted": 4, "accepted": 0, "draft_steps": 1,
             "accepted_per_position": [0, 0, 0, 0]}]
    baselines = engine.baselines_of(rows, k=4)
    assert baselines["k"] == 4
    assert baselines["overall"]["acceptance_rate"] == 0.5
    assert baselines["overall"]["mean_acceptance_length"] == 3.0
    assert baselines["overall"]["per_position_acceptance"] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert baselines["per_category"]["mail"]["acceptance_rate"] == 0.0
    assert baselines["per_category"]["code"]["num_drafts"] == 2
    unknown = engine.figures([{**rows[0], "draft_steps": None, "accepted_per_position": None}])
    assert unknown["mean_acceptance_length"] is None and unknown["acceptance_rate"] == 0.75
    # SGLang's histogram ends at the most drafts a step accepted: a run that never accepted all k
    # still reads k positions, the unreached ones 0
    short = [{**rows[0], "accepted_per_position": [2, 1]}, {**rows[1], "accepted_per_position": [0]}]
    pooled = engine.baselines_of(short, k=4)
    assert pooled["overall"]["per_position_acceptance"] == pytest.approx([2 / 3, 1 / 3, 0, 0])
    assert pooled["per_category"]["mail"]["per_position_acceptance"] == [0, 0, 0, 0]


def _figures(alpha, tau=2.0, drafted=100):
    return {"acceptance_rate": alpha, "mean_acceptance_length": tau, "per_position_acceptance": [alpha],
            "drafted": drafted}


def test_parity_fails_beyond_the_tolerance_overall():
    ours = {"overall": _figures(0.60), "per_category": {"code": _figures(0.70), "mail": _figures(0.50)}}
    far = {"overall": _figures(0.64), "per_category": {}}
    assert engine.check_parity(ours, far, engine_name="llama.cpp", tolerance=0.03).status == "fail"
    same = {"overall": _figures(0.60), "per_category": {"code": _figures(0.70), "mail": _figures(0.50)}}
    assert engine.check_parity(ours, same, engine_name="llama.cpp").status == "pass"


def test_parity_beyond_the_tolerance_names_what_the_engine_did_that_ours_could_not_see():
    # a suffix pair on a vLLM server that served traffic before: its cache drafted from it
    caveat = "the server had drafted 12 times before this run and suffix drafts from the requests a server served before"
    ours = {"overall": _figures(0.415), "per_category": {}, "caveat": caveat}
    result = engine.check_parity(ours, {"overall": _figures(0.62), "per_category": {}}, engine_name="vllm")
    assert result.status == "fail" and result.summary.endswith(f"tau ours 2.000 vs 2.000: {caveat}")
    # within the tolerance the caveat changes nothing
    within = engine.check_parity(ours, {"overall": _figures(0.42), "per_category": {}}, engine_name="vllm")
    assert within.status == "pass" and caveat not in within.summary


def test_a_category_beyond_the_tolerance_fails_in_one_line_naming_it_and_both_alphas():
    # an EAGLE-3 pair at k 4: overall within the tolerance, the support category not
    ours = {"k": 4, "overall": _figures(0.736, drafted=652),
            "per_category": {"code": _figures(0.781, drafted=160), "support": _figures(0.712, drafted=236)}}
    theirs = {"k": 4, "overall": _figures(0.722, drafted=648),
              "per_category": {"code": _figures(0.775, drafted=160), "support": _figures(0.665, drafted=236)}}
    result = engine.check_parity(ours, theirs, engine_name="llama.cpp", tolerance=0.03)
    assert result.status == "fail" and "\n" not in result.summary
    assert result.summary == ("category beyond the tolerance 0.03: support: alpha ours 0.712 vs llama.cpp 0.665 "
                              "(|d| 0.047)")
    assert result.figures["alpha_delta"] == pytest.approx(0.014)  # overall stays within
    assert result.evidence["category_min_drafted"] == 134  # ceil(4 / 0.03)
    # the baseline it records waits for an approver, saying which category and why
    from specreg.core.statuses import PARITY_TOLERANCE
    from specreg.registry.governance.engine_baseline_standing import baseline_status

    status, why = baseline_status([result], PARITY_TOLERANCE)
    assert status == "unaccepted" and why == result.summary


def test_a_category_with_too_few_drafted_tokens_to_judge_warns():
    # one step's near-tie moves k tokens: under k / tolerance drafted that alone exceeds the tolerance
    assert engine.category_min_drafted(4, 0.03) == 134 and engine.category_min_drafted(3, 0.03) == 100
    ours = {"k": 4, "overall": _figures(0.736, drafted=652), "per_category": {"creative": _figures(0.700, drafted=40)}}
    theirs = {"k": 4, "overall": _figures(0.730, drafted=652), "per_category": {"creative": _figures(0.600, drafted=40)}}
    result = engine.check_parity(ours, theirs, engine_name="llama.cpp", tolerance=0.03)
    assert result.status == "warn"
    assert "fewer than 134 drafted tokens, too few to judge: creative (40 drafted)" in result.summary
    # the same difference on 134 drafted tokens each side is judged
    judged = {**theirs, "per_category": {"creative": _figures(0.600, drafted=134)}}
    ours["per_category"]["creative"]["drafted"] = 134
    assert engine.check_parity(ours, judged, engine_name="llama.cpp", tolerance=0.03).status == "fail"


def _record(name, speculative, plain):
    return {"record": name, "category": "code", "prompt_ids": [1, 2, 3], "speculative": speculative,
            "target_only": plain}


def test_equivalence_lists_every_difference_and_needs_evidence_for_a_near_tie():
    records = [_record("same", [5, 6, 7], [5, 6, 7]), _record("tie", [5, 9, 1], [5, 6, 7]),
               _record("real", [4, 4], [5, 6])]
    tops = {("tie", 1): [(6, -0.6930), (9, -0.6935)], ("real", 0): [(5, -0.1), (8, -3.0)]}
    result = engine.check_engine_equivalence(records, engine_name="llama.cpp", tolerance=1e-3,
                                             top_of=lambda record, position: tops[(record["record"], position)])
    assert result.status == "fail"
    assert result.figures == {"prompts": 3, "exact": 1, "near_tie": 1, "fail": 1, "tokens_compared": 8}
    tie, real = result.evidence["differences"]
    assert (tie["record"], tie["position"], tie["near_tie"]) == ("tie", 1, True)
    assert tie["engine_margin"] == pytest.approx(0.0005)
    assert (real["record"], real["position"], real["near_tie"]) == ("real", 0, False)
    # the same tie with our runtime's margin too: both must say near-tie
    wide = engine.check_engine_equivalence(records[:2], engine_name="llama.cpp", tolerance=1e-3,
                                           top_of=lambda record, position: tops[(record["record"], position)],
                                           our_margin=lambda prompt, prefix: {"top2_ids": [6, 9], "margin": 0.5})
    assert wide.status == "fail" and wide.evidence["differences"][0]["runtime_margin"] == 0.5
    no_evidence = engine.check_engine_equivalence(records[:2], engine_name="llama.cpp", tolerance=1e-3)
    assert no_evidence.status == "fail"  # a difference without evidence is never a near-tie
    only_ties = engine.check_engine_equivalence(records[:2], engine_name="llama.cpp", tolerance=1e-3,
                                                top_of=lambda record, position: tops[(record["record"], position)])
    assert only_ties.status == "warn"


def test_throughput_speedup_per_tier_and_a_slower_tier_warns():
    result = engine.check_throughput([{"concurrency": 1, "with_draft_tokens_per_s": 30.0, "without_draft_tokens_per_s": 20.0},
                                      {"concurrency": 4, "with_draft_tokens_per_s": 30.0, "without_draft_tokens_per_s": 40.0}],
                                     engine_name="llama.cpp")
    assert result.status == "warn" and "concurrency 4" in result.summary
    assert result.figures == {"speedup_c1": 1.5, "speedup_c4": 0.75}


def test_acceptance_that_falls_with_concurrency_fails_in_one_line():
    # llama.cpp slots drafting worse as more requests share the server (the DFlash report: 0.06-0.49
    # at 16 slots): the same greedy prompts, so acceptance should not move beyond numerics
    def tiers(*alphas):
        return [{"concurrency": c, "acceptance_rate": a} for c, a in zip((1, 2, 4), alphas)]

    fallen = engine.check_concurrency(tiers(0.65, 0.64, 0.31), engine_name="llama.cpp")
    assert fallen.status == "fail" and "\n" not in fallen.summary
    assert fallen.summary.startswith("llama.cpp's acceptance falls with concurrency (c=1: 0.650, c=2: 0.640, "
                                     "c=4: 0.310): more than 0.1 below concurrency 1 at 4;")
    assert fallen.figures == {"alpha_c1": 0.65, "alpha_c2": 0.64, "alpha_c4": 0.31}
    assert engine.check_concurrency(tiers(0.65, 0.63, 0.66), engine_name="llama.cpp").status == "pass"
    assert engine.check_concurrency(tiers(0.65, None, None), engine_name="vLLM").status == "skip"


def test_tier_acceptance_pools_the_prompts_of_a_tier():
    from specreg.registry.deploy.engine_passes import tier_acceptance

    assert tier_acceptance([{"drafted": 8, "accepted": 6}, {"drafted": 4, "accepted": 0}]) == 0.5
    assert tier_acceptance([{"drafted": None, "accepted": None}]) is None


def test_the_engine_checks_run_in_order_over_one_context():
    """validate --engine's checks are context.Checks over one EngineCheckContext: each reads its part
    of it; without an engine run without the draft, equivalence skips with the context's reason."""
    from specreg.validators.context import EngineCheckContext

    rows = [{"record": "a", "category": "code", "generated_tokens": 10, "drafted": 8, "accepted": 6, "draft_steps": 2,
             "accepted_per_position": [2, 2, 1, 1]}]
    baselines = engine.baselines_of(rows, k=4)
    tiers = [{"concurrency": 1, "with_draft_tokens_per_s": 30.0, "without_draft_tokens_per_s": None,
              "acceptance_rate": 0.75}]
    context = EngineCheckContext("vLLM", rows, baselines, {**baselines, "source": "ours"}, tiers, 0.03,
                                 no_outputs="no --engine-reference-url")
    results = engine.run_engine_checks(context)
    assert [result.name for result in results] == [check.name for check in engine.ENGINE_CHECKS] == [
        "engine_counts", "engine_parity", "engine_equivalence", "engine_throughput", "engine_concurrency"]
    assert [result.status for result in results] == ["pass", "pass", "skip", "pass", "skip"]
    assert results[2].summary == "no --engine-reference-url"
    outputs = [_record("a", [5, 6], [5, 7])]
    differs = engine.run_engine_checks(EngineCheckContext("vLLM", rows, baselines, baselines, tiers, 0.03,
                                                          outputs=outputs, near_tie_tolerance=1e-3))
    assert differs[2].status == "fail" and differs[2].figures["fail"] == 1
