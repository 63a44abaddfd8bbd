"""What a validation becomes in MLflow: the run's params and metrics, flattened from the
registry's pair version and validation summary, and the files logged under ``pair/`` (no
mlflow import)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from specreg.core.types import ModelRef
from specreg.errors import NotFoundError, UsageError
from specreg.registry.store.entities import PairVersion

_METRIC_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")

def _metric_name(name: str) -> str:
    """MLflow accepts letters, digits, ``_-. /`` in metric names; anything else becomes ``_``."""
    return _METRIC_NAME_UNSAFE.sub("_", name)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validation_metrics(validation: dict[str, Any]) -> dict[str, float]:
    """Flatten the metric sections of a validation dict (see MlflowSync.log_validation) into
    MLflow metric names -> values. Missing sections and None values are left out."""
    metrics: dict[str, float] = {}
    acceptance = validation.get("acceptance") or {}
    for key, value in acceptance.items():
        if key == "per_position":
            for position, rate in enumerate(value or []):
                if _is_number(rate):
                    metrics[f"acceptance_rate_pos_{position}"] = float(rate)
        elif key == "per_category":
            for category, values in (value or {}).items():
                for metric, number in (values or {}).items():
                    if _is_number(number):
                        metrics[_metric_name(f"{metric}.{category}")] = float(number)
        elif _is_number(value):
            metrics[_metric_name(key)] = float(value)
    performance = validation.get("performance") or {}
    for key, value in performance.items():
        if isinstance(value, dict):  # e.g. latency_ms: {p50, p95, p99}
            for sub, number in value.items():
                if _is_number(number):
                    metrics[_metric_name(f"{key}_{sub}")] = float(number)
        elif _is_number(value):
            metrics[_metric_name(key)] = float(value)
    equivalence = validation.get("equivalence") or {}
    for key, value in equivalence.items():
        if _is_number(value):
            metrics[_metric_name(f"equivalence_{key}")] = float(value)
    return metrics


def _model_params(prefix: str, model: ModelRef | None) -> dict[str, Any]:
    if model is None:
        return {f"{prefix}.reference": "none"}
    fingerprint = model.fingerprint
    return {
        f"{prefix}.reference": model.reference,
        f"{prefix}.revision": model.revision,
        f"{prefix}.weights_sha256": fingerprint.weights_sha256,
        f"{prefix}.config_sha256": fingerprint.config_sha256,
        f"{prefix}.tokenizer_sha256": fingerprint.tokenizer_sha256,
        f"{prefix}.chat_template_sha256": fingerprint.chat_template_sha256,
        f"{prefix}.architecture": fingerprint.architecture,
        f"{prefix}.vocab_size": fingerprint.vocab_size,
    }


def validation_params(pair_version: PairVersion, validation: dict[str, Any]) -> dict[str, str]:
    """MLflow params of a validation run: what was validated and how. None values are left
    out; every value is a string (MLflow params are strings, at most 6000 characters)."""
    settings = validation.get("settings") or {}
    golden_set = validation.get("golden_set") or {}
    config = pair_version.config
    params: dict[str, Any] = {
        "pair": pair_version.name,
        "pair_version": pair_version.version,
        "binding_sha256": pair_version.binding_sha256,
        **_model_params("target", pair_version.target),
        **_model_params("draft", pair_version.draft),
        "method": settings.get("method") or config.method.value,
        "k": settings.get("k") or config.num_speculative_tokens,
        "prompt_lookup_min": config.prompt_lookup_min,
        "prompt_lookup_max": config.prompt_lookup_max,
        **(config.suffix.vllm_keys() if config.suffix is not None else {}),
    }
    for key, value in golden_set.items():  # name -> golden_set, sha256 -> golden_set_sha256 ...
        params["golden_set" if key == "name" else f"golden_set_{key}"] = value
    for key, value in settings.items():
        params.setdefault(key, value)
    for package, version in (validation.get("runtime") or {}).items():
        params[f"runtime.{package}"] = version
    return {key: str(value)[:6000] for key, value in params.items() if value is not None}


def _check_statuses(checks: Any) -> dict[str, str]:
    """check name -> status, from ``{name: status}`` or ``[{"name", "status", ...}]``."""
    if isinstance(checks, dict):
        return {str(name): str(status) for name, status in checks.items() if status}
    return {
        str(check["name"]): str(check["status"])
        for check in checks or []
        if check.get("name") and check.get("status")
    }


def stage_artifacts(
    staging: Path,
    pair_version: PairVersion,
    validation: dict[str, Any],
    artifacts: dict[str, Path | str],
) -> None:
    """Write everything to log under ``pair/`` into ``staging`` (one upload call)."""
    (staging / "pair.yaml").write_text(
        yaml.safe_dump(pair_version.to_dict(), sort_keys=False), encoding="utf-8"
    )
    (staging / "validation.json").write_text(
        json.dumps(validation, indent=2, sort_keys=True, default=str), encoding="utf-8"
    )
    for name, content in artifacts.items():
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts:
            raise UsageError(f"artifact name {name!r} must be a relative path inside pair/")
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            if not content.exists():
                raise NotFoundError(f"artifact {name}: file {content} does not exist")
            if content.is_dir():
                shutil.copytree(content, target, dirs_exist_ok=True)
            else:
                shutil.copyfile(content, target)
        else:
            target.write_text(str(content), encoding="utf-8")


# the model-version tags the gate summary owns: written from each sync's gate results, and removed
# when they no longer hold (an exception of an earlier validation run)
GATE_TAG_PREFIXES = ("specreg.gate.", "specreg.exception.")
MAX_TAG_VALUE = 5000  # MLflow's limit on a model-version tag value


def _tag_key(environment: str) -> str:
    return _METRIC_NAME_UNSAFE.sub("_", environment)


def exception_line(result) -> str | None:
    """The speedup exception a gate result honours, in one line (who, when, the measured speedup
    against the floor, why), or None."""
    for condition in result.conditions:
        exception = (condition.details or {}).get("exception")
        if exception:
            speedup, floor = condition.details.get("speedup"), condition.details.get("floor")
            measured = f"{speedup:.2f}x < {floor:g}x min_speedup" if _is_number(speedup) and _is_number(floor) else ""
            return (f"--allow-slower by {exception.get('actor')} at {exception.get('at')}"
                    + (f" ({measured})" if measured else "") + f": {exception.get('reason')}")
    return None


def gate_description(results: list) -> str:
    """The model version's description head: per environment of the policy of record its verdict,
    any exception with its reason, who gave it and the measured speedup, then every condition."""
    from specreg.registry.governance.gate_report import escape_cell, markdown_summary

    if not results:
        return ""
    lines = [f"# Gate summary (policy `{results[0].policy_source}`)", "",
             "| environment | verdict | exception |", "|---|---|---|"]
    for result in results:
        exception = exception_line(result)
        # words, not emoji: the MLflow UI in a headless browser renders those glyphs as boxes
        verdict = ("PASS" + (" by exception" if exception else "")) if result.passed else "REFUSED"
        lines.append(f"| {escape_cell(result.environment)} | {verdict} | {escape_cell(exception or '-')} |")
    for result in results:
        exception = exception_line(result)
        lines += ["", markdown_summary(result).rstrip()]
        if exception:
            lines += ["", f"**Exception in {escape_cell(result.environment)}:** {escape_cell(exception)}"]
    return "\n".join(lines) + "\n"


def gate_tags(results: list) -> dict[str, str]:
    """Machine-readable gate state: ``specreg.gate.<env>`` pass | refused and, where an exception
    lets the version pass, ``specreg.exception.<env>`` (exception_line)."""
    tags = {}
    for result in results:
        key = _tag_key(result.environment)
        tags[f"specreg.gate.{key}"] = "pass" if result.passed else "refused"
        exception = exception_line(result)
        if exception:
            tags[f"specreg.exception.{key}"] = exception[:MAX_TAG_VALUE]
    return tags
