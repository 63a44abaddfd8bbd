"""The validation suite: the checks the options select, in order (static checks first, then the
runtime checks over one decode pass of the golden prompts), each over one CheckContext
(validators/context.py). Knows the runtime and the registry's plain entities, never the store:
the caller persists each result through ``on_check``.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from specreg.errors import UsageError
from specreg.core.types import ERROR, FAIL, SKIP, CheckResult, combine_statuses
from specreg.validators.context import Check, CheckContext, ChecksStopped, guarded
from specreg.validators.equivalence import DEFAULT_BATCH_SIZE
from specreg.validators.equivalence import default_near_tie_tolerance  # noqa: F401 - the name engine validation reads

STATIC_CHECKS = ("integrity", "tokenizer", "chat_template", "memory")
RUNTIME_CHECKS = ("equivalence", "distribution", "acceptance", "performance")
CHECK_NAMES = STATIC_CHECKS + RUNTIME_CHECKS


@dataclass(frozen=True)
class ValidationOptions:
    """How to validate. checks None: all of CHECK_NAMES. near_tie_tolerance None: by dtype."""

    device: str = "auto"
    dtype: str = "float32"
    checks: tuple[str, ...] | None = None
    gpu_memory: str | None = None
    max_context_tokens: int | None = None
    batch_size: int = 1  # sequences held at once (the memory check's KV cache)
    runtime_batch_size: int = DEFAULT_BATCH_SIZE  # golden prompts the runtime decodes at once (equivalence.decode_golden)
    acceptance_tolerance: float = 0.10
    near_tie_tolerance: float | None = None
    distribution_samples: int = 4000
    seed: int = 0
    # how sampled golden records draft (runtime DecodeConfig.draft_sampling): the engines' default,
    # which the baselines then describe and the vLLM exports write as draft_sample_method
    draft_sampling: str = "greedy"

    @property
    def selected(self) -> tuple[str, ...]:
        return tuple(self.checks) if self.checks else CHECK_NAMES

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["checks"] = list(self.selected)
        return data


def parse_checks(text: str | None) -> tuple[str, ...] | None:
    """"equivalence,acceptance" -> ("equivalence", "acceptance") in suite order; None for all.
    Raises UsageError naming an unknown check."""
    if not text:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CHECK_NAMES]
    if unknown:
        raise UsageError(f"unknown check {unknown[0]!r} in --checks: use any of {', '.join(CHECK_NAMES)}")
    return tuple(name for name in CHECK_NAMES if name in names)


@dataclass
class SuiteResult:
    checks: list[CheckResult] = field(default_factory=list)
    baselines: dict[str, Any] | None = None  # this run's acceptance figures (kept if it passes)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """The worst check status; a run in which no check ran (all skipped, or none) fails:
        it measured nothing, so it must not make a version validated. "error": no check failed
        but one could not run, so the run judged nothing about the pair (its state stays)."""
        status = combine_statuses(check.status for check in self.checks)
        return FAIL if status == SKIP else status

    @property
    def passed(self) -> bool:
        return self.verdict not in (FAIL, ERROR)

    @property
    def reason(self) -> str | None:
        """Why the run did not pass, in one line (None when it passed)."""
        failed = [check.name for check in self.checks if check.status == FAIL]
        if failed:
            return f"{', '.join(failed)} failed"
        errors = [check for check in self.checks if check.status == ERROR]
        if errors:
            return "; ".join(f"{check.name}: {check.summary}" for check in errors)
        if self.verdict == FAIL:
            skipped = ", ".join(check.name for check in self.checks) or "none selected"
            return f"no check ran (every selected check was skipped: {skipped})"
        return None


def environment(device: str, dtype: str) -> dict[str, Any]:
    """Versions and hardware a validation ran on (recorded with the run)."""
    import torch
    import transformers

    from importlib.metadata import PackageNotFoundError, version

    try:
        specreg_version = version("specreg")
    except PackageNotFoundError:
        specreg_version = None
    # the CPU threads torch ran on (runtime/process.py decides them from the free cores): CPU
    # speed figures depend on them
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "specreg": specreg_version,
           "python": platform.python_version(), "platform": platform.platform(), "device": device, "dtype": dtype,
           "threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        env["device_name"] = torch.cuda.get_device_name(torch.device(device))
    return env


def suite_checks() -> dict[str, Check]:
    """Every check of a validation, by name, in CHECK_NAMES order (each validator module's CHECK)."""
    from specreg.validators import (acceptance, chat_template, distribution, equivalence, integrity, memory,
                                    performance, tokenizer)

    checks = [module.CHECK for module in (integrity, tokenizer, chat_template, memory, equivalence, distribution,
                                          acceptance, performance)]
    return {check.name: check for check in checks}


def run_suite(pair_version, golden, options: ValidationOptions, *, device: str,
              previous_baselines: tuple[int, dict] | None = None,
              on_check: Callable[[CheckResult], None] | None = None,
              progress: Callable[..., None] | None = None,
              hooks: dict | None = None) -> SuiteResult:
    """Run the selected checks on a pair version, in order -> SuiteResult.

    pair_version: registry PairVersion (its recorded model paths and fingerprints); golden: a
    GoldenSet; device: resolved device string; previous_baselines: (version, baselines) of the
    previous validated version of this pair name; on_check(result) after each check (persist it);
    progress(what, done, total, detail): "check NAME" 0/1 as a long check starts and 1/1 (its
    status) as it ends, "decoding golden prompts" after each prompt, the distribution check after
    each prefix (specreg.cli.progress.Progress prints them); hooks: acceptance_rule / greedy_rule
    handed to the runtime (tests inject broken rules). Model errors raise (ModelReferenceError); a
    pair the runtime refuses fails the runtime checks instead.
    """
    context = CheckContext(pair_version, golden, options, device, previous_baselines, hooks or {}, progress)
    result = SuiteResult()
    checks = suite_checks()
    stopped: ChecksStopped | None = None  # why the checks from here on are not run
    for check in (checks[name] for name in options.selected):
        outcome = stopped.result(check.name, first=False) if stopped else run_check(check, context)
        result.checks.append(outcome)
        context.results[outcome.name] = outcome
        if on_check:
            on_check(outcome)
        total = context.totals.get(f"check {outcome.name}", 1)
        context.report(f"check {outcome.name}", total, total, outcome.status)
        if isinstance(outcome.evidence, dict) and "baselines" in outcome.evidence:
            result.baselines = outcome.evidence["baselines"]  # kept only if the run passes
        if check.stops and outcome.status in (FAIL, ERROR) and stopped is None:
            stopped = ChecksStopped(SKIP, "", check.stops)
    result.summary = build_summary(result, golden, options, device)
    return result


def runtime_weight_files(pair_version, options: ValidationOptions) -> list[Path]:
    """The weight files the selected checks will load, in the order the runtime loads them: the
    target's, then a draft model's (a head's are small and read by the head's own loader); none
    when no runtime check is selected, nor of a model whose files cannot be listed (loading will
    say why). What a validation reads ahead (digests.read_ahead)."""
    from specreg.core.methods import method_descriptor
    from specreg.errors import SpecregError
    from specreg.runtime.loading import weight_names

    checks = suite_checks()
    if not any(checks[name].runtime for name in options.selected):
        return []
    models = [pair_version.target]
    if pair_version.draft is not None and not method_descriptor(pair_version.config.method.value).has_head:
        models.append(pair_version.draft)
    files = []
    for model in models:
        try:
            files += [Path(model.path) / name for name in weight_names(Path(model.path), model.fingerprint)[1]]
        except (SpecregError, OSError):
            continue
    return files


def run_check(check: Check, context: CheckContext) -> CheckResult:
    """One check's result: not run when the runtime cannot decode the pair (a runtime check),
    else its own, an exception inside it turned into its result (guarded)."""
    if check.runtime:
        first = context.loaded_runtime is None
        try:
            context.runtime()
        except ChecksStopped as stopped:
            return stopped.result(check.name, first)
    if check.announce:
        context.report(f"check {check.name}", 0, 1)
    return guarded(check.name, lambda: check.run(context))


def build_summary(result: SuiteResult, golden, options: ValidationOptions, device: str) -> dict[str, Any]:
    """Headline figures of a run in the sections MlflowSync.log_validation reads
    (acceptance, performance, equivalence, golden_set, settings, checks)."""
    by_name = {check.name: check for check in result.checks}
    summary: dict[str, Any] = {
        "verdict": result.verdict,
        "reason": result.reason,
        "checks": {check.name: check.status for check in result.checks},
        "golden_set": {"name": golden.name, "version": golden.version, "sha256": golden.content_sha256,
                       "prompts": len(golden)},
        "settings": {"device": device, "dtype": options.dtype, "seed": options.seed,
                     "acceptance_tolerance": options.acceptance_tolerance, "draft_sampling": options.draft_sampling},
    }
    if result.baselines:
        overall = result.baselines["overall"]
        summary["acceptance"] = {
            "acceptance_rate": overall.get("acceptance_rate"),
            "mean_acceptance_length": overall.get("mean_acceptance_length"),
            "per_position": overall.get("per_position_acceptance") or [],
            "per_category": {category: {"acceptance_rate": figures.get("acceptance_rate"),
                                        "mean_acceptance_length": figures.get("mean_acceptance_length")}
                             for category, figures in result.baselines["per_category"].items()},
            "drafted_tokens": overall.get("drafted"), "accepted_tokens": overall.get("accepted"),
            "longest_rejection_run": overall.get("longest_rejection_run"),
        }
    if "performance" in by_name and by_name["performance"].figures:
        figures = by_name["performance"].figures
        summary["performance"] = {
            "batch_size": figures.get("batch_size", 1), "batch1_speedup": figures.get("batch1_speedup"),
            "speedup": figures["speedup"], "decode_speedup": figures.get("decode_speedup"),
            "tokens_per_s": figures["tokens_per_s"],
            "baseline_tokens_per_s": figures["baseline_tokens_per_s"], "ttft_ms": figures["ttft_ms"],
            "latency_ms": {"p50": figures["latency_p50_ms"], "p95": figures["latency_p95_ms"],
                           "p99": figures["latency_p99_ms"]},
            "recommended_k": figures["recommended_k"], "cost_ratio": figures["cost_ratio"],
            "expected_speedup_at_recommended_k": figures.get("expected_speedup_at_recommended_k"),
            "other_work_cores": figures.get("other_work_cores"),
        }
    if "equivalence" in by_name and by_name["equivalence"].figures:
        figures = by_name["equivalence"].figures
        summary["equivalence"] = {key: figures[key] for key in ("prompts", "exact", "near_tie", "fail")
                                  if key in figures}
    return summary

