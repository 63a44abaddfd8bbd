"""TGI 3.3: `text-generation-launcher --speculate N` (tgi-launch.sh). Its only drafting without a
combined Medusa repository is a one-token n-gram lookup that no validated pair describes, so every
pair kind is refused today (read from TGI's source, tag v3.3.0; the lines below are the same up to
v3.3.7); the module stays so that the refusal says why, and the writer is ready for a method TGI
serves as validated."""

from __future__ import annotations

from typing import Any

from specreg.registry.deploy.engines.common import (Export, accept_options, no_check, no_head_layout, no_model_files,
                                                    nothing_read_back, registered_sources)
from specreg.registry.store.entities import PairVersion, SpecMethod

ENGINE = "tgi"
VERSIONS = ("3.3",)
SCHEMA = "tgi-3.3.json"
FILES = ("tgi-launch.sh",)
WRITES_MODELS = False
WRITES_LOCK = True
# what it needs nothing of its own for: the shared defaults (engines.EngineModule)
check_options, check, sources, head_layout, write_models = accept_options, no_check, registered_sources, no_head_layout, no_model_files
# no pair kind is written for it today (refusal): nothing to read back
read_back = nothing_read_back

OPTIONS: dict[str, Any] = {}


def baseline_engine(opts: dict[str, Any]) -> str | None:
    return ENGINE


SPECULATE = "launcher/src/main.rs:622-627: --speculate is Medusa heads of the model itself, else n-gram"
NGRAM = ("server/text_generation_server/utils/tokens.py:209-229 create_n_gram_speculation seeds on the last "
         "accepted token alone, takes its first occurrence in the sequence and proposes the k tokens after it, "
         "and when nothing matches still proposes the tokens at positions 1..k")
MEDUSA = ("TGI 3.3 reads Medusa heads only from a combined model repository "
          "(server/text_generation_server/models/__init__.py:522-551)")


def refusal(pair_version: PairVersion) -> str | None:
    method = pair_version.config.method
    if method in (SpecMethod.EAGLE3, SpecMethod.MTP, SpecMethod.SUFFIX, SpecMethod.DFLASH, SpecMethod.DSPARK,
                  SpecMethod.PEAGLE):
        return f"TGI 3.3's --speculate does Medusa (from a combined repository) or n-gram only ({SPECULATE})"
    if method is SpecMethod.DRAFT_MODEL:
        return (f"TGI 3.3 has no separate-draft mode (--speculate does Medusa or n-gram only: {SPECULATE}); "
                "use vllm, sglang or trtllm")
    if method is SpecMethod.NGRAM:
        return (f"TGI 3.3's n-gram is not the prompt lookup that was validated ({NGRAM}); no option sets "
                f"prompt_lookup_min/max; use vllm or trtllm")
    if method is SpecMethod.MEDUSA:
        return f"the heads are registered apart from their base model; {MEDUSA}"
    return None


def context(export: Export) -> dict[str, Any]:
    if export.config.method is not SpecMethod.NGRAM:
        return {"tgi_command": None}
    return {"tgi_command": command(export.pair_version, export.target_source, export.opts)}


def command(pair_version: PairVersion, target_source: str, opts: dict[str, Any]) -> list[list[str]]:
    lines = [["text-generation-launcher"], ["--model-id", target_source]]
    if pair_version.target.revision:
        lines.append(["--revision", pair_version.target.revision])
    lines.append(["--speculate", str(pair_version.config.num_speculative_tokens)])
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--num-shard", str(opts["tensor_parallel_size"])])
    lines.append(["--hostname", str(opts["host"]), "--port", str(opts["port"])])
    return lines
