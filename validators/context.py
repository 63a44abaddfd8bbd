"""The one shape of a validation's checks: a ``Check`` names itself and runs over one context.

``validate`` runs its checks over one ``CheckContext``, which holds what every check may read: the
pair version, the golden set, the settings, the results of the checks before it, and what the
steps before it loaded once for all the checks that need it (the pair's two tokenizers; the runtime
pair and its golden decodes). Each validator module defines its ``CHECK``; validators/suite.py runs
those the options select, in order, and knows no check by name.

``validate --engine`` runs the checks of validators/engine.py over one ``EngineCheckContext``: what
the engine and our runtime did with the same golden prompts, gathered before any check runs
(specreg/engine_validation/ drives the engine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from specreg.core.types import ERROR, FAIL, SKIP, CheckResult
from specreg.errors import (HeadMismatchError, ModelReferenceError, RuntimeConfigError, RuntimeUnsupportedError,
                            UsageError)

DECODING = "decoding golden prompts (target-only and speculative)"


@dataclass(frozen=True)
class Check:
    """One check of a validation. ``run(context) -> CheckResult``, over its validation's context
    (CheckContext, or EngineCheckContext for an engine's checks); ``announce``: it reports its
    start (it takes long enough to be waited on); ``runtime``: it reads the runtime's golden
    decodes (CheckContext.runtime), so it is not run when the runtime cannot decode the pair;
    ``stops``: why the checks after it are not run when it fails or errors (None: they run)."""

    name: str
    run: Callable[[Any], CheckResult]
    announce: bool = False
    runtime: bool = False
    stops: str | None = None


class ChecksStopped(Exception):
    """The checks from here on cannot run: the first gets ``status`` and ``summary``, the others
    are skipped, ``not run: <not_run>``; each carries ``evidence``."""

    def __init__(self, status: str, summary: str, not_run: str, evidence: dict | list | None = None):
        super().__init__(summary)
        self.status, self.summary, self.not_run, self.evidence = status, summary, not_run, evidence or []

    def result(self, name: str, first: bool) -> CheckResult:
        if first:
            return CheckResult(name, self.status, self.summary, self.evidence)
        return CheckResult(name, SKIP, f"not run: {self.not_run}", self.evidence)


@dataclass
class CheckContext:
    """What a check reads. pair_version: the registry's PairVersion (recorded paths and
    fingerprints); golden: the GoldenSet; options: suite.ValidationOptions; device: the resolved
    device; previous_baselines: (version, baselines) of the pair name's previous validated
    version; hooks: rule overrides handed to the runtime (tests); progress(what, done, total,
    detail); results: the checks run so far, by name."""

    pair_version: Any
    golden: Any
    options: Any
    device: str
    previous_baselines: tuple[int, dict] | None = None
    hooks: dict = field(default_factory=dict)
    progress: Callable[..., None] | None = None
    results: dict[str, CheckResult] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)  # the last total reported for each step
    loaded_tokenizers: dict | Exception | None = None
    loaded_runtime: tuple[Any, Any] | ChecksStopped | None = None

    @property
    def config(self):
        return self.pair_version.config

    @property
    def target_dir(self) -> str:
        return self.pair_version.target.path

    @property
    def draft_dir(self) -> str | None:
        return self.pair_version.draft.path if self.pair_version.draft else None

    @cached_property
    def settings(self):
        """The pair's runtime DecodeConfig (DecodeConfig.from_spec): method, k, prompt lookup and the
        candidate tree, parsed once for every check, with the validation's draft sampling."""
        import dataclasses

        from specreg.runtime.decode_config import DecodeConfig

        return dataclasses.replace(DecodeConfig.from_spec(self.config), draft_sampling=self.options.draft_sampling)

    def report(self, what: str, done: int, total: int, detail: str = "") -> None:
        self.totals[what] = total
        if self.progress:
            self.progress(what, done, total, detail)

    def pair_tokenizers(self) -> dict | Exception:
        """The draft's and the target's tokenizers, loaded once for the checks that compare them and
        checked against the registered fingerprints while they are read; the exception when they
        cannot be loaded (which fails each of those checks)."""
        from specreg.validators.tokenizer import load_pair_tokenizers

        if self.loaded_tokenizers is None:
            version = self.pair_version
            try:
                self.loaded_tokenizers = load_pair_tokenizers(
                    self.draft_dir, self.target_dir, draft_expected=version.draft.fingerprint,
                    target_expected=version.target.fingerprint)
            except Exception as exc:  # noqa: BLE001 - a tokenizer that cannot load fails both checks
                self.loaded_tokenizers = exc
        return self.loaded_tokenizers

    def compared_tokenizers(self, name: str) -> dict | CheckResult:
        """The tokenizers check ``name`` compares (tokenizer.load_pair_tokenizers' dict), or its
        result when there is nothing to compare (no draft model: skip) or they cannot be loaded."""
        if self.draft_dir is None:
            return CheckResult(name, SKIP, f"{self.config.method.value} drafting has no draft model to compare")
        tokenizers = self.pair_tokenizers()
        return error_result(name, tokenizers) if isinstance(tokenizers, Exception) else tokenizers

    def runtime(self) -> tuple[Any, Any]:
        """(runtime ModelPair, equivalence.GoldenDecodes): the pair loaded and the golden set decoded
        once, for every runtime check. ChecksStopped when the runtime cannot (each time asked)."""
        if self.loaded_runtime is None:
            try:
                self.loaded_runtime = self.decode()
            except UsageError:
                raise
            except Exception as exc:  # noqa: BLE001 - every runtime check needs the decodes
                self.loaded_runtime = runtime_stopped(exc)
        if isinstance(self.loaded_runtime, ChecksStopped):
            raise self.loaded_runtime
        return self.loaded_runtime

    def decode(self) -> tuple[Any, Any]:
        from transformers.utils import logging as transformers_logging

        from specreg.runtime.methods import load_pair
        from specreg.validators.equivalence import decode_golden, decoded_rows

        transformers_logging.disable_progress_bar()  # the suite reports its own progress
        version = self.pair_version

        def advance(done: int, total: int, record_id: str) -> None:
            self.report(DECODING, done, total, record_id)

        # loaded from what is checked against the registered fingerprints while it is read:
        # files swapped since the integrity check are never validated as the registered ones
        self.report(DECODING, 0, decoded_rows(self.golden), "loading the models")
        pair = load_pair(self.target_dir, self.draft_dir, device=self.device, dtype=self.options.dtype,
                         target_fingerprint=version.target.fingerprint,
                         draft_fingerprint=version.draft.fingerprint if version.draft else None,
                         method=self.config.method.value)
        decodes = decode_golden(pair, self.golden, self.settings, seed=self.options.seed, progress=advance,
                                hooks=self.hooks, batch_size=self.options.runtime_batch_size)
        return pair, decodes


