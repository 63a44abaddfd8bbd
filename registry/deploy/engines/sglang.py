"""SGLang 0.5.23: `python -m sglang.launch_server` (sglang-launch.sh), its alert expressions and
its metrics reader.

Facts from the released sglang 0.5.23 wheel (tests/engines runs the exports through it)."""

from __future__ import annotations

from typing import Any

from specreg.registry.deploy.engines.common import Export, head_refusal, mtp_family
from specreg.registry.store.entities import PairVersion, SpecMethod

ENGINE = "sglang"
VERSIONS = ("0.5.23",)
SCHEMA = "sglang-0.5.23.json"
FILES = ("sglang-launch.sh",)
OPTIONS: dict[str, Any] = {}

ACCEPT_LENGTH = "sglang:spec_accept_length"
ACCEPT_RATE = "sglang:spec_accept_rate"

NGRAM_REFUSAL = (
    "SGLang 0.5.23's NGRAM drafts a token tree (--speculative-num-draft-tokens nodes, BFS breadth 1-10) from a trie "
    "shared by all requests (--speculative-ngram-capacity), matching suffixes of up to "
    "--speculative-ngram-max-trie-depth tokens with no minimum; prompt_lookup_min/max have no counterpart, so the "
    "validated baselines would not describe what it serves; use vllm or trtllm")


def refusal(pair_version: PairVersion) -> str | None:
    if pair_version.config.method is SpecMethod.NGRAM:
        return NGRAM_REFUSAL
    reason = head_refusal(pair_version)
    if reason is None and pair_version.config.method is SpecMethod.MTP and mtp_family(pair_version) != "deepseek":
        reason = f"its NEXTN/MTP drafting is checked here for DeepSeek-family targets only, not {mtp_family(pair_version)}"
    return reason


def context(export: Export) -> dict[str, Any]:
    # ngram has no SGLang command (refusal above); the key stays, None, for user templates
    if export.config.method is SpecMethod.NGRAM:
        return {"sglang_command": None}
    return {"sglang_command": command(export.pair_version, export.target_source, export.draft_source,
                                      export.served_name, export.opts)}


def command(pair_version: PairVersion, target_source: str, draft_source: str | None, served_name: str,
            opts: dict[str, Any]) -> list[list[str]]:
    k = pair_version.config.num_speculative_tokens
    lines = [["python", "-m", "sglang.launch_server"], ["--model-path", target_source]]
    if pair_version.target.revision:
        lines.append(["--revision", pair_version.target.revision])
    # NEXTN (MTP) is SGLang's alias of EAGLE whose draft defaults to the target itself.
    method = pair_version.config.method
    algorithm = {SpecMethod.DRAFT_MODEL: "STANDALONE", SpecMethod.EAGLE3: "EAGLE3", SpecMethod.MTP: "NEXTN"}[method]
    lines.append(["--speculative-algorithm", algorithm])
    if draft_source is not None:
        lines.append(["--speculative-draft-model-path", draft_source])
        if pair_version.draft.revision:
            lines.append(["--speculative-draft-model-revision", pair_version.draft.revision])
    lines.append(["--speculative-num-steps", str(k)])
    lines.append(["--speculative-eagle-topk", "1"])
    # SGLang counts the verified root token among the draft tokens: with top-k 1 that is k + 1.
    lines.append(["--speculative-num-draft-tokens", str(k + 1)])
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--tp-size", str(opts["tensor_parallel_size"])])
    # /metrics (sglang:spec_accept_length / _rate, read by the alert rules and observe) is off by default.
    lines.append(["--enable-metrics"])
    lines.append(["--served-model-name", served_name])
    lines.append(["--host", str(opts["host"]), "--port", str(opts["port"])])
    return lines


# ---------------------------------------------------------------------------------------------
# Metrics: gauges that already hold both figures over SGLang's own logging window.


def alert_expressions(selector: str, window: str) -> dict[str, str]:
    return {"acceptance_rate": f"avg({ACCEPT_RATE}{selector})",
            "mean_acceptance_length": f"avg({ACCEPT_LENGTH}{selector})"}


def read_metrics(samples, model_name: str | None, source: str) -> dict[str, Any]:
    """Gauge values of one SGLang scrape, averaged over the remaining series (e.g. DP ranks)."""
    from specreg.registry.deploy.observe import select

    figures = {}
    for key, name in (("mean_acceptance_length", ACCEPT_LENGTH), ("acceptance_rate", ACCEPT_RATE)):
        series = select(samples, name, model_name, source)
        figures[key] = sum(value for _, value in series) / len(series)
    return figures
