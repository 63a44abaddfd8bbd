"""Every status vocabulary in one place: a check's, a validation run's, an engine baseline's and
the gate's verdict. Members are strings (``CheckStatus.PASS == "pass"``) that print, format,
JSON-encode and bind to SQL as their value, so what is stored, hashed, printed and tagged in
MLflow stays the plain word; compare against the members, never against the words."""

from __future__ import annotations

import enum


class StrEnum(str, enum.Enum):
    """``enum.StrEnum`` for Python 3.10: ``str()`` and f-strings give the value, not
    ``Class.MEMBER`` (a ``str, Enum`` mixin alone formats as its name from Python 3.12)."""

    __str__ = str.__str__
    __format__ = str.__format__


class CheckStatus(StrEnum):
    """One check's outcome (specreg.core.types.CheckResult); "error": it could not run."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"


class RunStatus(StrEnum):
    """A validation run's (registry/store/validations.py): written ``running``, finished
    ``passed`` or ``failed``; ``aborted`` (interrupted), ``abandoned`` (its process died without a
    word: found gone by a later command) and ``error`` (a check could not run) never move the
    pair's state."""

    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    ABORTED = "aborted"
    ABANDONED = "abandoned"
    ERROR = "error"


FINISHED_RUNS = (RunStatus.PASSED, RunStatus.FAILED)  # the runs that say something about the pair


class EngineBaselineStatus(StrEnum):
    """An engine baseline's (registry/store/engine_baselines.py); ``unaccepted``: every check held
    but the engine's acceptance differs from our runtime's beyond the parity tolerance, so it is
    not a baseline until an approver accepts it."""

    PASSED = "passed"
    FAILED = "failed"
    UNACCEPTED = "unaccepted"


# |alpha_engine - alpha_ours| (greedy, overall and per category) beyond which an engine baseline is
# unaccepted, whatever looser --parity-tolerance its run was given (the rule:
# registry/governance/engine_baseline_standing.baseline_status); an engine validation's default
PARITY_TOLERANCE = 0.03


class GateVerdict(StrEnum):
    """The gate's answer (`specreg gate --json` ``verdict``): every condition held, one did not,
    or the gate could not be evaluated (it fails closed)."""

    PASS = "pass"
    REFUSED = "refused"
    ERROR = "error"
