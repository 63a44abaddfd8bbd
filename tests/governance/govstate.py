"""Governance test state: validated versions built as database rows.

``record_validation`` writes the rows a finished `specreg validate` leaves behind (a
ValidationRunRow, its CheckResultRows, the state move and its audit event) through the Store's
own session, so promotion, approval and the gate are tested against real database state
without running the speculative runtime (the runtime is tested in tests/runtime and
tests/validation; one end-to-end test here runs the real validation).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from specreg.api import Registry
from specreg.golden_prompts.loader import load_golden_set
from specreg.registry.store.entities import PairState
from specreg.registry.store.orm import CheckResultRow, ValidationRunRow
from specreg.registry.store.validations import run_content_sha256

POLICY_TOML = """\
golden_set = "smoke"
required_checks = ["integrity", "tokenizer", "equivalence", "acceptance"]
acceptance_tolerance = 0.10
max_validation_age_days = 30

[environments.staging]
approval_required = false

[environments.production]
approval_required = true
approvers = []
"""
DEFAULT_CHECKS = {"integrity": "pass", "tokenizer": "pass", "equivalence": "pass", "acceptance": "pass"}


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def record_validation(registry: Registry, ref: str, *, status: str = "passed", golden: str = "smoke",
                      golden_sha256: str | None = None, acceptance_rate: float = 0.8,
                      mean_acceptance_length: float = 3.0, checks: dict[str, str] | None = None,
                      finished_at: datetime | None = None, binding_sha256: str | None = None,
                      tau_definition: str | None = "engines", speedup: float | None = None,
                      recommended_k: int | None = None, expected_speedup: float | None = None,
                      cost_ratio: float | None = None) -> int:
    """Insert a finished validation run of ``ref`` and move its state; returns the run id.
    ``tau_definition=None`` stores baselines as runs before the engines' tau did; ``speedup``:
    what its performance check measured (None: the check did not run), with ``recommended_k``, the
    speedup it expects there (``expected_speedup``) and the draft/target step cost (``cost_ratio``)."""
    version = registry.get(ref)
    finished_at = finished_at or utcnow()
    def figures(rate: float) -> dict:
        # the keys validators/acceptance.py records (BASELINE_KEYS), for 100 drafted tokens
        return {"acceptance_rate": rate, "mean_acceptance_length": mean_acceptance_length,
                "per_position_acceptance": [rate, rate * 0.9], "drafted": 100, "accepted": round(100 * rate),
                "generated_tokens": 64, "target_forwards": 20, "longest_rejection_run": 1, "generations": 4,
                "tokens_per_target_forward": 3.2}

    baselines = {"k": version.config.num_speculative_tokens, "overall": figures(acceptance_rate),
                 "per_category": {"code": figures(acceptance_rate + 0.05)}} if status == "passed" else None
    if baselines and tau_definition:
        baselines["tau_definition"] = tau_definition
    store = registry.store
    with store.session(write=True) as session:
        run = ValidationRunRow(
            pair_version_id=version.id, status=status, golden_set=golden,
            golden_sha256=golden_sha256 or load_golden_set(golden).content_sha256,
            binding_sha256=binding_sha256 or version.binding_sha256,
            environment={"torch": "2.13.0", "transformers": "5.24.0", "specreg": "0.1.0", "python": "3.11",
                         "device": "cpu", "dtype": "float32"},
            options={}, baselines=baselines,
            summary={"verdict": "pass" if status == "passed" else "fail",
                     **({"performance": {"speedup": speedup, "tokens_per_s": 100.0 * speedup,
                                         "baseline_tokens_per_s": 100.0, "recommended_k": recommended_k,
                                         "expected_speedup_at_recommended_k": expected_speedup,
                                         "cost_ratio": cost_ratio}}
                        if speedup is not None else {})},
            actor="validator", pid=None, started_at=finished_at - timedelta(seconds=5), finished_at=finished_at,
        )
        session.add(run)
        session.flush()
        for name, check_status in (checks or DEFAULT_CHECKS).items():
            session.add(CheckResultRow(validation_run_id=run.id, name=name, status=check_status,
                                       summary=f"{name} {check_status}", evidence=None, figures=None))
        session.flush()
        session.expire(run, ["checks"])
        # as ValidationStore.finish: the validate event covers the run's content, else it counts for nothing
        kept = version.state in (PairState.APPROVED, PairState.PROMOTED) and status == "passed"
        store.transition(version.name, version.version,
                         version.state if kept else PairState.VALIDATED if status == "passed" else PairState.FAILED,
                         actor="validator", action="validate",
                         details={"validation_run_id": run.id, "run_sha256": run_content_sha256(run)},
                         session=session)
        return run.id


def validated_pair(db_url: str, tiny_models, name: str, registrant: str = "alice") -> Registry:
    """NAME@1 (k = 2) registered by ``registrant`` (their own role on PostgreSQL) and validated."""
    from pgroles import as_user

    registry = Registry(as_user(db_url, registrant), user=registrant)
    registry.register(name, target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                      num_speculative_tokens=2)
    record_validation(registry, f"{name}@1")
    return registry


def register_versions(registry: Registry, tiny_models, name: str, count: int, target=None, draft=None) -> list[str]:
    """``count`` versions of ``name`` over the same tiny models (k = 1..count)."""
    refs = []
    for k in range(1, count + 1):
        result = registry.register(name, target=str(target or tiny_models["target"]),
                                   draft=str(draft or tiny_models["draft"]), num_speculative_tokens=k)
        refs.append(result.version.label)
    return refs


def recorded_policy_file(tmp_path, request, text: str = POLICY_TOML):
    """Write ``text`` as a policy file and make it the policy of record of the database fixture
    the test uses (``db_url`` or ``postgres_url``); returns the file's path."""
    from policyrecord import record_policy

    path = tmp_path / "specreg.toml"
    path.write_text(text)
    for name in ("db_url", "postgres_url"):
        if name in request.fixturenames:
            record_policy(request.getfixturevalue(name), path, tmp_path)
            break
    return path


@pytest.fixture
def policy_file(tmp_path, request):
    """A policy on the smoke golden set, made the policy of record of the test's database
    (import it into a test module outside tests/governance, whose conftest has the same fixture)."""
    return recorded_policy_file(tmp_path, request)
