"""TGI 3.3: `text-generation-launcher --speculate N` (tgi-launch.sh): n-gram drafting for a model
without Medusa heads. No separate draft model, no EAGLE-3 or MTP drafting."""

from __future__ import annotations

from typing import Any

from specreg.registry.deploy.engines.common import Export
from specreg.registry.store.entities import PairVersion, SpecMethod

ENGINE = "tgi"
VERSIONS = ("3.3",)
SCHEMA = "tgi-3.3.json"
FILES = ("tgi-launch.sh",)
OPTIONS: dict[str, Any] = {}


def refusal(pair_version: PairVersion) -> str | None:
    method = pair_version.config.method
    if method in (SpecMethod.EAGLE3, SpecMethod.MTP):
        return "TGI 3.3's --speculate does Medusa (from a combined repository) or n-gram only"
    if method is SpecMethod.DRAFT_MODEL:
        return ("TGI 3.3 has no separate-draft mode (--speculate does Medusa or n-gram only); "
                "use vllm, sglang or trtllm")
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
