"""Acceptance (docs/design.md §2): alpha-hat, tau and per-position acceptance, overall and per
category, measured on the golden prompts decoded as their records ask (greedy or sampled), and
compared with the baselines of the previous validated version of the same pair name.

A relative drop beyond the tolerance (default 10%) of alpha-hat or of tau's accepted part (tau - 1:
specreg.core.baselines.drift_floor), overall or in any category both runs measured, fails. Tau counts up to k + 1 tokens per step, so it is compared
only between runs at the same k (baselines record k), and only with a baseline that counted tau as
the engines do (specreg.core.baselines); alpha-hat is compared always: a new draft that accepts
less loses the speedup the platform planned for. When the run passes, ``acceptance_baselines``
becomes this version's baselines (what `observe`, exports and the next version compare with).
"""

from __future__ import annotations

from typing import Any

from specreg.core.baselines import (ENGINE_SCHEDULE, ENGINE_TAU, draft_sampling_note, drift_floor, in_engine_terms,
                                    legacy_tau_note, relative_change, schedule_note)
from specreg.core.types import FAIL, PASS, SKIP, CheckResult
from specreg.validators.context import Check, CheckContext

CHECK_NAME = "acceptance"
DEFAULT_TOLERANCE = 0.10
COMPARED = ("acceptance_rate", "mean_acceptance_length")
BASELINE_KEYS = ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance", "drafted",
                 "accepted", "draft_steps", "generated_tokens", "target_forwards", "longest_rejection_run",
                 "generations", "tokens_per_target_forward", "per_position_acceptance_conditional")


def acceptance_baselines(decodes, k: int | None = None, draft_sampling: str | None = None) -> dict[str, Any]:
    """GoldenDecodes -> {"k": k, "tau_definition": "engines", "schedule": "prefill_alone" (the
    decodes' schedule: core.baselines.schedule_of), "draft_sampling": how the sampled records
    drafted (None when none was sampled: core.baselines.draft_sampling_of), "overall": figures, "per_category":
    {category: figures}} with the names and definitions vLLM uses (acceptance_rate,
    mean_acceptance_length, per_position_acceptance ...) and ours under their own names
    (tokens_per_target_forward, per_position_acceptance_conditional); k is the speculative depth
    the figures were measured at."""
    from specreg.runtime.metrics import aggregate

    def figures(runs) -> dict[str, Any]:
        summary = aggregate([run.acceptance_generation.metrics for run in runs])
        return {key: summary.get(key) for key in BASELINE_KEYS}

    categories: dict[str, list] = {}
    for run in decodes.runs:
        categories.setdefault(run.category, []).append(run)
    sampled = any(run.temperature > 0 for run in decodes.runs)
    return {"k": k, "tau_definition": ENGINE_TAU, "schedule": ENGINE_SCHEDULE,
            "draft_sampling": draft_sampling if sampled else None, "overall": figures(decodes.runs),
            "per_category": {category: figures(runs) for category, runs in categories.items()}}


def greedy_rows(decodes) -> list[dict[str, Any]]:
    """Per prompt, the greedy speculative decode in the engines' terms (validators.engine rows)
    with its token ids and its counts as llama.cpp counts at a stop token ("stop_counts",
    runtime.metrics.stop_draft_counts): what `validate --engine llamacpp` compares the engine
    with instead of decoding the prompts again (both on the engines' schedule)."""
    from specreg.runtime.metrics import stop_draft_counts
    from specreg.validators.engine import runtime_row

    return [{**runtime_row(run.record_id, run.category, run.speculative.metrics),
             "token_ids": list(run.speculative.token_ids), "stop_counts": stop_draft_counts(run.speculative.metrics)}
            for run in decodes.runs]


def comparable_metrics(current: dict[str, Any], previous: dict[str, Any]) -> tuple[tuple[str, ...], list[str]]:
    """(metrics of COMPARED that two baselines can be compared on, why any other is not):
    tau (mean_acceptance_length) only when both counted it as the engines do, at the same k."""
    legacy = legacy_tau_note(in_engine_terms(previous)) or legacy_tau_note(in_engine_terms(current), "this run")
    if legacy:
        return ("acceptance_rate",), [legacy]
    k_now, k_before = current.get("k"), previous.get("k")
    if k_now is not None and k_now == k_before:
        return COMPARED, []
    why = (f"mean_acceptance_length not compared: measured at k={k_now}, the baseline at k={k_before}"
           if k_before is not None else "mean_acceptance_length not compared: the baseline does not record its k")
    return ("acceptance_rate",), [why]


