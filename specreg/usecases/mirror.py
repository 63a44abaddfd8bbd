"""The MLflow review surface: after a validation, approval or promotion MLflow is brought up to
date; when it cannot be reached the registry operation still completes and a warning says MLflow
is behind (registry/review/replay.py)."""

from __future__ import annotations

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


def mirror(registry, ref) -> None:
    """Bring MLflow up to date for a version (or every version of a pair); never fails the
    registry operation that called it: an unreachable MLflow becomes a warning."""
    from specreg.errors import MlflowUnavailable
    from specreg.registry.review.replay import behind_warning

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
