"""The policy's floors (min_acceptance_rate, min_speedup) as gate conditions, and the explicit
exception a promote can make to min_speedup.

A first validated version sets the acceptance baseline later versions are compared with: a
version accepted almost never (a random draft: acceptance 0.037, speedup 0.10x) passed the
production gate under the built-in policy, and set a baseline that made the regression check of
every later version meaningless. The floors refuse it. A pair slower than its target can still
hold an environment where someone says so: `promote --allow-slower REASON` records the
exception (who, why, the measured speedup) in the promote's audit event, and the gate honours
an exception for the same version, environment and validation run.
"""

from __future__ import annotations

from typing import Any

from specreg.core.statuses import RunStatus
from specreg.registry.governance.queries import Condition

SPEEDUP_EXCEPTION = "speedup"  # the one condition an explicit exception may waive


def measured_speedup(run) -> tuple[float | None, int | None]:
    """(speedup, k) the run's performance check measured; (None, None) when it did not run."""
    performance = ((run.summary or {}).get("performance") or {}) if run is not None else {}
    speedup = performance.get("speedup")
    if not isinstance(speedup, (int, float)) or isinstance(speedup, bool):
        return None, None
    return float(speedup), (run.baselines or {}).get("k")


def best_k_outlook(run) -> dict[str, float] | None:
    """What the run's performance check expects of the best k it measured: {"k", "expected_speedup",
    "cost_ratio"} (docs/design.md §2's formula over the measured per-position acceptance and the
    measured draft/target step cost c), or None for a run that did not record it."""
    performance = ((run.summary or {}).get("performance") or {}) if run is not None else {}
    k, expected = performance.get("recommended_k"), performance.get("expected_speedup_at_recommended_k")
    cost_ratio = performance.get("cost_ratio")
    if not isinstance(k, int) or not all(isinstance(value, (int, float)) and not isinstance(value, bool)
                                         for value in (expected, cost_ratio)):
        return None
    return {"k": k, "expected_speedup": float(expected), "cost_ratio": float(cost_ratio)}


def no_k_reaches(outlook: dict[str, float], floor: float) -> str:
    """Why no k helps a pair whose best k is expected below ``floor``, in words."""
    cost = outlook["cost_ratio"]
    why = ("the draft costs as much as the target" if cost >= 0.9 else f"a draft step costs {cost:.2f} of a target step")
    return (f"no k reaches {floor:g}x: the best, k={outlook['k']}, is expected at about "
            f"{outlook['expected_speedup']:.2f}x ({why}: c ≈ {cost:.2f})")


def recorded_exception(events, environment: str, run_id: int | None) -> dict[str, Any] | None:
    """The newest speedup exception among a version's verified audit ``events`` for this
    environment and validation run -> its details with actor and time, or None."""
    for event in reversed(list(events)):
        details = event.details or {}
        exception = details.get("exception") or {}
        if (event.action == "promote" and details.get("environment") == environment
                and exception.get("condition") == SPEEDUP_EXCEPTION and details.get("validation_run") == run_id):
            return {**exception, "actor": event.actor, "at": event.created_at.isoformat(timespec="seconds")}
    return None


def floor_conditions(run, env, figures: dict[str, float] | None, events) -> list:
    """The Conditions of ``env``'s floors for a version judged on validation ``run`` (None: none):
    ``figures``: the run's overall acceptance figures; ``events``: the version's verified audit
    events (an exception to min_speedup counts only from them)."""
    conditions = []
    floor = env.min_acceptance_rate
    if floor is not None:
        if figures is None:
            conditions.append(Condition("min_acceptance", False, f"no acceptance rate measured (policy floor {floor:g})"))
        else:
            rate = figures["acceptance_rate"]
            conditions.append(Condition(
                "min_acceptance", rate >= floor,
                f"acceptance rate {rate:.3f} {'>=' if rate >= floor else '<'} {floor:g} (min_acceptance_rate)",
                {"acceptance_rate": rate, "floor": floor}))
    floor = env.min_speedup
    if floor is not None:
        speedup, k = measured_speedup(run)
        at = f" at k={k}" if k is not None else ""
        if run is None:
            conditions.append(Condition("speedup", False, f"no validation measured a speedup (policy floor {floor:g}x)"))
        elif speedup is None:
            conditions.append(Condition("speedup", False, f"run {run.id} measured no speedup (the performance check "
                                                          f"did not run; policy floor {floor:g}x)"))
        elif speedup >= floor:
            conditions.append(Condition("speedup", True, f"{speedup:.2f}x{at} >= {floor:g}x (min_speedup)",
                                        {"speedup": speedup, "floor": floor}))
        else:
            exception = recorded_exception(events, env.name, run.id)
            if exception is not None:
                conditions.append(Condition(
                    "speedup", True, f"EXCEPTION: {speedup:.2f}x{at} < {floor:g}x, allowed by {exception['actor']} at "
                    f"{exception['at']}: {exception.get('reason')}", {"speedup": speedup, "floor": floor,
                                                                     "exception": exception}))
            else:
                outlook = best_k_outlook(run)
                hopeless = outlook is not None and outlook["expected_speedup"] < floor
                conditions.append(Condition(
                    "speedup", False, f"{speedup:.2f}x{at} < {floor:g}x (min_speedup): slower than the target alone"
                    + (f"; {no_k_reaches(outlook, floor)}" if hopeless else ""),
                    {"speedup": speedup, "floor": floor, **({"best_k": outlook} if outlook else {})}))
    return conditions


def low_baseline_warnings(run, policy) -> list[str]:
    """Warnings for a finished validation ``run`` (registry.entities.ValidationRun) whose
    acceptance rate is below an environment's min_acceptance_rate: kept as this version's
    baseline, it cannot hold that environment."""
    acceptance = (run.summary or {}).get("acceptance") or {}
    rate = acceptance.get("acceptance_rate")
    if run.status != RunStatus.PASSED or not isinstance(rate, (int, float)):
        return []
    below = [env for env in policy.environments.values()
             if env.min_acceptance_rate is not None and rate < env.min_acceptance_rate]
    return [f"{run.label}: acceptance rate {rate:.3f} is below {env.name}'s min_acceptance_rate "
            f"{env.min_acceptance_rate:g} (policy {policy.source}): this baseline cannot hold {env.name}; "
            "a draft closer to the target (or another k) is needed" for env in below]
