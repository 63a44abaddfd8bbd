"""Validate: run the checks on our runtime over a golden set, record the run with its per-check
results and acceptance baselines, and move the version to validated or failed
(specreg.runtime_validation does the run; this resolves its request, once, around it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specreg.errors import SpecregError, UsageError
from specreg.usecases import mirror
from specreg.usecases.inputs import check_range
from specreg.validators.suite import ValidationOptions

if TYPE_CHECKING:
    from specreg.golden_prompts.records import GoldenSet
    from specreg.registry.governance.policy import Policy
    from specreg.registry.store.entities import PairVersion

MAX_DISTRIBUTION_SAMPLES = 1_000_000
MAX_RUNTIME_BATCH = 256


@dataclass(frozen=True)
class ValidationRequest:
    """One validation of our runtime as the command that asks for it resolved it where it starts
    (the CLI, or Registry.validate), each value read once: the version, the golden set (its
    ``reference`` is what the run records and what the gate matches runs by), the checked options
    with the acceptance tolerance, and the policy snapshot they were taken from."""

    version: PairVersion
    golden: GoldenSet
    options: ValidationOptions
    policy: Policy | None  # the policy of record as this command read it (None: unreadable, and not needed)
    environment: str | None  # the policy environment that set the golden set or tolerance (None: both given)

    @property
    def policy_source(self) -> str | None:
        """The policy that chose the golden set or tolerance (None: both were given)."""
        return self.policy.source if self.environment is not None else None


def validation_request(registry, ref, *, golden: str | None = None, acceptance_tolerance: float | None = None,
                       device: str = ValidationOptions.device, dtype: str = ValidationOptions.dtype,
                       checks: str | list[str] | None = None, gpu_memory: str | None = None,
                       near_tie_tolerance: float | None = None,
                       distribution_samples: int = ValidationOptions.distribution_samples,
                       seed: int = ValidationOptions.seed, runtime_batch: int = ValidationOptions.runtime_batch_size,
                       draft_sampling: str = ValidationOptions.draft_sampling,
                       policy: Policy | None = None) -> ValidationRequest:
    """The request of one validation (see Registry.validate), its settings checked (UsageError
    naming the one): the golden set (a shipped set's name or a file's path) and acceptance
    tolerance given, else those of the policy's validation environment
    (Policy.validation_environment); ``policy``: the policy of record this command read already
    (default: read here, once). The other defaults are ValidationOptions'."""
    from specreg.golden_prompts.loader import load_golden_set

    from_policy = golden is None or acceptance_tolerance is None
    if policy is None:
        policy = read_policy(registry, needed=from_policy)
    env = policy.validation_environment() if from_policy else None
    tolerance = env.acceptance_tolerance if acceptance_tolerance is None else acceptance_tolerance
    options = validation_options(tolerance, device=device, dtype=dtype, checks=checks, gpu_memory=gpu_memory,
                                 near_tie_tolerance=near_tie_tolerance, distribution_samples=distribution_samples,
                                 seed=seed, runtime_batch=runtime_batch, draft_sampling=draft_sampling)
    version = registry.get(ref)
    golden_set = load_golden_set(env.golden_set if golden is None else golden)
    return ValidationRequest(version, golden_set, options, policy, env.name if env is not None else None)


def read_policy(registry, *, needed: bool) -> Policy | None:
    """The policy of record, read once for a validation; when ``needed`` is False (golden set and
    tolerance given, the policy only warns about low baselines) an unreadable one is None: the
    commands that apply it report it."""
    if needed:
        return registry.policy()
    try:
        return registry.policy()
    except SpecregError:
        return None


def validate(registry, ref, *, progress=None, hooks: dict | None = None, **settings):
    """Validate a version and record the run (see Registry.validate): the request built here, at
    the Python API's edge, from ``settings`` (validation_request's keywords) ->
    registry.validations.ValidationOutcome."""
    return run_validation(registry, validation_request(registry, ref, **settings), progress=progress, hooks=hooks)


def run_validation(registry, request: ValidationRequest, *, progress=None, hooks: dict | None = None):
    """Run the validation ``request`` asks for and record the run ->
    registry.validations.ValidationOutcome."""
    from specreg.runtime_validation import validate_version

    helper = mirror.start_helper(registry)  # opens MLflow while the checks run
    try:
        outcome = validate_version(registry.store, request.version, request.golden, request.options,
                                   actor=registry.user, progress=progress, hooks=hooks)
    except BaseException:
        if helper is not None:
            helper.cancel()
        raise
    registry.warnings += low_baseline_warnings(request.policy, outcome.run)
    mirror.mirror(registry, request.version.label, helper)
    return outcome


def validation_options(acceptance_tolerance: float, *, device: str, dtype: str, checks, gpu_memory: str | None,
                       near_tie_tolerance: float | None, distribution_samples: int, seed: int, runtime_batch: int,
                       draft_sampling: str = ValidationOptions.draft_sampling):
    """The options of one validation, each checked (UsageError naming it) ->
    validators.suite.ValidationOptions."""
    from specreg.runtime.sampling import DRAFT_SAMPLING
    from specreg.validators.suite import parse_checks

    if not 0 <= acceptance_tolerance < 1:
        raise UsageError(f"invalid acceptance tolerance {acceptance_tolerance!r}: use a fraction in [0, 1)")
    if distribution_samples < 1000:
        # below ~1000 draws sparse tokens make the chi-square approximation too loose
        raise UsageError(f"invalid distribution samples {distribution_samples!r}: use at least 1000")
    check_range("distribution samples", distribution_samples, 1000, MAX_DISTRIBUTION_SAMPLES)
    if near_tie_tolerance is not None and not 0 <= near_tie_tolerance < float("inf"):
        raise UsageError(f"invalid near-tie tolerance {near_tie_tolerance!r}: use a finite number >= 0")
    check_range("runtime batch", runtime_batch, 1, MAX_RUNTIME_BATCH)
    if draft_sampling not in DRAFT_SAMPLING:
        raise UsageError(f"invalid draft sampling {draft_sampling!r}: use one of {', '.join(DRAFT_SAMPLING)}")
    selected = parse_checks(checks if isinstance(checks, str) or checks is None else ",".join(checks))
    return ValidationOptions(device=device, dtype=dtype, checks=selected, gpu_memory=gpu_memory,
                             acceptance_tolerance=acceptance_tolerance, near_tie_tolerance=near_tie_tolerance,
                             distribution_samples=distribution_samples, seed=seed, runtime_batch_size=runtime_batch,
                             draft_sampling=draft_sampling)


def low_baseline_warnings(policy: Policy | None, run) -> list[str]:
    """The policy's warnings about a run's low baselines (none without a readable policy)."""
    from specreg.registry.governance.floors import low_baseline_warnings as warnings_of

    return warnings_of(run, policy) if policy is not None else []


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