@dataclass(frozen=True)
class EngineCheckContext:
    """What an engine validation's checks read. rows: the engine's counts per golden prompt at
    concurrency 1 (validators.engine rows) and engine_baselines their figures (baselines_of);
    ours: our runtime's baselines on the same prompts, with their "source"; tiers: each
    concurrency tier's tokens/s with and without the draft and its acceptance_rate; outputs: the
    engine's token ids with and without the draft per prompt ({"record", "category",
    "prompt_ids", "speculative", "target_only"}), None when the engine was not run without it
    (no_outputs says why), judged with near_tie_tolerance, top_of(record, position) (the engine's
    target-only top log-probabilities there) and our_margin(prompt ids, prefix) (our runtime's
    plain top-2, None when the runtime does not hold the model)."""

    engine_name: str
    rows: list[dict[str, Any]]
    engine_baselines: dict[str, Any]
    ours: dict[str, Any]
    tiers: list[dict[str, Any]]
    parity_tolerance: float
    outputs: list[dict[str, Any]] | None = None
    no_outputs: str = "the engine was not run without the draft"
    near_tie_tolerance: float = 0.0
    top_of: Callable[[dict[str, Any], int], list[tuple[int, float]] | None] | None = None
    our_margin: Callable[[list[int], list[int]], dict] | None = None


def runtime_stopped(exc: Exception) -> ChecksStopped:
    """Why the runtime checks cannot run. RuntimeConfigError / HeadMismatchError: the pair's models
    do not fit each other (a fail); ModelReferenceError: a file is wrong or changed (a fail);
    RuntimeUnsupportedError (something engines run that this runtime does not) or any other
    error: the checks could not run (an error, no verdict on the pair)."""
    message = " ".join(str(exc).split())[:300] or type(exc).__name__
    evidence = {"error": {"type": type(exc).__name__, "message": message}}
    if isinstance(exc, ModelReferenceError):
        return ChecksStopped(FAIL, message, "the pair's files cannot be loaded", evidence)
    if isinstance(exc, (RuntimeConfigError, HeadMismatchError)) and not isinstance(exc, RuntimeUnsupportedError):
        return ChecksStopped(FAIL, f"the runtime refuses this pair: {message}", "the runtime refuses this pair",
                             evidence)
    why = (f"the check could not run: {message}" if isinstance(exc, RuntimeUnsupportedError)
           else f"the check could not run: the runtime stopped on this pair: {message}")
    return ChecksStopped(ERROR, why, "the runtime could not run this pair", evidence)


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
