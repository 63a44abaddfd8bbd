"""The validation suite: static checks first, then one decode pass over the golden prompts on
the runtime, then the runtime checks over its results. Knows the runtime and the registry's
plain entities, never the store: the caller persists each result through ``on_check``.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from specreg.errors import (HeadMismatchError, ModelReferenceError, RuntimeConfigError, RuntimeUnsupportedError,
                            UsageError)
from specreg.core.types import ERROR, FAIL, SKIP, CheckResult, combine_statuses

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
    runtime_batch_size: int = 8  # golden prompts the runtime decodes at once (equivalence.decode_golden)
    acceptance_tolerance: float = 0.10
    near_tie_tolerance: float | None = None
    distribution_samples: int = 4000
    seed: int = 0

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


def guarded(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    """Run one check; an exception inside it becomes that check's result with a one-line reason
    (see error_result), so one broken check never takes the others (or the recorded run) down.
    Interrupts (KeyboardInterrupt, SystemExit) still propagate."""
    try:
        return check()
    except UsageError:
        raise  # the user's arguments, not the pair: exit 2 before anything is judged
    except Exception as exc:  # noqa: BLE001 - any failure of a check is that check's verdict
        return error_result(name, exc)


def error_result(name: str, exc: Exception) -> CheckResult:
    """Check ``name`` stopped on ``exc`` -> its result, one line. A ModelReferenceError names a
    file of the pair that is wrong or changed since registration: the pair's ``fail``. Anything
    else means the check could not run: ``error``, which judges nothing about the pair (a
    sound pair is never failed because specreg could not check it)."""
    message = " ".join(str(exc).split())[:300] or type(exc).__name__
    evidence = {"error": {"type": type(exc).__name__, "message": message}}
    if isinstance(exc, ModelReferenceError):
        return CheckResult(name, FAIL, message, evidence)
    return CheckResult(name, ERROR, f"the check could not run: {message}", evidence)


def environment(device: str, dtype: str) -> dict[str, Any]:
    """Versions and hardware a validation ran on (recorded with the run)."""
    import torch
    import transformers

    from importlib.metadata import PackageNotFoundError, version

    try:
        specreg_version = version("specreg")
    except PackageNotFoundError:
        specreg_version = None
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "specreg": specreg_version,
           "python": platform.python_version(), "platform": platform.platform(), "device": device, "dtype": dtype}
    if device.startswith("cuda"):
        env["device_name"] = torch.cuda.get_device_name(torch.device(device))
    return env


def default_near_tie_tolerance(dtype: str) -> float:
    from specreg.validators.equivalence import NEAR_TIE_TOLERANCE

    return NEAR_TIE_TOLERANCE.get(dtype, NEAR_TIE_TOLERANCE["bfloat16"])


def run_suite(pair_version, golden, options: ValidationOptions, *, device: str,
              previous_baselines: tuple[int, dict] | None = None,
              on_check: Callable[[CheckResult], None] | None = None,
              progress: Callable[..., None] | None = None,
              hooks: dict | None = None) -> SuiteResult:
    """Run the selected checks on a pair version -> SuiteResult.

    pair_version: registry PairVersion (its recorded model paths and fingerprints); golden: a
    GoldenSet; device: resolved device string; previous_baselines: (version, baselines) of the
    previous validated version of this pair name; on_check(result) after each check (persist it);
    progress(what, done, total, detail): "check NAME" 0/1 as a check starts and 1/1 (its status) as
    it ends, "decoding golden prompts" after each prompt, the distribution check after each prefix
    (specreg.cli.progress.Progress prints them); hooks: acceptance_rule /
    greedy_rule handed to the runtime (tests inject broken rules). Model errors raise
    (ModelReferenceError); a pair the runtime refuses fails the runtime checks instead.
    """
    from specreg.validators import acceptance, distribution, equivalence, integrity, performance

    selected = options.selected
    result = SuiteResult()
    hooks = hooks or {}
    totals: dict[str, int] = {}  # the last total reported for each step: its end reports done = total

    def report(what: str, done: int, total: int, detail: str = "") -> None:
        totals[what] = total
        if progress:
            progress(what, done, total, detail)

    def starting(name: str) -> None:
        report(f"check {name}", 0, 1)

    def emit(check: CheckResult) -> None:
        result.checks.append(check)
        if on_check:
            on_check(check)
        total = totals.get(f"check {check.name}", 1)
        report(f"check {check.name}", total, total, check.status)

    target_dir = pair_version.target.path
    draft_dir = pair_version.draft.path if pair_version.draft else None
    no_draft = f"{pair_version.config.method.value} drafting has no draft model to compare"
    if "integrity" in selected:
        starting("integrity")  # hashes every weight file: a minute for a large model
        emit(guarded("integrity", lambda: integrity.check_integrity(
            {"target": pair_version.target, "draft": pair_version.draft}, allow_pickle=pair_version.allow_pickle)))
        if result.checks[-1].status in (FAIL, ERROR):
            # the files are not the registered ones: nothing measured on them would be about this version
            for name in selected[1:]:
                emit(CheckResult(name, SKIP, "not run: integrity failed, the models on disk are not the "
                                             "registered ones"))
            result.summary = build_summary(result, golden, options, device)
            return result
    static_pair_checks = [name for name in ("tokenizer", "chat_template") if name in selected]
    config = pair_version.config
    if static_pair_checks and config.method.has_head:
        # a head drafts the target's ids inside the target's own context: no second tokenizer or
        # chat template to compare; what can break is its fit to the target's files now
        from specreg.validators.head_vocabulary import check_head_vocabulary

        fit = config.head.get("fit", {}) if config.head else {}
        if "tokenizer" in selected:
            emit(guarded("tokenizer", lambda: check_head_vocabulary(
                config.method.value, draft_dir, target_dir, target_reference=pair_version.target.reference,
                target_fingerprint=pair_version.target.fingerprint,
                allow_verifier_mismatch=bool(fit.get("allow_verifier_mismatch")))))
        if "chat_template" in selected:
            emit(CheckResult("chat_template", SKIP, f"the {config.method.value} head drafts inside the target's "
                                                    "own chat context: there is no second template"))
    elif static_pair_checks and draft_dir is None:
        for name in static_pair_checks:
            emit(CheckResult(name, SKIP, no_draft))
    elif static_pair_checks:
        from specreg.validators.chat_template import check_chat_template_alignment
        from specreg.validators.tokenizer import check_tokenizer_alignment, load_pair_tokenizers

        tokenizers, load_error = None, None
        try:
            # both checks compare the same two tokenizers: load them once, checked against the
            # registered fingerprints while they are read
            tokenizers = load_pair_tokenizers(draft_dir, target_dir, draft_expected=pair_version.draft.fingerprint,
                                              target_expected=pair_version.target.fingerprint)
        except Exception as exc:  # noqa: BLE001 - a tokenizer that cannot load fails both checks
            load_error = exc
        for name, check in (("tokenizer", check_tokenizer_alignment), ("chat_template", check_chat_template_alignment)):
            if name in selected:
                emit(error_result(name, load_error) if load_error is not None else
                     guarded(name, lambda check=check: check(draft_dir, target_dir, golden, **tokenizers)))
    if "memory" in selected:
        from specreg.validators.memory import check_memory_headroom

        starting("memory")
        # a head's weights are a fraction of one target layer's: the check counts the target
        emit(guarded("memory", lambda: check_memory_headroom(
            None if config.method.has_head else draft_dir, target_dir, gpu_memory=options.gpu_memory, max_context_tokens=options.max_context_tokens,
            batch_size=options.batch_size, dtype=options.dtype, device=device if device.startswith("cuda") else None)))

    runtime_checks = [name for name in RUNTIME_CHECKS if name in selected]
    if runtime_checks:
        from transformers.utils import logging as transformers_logging

        from specreg.runtime.methods import load_pair

        transformers_logging.disable_progress_bar()  # the suite reports its own progress

        from specreg.runtime.decode import DecodeConfig

        settings = DecodeConfig.from_spec(config)  # the candidate tree parsed once for every check
        total = len(golden)
        done = [0]
        decoding = "decoding golden prompts (target-only and speculative)"

        def advance(record_id: str) -> None:
            done[0] += 1
            report(decoding, done[0], total, record_id)

        try:
            # loaded from what is checked against the registered fingerprints while it is read:
            # files swapped since the integrity check are never validated as the registered ones
            report(decoding, 0, total, "loading the models")
            pair = load_pair(target_dir, draft_dir, device=device, dtype=options.dtype,
                             target_fingerprint=pair_version.target.fingerprint,
                             draft_fingerprint=pair_version.draft.fingerprint if pair_version.draft else None,
                             method=config.method.value)
            decodes = equivalence.decode_golden(pair, golden, settings, seed=options.seed, progress=advance,
                                                hooks=hooks, batch_size=options.runtime_batch_size)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - every runtime check needs the decodes
            # RuntimeConfigError / HeadMismatchError: the pair's models do not fit each other (a
            # fail); ModelReferenceError: a file is wrong or changed (a fail); RuntimeUnsupportedError
            # (something engines run that this runtime does not) or any other error: the checks could
            # not run (an error, no verdict on the pair)
            message = " ".join(str(exc).split())[:300] or type(exc).__name__
            if isinstance(exc, ModelReferenceError):
                status, why, not_run = FAIL, message, "the pair's files cannot be loaded"
            elif isinstance(exc, (RuntimeConfigError, HeadMismatchError)) \
                    and not isinstance(exc, RuntimeUnsupportedError):
                status, why, not_run = FAIL, f"the runtime refuses this pair: {message}", "the runtime refuses this pair"
            else:
                status, why = ERROR, f"the check could not run: the runtime stopped on this pair: {message}"
                not_run = "the runtime could not run this pair"
                if isinstance(exc, RuntimeUnsupportedError):
                    why = f"the check could not run: {message}"
            for name in runtime_checks:
                status_now, summary = (status, why) if name == runtime_checks[0] else (SKIP, f"not run: {not_run}")
                emit(CheckResult(name, status_now, summary, {"error": {"type": type(exc).__name__, "message": message}}))
            result.summary = build_summary(result, golden, options, device)
            return result

        if "equivalence" in selected:
            tolerance = options.near_tie_tolerance
            if tolerance is None:
                tolerance = default_near_tie_tolerance(options.dtype)
            emit(guarded("equivalence", lambda: equivalence.check_equivalence(pair, decodes, tolerance=tolerance)))
        if "distribution" in selected:
            starting("distribution")
            emit(guarded("distribution", lambda: distribution.check_distribution(
                pair, golden, decodes, method=settings.method, samples=options.distribution_samples,
                seed=options.seed, acceptance_rule=hooks.get("acceptance_rule"), tree=settings.tree,
                tree_acceptance_rule=hooks.get("tree_acceptance_rule"),
                progress=lambda done, total: report("check distribution", done, total + 1, "prefixes sampled"))))
        if "acceptance" in selected:
            check = guarded("acceptance", lambda: acceptance.check_acceptance(
                decodes, previous=previous_baselines, tolerance=options.acceptance_tolerance, k=settings.k))
            emit(check)
            if isinstance(check.evidence, dict) and "baselines" in check.evidence:
                result.baselines = check.evidence["baselines"]  # kept only if the run passes
        if "performance" in selected:
            starting("performance")  # times verification steps of the pair
            emit(guarded("performance", lambda: performance.check_performance(
                pair, decodes, method=settings.method, k=settings.k, tree=settings.tree)))
    result.summary = build_summary(result, golden, options, device)
    return result


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
                     "acceptance_tolerance": options.acceptance_tolerance},
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
        }
    if "equivalence" in by_name and by_name["equivalence"].figures:
        figures = by_name["equivalence"].figures
        summary["equivalence"] = {key: figures[key] for key in ("prompts", "exact", "near_tie", "fail")
                                  if key in figures}
    return summary

