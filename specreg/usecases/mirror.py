"""The MLflow review surface: after a validation, approval or promotion MLflow is brought up to
date; when it cannot be reached the registry operation still completes and a warning says MLflow
is behind (registry/review/replay.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from specreg.errors import UsageError
from specreg.usecases.inputs import pair_ref


def open_review(registry):
    """The MLflow mirror (registry.review.Review), or None when SPECREG_MLFLOW=off or MLflow is
    not installed (a gate or verify install: the registry works on, with a warning)."""
    import importlib.util

    from specreg.registry.review.replay import Review, mlflow_enabled

    if not mlflow_enabled():
        return None
    if importlib.util.find_spec("mlflow") is None:
        note = "MLflow is not installed: no MLflow mirror (SPECREG_MLFLOW=off silences this)"
        if note not in registry.warnings:
            registry.warnings.append(note)
        return None
    return Review(registry.store, registry.mlflow_uri, actor=registry.user)


def mirror(registry, ref, helper: MirrorHelper | None = None) -> None:
    """Bring MLflow up to date for a version (or every version of a pair); never fails the
    registry operation that called it: an unreachable MLflow becomes a warning. helper: a
    MirrorHelper started for this (start_helper), which does it in its process when it can."""
    from specreg.errors import MlflowUnavailable
    from specreg.registry.review.replay import behind_warning

    if helper is not None and helper.mirror(registry, ref):
        return
    review = registry.review
    if review is None:
        return
    ref = pair_ref(ref)
    versions = [registry.get(ref)] if (ref.version or ref.environment) else registry.list(ref.name)
    try:
        for version in versions:
            review.sync_version(version)
    except MlflowUnavailable as exc:
        registry.warnings.append(behind_warning(review.tracking_uri, exc))
    registry.warnings.extend(review.notes)
    review.notes.clear()


def sync(registry, name: str | None = None) -> list[dict]:
    """Replay the registry (one pair or all) into MLflow and read approvals back. Idempotent.
    Raises MlflowUnavailable when MLflow cannot be reached."""
    review = registry.review
    if review is None:
        raise UsageError("MLflow is turned off (SPECREG_MLFLOW=off): nothing to sync")
    review.mlflow.ping()
    done = [review.sync_version(version) for version in registry.list(name)]
    registry.warnings.extend(review.notes)
    review.notes.clear()
    return done


class MirrorHelper:
    """A process of its own that imports MLflow and opens its store (seconds of one core's work:
    MLflow's import, and on a new store its schema migrations) while a long command such as
    `validate` keeps the other busy, then brings MLflow up to date when told which version
    (mirror). It runs at a lower priority, so it never slows the work it overlaps, and reads the
    registry only once told: what it mirrors is what the command committed."""

    def __init__(self, command: list[str]):
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)

    def mirror(self, registry, ref) -> bool:
        """Have the helper mirror ``ref`` -> True when it did (its warnings added to the
        registry's), False when it failed in any way (the caller then mirrors itself)."""
        request = {"db_url": registry.db_url, "user": registry.user, "mlflow_uri": registry.mlflow_uri,
                   "ref": str(ref)}
        try:
            out, _ = self.process.communicate(json.dumps(request) + "\n")
            answer = json.loads(out.strip().splitlines()[-1]) if self.process.returncode == 0 else None
        except (OSError, ValueError, IndexError):
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("warnings"), list):
            return False
        registry.warnings.extend(str(warning) for warning in answer["warnings"] if warning not in registry.warnings)
        return True

    def cancel(self) -> None:
        """End the helper without mirroring (the command failed). It is let finish opening the
        store rather than killed: a new store's schema migrations must not stop halfway."""
        if self.process.poll() is None:
            self.process.communicate("")


def start_helper(registry, command: list[str] | None = None) -> MirrorHelper | None:
    """A MirrorHelper for a command that will mirror after long work, or None where it would not
    pay: the mirror off, MLflow not installed, or already imported in this process (a second
    import elsewhere would only add work). command: the helper's argv (tests)."""
    import importlib.util

    from specreg.registry.review.replay import mlflow_enabled

    if not mlflow_enabled() or "mlflow" in sys.modules or importlib.util.find_spec("mlflow") is None:
        return None
    try:
        return MirrorHelper(command or [sys.executable, "-m", "specreg.cli.mirror_helper", registry.mlflow_uri or ""])
    except OSError:
        return None
