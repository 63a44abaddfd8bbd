"""Value types shared by every part: the result a validation check returns (and how statuses
combine), and a model's content fingerprint and reference. Pure dataclasses: no torch,
transformers, mlflow or SQLAlchemy, and nothing from registry/, validators/ or runtime/."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from specreg.core.statuses import CheckStatus

# the short names the checks write; they are the CheckStatus members themselves
PASS, WARN, FAIL, SKIP, ERROR = CheckStatus.PASS, CheckStatus.WARN, CheckStatus.FAIL, CheckStatus.SKIP, CheckStatus.ERROR
STATUSES = tuple(CheckStatus)

# Worst wins: fail > error > warn > pass > skip. "error": the check could not run, so it judged
# nothing about the pair; a measured fail outranks it. A skip never hides a result that was
# measured, and a combination is "skip" only when every part was skipped.
_SEVERITY = {SKIP: 0, PASS: 1, WARN: 2, ERROR: 3, FAIL: 4}


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check.

    name: the check ("tokenizer", "chat_template", "memory", ...).
    status: a CheckStatus ("pass", "warn", "fail", "skip" or "error": the check could not run, no
        verdict on the pair); given as its word, it is stored as the member.
    summary: one line a reviewer reads first.
    evidence: JSON-able facts behind the status (a list of findings or a dict).
    figures: numbers by name (bytes, counts, rates) for tables, baselines and MLflow metrics.
    """

    name: str
    status: CheckStatus
    summary: str
    evidence: list | dict = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        # Programming errors, not user errors: a check must not build a malformed result.
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {tuple(map(str, STATUSES))}, got {self.status!r}")
        object.__setattr__(self, "status", CheckStatus(self.status))
        if "\n" in self.summary:
            raise ValueError(f"summary must be one line, got {self.summary!r}")
        for key, value in self.figures.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"figure {key!r} must be a number, got {value!r}")

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "evidence": self.evidence,
            "figures": dict(self.figures),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CheckResult":
        return cls(
            name=data["name"],
            status=data["status"],
            summary=data["summary"],
            evidence=data.get("evidence", []),
            figures=dict(data.get("figures", {})),
        )


def combine_statuses(statuses: Iterable[str]) -> CheckStatus:
    """Worst status of several (fail > error > warn > pass > skip); "skip" for none."""
    worst = SKIP
    for status in statuses:
        if status not in _SEVERITY:
            raise ValueError(f"unknown status {status!r}")
        if _SEVERITY[status] > _SEVERITY[worst]:
            worst = status
    return CheckStatus(worst)


def summarize_findings(findings: list[dict], ok_summary: str) -> tuple[CheckStatus, str]:
    """Status and one-line summary from findings ({"status", "message", ...}).

    The summary is the first message of the worst status, with a count of the others, or
    ok_summary when nothing was found.
    """
    status = combine_statuses(f["status"] for f in findings)
    if not findings:
        return PASS, ok_summary
    worst = [f for f in findings if f["status"] == status]
    summary = worst[0]["message"]
    others = len(findings) - 1
    if others:
        summary += f" (and {others} more finding{'s' if others > 1 else ''})"
    return status, summary


@dataclass(frozen=True)
class ModelFingerprint:
    """Content identity of one model directory, computed without loading tensors."""

    weights_sha256: str  # digest over the sorted (file name, file digest) list
    weight_files: dict[str, str]  # file name -> sha256 of its bytes
    weight_format: str  # "safetensors" or "pickle"
    config_sha256: str
    tokenizer_sha256: str | None  # canonical form: vocab, merges, special tokens, pipeline
    chat_template_sha256: str | None
    architecture: str | None
    model_type: str | None
    vocab_size: int | None  # embedding rows (config.vocab_size)
    tokenizer_length: int | None  # len(tokenizer), may be < vocab_size (padding ids)
    parameter_count: int | None
    dtype: str | None
    max_position_embeddings: int | None
    # None: scheme 1, recorded before these existed (specreg.core.fingerprint.FINGERPRINT_SCHEME)
    scheme: int | None = None
    behaviour_files: dict[str, str] | None = None  # tokenizer/generation options, shard indexes

    def to_dict(self) -> dict[str, Any]:
        # a scheme-1 fingerprint serialises exactly as it was recorded (its binding digest holds)
        later = {} if self.scheme is None else {"scheme": self.scheme,
                                                "behaviour_files": dict(self.behaviour_files or {})}
        return {
            "weights_sha256": self.weights_sha256,
            "weight_files": dict(self.weight_files),
            "weight_format": self.weight_format,
            "config_sha256": self.config_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "chat_template_sha256": self.chat_template_sha256,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "tokenizer_length": self.tokenizer_length,
            "parameter_count": self.parameter_count,
            "dtype": self.dtype,
            "max_position_embeddings": self.max_position_embeddings,
            **later,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelFingerprint":
        return cls(**{name: data.get(name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ModelRef:
    """A model as the user named it (``reference``), where it was found, and its fingerprint."""

    reference: str
    path: str
    revision: str | None
    fingerprint: ModelFingerprint

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "path": self.path,
            "revision": self.revision,
            "fingerprint": self.fingerprint.to_dict(),
        }
