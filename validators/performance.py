"""Performance: what speculation buys on this device, and the k the measurements recommend.

Speedup = speculative tokens/s / target-only tokens/s over the greedy decodes of the golden prompts
decoded in batches (same prompts, same tokens: equivalence holds them equal), end to end, at the
batch size they were decoded at (figures["batch_size"]: throughput, tokens over their share of the
batches' wall time); the two passes decode side by side (equivalence.decode_golden), so a load that
comes or goes during validation slows both alike, and the cores other work kept busy meanwhile go
with the figures (other_work_cores; the summary names it from OTHER_WORK_NOTED). Latency (per-token
p50/p95/p99, TTFT) and a batch-1 speedup come from the first prompts, decoded one at a time
(equivalence.GoldenDecodes.single): what one request alone sees. The decode speedup leaves out each
generation's first step (prefill, TTFT) on both sides: the part that docs/design.md §2's formula
models, which short golden outputs would otherwise dilute. The longest run of fully rejected steps
comes from every speculative decode. The recommended k is the runtime's choose_k over the measured
per-position acceptance and the measured draft/target step-cost ratio, searched only up to the
deepest measured position; a better k beyond it is reported as extrapolated, never as the
recommendation. For a candidate tree (Medusa) the recommendation is the depth to cut the tree at:
expected tokens per step over the heads' cost per step plus the measured cost of one forward over
the cut tree, both in one-token target steps (runtime/choose_k.choose_tree_depth). A speedup below
1 warns (speculation slows this pair down here); it does not fail, since CPU figures say little
about the serving accelerator.
"""

from __future__ import annotations

from typing import Any

from specreg.core.types import PASS, SKIP, WARN, CheckResult
from specreg.validators.context import Check, CheckContext

CHECK_NAME = "performance"
HISTOGRAM_BINS = 20
# other work, in cores kept busy during the batched passes, from which the summary says so: the
# passes decode side by side, but a competitor's time slices still land in one or the other
OTHER_WORK_NOTED = 0.5


