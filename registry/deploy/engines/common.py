"""What every engine module shares: the pair as one export sees it (``Export``), the defaults of the
engine interface (engines.EngineModule) a module names where it needs nothing of its own, the
refusal that holds for every engine (MTP on a target no engine builds an MTP drafter for) and the
head's trained aux layers, which each engine module translates into its own numbering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specreg.registry.store.entities import PairVersion, SpecMethod


@dataclass(frozen=True)
class Export:
    """One export's inputs, resolved: the pair, its baselines, the merged options and where the
    engine finds the models (``target_source``, ``draft_source``: reference, path or in-pod path)."""

    fmt: str  # the export format
    engine: Any  # its engines.EngineModule, resolved once for the whole export
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


# The engine interface's defaults (engines.EngineModule), for a module that needs nothing of its own.


def accept_options(opts: dict[str, Any]) -> None:
    """No options of its own to check."""


def no_check(pair_version: PairVersion, baselines: dict[str, Any] | None, opts: dict[str, Any]) -> None:
    """No precondition past the engine's refusal."""


def registered_sources(pair_version: PairVersion, opts: dict[str, Any]) -> tuple[str, str | None]:
    """(target, draft) where they were registered: the reference (served_reference) under
    model_source=reference, else the fingerprinted folder."""
    source = served_reference if opts["model_source"] == "reference" else (lambda model: model.path)
    return source(pair_version.target), source(pair_version.draft) if pair_version.draft is not None else None


def no_head_layout(export: Export) -> None:
    """The engine loads the registered head directory itself."""


def no_model_files(pair_version: PairVersion, out_dir, opts: dict[str, Any], overwrite: bool = False, log=None, *,
                   records) -> None:
    """The engine loads the registered model files themselves."""


def nothing_read_back(export: Export, files: dict[str, Any]) -> list:
    """Its files start no model server: nothing to read back."""
    return []


def served_dtype(export: Export) -> str | None:
    """The dtype the export's acceptance baselines were measured in (the engine baseline's where
    one is merged, else the validation's), which the engines that take ``--dtype`` are pinned to:
    their ``auto`` serves a float32 checkpoint in another dtype, with other acceptance (vLLM 0.33:
    bfloat16 on an x86 CPU or a recent GPU, vllm/config/model.py:2420-2424, vllm/platforms/cpu.py:131-132;
    SGLang 0.5.23: float16, sglang/srt/configs/model_config.py:2303-2319). None: never validated
    (a forced export), the engine's own choice."""
    return (export.baselines or {}).get("dtype")


# The methods whose runtime drafters draw a chain from a draft law q (runtime/sampling.py draft_token):
# only their sampled drafts depend on the draft sampling. n-gram and suffix look their drafts up and
# Medusa and every candidate tree take their top-k: point masses either way.
DRAFT_LAW_METHODS = (SpecMethod.DRAFT_MODEL, SpecMethod.EAGLE3, SpecMethod.PEAGLE, SpecMethod.MTP, SpecMethod.DFLASH,
                     SpecMethod.DSPARK)


def drafts_from_a_law(pair_version: PairVersion) -> bool:
    """Whether the pair's sampled drafts depend on the draft sampling: a chain of DRAFT_LAW_METHODS."""
    return pair_version.config.method in DRAFT_LAW_METHODS and pair_version.config.tree is None


def served_draft_sampling(baselines: dict[str, Any] | None) -> str:
    """How the export's baselines' sampled records drafted (core.baselines.draft_sampling_of), else the
    engines' and the runtime's default "greedy" (no sampled record measured, a forced export, or
    baselines recorded before the setting)."""
    from specreg.core.baselines import draft_sampling_of

    return draft_sampling_of(baselines) or "greedy"


def point_mass_check(engine_drafts: str):
    """The ``check`` of an engine that drafts only the argmax with a point-mass q (``engine_drafts``
    says so, citing its source): it refuses baselines whose sampled records drafted from q, which
    describe an algorithm the engine does not run."""
    from specreg.errors import EngineRefusal

    def check(pair_version: PairVersion, baselines: dict[str, Any] | None, opts: dict[str, Any]) -> None:
        if drafts_from_a_law(pair_version) and served_draft_sampling(baselines) == "probabilistic":
            raise EngineRefusal(f"{pair_version.label}'s baselines were measured with probabilistic draft sampling "
                                f"(sampled drafts drawn from q), but {engine_drafts}: validate it with "
                                f"--draft-sampling greedy")

    return check


