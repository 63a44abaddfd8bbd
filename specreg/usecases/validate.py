"""Validate: run the checks on our runtime over a golden set, record the run with its per-check
results and acceptance baselines, and move the version to validated or failed
(specreg.runtime_validation does the run; this reads the settings and the policy around it)."""

from __future__ import annotations

from specreg.errors import SpecregError, UsageError
from specreg.usecases import mirror
from specreg.usecases.inputs import check_range
from specreg.validators.equivalence import DEFAULT_BATCH_SIZE

MAX_DISTRIBUTION_SAMPLES = 1_000_000
MAX_RUNTIME_BATCH = 256


def validation_settings(registry, golden: str | None = None, acceptance_tolerance: float | None = None) -> dict:
    """The golden set and acceptance tolerance a validation uses: those given, else those of the
    policy in effect (its validation environment: Policy.validation_environment) ->
    {"golden_set", "acceptance_tolerance", "policy", "environment"} ("environment": None when both
    were given)."""
    if golden is not None and acceptance_tolerance is not None:
        return {"golden_set": golden, "acceptance_tolerance": acceptance_tolerance, "policy": None,
                "environment": None}
    policy = registry.policy()
    env = policy.validation_environment()
    return {"golden_set": golden if golden is not None else env.golden_set,
            "acceptance_tolerance": (acceptance_tolerance if acceptance_tolerance is not None
                                     else env.acceptance_tolerance),
            "policy": policy.source, "environment": env.name}


def validate(registry, ref, *, golden: str | None = None, device: str = "auto", dtype: str = "float32",
             checks: str | list[str] | None = None, gpu_memory: str | None = None,
             acceptance_tolerance: float | None = None, near_tie_tolerance: float | None = None,
             distribution_samples: int = 4000, seed: int = 0, runtime_batch: int = DEFAULT_BATCH_SIZE, progress=None,
             hooks: dict | None = None):
    """Validate a pair version and record the run (see Registry.validate) ->
    registry.validations.ValidationOutcome."""
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime_validation import validate_version

    chosen = validation_settings(registry, golden, acceptance_tolerance)
    options = validation_options(chosen["acceptance_tolerance"], device=device, dtype=dtype, checks=checks,
                                 gpu_memory=gpu_memory, near_tie_tolerance=near_tie_tolerance,
                                 distribution_samples=distribution_samples, seed=seed, runtime_batch=runtime_batch)
    version = registry.get(ref)
    golden_set = load_golden_set(chosen["golden_set"])
    helper = mirror.start_helper(registry)  # opens MLflow while the checks run
    try:
        outcome = validate_version(registry.store, version, golden_set, options, actor=registry.user,
                                   progress=progress, hooks=hooks)
    except BaseException:
        if helper is not None:
            helper.cancel()
        raise
    registry.warnings += low_baseline_warnings(registry, outcome.run)
    mirror.mirror(registry, version.label, helper)
    return outcome


def validation_options(acceptance_tolerance: float, *, device: str, dtype: str, checks, gpu_memory: str | None,
                       near_tie_tolerance: float | None, distribution_samples: int, seed: int, runtime_batch: int):
    """The options of one validation, each checked (UsageError naming it) ->
    validators.suite.ValidationOptions."""
    from specreg.validators.suite import ValidationOptions, parse_checks

    if not 0 <= acceptance_tolerance < 1:
        raise UsageError(f"invalid acceptance tolerance {acceptance_tolerance!r}: use a fraction in [0, 1)")
    if distribution_samples < 1000:
        # below ~1000 draws sparse tokens make the chi-square approximation too loose
        raise UsageError(f"invalid distribution samples {distribution_samples!r}: use at least 1000")
    check_range("distribution samples", distribution_samples, 1000, MAX_DISTRIBUTION_SAMPLES)
    if near_tie_tolerance is not None and not 0 <= near_tie_tolerance < float("inf"):
        raise UsageError(f"invalid near-tie tolerance {near_tie_tolerance!r}: use a finite number >= 0")
    check_range("runtime batch", runtime_batch, 1, MAX_RUNTIME_BATCH)
    selected = parse_checks(checks if isinstance(checks, str) or checks is None else ",".join(checks))
    return ValidationOptions(device=device, dtype=dtype, checks=selected, gpu_memory=gpu_memory,
                             acceptance_tolerance=acceptance_tolerance, near_tie_tolerance=near_tie_tolerance,
                             distribution_samples=distribution_samples, seed=seed, runtime_batch_size=runtime_batch)


def low_baseline_warnings(registry, run) -> list[str]:
    """The policy's warnings about a run's low baselines (none when the policy cannot be read: a
    broken policy file is reported by the commands that apply it)."""
    from specreg.registry.governance.floors import low_baseline_warnings as warnings_of

    try:
        policy = registry.policy()
    except SpecregError:
        return []
    return warnings_of(run, policy)


def validation_runs(registry, ref) -> list:
    """Validation runs (registry.entities.ValidationRun) of a version, oldest first; runs of this
    host whose process is gone are marked abandoned first."""
    from specreg.registry.store.validations import ValidationStore

    version = registry.get(ref)
    runs = ValidationStore(registry.store)
    runs.reap_dead_runs()
    return runs.list_runs(version.name, version.version)


def baselines(registry, ref) -> dict | None:
    """Acceptance baselines of a version: those of its newest passed validation run, or None."""
    from specreg.registry.store.validations import ValidationStore

    version = registry.get(ref)
    return ValidationStore(registry.store).baselines(version.name, version.version)
