"""One validation, end to end: the orchestration over the one-way dependencies (docs/design.md §1).

It runs the validators' suite (which runs the runtime) on a registered pair version and
persists the run through the registry's ValidationStore, so neither side imports the other:
runtime <- validators <- this module -> registry. SIGINT / SIGTERM mark the run aborted.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass

from specreg.core.types import ERROR as ERROR_VERDICT
from specreg.errors import IllegalTransitionError
from specreg.registry.store.entities import PairState, PairVersion, ValidationRun
from specreg.registry.store.store import Store
from specreg.registry.store.validations import ABORTED, ERROR, PASSED, ValidationStore


class ValidationInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during a validation; the run is marked aborted."""

    def __init__(self, signal_name: str, signal_number: int):
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.signal_number = signal_number


@contextlib.contextmanager
def interrupt_on_signals():
    """Turn SIGINT and SIGTERM into ValidationInterrupted for the duration, so the run can be
    marked aborted before the process ends (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise ValidationInterrupted(signal.Signals(signum).name, signum)

    previous = {number: signal.signal(number, handler) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


@dataclass(frozen=True)
class ValidationOutcome:
    run: ValidationRun
    version: PairVersion  # after the state move (unchanged when the run did not finish)
    checks: tuple  # the CheckResults, in suite order

    @property
    def passed(self) -> bool:
        return self.run.status == PASSED


def validate_version(store: Store, version: PairVersion, golden, options, *, actor: str,
                     progress=None, hooks: dict | None = None) -> ValidationOutcome:
    """Run the validation suite on ``version`` and persist it -> ValidationOutcome.

    golden: a loaded GoldenSet; options: validators.suite.ValidationOptions; progress, hooks:
    see run_suite. The run row is written before the first check and each check as it ends;
    the pair moves (validated / failed) with the run's end in one transaction. A run in which a
    check could not run (and none failed) ends as ``error`` and leaves the pair's state. On SIGINT /
    SIGTERM the run is marked aborted and ValidationInterrupted propagates; on any other error
    it is marked error and the error propagates; the pair's state is unchanged in both cases.
    """
    from specreg.core.digests import read_ahead
    from specreg.runtime.loading import shared_tokenizers
    from specreg.validators.suite import runtime_weight_files

    # the weights are read and hashed on a thread of their own while torch and transformers import
    # and the first checks run (they hold the GIL and one core; reading and hashing release it);
    # the tokenizers the checks load serve the runtime too
    with read_ahead(runtime_weight_files(version, options)), shared_tokenizers():
        return run_validation(store, version, golden, options, actor=actor, progress=progress, hooks=hooks)


def run_validation(store: Store, version: PairVersion, golden, options, *, actor: str,
                   progress=None, hooks: dict | None = None) -> ValidationOutcome:
    """validate_version's run, its weights being read ahead."""
    from specreg.golden_prompts.loader import check_vocabulary
    from specreg.runtime.loading import resolve_device
    from specreg.validators.suite import environment, run_suite

    runs = ValidationStore(store)
    runs.reap_dead_runs()
    if version.state is PairState.RETIRED:
        raise IllegalTransitionError(f"{version.label} is retired: it cannot be validated")
    check_vocabulary(golden, version.target.fingerprint.vocab_size)
    device = resolve_device(options.device)
    env = environment(device, options.dtype)
    previous = runs.previous_baselines(version.name, version.version)
    run = runs.start(version, golden_set=golden.name, golden_sha256=golden.content_sha256,
                     environment=env, options=options.to_dict(), actor=actor)
    if progress:  # a first line at once: what follows (imports, hashing, tokenizers) says nothing for seconds
        progress(f"validation run {run.id} of {version.label}", 0, 0,
                 f"golden set {golden.name}, {len(golden)} prompt(s), on {device}")
    try:
        with interrupt_on_signals():
            result = run_suite(version, golden, options, device=device, previous_baselines=previous,
                               on_check=lambda check: runs.record_check(run.id, check),
                               progress=progress, hooks=hooks)
            if result.verdict == ERROR_VERDICT:
                # a check could not run: the run judged nothing about the pair, whose state stays
                runs.abort(run.id, ERROR, result.reason or "a check could not run", summary=result.summary)
                finished, moved = runs.get(run.id), version
            else:
                finished, moved = runs.finish(run.id, version, passed=result.passed, summary=result.summary,
                                              baselines=result.baselines, actor=actor)
    except ValidationInterrupted as exc:
        runs.abort(run.id, ABORTED, f"interrupted by {exc.signal_name}")
        raise
    except KeyboardInterrupt:
        runs.abort(run.id, ABORTED, "interrupted")
        raise
    except BaseException as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        runs.abort(run.id, ERROR, f"{type(exc).__name__}: {message}")
        raise
    return ValidationOutcome(finished, moved, tuple(result.checks))
