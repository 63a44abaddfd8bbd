"""What every engine module shares: the pair as one export sees it (``Export``) and the refusals
that hold for every engine serving a head pair (a static tree; MTP on a target no engine builds
an MTP drafter for)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specreg.registry.store.entities import PairVersion, SpecMethod


@dataclass(frozen=True)
class Export:
    """One export's inputs, resolved: the pair, its baselines, the merged options and where the
    engine finds the models (``target_source``, ``draft_source``: reference, path or in-pod path)."""

    pair_version: PairVersion
    baselines: dict[str, Any] | None
    approved: bool
    opts: dict[str, Any]
    target_source: str
    draft_source: str | None
    served_name: str
    overall: dict[str, Any]
    thresholds: dict[str, float]

    @property
    def config(self):
        return self.pair_version.config


def head_refusal(pair_version: PairVersion) -> str | None:
    """Why no engine specreg targets serves this eagle3 or mtp pair as registered (None: they may).

    A static tree: vLLM has no static token tree for eagle3 and SGLang's EAGLE trees are dynamic
    top-k trees. MTP: vLLM builds MTP drafters only for the targets config/speculative.py
    hf_config_override rewrites."""
    config = pair_version.config
    if config.method not in (SpecMethod.EAGLE3, SpecMethod.MTP):
        return None
    if config.tree is not None:
        return ("the registered candidate tree is static; vLLM 0.33's eagle3 drafts a chain, SGLang 0.5.23 "
                "builds a dynamic top-k tree, and TensorRT-LLM's eagle_choices were not checked against its release")
    if config.method is SpecMethod.MTP and mtp_family(pair_version) is None:
        target = pair_version.target.fingerprint
        return (f"no engine builds an MTP drafter for model_type {target.model_type!r} "
                f"({target.architecture}): vLLM 0.33 rewrites only DeepSeek-V3/V3.2, GLM, MiMo, Qwen3-Next, "
                f"Qwen3.5 and similar targets into MTP drafters (config/speculative.py hf_config_override)")
    return None


def mtp_family(pair_version: PairVersion) -> str | None:
    """The MTP family (specreg.core.heads.mtp.served_mtp_family) of the pair's target, or None."""
    from specreg.core.heads.mtp import served_mtp_family

    target = pair_version.target.fingerprint
    return served_mtp_family(target.model_type, [target.architecture] if target.architecture else [])
