"""The acceptance check compares like with like: tau only with a baseline that counted it as the
engines do (specreg.core.baselines), and the tolerance on tau applies to its accepted part."""

from __future__ import annotations

import pytest

from specreg.core.baselines import drift_floor, in_engine_terms
from specreg.validators.acceptance import compare_baselines, comparable_metrics


def baselines(tau: float, rate: float = 0.7, marked: bool = True, k: int = 4) -> dict:
    recorded = {"k": k, "overall": {"acceptance_rate": rate, "mean_acceptance_length": tau,
                                    "per_position_acceptance": [0.8, 0.6]},
                "per_category": {"code": {"acceptance_rate": rate, "mean_acceptance_length": tau}}}
    return {**recorded, "tau_definition": "engines"} if marked else recorded


def test_tau_drop_is_judged_on_its_accepted_part():
    # tau 3.1 -> 2.85: 8% lower, but tau - 1 fell from 2.1 to 1.85, 12% (past 10%)
    rows = compare_baselines(baselines(2.85), baselines(3.1), 0.10)
    tau = [row for row in rows if row["metric"] == "mean_acceptance_length"]
    assert [row["scope"] for row in tau] == ["overall", "code"]
    assert tau[0]["floor"] == pytest.approx(2.89) and tau[0]["ok"] is False
    assert tau[0]["relative_change"] == pytest.approx(1.85 / 2.1 - 1)
    assert all(row["ok"] for row in compare_baselines(baselines(2.9), baselines(3.1), 0.10))
    assert drift_floor("acceptance_rate", 0.71, 0.1) == pytest.approx(0.639)


def test_a_baseline_recorded_before_engine_tau_is_not_compared_on_tau():
    """Old baselines hold tokens per target forward (1.45 for an n-gram pair whose engine tau is
    2.1): comparing would pass any engine tau down to 1.4. Alpha-hat is compared as before."""
    old = baselines(1.45, marked=False)
    metrics, why = comparable_metrics(baselines(1.5), old)
    assert metrics == ("acceptance_rate",) and "recorded before tau was counted as the engines count it" in why[0]
    rows = compare_baselines(baselines(1.5, rate=0.6), old, 0.10)
    assert {row["metric"] for row in rows} == {"acceptance_rate"} and not rows[0]["ok"]
    assert in_engine_terms(old)["overall"]["tokens_per_target_forward"] == 1.45
    assert in_engine_terms(baselines(3.0)) == baselines(3.0)  # marked: unchanged


def test_a_baseline_counted_on_the_earlier_schedule_is_compared_and_flagged():
    """Baselines recorded before validate decoded on the engines' schedule carry no "schedule":
    they are read as before (alpha-hat and tau compared) and every verdict says what counted them."""
    from specreg.core.baselines import ENGINE_SCHEDULE, LEGACY_SCHEDULE, schedule_note, schedule_of
    from specreg.registry.deploy.live_metrics import compare_with_baseline

    old, new = baselines(3.0), {**baselines(3.0), "schedule": ENGINE_SCHEDULE}
    assert schedule_of(old) == LEGACY_SCHEDULE and schedule_of(new) == ENGINE_SCHEDULE
    assert schedule_note(new) is None
    assert schedule_note(old, "v1's baseline").startswith("v1's baseline was counted on the earlier decode schedule")
    assert {row["metric"] for row in compare_baselines(new, old, 0.10)} == {"acceptance_rate", "mean_acceptance_length"}
    live = {"acceptance_rate": 0.7, "mean_acceptance_length": 3.0, "per_position_acceptance": [0.8, 0.6]}
    assert compare_with_baseline(live, old)["notes"] == [schedule_note(old)]
    assert compare_with_baseline(live, new)["notes"] == []
