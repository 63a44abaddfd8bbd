"""The tokenizer check of a pair whose drafter is a head on the target (EAGLE-3, Medusa, MTP).

A head has no tokenizer of its own: it drafts ids of the target's vocabulary (EAGLE-3 through its
d2t map from a reduced draft vocabulary). What can silently break is the head's fit to the target
files as they are now: hidden size, aux layers, vocabulary size, the d2t/t2d map (one to one, into
the target's ids, the same token strings) and the declared verifier. Registration checked this
once; this check repeats it on the files the runtime is about to load, so a target swapped or
re-tokenized after registration fails here, naming the field.
"""

from __future__ import annotations

from typing import Any

from specreg.core.types import FAIL, PASS, CheckResult
from specreg.errors import RuntimeUnsupportedError, SpecregError
from specreg.validators.context import CheckContext, error_result

CHECK_NAME = "tokenizer"


def check_head_vocabulary(method: str, head_dir: str | None, target_dir: str, *, target_reference: str | None = None,
                          target_fingerprint: Any = None, allow_verifier_mismatch: bool = False) -> CheckResult:
    """Re-read the head (or, for mtp, the target's MTP layers) and check it fits the target.

    method: "eagle3" | "medusa" | "mtp"; head_dir: the head's directory (None for mtp).
    Returns a pass with what was compared, or a fail naming the field that no longer fits; an
    error (no verdict) for a head specreg's runtime cannot run (registration refuses those).
    """
    from specreg.core.heads import read_head
    from specreg.core.heads.fit import check_head_fits

    try:
        head = read_head(head_dir if head_dir is not None else target_dir, method=method)
        fit = check_head_fits(head, target_dir, target_reference=target_reference,
                              target_fingerprint=target_fingerprint, allow_verifier_mismatch=allow_verifier_mismatch)
    except RuntimeUnsupportedError as exc:  # what specreg's runtime lacks judges nothing about the pair
        return error_result(CHECK_NAME, exc)
    except SpecregError as exc:
        return CheckResult(CHECK_NAME, FAIL, f"the {method} head does not fit the target: {exc}",
                           {"method": method, "error": str(exc)})
    compared = (f"{fit.compared_token_strings} draft token strings compared with the target's"
                if fit.compared_token_strings else "no token strings to compare (the head drafts the target's ids)")
    evidence = {"method": method, "layout": head.layout, "aux_layer_ids": list(fit.aux_layer_ids),
                "draft_vocab_size": head.draft_vocab_size, "target_vocab_size": head.target_vocab_size,
                "verifier_matched": fit.verifier_matched, "notes": list(fit.notes)}
    figures = {"compared_token_strings": fit.compared_token_strings}
    return CheckResult(CHECK_NAME, PASS, f"the {method} head fits the target's vocabulary and layers; {compared}",
                       evidence, figures)


def run(context: CheckContext) -> CheckResult:
    """The tokenizer check of a head pair (tokenizer.run): the head's fit to the target's files now."""
    config, version = context.config, context.pair_version
    fit = config.head.get("fit", {}) if config.head else {}
    return check_head_vocabulary(config.method.value, context.draft_dir, context.target_dir,
                                 target_reference=version.target.reference,
                                 target_fingerprint=version.target.fingerprint,
                                 allow_verifier_mismatch=bool(fit.get("allow_verifier_mismatch")))