def served_reference(model) -> str:
    """What an export names a model by under model_source=reference: the hub id, or for a local
    folder the resolved path that was fingerprinted at registration. The folder as typed may be a
    symlink (re-pointed later to other weights) or relative (valid only from the folder it was
    typed in, and read as a hub id by an engine): neither is written into a serve script."""
    if model.revision is not None:
        return model.reference
    return model.path


def mtp_refusal(pair_version: PairVersion) -> str | None:
    """Why no engine serves this mtp pair (None: one may): the engines build MTP drafters only for
    the target types vLLM's SpeculativeConfig.hf_config_override rewrites
    (vllm/config/speculative.py:711-830; SGLang and TensorRT-LLM serve a subset of them)."""
    if pair_version.config.method is not SpecMethod.MTP or mtp_family(pair_version) is not None:
        return None
    target = pair_version.target.fingerprint
    return (f"no engine builds an MTP drafter for model_type {target.model_type!r} "
            f"({target.architecture}): vLLM 0.33 rewrites only DeepSeek-V3/V3.2, GLM, MiMo, Qwen3-Next, "
            f"Qwen3.5 and similar targets into MTP drafters (config/speculative.py hf_config_override)")


def mtp_family(pair_version: PairVersion) -> str | None:
    """The MTP family (specreg.core.heads.mtp_checkpoint.served_mtp_family) of the pair's target,
    or None."""
    from specreg.core.heads.mtp_checkpoint import served_mtp_family

    target = pair_version.target.fingerprint
    return served_mtp_family(target.model_type, [target.architecture] if target.architecture else [])


def trained_aux_layers(pair_version: PairVersion) -> tuple[int, ...]:
    """The target hidden states an EAGLE-3 head was trained on, as registration recorded them
    (config.head["fit"]["aux_layer_ids"]: declared, or the target's default), sorted and unique.

    In vLLM's numbering, which the speculators format uses: id i is the state entering decoder
    layer i (transformers' hidden_states[i]; 0 the embeddings, N the last layer's output before
    the final norm): vllm/model_executor/models/llama.py:429-441 appends the state at idx + 1
    after layer idx. Each engine module translates these into its own terms."""
    fit = (pair_version.config.head or {}).get("fit") or {}
    return tuple(sorted(set(fit.get("aux_layer_ids") or ())))


def measured_schedule(tiers: list[dict[str, Any]] | None, k: int) -> list[list[int]] | None:
    """The per-batch-size schedule an engine baseline's throughput tiers support, in vLLM's form
    ``[[range_start, range_end, k], ...]`` (inclusive ranges; vLLM carries the last range's k to
    larger batch sizes): the batch sizes up to each measured concurrency draft k tokens where the
    draft sped that concurrency up (with / without >= 1) and none where it slowed it down. None
    when no tier measured both (a server without a reference to compare with)."""
    measured = sorted((int(tier["concurrency"]), tier["with_draft_tokens_per_s"] / tier["without_draft_tokens_per_s"])
                      for tier in tiers or () if tier.get("with_draft_tokens_per_s")
                      and tier.get("without_draft_tokens_per_s"))
    if not measured:
        return None
    schedule: list[list[int]] = []
    start = 1
    for concurrency, speedup in measured:
        depth = k if speedup >= 1.0 else 0
        if schedule and schedule[-1][2] == depth:
            schedule[-1][1] = concurrency
        else:
            schedule.append([start, concurrency, depth])
        start = concurrency + 1
    return schedule


def schedule_depth(schedule: list[list[int]], batch_size: int) -> int:
    """The k a schedule (measured_schedule's form) gives ``batch_size``: its range's, or the last
    range's above them all (as vLLM reads it)."""
    for start, end, depth in schedule:
        if start <= batch_size <= end:
            return depth
    return schedule[-1][2]
