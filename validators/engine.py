"""Validation in a serving engine (``specreg validate --engine``): the checks over what the
engine did with the golden prompts, beside what our runtime did with the same token ids.

- **parity**: acceptance in the engines' terms (docs/design.md §2), ours against the engine's, overall
  and per category: α̂ = accepted / drafted; τ = 1 + accepted / steps that had drafts;
  per-position = accepted at position i / steps that had drafts (vLLM's unconditional rate).
  |α_engine − α_ours| beyond the tolerance fails, overall or in a category. A category too small
  to judge (fewer drafted tokens than k / tolerance on either side: one step's near-tie, k drafts,
  would exceed the tolerance alone) beyond it warns.
- **equivalence in the engine**: the engine's speculative greedy output against the same engine
  without a draft, every difference listed. At the first difference of a prompt the evidence is
  the engine's own top-2 log-probabilities there (target-only run) and, when our runtime holds the
  model, its plain-decoding top-1/top-2 logit margin (validators.equivalence): both tokens in the
  top two with a margin under the tolerance is a numerical near-tie (warn); anything else fails.
- **throughput**: tokens/s with and without the draft at each concurrency tier, and the speedup.
- **counts**: what any engine's counts obey, prompt by prompt: accepted <= drafted tokens, steps
  with drafts <= drafted tokens (a step drafts at least one), per-position counts non-increasing,
  summing to accepted, the first at most the steps. An engine whose counts break one reports
  figures nobody can use (an acceptance of 1.0 with a tau just above 1 is one such): the
  baseline fails.

Rows are plain dicts, one per prompt: {"record", "category", "generated_tokens", "drafted",
"accepted", "draft_steps", "accepted_per_position"} (counts; None where unknown). Each check is a
context.Check over one context.EngineCheckContext (``ENGINE_CHECKS``, run by ``run_engine_checks``),
with a ``check_*`` function over plain values under it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from specreg.core.differences import first_difference
from specreg.core.statuses import PARITY_TOLERANCE
from specreg.core.types import FAIL, PASS, SKIP, WARN, CheckResult
from specreg.validators.context import Check, EngineCheckContext

MAX_DIFFERENCES = 50


def runtime_row(record_id: str, category: str, metrics) -> dict[str, Any]:
    """Our runtime's GenerationMetrics of one greedy speculative decode -> a counts row in the
    engines' terms (draft_steps: verifications that had drafts, as runtime/metrics.py counts)."""
    return {"record": record_id, "category": category, "generated_tokens": metrics.generated_tokens,
            "drafted": metrics.drafted, "accepted": metrics.accepted, "draft_steps": metrics.draft_steps,
            "accepted_per_position": list(metrics.accepted_per_position or [])}


def figures(rows: list[dict[str, Any]], k: int = 0) -> dict[str, Any]:
    """Pooled counts of some rows -> acceptance_rate, mean_acceptance_length (engines' τ),
    per_position_acceptance (unconditional, at least ``k`` positions: SGLang's histogram stops at
    the most drafts a step accepted, so the positions no step reached read 0), and the counts;
    None where a count is unknown."""
    def total(key):
        values = [row.get(key) for row in rows]
        return None if any(v is None for v in values) else sum(values)

    drafted, accepted, steps = total("drafted"), total("accepted"), total("draft_steps")
    per_position = None
    if steps and all(row.get("accepted_per_position") is not None for row in rows):
        width = max([k, *(len(row["accepted_per_position"]) for row in rows)])
        sums = [sum(row["accepted_per_position"][i] for row in rows if i < len(row["accepted_per_position"]))
                for i in range(width)]
        per_position = [value / steps for value in sums]
    return {"acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1.0 + accepted / steps if steps and accepted is not None else None,
            "per_position_acceptance": per_position, "drafted": drafted, "accepted": accepted,
            "num_drafts": steps, "generated_tokens": total("generated_tokens"), "generations": len(rows)}