def compare_baselines(current: dict[str, Any], previous: dict[str, Any], tolerance: float) -> list[dict]:
    """Every compared figure (overall and per shared category; tau only at the same k, see
    comparable_metrics) -> list of {scope, metric, current, baseline, floor, relative_change, ok}."""
    rows = []
    current, previous = in_engine_terms(current), in_engine_terms(previous)
    metrics, _ = comparable_metrics(current, previous)
    scopes = [("overall", current.get("overall") or {}, previous.get("overall") or {})]
    for category, figures in (current.get("per_category") or {}).items():
        before = (previous.get("per_category") or {}).get(category)
        if before:
            scopes.append((category, figures, before))
    for scope, now, before in scopes:
        for metric in metrics:
            value, baseline = now.get(metric), before.get(metric)
            if not isinstance(value, (int, float)) or not isinstance(baseline, (int, float)) or baseline <= 0:
                continue
            floor = drift_floor(metric, baseline, tolerance)
            rows.append({"scope": scope, "metric": metric, "current": value, "baseline": baseline, "floor": floor,
                         "relative_change": relative_change(metric, value, baseline), "ok": value >= floor})
    return rows


def check_acceptance(decodes, *, previous: tuple[int, dict[str, Any]] | None = None,
                     tolerance: float = DEFAULT_TOLERANCE, k: int | None = None,
                     draft_sampling: str | None = None) -> CheckResult:
    """Acceptance figures of this run, checked against the previous version's baselines.

    decodes: GoldenDecodes; previous: (version, baselines) of the previous validated version
    of the same pair name, or None; tolerance: relative drop allowed. Returns a CheckResult
    "acceptance" whose evidence holds the would-be baselines ("baselines") and the comparison.
    """
    baselines = acceptance_baselines(decodes, k=k, draft_sampling=draft_sampling)
    overall = baselines["overall"]
    evidence: dict[str, Any] = {"baselines": baselines, "tolerance": tolerance, "k": k,
                                "greedy_rows": greedy_rows(decodes),
                                "compared_with_version": previous[0] if previous else None, "comparison": []}
    if not decodes.runs or not overall.get("drafted"):
        return CheckResult(CHECK_NAME, SKIP, "no draft token was proposed on the golden prompts: nothing to measure",
                           evidence, {"drafted": overall.get("drafted") or 0})
    figures = {"acceptance_rate": overall["acceptance_rate"], "mean_acceptance_length": overall["mean_acceptance_length"],
               "drafted": overall["drafted"], "accepted": overall["accepted"]}
    for position, rate in enumerate(overall["per_position_acceptance"] or []):
        figures[f"acceptance_rate_pos_{position}"] = rate
    headline = (f"alpha {overall['acceptance_rate']:.3f}, tau {overall['mean_acceptance_length']:.2f}"
                + (f" (k={k})" if k else ""))
    if previous is None:
        return CheckResult(CHECK_NAME, PASS, f"{headline}; no previous validated version: these figures become "
                           f"the baseline", evidence, figures)
    version, previous_baselines = previous
    comparison = compare_baselines(baselines, previous_baselines, tolerance)
    evidence["comparison"] = comparison
    evidence["not_compared"] = comparable_metrics(baselines, previous_baselines)[1]
    notes = [note for note in (schedule_note(previous_baselines, f"v{version}'s baseline"),
                               draft_sampling_note(baselines, previous_baselines, f"v{version}'s baseline")) if note]
    evidence["notes"] = notes
    flagged = "".join(f"; {note}" for note in notes)
    drops = [row for row in comparison if not row["ok"]]
    if drops:
        worst = min(drops, key=lambda row: row["relative_change"])
        part = " (its accepted part, tau - 1)" if worst["metric"] == "mean_acceptance_length" else ""
        summary = (f"{headline}; {worst['metric']} ({worst['scope']}) {worst['current']:.3f} is "
                   f"{-worst['relative_change']:.0%}{part} below v{version}'s {worst['baseline']:.3f} "
                   f"(tolerance {tolerance:.0%}; {len(drops)} figure(s) dropped){flagged}")
        return CheckResult(CHECK_NAME, FAIL, summary, evidence, figures)
    return CheckResult(CHECK_NAME, PASS, f"{headline}; within {tolerance:.0%} of v{version}'s baseline "
                       f"({len(comparison)} figures compared){flagged}", evidence, figures)


def run(context: CheckContext) -> CheckResult:
    """The acceptance check of a validation, over the runtime's golden decodes."""
    _, decodes = context.runtime()
    return check_acceptance(decodes, previous=context.previous_baselines, tolerance=context.options.acceptance_tolerance,
                            k=context.settings.k, draft_sampling=context.settings.draft_sampling)


CHECK = Check(CHECK_NAME, run, runtime=True)
