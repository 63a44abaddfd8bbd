"""Which tau a recorded acceptance baseline holds (docs/design.md §2), so that no comparison mixes two.

Baselines recorded since the engines' definitions (runtime/metrics.py) carry
``"tau_definition": "engines"``: mean_acceptance_length = 1 + accepted / draft steps and
per_position_acceptance = accepted at position i / draft steps, as vLLM and SGLang count them.
Baselines recorded before carry no marker: their mean_acceptance_length was emitted tokens / every
target forward (steps without drafts counted) and their per_position_acceptance the conditional
rate. The engines' figures cannot be recovered from them (the number of draft steps was not
recorded), so ``in_engine_terms`` reads them under their own names and leaves the engines' names
empty: tau is then not compared (nor alerted on) until the version is validated again, and the
reader says so (``legacy_tau_note``); alpha-hat meant the same then and is compared as before.
Nothing stored is rewritten: signed locks and MLflow tags hold the old baselines verbatim.
"""

from __future__ import annotations

from typing import Any

ENGINE_TAU = "engines"
# the decode schedule that counted a baseline: the serving engines' (the prefill emits the first
# token alone and drafting starts from it), recorded as "schedule"; baselines recorded before
# carry none and were counted on our earlier one (the prefill forward verified the first drafts too)
ENGINE_SCHEDULE = "prefill_alone"
LEGACY_SCHEDULE = "prefill_verifies_drafts"
LEGACY_TAU = "tokens_per_target_forward"
# an old baseline's figure -> the name it has now
LEGACY_NAMES = {"mean_acceptance_length": "tokens_per_target_forward",
                "per_position_acceptance": "per_position_acceptance_conditional"}


def in_engine_terms(baselines: dict[str, Any] | None) -> dict[str, Any] | None:
    """Recorded baselines -> the same where every engine-named figure means the engines' figure.

    Marked baselines come back unchanged; unmarked (older) ones as a copy with their figures under
    LEGACY_NAMES, the engines' names None and ``"tau_definition": LEGACY_TAU``."""
    if not isinstance(baselines, dict) or baselines.get("tau_definition") is not None:
        return baselines

    def renamed(figures: Any) -> Any:
        if not isinstance(figures, dict):
            return figures
        moved = dict(figures)
        for engine_name, own_name in LEGACY_NAMES.items():
            if engine_name in moved:
                moved[own_name] = moved.pop(engine_name)
                moved[engine_name] = None
        return moved

    converted = dict(baselines, tau_definition=LEGACY_TAU)
    if "overall" in baselines:
        converted["overall"] = renamed(baselines["overall"])
    if isinstance(baselines.get("per_category"), dict):
        converted["per_category"] = {category: renamed(figures) for category, figures in baselines["per_category"].items()}
    return converted


def legacy_tau_note(baselines: dict[str, Any] | None, whose: str = "the baseline") -> str | None:
    """One line saying why tau is not compared with ``baselines`` (None when it can be)."""
    if isinstance(baselines, dict) and baselines.get("tau_definition") == LEGACY_TAU:
        return (f"mean_acceptance_length not compared: {whose} was recorded before tau was counted as the engines "
                f"count it (it holds tokens per target forward, steps without drafts included); validate that "
                f"version again to record tau")
    return None


def schedule_note(baselines: dict[str, Any] | None, whose: str = "the baseline") -> str | None:
    """One line flagging ``baselines`` counted on the earlier decode schedule (None when they were
    counted on the engines'): they are still compared as recorded, but their first draft step of
    every prompt was drafted from the prompt and verified by the prefill, so alpha-hat and tau
    moved a little with the schedule alone."""
    if not isinstance(baselines, dict) or schedule_of(baselines) == ENGINE_SCHEDULE:
        return None
    return (f"{whose} was counted on the earlier decode schedule (the prefill verified the first drafts; "
            f"the engines draft from the first sampled token): compared as recorded, a difference of a "
            f"few points can be the schedule; validate that version again to re-count it")


def drift_floor(metric: str, baseline: float, tolerance: float) -> float:
    """The lowest value of ``metric`` within ``tolerance`` of its baseline (below it is drift).

    alpha-hat (and any rate): baseline * (1 - tolerance). tau: its bonus token is there at every
    step whatever the draft does, so the tolerance applies to the accepted part, tau - 1 (accepted
    tokens per draft step, the figure TensorRT-LLM's gate also compares): 1 + (baseline - 1) *
    (1 - tolerance). A floor of tau * (1 - tolerance) would let acceptance fall by tolerance * tau /
    (tau - 1) before firing: 15% instead of 10% at tau 3.1, 19% at tau 2.1."""
    if metric == "mean_acceptance_length":
        return 1.0 + (baseline - 1.0) * (1.0 - tolerance)
    return baseline * (1.0 - tolerance)


def relative_change(metric: str, value: float, baseline: float) -> float:
    """value against baseline as drift_floor measures it (tau: its accepted part); below
    -tolerance is drift."""
    if metric == "mean_acceptance_length":
        return (value - 1.0) / (baseline - 1.0) - 1.0 if baseline > 1.0 else 0.0
    return value / baseline - 1.0


def schedule_of(baselines: dict[str, Any] | None) -> str:
    """The decode schedule that counted ``baselines``: ENGINE_SCHEDULE, or LEGACY_SCHEDULE for
    baselines recorded before the schedule was (read as they always were)."""
    if isinstance(baselines, dict) and baselines.get("schedule"):
        return str(baselines["schedule"])
    return LEGACY_SCHEDULE


def draft_sampling_of(baselines: dict[str, Any] | None) -> str | None:
    """How the sampled golden records behind ``baselines`` drafted (runtime DecodeConfig.draft_sampling:
    "greedy", the engines' default, or "probabilistic"), recorded as "draft_sampling"; None when no
    sampled record was measured (both ways draft the argmax of a greedy record) or for baselines
    recorded before the setting (whose sampled records drafted from q: validate again to record it)."""
    if isinstance(baselines, dict) and baselines.get("draft_sampling"):
        return str(baselines["draft_sampling"])
    return None


def draft_sampling_note(current: dict[str, Any] | None, previous: dict[str, Any] | None,
                        whose: str = "the baseline") -> str | None:
    """One line flagging two baselines whose sampled records drafted differently (both recorded, and
    not the same; None otherwise): the sampled categories' figures moved with the draft sampling
    alone, so a drop or gain there may not be the pair's."""
    now, before = draft_sampling_of(current), draft_sampling_of(previous)
    if now is None or before is None or now == before:
        return None
    return (f"{whose}'s sampled records drafted {before}, this run's {now}: the sampled categories' figures "
            f"moved with the draft sampling too; validate both the same way to compare them")