def baselines_of(rows: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """Rows -> {"k", "overall", "per_category"}: the validation baselines' shape, so exports and
    observe read an engine baseline as they read ours."""
    categories: dict[str, list] = {}
    for row in rows:
        categories.setdefault(row["category"], []).append(row)
    return {"k": k, "tau_definition": "1 + accepted / steps with drafts", "overall": figures(rows, k),
            "per_category": {category: figures(group, k) for category, group in categories.items()}}


def count_problems(row: dict[str, Any]) -> list[str]:
    """What is inconsistent in one counts row (validators.engine rows; None counts are unknown and
    not judged) -> one phrase per broken relation, empty when the counts can all be true."""
    drafted, accepted, steps = row.get("drafted"), row.get("accepted"), row.get("draft_steps")
    per_position = row.get("accepted_per_position")
    problems = []
    if drafted is not None and accepted is not None and accepted > drafted:
        problems.append(f"{accepted} accepted of {drafted} drafted tokens")
    if drafted is not None and steps is not None and steps > drafted:
        problems.append(f"{steps} steps with drafts but {drafted} drafted tokens")
    if per_position:
        if any(later > earlier for earlier, later in zip(per_position, per_position[1:])):
            problems.append(f"accepted per position {per_position} increases (position i+1 is reached only "
                            f"through i)")
        if accepted is not None and sum(per_position) != accepted:
            problems.append(f"accepted per position sums to {sum(per_position)}, not the {accepted} accepted")
        if steps is not None and per_position[0] > steps:
            problems.append(f"{per_position[0]} accepted at position 0 in {steps} steps")
    return problems


def check_counts(rows: list[dict[str, Any]], *, engine_name: str) -> CheckResult:
    """Every row's counts consistent (count_problems) -> CheckResult "engine_counts": pass, or
    fail naming the first inconsistent prompt, every one in the evidence."""
    found = [{"record": row["record"], "problems": problems}
             for row in rows if (problems := count_problems(row))]
    evidence = {"inconsistent": found[:MAX_DIFFERENCES], "engine": engine_name}
    figures_out = {"prompts": len(rows), "inconsistent": len(found)}
    if found:
        first = found[0]
        return CheckResult("engine_counts", FAIL, f"{engine_name} reported impossible counts for {len(found)} of "
                           f"{len(rows)} prompts; '{first['record']}': {'; '.join(first['problems'])}",
                           evidence, figures_out)
    return CheckResult("engine_counts", PASS, f"{len(rows)} prompts: {engine_name}'s counts consistent "
                       f"(accepted <= drafted, steps <= drafted, per-position non-increasing and summing to accepted)",
                       evidence, figures_out)


# greedy acceptance depends on the tokens, not on how many requests share a batch: a tier this far
# below concurrency 1 means the engine drafts worse with more slots (numerics move it by hundredths)
CONCURRENCY_DROP = 0.1
# an engine this far below our runtime's acceptance on the same token ids is not drafting with the
# model we validated (numerics alone move it by hundredths)
FAR_BELOW = 0.2


def check_parity(ours: dict[str, Any], engine: dict[str, Any], *, engine_name: str,
                 tolerance: float = PARITY_TOLERANCE) -> CheckResult:
    """Our baselines (baselines_of) against the engine's -> CheckResult "engine_parity"; a
    difference beyond the tolerance says ours["caveat"] (what the engine did that our runtime
    could not model) when there is one."""
    scopes = [("overall", ours.get("overall") or {}, engine.get("overall") or {})]
    scopes += [(category, figures_ours, (engine.get("per_category") or {}).get(category) or {})
               for category, figures_ours in sorted((ours.get("per_category") or {}).items())]
    rows = []
    for scope, mine, theirs in scopes:
        alpha_ours, alpha_engine = mine.get("acceptance_rate"), theirs.get("acceptance_rate")
        delta = abs(alpha_engine - alpha_ours) if alpha_ours is not None and alpha_engine is not None else None
        rows.append({"scope": scope, "alpha_ours": alpha_ours, "alpha_engine": alpha_engine, "alpha_delta": delta,
                     "tau_ours": mine.get("mean_acceptance_length"), "tau_engine": theirs.get("mean_acceptance_length"),
                     "per_position_ours": mine.get("per_position_acceptance"),
                     "per_position_engine": theirs.get("per_position_acceptance"),
                     "drafted_ours": mine.get("drafted"), "drafted_engine": theirs.get("drafted"),
                     "within": delta is not None and delta <= tolerance})
    overall = rows[0]
    evidence = {"rows": rows, "tolerance": tolerance, "ours_source": ours.get("source"), "engine": engine_name}
    figures_out = {"alpha_ours": overall["alpha_ours"], "alpha_engine": overall["alpha_engine"],
                   "alpha_delta": overall["alpha_delta"], "tau_ours": overall["tau_ours"],
                   "tau_engine": overall["tau_engine"]}
    figures_out = {key: value for key, value in figures_out.items() if value is not None}
    if overall["alpha_delta"] is None:
        return CheckResult("engine_parity", SKIP if not overall["drafted_engine"] else FAIL,
                           f"no acceptance to compare (drafted: ours {overall['drafted_ours']}, "
                           f"{engine_name} {overall['drafted_engine']})", evidence, figures_out)
    headline = (f"alpha ours {overall['alpha_ours']:.3f} vs {engine_name} {overall['alpha_engine']:.3f} "
                f"(|d| {overall['alpha_delta']:.3f}, tolerance {tolerance:g}); tau ours "
                f"{_fmt(overall['tau_ours'])} vs {_fmt(overall['tau_engine'])}")
    if not overall["within"]:
        if ours.get("caveat"):  # what the engine did that our runtime could not see
            headline += f": {ours['caveat']}"
        elif overall["alpha_ours"] - overall["alpha_engine"] >= FAR_BELOW:
            headline += (f": {engine_name}'s acceptance is far below our runtime's for the same pair, so it is not "
                         f"running the draft as validated (an EAGLE-3 head on other target layers than its "
                         f"eagle_aux_hidden_state_layer_ids, a head served as another method)")
        return CheckResult("engine_parity", FAIL, headline, evidence, figures_out)
    off = [row for row in rows[1:] if row["alpha_delta"] is not None and not row["within"]]
    smallest = category_min_drafted(ours.get("k") or engine.get("k"), tolerance)
    evidence["category_min_drafted"] = smallest
    judged = [row for row in off if min(row["drafted_ours"] or 0, row["drafted_engine"] or 0) >= smallest]
    if judged:
        shown = "; ".join(f"{row['scope']}: alpha ours {row['alpha_ours']:.3f} vs {engine_name} "
                          f"{row['alpha_engine']:.3f} (|d| {row['alpha_delta']:.3f})" for row in judged)
        figures_out["categories_beyond_tolerance"] = len(judged)
        return CheckResult("engine_parity", FAIL, f"category beyond the tolerance {tolerance:g}: {shown}",
                           evidence, figures_out)
    if off:
        shown = ", ".join(f"{row['scope']} ({min(row['drafted_ours'] or 0, row['drafted_engine'] or 0)} drafted)"
                          for row in off)
        return CheckResult("engine_parity", WARN, f"{headline}; categories beyond the tolerance with fewer than "
                           f"{smallest} drafted tokens, too few to judge: {shown}", evidence, figures_out)
    return CheckResult("engine_parity", PASS, headline, evidence, figures_out)


def category_min_drafted(k: int | None, tolerance: float) -> int:
    """The fewest drafted tokens a category needs for its parity to be judged: one step whose first
    draft differs by a numerical near-tie moves up to k tokens, and below k / tolerance drafted
    tokens that alone exceeds the tolerance."""
    return math.ceil((k or 1) / tolerance)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def describe_engine_difference(record: dict[str, Any], position: int, speculative: list[int], plain: list[int],
                               engine_top: list[tuple[int, float]] | None, tolerance: float,
                               our_margin: Callable[[list[int], list[int]], dict] | None = None) -> dict[str, Any]:
    """One difference: both tokens, the engine's target-only top-2 there, our runtime's plain margin."""
    spec_token = speculative[position] if position < len(speculative) else None
    plain_token = plain[position] if position < len(plain) else None
    found: dict[str, Any] = {"record": record["record"], "category": record["category"], "position": position,
                             "speculative_token_id": spec_token, "target_only_token_id": plain_token,
                             "speculative_length": len(speculative), "target_only_length": len(plain),
                             "tolerance": tolerance}
    tops = []
    if engine_top:
        top2 = engine_top[:2]
        found["engine_top2"] = [[token, logprob] for token, logprob in top2]
        if len(top2) == 2:
            found["engine_margin"] = top2[0][1] - top2[1][1]
            tops.append(({token for token, _ in top2}, found["engine_margin"]))
    if our_margin is not None:
        ours = our_margin(record["prompt_ids"], plain[:position])
        found["runtime_top2_ids"], found["runtime_margin"] = ours["top2_ids"], ours["margin"]
        tops.append((set(ours["top2_ids"]), ours["margin"]))
    # a difference in length only (one side stopped): the token that ended is not a rival token
    tokens = {t for t in (spec_token, plain_token) if t is not None}
    found["near_tie"] = bool(tops) and all(tokens <= top and margin < tolerance for top, margin in tops)
    return found


def check_engine_equivalence(records: list[dict[str, Any]], *, engine_name: str, tolerance: float,
                             top_of: Callable[[dict[str, Any], int], list[tuple[int, float]] | None] | None = None,
                             our_margin: Callable[[list[int], list[int]], dict] | None = None) -> CheckResult:
    """records: [{"record", "category", "prompt_ids", "speculative", "target_only"}] (token ids
    from the engine with and without its draft) -> CheckResult "engine_equivalence", every
    difference in the evidence (up to MAX_DIFFERENCES). top_of(record, position): the engine's
    target-only top log-probabilities at that position."""
    differences = []
    for record in records:
        position = first_difference(record["speculative"], record["target_only"])
        if position is None:
            continue
        top = top_of(record, position) if top_of is not None else None
        differences.append(describe_engine_difference(record, position, record["speculative"], record["target_only"],
                                                       top, tolerance, our_margin))
    prompts = len(records)
    near = sum(1 for d in differences if d["near_tie"])
    figures_out = {"prompts": prompts, "exact": prompts - len(differences), "near_tie": near,
                   "fail": len(differences) - near, "tokens_compared": sum(len(r["target_only"]) for r in records)}
    evidence = {"differences": differences[:MAX_DIFFERENCES], "tolerance": tolerance, "engine": engine_name}
    if not prompts:
        return CheckResult("engine_equivalence", SKIP, "no prompt compared", evidence, figures_out)
    hard = [d for d in differences if not d["near_tie"]]
    if hard:
        first = hard[0]
        margin = first.get("engine_margin", first.get("runtime_margin"))
        return CheckResult("engine_equivalence", FAIL,
                           f"{len(differences)} of {prompts} prompts differ in {engine_name} with and without the "
                           f"draft; '{first['record']}' at token {first['position']}: {first['speculative_token_id']} vs "
                           f"{first['target_only_token_id']}, margin {_fmt(margin)} (tolerance {tolerance:g})",
                           evidence, figures_out)
    if differences:
        return CheckResult("engine_equivalence", WARN,
                           f"near-tie: {len(differences)} of {prompts} prompts differ in {engine_name}, each where the "
                           f"target's top-1/top-2 margin is below {tolerance:g}", evidence, figures_out)
    return CheckResult("engine_equivalence", PASS,
                       f"{prompts} prompts, {figures_out['tokens_compared']} tokens: {engine_name} output with the "
                       f"draft identical to without it", evidence, figures_out)


def check_throughput(tiers: list[dict[str, Any]], *, engine_name: str) -> CheckResult:
    """tiers: [{"concurrency", "with_draft_tokens_per_s", "without_draft_tokens_per_s", ...}] ->
    CheckResult "engine_throughput" (informational: pass, or warn when the draft slows a tier)."""
    rows = []
    for tier in tiers:
        with_draft, without = tier.get("with_draft_tokens_per_s"), tier.get("without_draft_tokens_per_s")
        rows.append({**tier, "speedup": with_draft / without if with_draft and without else None})
    evidence = {"tiers": rows, "engine": engine_name}
    figures_out = {f"speedup_c{row['concurrency']}": row["speedup"] for row in rows if row["speedup"] is not None}
    text = "; ".join(f"c={row['concurrency']}: {_fmt(row.get('with_draft_tokens_per_s'))} tok/s with the draft, "
                     f"{_fmt(row.get('without_draft_tokens_per_s'))} without"
                     + (f" ({row['speedup']:.2f}x)" if row["speedup"] else "") for row in rows)
    slower = [row["concurrency"] for row in rows if row["speedup"] is not None and row["speedup"] < 1.0]
    if slower:
        return CheckResult("engine_throughput", WARN, f"{text}; the draft slows concurrency "
                           f"{', '.join(map(str, slower))}", evidence, figures_out)
    return CheckResult("engine_throughput", PASS if rows else SKIP, text or "not measured", evidence, figures_out)


def check_concurrency(tiers: list[dict[str, Any]], *, engine_name: str,
                      tolerance: float = CONCURRENCY_DROP) -> CheckResult:
    """tiers (check_throughput's, with each tier's engine "acceptance_rate") -> CheckResult
    "engine_concurrency": fail when a tier's acceptance falls more than ``tolerance`` below the
    first tier's (the same greedy prompts, more requests at once)."""
    ordered = sorted(tiers, key=lambda tier: tier["concurrency"])
    measured = [(tier["concurrency"], tier["acceptance_rate"]) for tier in ordered if tier.get("acceptance_rate") is not None]
    evidence = {"tiers": [{"concurrency": c, "acceptance_rate": a} for c, a in measured], "tolerance": tolerance,
                "engine": engine_name}
    figures_out = {f"alpha_c{c}": a for c, a in measured}
    if len(measured) < 2:
        return CheckResult("engine_concurrency", SKIP, "acceptance measured at fewer than two concurrency tiers",
                           evidence, figures_out)
    (first, alpha_first), text = measured[0], ", ".join(f"c={c}: {a:.3f}" for c, a in measured)
    fallen = [c for c, a in measured[1:] if alpha_first - a > tolerance]
    if fallen:
        return CheckResult("engine_concurrency", FAIL,
                           f"{engine_name}'s acceptance falls with concurrency ({text}): more than {tolerance:g} below "
                           f"concurrency {first} at {', '.join(map(str, fallen))}; the same greedy prompts draft worse "
                           f"with more requests at once, so speculation there is not what was validated", evidence,
                           figures_out)
    return CheckResult("engine_concurrency", PASS, f"acceptance per concurrency: {text}", evidence, figures_out)


def _equivalence(context: EngineCheckContext) -> CheckResult:
    if context.outputs is None:
        return CheckResult("engine_equivalence", SKIP, context.no_outputs)
    return check_engine_equivalence(context.outputs, engine_name=context.engine_name,
                                    tolerance=context.near_tie_tolerance, top_of=context.top_of,
                                    our_margin=context.our_margin)


# validate --engine's checks, in the order it runs and reports them
ENGINE_CHECKS = (
    Check("engine_counts", lambda context: check_counts(context.rows, engine_name=context.engine_name)),
    Check("engine_parity", lambda context: check_parity(context.ours, context.engine_baselines,
                                                        engine_name=context.engine_name,
                                                        tolerance=context.parity_tolerance)),
    Check("engine_equivalence", _equivalence),
    Check("engine_throughput", lambda context: check_throughput(context.tiers, engine_name=context.engine_name)),
    Check("engine_concurrency", lambda context: check_concurrency(context.tiers, engine_name=context.engine_name)),
)


def run_engine_checks(context: EngineCheckContext) -> list[CheckResult]:
    """Every engine check over ``context``, in order -> their results."""
    return [check.run(context) for check in ENGINE_CHECKS]