def latency_histogram(latencies_s: list[float], bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Per-token latencies -> {"edges_ms": [bins+1], "counts": [bins]} over [min, max]."""
    if not latencies_s:
        return {"edges_ms": [], "counts": []}
    low, high = min(latencies_s) * 1000, max(latencies_s) * 1000
    width = (high - low) / bins or 1e-9
    counts = [0] * bins
    for value in latencies_s:
        counts[min(int((value * 1000 - low) / width), bins - 1)] += 1
    return {"edges_ms": [low + i * width for i in range(bins + 1)], "counts": counts}


def batch_seconds(summary: dict) -> float:
    """The wall time an aggregate's batches took (tokens / throughput)."""
    rate = summary["batch_tokens_per_s"]
    return summary["generated_tokens"] / rate if rate else 0.0


def in_loop_cost_ratio(speculative: dict) -> float:
    """c from aggregated decode metrics: seconds per draft forward / seconds per target forward."""
    if not speculative["draft_forwards"] or not speculative["target_forwards"] or not speculative["verify_time_s"]:
        return 0.0
    return (speculative["draft_time_s"] / speculative["draft_forwards"]) / \
        (speculative["verify_time_s"] / speculative["target_forwards"])


def check_performance(pair, decodes, *, method: str = "draft_model", k: int = 4, k_max: int = 8,
                      cost_ratio: float | None = None, tree=None) -> CheckResult:
    """Speedup, latency percentiles, longest rejection run and recommended k.

    pair: runtime ModelPair; decodes: GoldenDecodes; method, k: the pair's configuration;
    cost_ratio: draft/target step cost (measured here with measure_cost_ratio when None; 0 for
    ngram, whose drafting has no forward pass); tree: the parsed CandidateTree (tree methods):
    the recommendation is then the depth to cut the tree at, from the measured per-depth
    acceptance, the heads' cost per step and the measured cost of verifying the tree cut at each
    depth (choose_tree_depth). Returns a CheckResult "performance".
    """
    from specreg.runtime.metrics import aggregate

    if not decodes.runs:
        return CheckResult(CHECK_NAME, SKIP, "no golden prompt was decoded", {}, {})
    speculative = aggregate([run.speculative.metrics for run in decodes.runs])
    # throughput over the rows decoded in batches; latency as one request alone sees it: the first
    # prompts, decoded one at a time (all of them at batch 1)
    batched_speculative = aggregate([run.speculative.metrics for run in decodes.batched])
    batched_target_only = aggregate([run.target_only.metrics for run in decodes.batched])
    single = decodes.single or decodes.runs
    if cost_ratio is None:
        cost_ratio = measured_cost_ratio(pair, decodes, method, speculative)
    measured = speculative["per_position_acceptance_conditional"] or []  # the factors choose_k multiplies
    (best_k, expected, extrapolated_k, extrapolated), tree_figures = recommend_k(
        pair, decodes, speculative, measured, method=method, k=k, k_max=k_max, cost_ratio=cost_ratio, tree=tree)
    figures = {**speed_figures(batched_speculative, batched_target_only, single, decodes.batch_size),
               "longest_rejection_run": speculative["longest_rejection_run"],
               "cost_ratio": cost_ratio, "k": k, "recommended_k": best_k, "expected_speedup_at_recommended_k": expected,
               "measured_positions": len(measured), "extrapolated_k": extrapolated_k,
               "expected_speedup_at_extrapolated_k": extrapolated, "other_work_cores": decodes.other_work_cores,
               **tree_figures}
    # a figure nobody could read (no batched pass ran: other work unread; no decode step) is left
    # out rather than recorded as a number it is not
    figures = {key: value for key, value in figures.items() if value is not None}
    latencies = [s for run in single for s in run.speculative.metrics.token_latencies_s]
    evidence = {"latency_histogram": latency_histogram(latencies),
                "speculative_time_s": batch_seconds(batched_speculative),
                "target_only_time_s": batch_seconds(batched_target_only),
                "generated_tokens": batched_speculative["generated_tokens"], "fallbacks": speculative["fallbacks"],
                "device": str(pair.device)}
    summary = headline(figures, tree_figures)
    if figures["speedup"] < 1.0:
        return CheckResult(CHECK_NAME, WARN, f"slower than target-only on {pair.device}: {summary}", evidence, figures)
    return CheckResult(CHECK_NAME, PASS, summary, evidence, figures)


def recommend_k(pair, decodes, speculative: dict, measured: list[float], *, method: str, k: int, k_max: int,
                cost_ratio: float, tree) -> tuple[tuple[int, float, int, float], dict]:
    """((recommended k, its expected speedup, the deeper extrapolated optimum, its expected
    speedup), the tree's figures) from the measured conditional per-position acceptance."""
    from specreg.core.methods import method_descriptor
    from specreg.runtime.choose_k import choose_k, expected_tokens_per_step

    per_position = measured or [speculative["acceptance_rate"] or 0.0]
    if tree is not None:
        best_k, expected, tree_figures = recommend_tree_depth(pair, decodes, tree, per_position, measured, speculative)
        return (best_k, expected, best_k, expected), tree_figures  # a tree is never cut deeper than registered
    if method_descriptor(method).drafts_in_one_forward:
        # a block drafter or P-EAGLE head drafts all k in one forward: more drafts cost no more
        # forwards, so within the positions measured the registered k is the best (a block
        # drafter's k is its block's, fixed at registration); the expected speedup is tokens per
        # step over (c + 1)
        expected = expected_tokens_per_step(per_position, k) / (cost_ratio + 1.0)
        return (k, expected, k, expected), {}
    # Past the measured positions choose_k can only assume the last one's acceptance holds:
    # recommend within what was measured, and name a deeper optimum as an extrapolation.
    best_k, expected = choose_k(per_position, cost_ratio, k_max=max(1, min(max(k_max, k), len(measured))))
    extrapolated_k, extrapolated = choose_k(per_position, cost_ratio, k_max=max(k_max, k))
    return (best_k, expected, extrapolated_k, extrapolated), {}


def measured_cost_ratio(pair, decodes, method: str, speculative: dict) -> float:
    """c, the draft/target step cost: 0 for a model-free method (no draft forward); for a head,
    which drafts from the target's hidden states and so has no standalone step to time, what the
    decode loop measured (time per head forward / time per verification); for a draft model, timed
    here."""
    from specreg.core.methods import method_descriptor
    from specreg.runtime.choose_k import measure_cost_ratio

    descriptor = method_descriptor(method)
    if descriptor.model_free or pair.draft is None:
        return 0.0
    if descriptor.has_head:
        return in_loop_cost_ratio(speculative)
    return measure_cost_ratio(pair.target, pair.draft, decodes.runs[0].prompt_ids)


def recommend_tree_depth(pair, decodes, tree, per_position: list[float], measured: list[float],
                         speculative: dict) -> tuple[int, float, dict[str, Any]]:
    """The depth to cut the candidate tree at, from the tree cut at each measured depth and its
    verification cost against a one-token step here -> (depth, expected speedup, tree figures)."""
    from specreg.runtime.choose_k import (choose_tree_depth, head_draft_step_cost, measure_step_time,
                                          measure_tree_step_time)

    full = tree  # the parsed CandidateTree (DecodeConfig.from_spec)
    prompt = decodes.runs[0].prompt_ids
    one_step = measure_step_time(pair.target, prompt, steps=8)
    depths = range(1, max(1, min(full.depth, len(measured))) + 1)
    verify_costs = {depth: measure_tree_step_time(pair.target, prompt, full.pruned(depth), steps=8) / one_step
                    for depth in depths}
    draft_step_cost = head_draft_step_cost(speculative, one_step)
    best_k, expected = choose_tree_depth(per_position, draft_step_cost, verify_costs)
    figures = {"tree_nodes": full.num_nodes, "recommended_tree_nodes": full.pruned(best_k).num_nodes,
               "verify_cost_ratio": verify_costs[max(depths)], "draft_step_cost": draft_step_cost,
               "expected_speedup_at_registered_tree": choose_tree_depth(
                   per_position, draft_step_cost, {max(depths): verify_costs[max(depths)]})[1]}
    return best_k, expected, figures


def speed_figures(speculative: dict, target_only: dict, single: list, batch_size: int) -> dict[str, Any]:
    """Throughput at the batch size the prompts were decoded at (tokens over the batches' wall
    time), and speed and latency of one request alone (batch 1), as a single user sees them."""
    from specreg.runtime.metrics import aggregate

    single_speculative = aggregate([run.speculative.metrics for run in single])
    single_target_only = aggregate([run.target_only.metrics for run in single])
    decode_speedup = None
    if speculative["decode_tokens_per_s"] and target_only["decode_tokens_per_s"]:
        decode_speedup = speculative["decode_tokens_per_s"] / target_only["decode_tokens_per_s"]
    return {
        "batch_size": batch_size,
        "speedup": (speculative["batch_tokens_per_s"] / target_only["batch_tokens_per_s"]
                    if speculative["batch_tokens_per_s"] and target_only["batch_tokens_per_s"] else 0.0),
        "decode_speedup": decode_speedup,
        "tokens_per_s": speculative["batch_tokens_per_s"] or 0.0,
        "baseline_tokens_per_s": target_only["batch_tokens_per_s"] or 0.0,
        "latency_prompts": len(single),
        "batch1_speedup": (single_target_only["total_time_s"] / single_speculative["total_time_s"]
                           if single_speculative["total_time_s"] > 0 else 0.0),
        "batch1_tokens_per_s": single_speculative["tokens_per_s"] or 0.0,
        "batch1_baseline_tokens_per_s": single_target_only["tokens_per_s"] or 0.0,
        "ttft_ms": (single_speculative["ttft_s"] or 0.0) * 1000,
        "latency_p50_ms": single_speculative["latency_p50_s"] * 1000,
        "latency_p95_ms": single_speculative["latency_p95_s"] * 1000,
        "latency_p99_ms": single_speculative["latency_p99_s"] * 1000,
        "baseline_latency_p50_ms": single_target_only["latency_p50_s"] * 1000,
    }


def headline(figures: dict[str, Any], tree_figures: dict[str, Any]) -> str:
    """The check's summary line."""
    best_k, k, cost_ratio = figures["recommended_k"], figures["k"], figures["cost_ratio"]
    summary = (f"speedup {figures['speedup']:.2f}x at {'tree depth ' if tree_figures else 'k='}{k}, batch "
               f"{figures['batch_size']} ({figures['tokens_per_s']:.1f} vs {figures['baseline_tokens_per_s']:.1f} "
               f"tokens/s); batch 1: {figures['batch1_speedup']:.2f}x, p50/p95/p99 "
               f"{figures['latency_p50_ms']:.2f}/{figures['latency_p95_ms']:.2f}/{figures['latency_p99_ms']:.2f} ms, "
               f"longest rejection run {figures['longest_rejection_run']}, " +
               (f"recommended tree depth {best_k} ({tree_figures['recommended_tree_nodes']} of "
                f"{tree_figures['tree_nodes']} nodes; verifying the tree costs "
                f"{tree_figures['verify_cost_ratio']:.2f} one-token steps)" if tree_figures else
                f"recommended k={best_k} (expected about {figures['expected_speedup_at_recommended_k']:.2f}x; "
                f"cost ratio {cost_ratio:.2f})"))
    if not tree_figures and figures["expected_speedup_at_recommended_k"] < 1.0:
        # no k helps: trying another one costs a validation and tells nothing new
        summary += (f"; no k is expected to beat the target alone here (a draft step costs {cost_ratio:.2f} of a "
                    f"target step): a cheaper draft or a head would")
    if (figures.get("other_work_cores") or 0.0) >= OTHER_WORK_NOTED:
        summary += (f"; measured beside other work that kept {figures['other_work_cores']:.1f} cores busy: "
                    f"speeds from an idle machine may differ")
    if figures["extrapolated_k"] > best_k:
        summary += (f"; k={figures['extrapolated_k']} is extrapolated (expected "
                    f"{figures['expected_speedup_at_extrapolated_k']:.2f}x, assuming positions past the "
                    f"{figures['measured_positions']} measured accept like the last): validate at that k before "
                    f"choosing it")
    return summary


def run(context: CheckContext) -> CheckResult:
    """The performance check of a validation: it times verification steps of the pair."""
    pair, decodes = context.runtime()
    settings = context.settings
    return check_performance(pair, decodes, method=settings.method, k=settings.k, tree=settings.tree)


CHECK = Check(CHECK_NAME, run, announce=True, runtime=True)
