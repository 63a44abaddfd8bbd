"""Integrity (static): are the models on disk still the ones that were registered?

Both directories are fingerprinted again (weights file by file, config, tokenizer, chat
template; no tensor is loaded) and compared with the fingerprints bound into the pair version.
Any change fails and names the file: a validation of other weights than the registered ones
would certify the wrong models.
"""

from __future__ import annotations

from specreg.errors import ModelReferenceError
from specreg.core.types import ModelRef
from specreg.core.fingerprint import compare_fingerprints, fingerprint_model
from specreg.core.types import FAIL, PASS, CheckResult
from specreg.validators.context import Check, CheckContext

CHECK_NAME = "integrity"


def check_integrity(models: dict[str, ModelRef | None], allow_pickle: bool = False) -> CheckResult:
    """Re-fingerprint each registered model and compare.

    models: role ("target", "draft") -> the ModelRef recorded at registration (None: no such
    model, e.g. ngram drafting). Returns a CheckResult "integrity": fail naming the role, the
    directory and each changed file; pass when every fingerprint is unchanged.
    """
    findings = []
    checked = 0
    for role, ref in models.items():
        if ref is None:
            continue
        checked += 1
        try:
            # a head recorded without a tokenizer is re-read the same way
            current = fingerprint_model(ref.path, allow_pickle=allow_pickle,
                                        require_tokenizer=ref.fingerprint.tokenizer_sha256 is not None)
        except ModelReferenceError as exc:
            findings.append({"model": role, "path": ref.path, "change": f"unreadable: {exc}"})
            continue
        for change in compare_fingerprints(ref.fingerprint, current):
            findings.append({"model": role, "path": ref.path, "change": change})
    figures = {"models_checked": checked, "changes": len(findings)}
    if findings:
        first = findings[0]
        more = f" (and {len(findings) - 1} more change{'s' if len(findings) > 2 else ''})" if len(findings) > 1 else ""
        summary = f"{first['model']} {first['path']}: {first['change']} since registration{more}"
        return CheckResult(CHECK_NAME, FAIL, summary, {"changes": findings}, figures)
    roles = " and ".join(role for role, ref in models.items() if ref is not None)
    return CheckResult(CHECK_NAME, PASS, f"{roles} unchanged since registration (weights, config, "
                       f"tokenizer, chat template)", {"changes": []}, figures)


def run(context: CheckContext) -> CheckResult:
    """The integrity check of a validation, over the pair version's registered models."""
    version = context.pair_version
    return check_integrity({"target": version.target, "draft": version.draft}, allow_pickle=version.allow_pickle)


# it hashes every weight file (a minute for a large model); when the files are not the registered
# ones, nothing measured on them would be about this version
CHECK = Check(CHECK_NAME, run, announce=True, stops="integrity failed, the models on disk are not the registered ones")
