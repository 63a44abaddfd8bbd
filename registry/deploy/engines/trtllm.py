"""TensorRT-LLM 1.2: `trtllm-serve TARGET --config trtllm-config.yaml` (trtllm-serve.sh) with the
LLM API's speculative_config in the YAML.

Facts from TensorRT-LLM 1.2's llm_args.py source (the PyPI wheel is a stub); trtllm-serve 1.2
exposes no Prometheus speculative-decoding metrics specreg knows the names of, so there is no
metrics reader (observe refuses it)."""

from __future__ import annotations

from typing import Any

from specreg.errors import UsageError
from specreg.registry.deploy.engines.common import Export, head_refusal, mtp_family
from specreg.registry.store.entities import PairVersion, SpecMethod

ENGINE = "trtllm"
# 1.3 replaced the 1.2 acceptance-length gate keys by rate-based ones
VERSIONS = ("1.2",)
SCHEMA = "trtllm-1.2.json"
FILES = ("trtllm-serve.sh", "trtllm-config.yaml")
OPTIONS: dict[str, Any] = {"acceptance_window": 128}  # rolling window for acceptance_length_threshold


def check_options(opts: dict[str, Any]) -> None:
    try:
        opts["acceptance_window"] = int(opts["acceptance_window"])
    except (TypeError, ValueError) as exc:
        raise UsageError(f"export option has a bad value: {exc}") from None


def refusal(pair_version: PairVersion) -> str | None:
    reason = head_refusal(pair_version)
    config = pair_version.config
    if reason is not None or config.method is not SpecMethod.MTP:
        return reason
    if mtp_family(pair_version) != "deepseek":
        return f"its NEXTN/MTP drafting is checked here for DeepSeek-family targets only, not {mtp_family(pair_version)}"
    layers = (config.head or {}).get("num_heads")
    if layers is not None and config.num_speculative_tokens != layers:
        return (f"TensorRT-LLM's MTP drafts one token per MTP layer: k = {config.num_speculative_tokens} "
                f"but the target has {layers}")
    return None


def context(export: Export) -> dict[str, Any]:
    return {"trtllm_command": command(export.target_source, export.opts),
            "trtllm_config": speculative_config(export.pair_version, export.draft_source, export.overall,
                                                export.opts)}


def command(target_source: str, opts: dict[str, Any]) -> list[list[str]]:
    lines = [["trtllm-serve", target_source], ["--config", "trtllm-config.yaml"]]
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--tp_size", str(opts["tensor_parallel_size"])])
    lines.append(["--host", str(opts["host"]), "--port", str(opts["port"])])
    return lines


def speculative_config(pair_version: PairVersion, draft_source: str | None, overall: dict[str, Any],
                       opts: dict[str, Any]) -> dict[str, Any]:
    """The speculative_config mapping of a trtllm-serve YAML (TensorRT-LLM 1.2 LLM API)."""
    config = pair_version.config
    if config.method == SpecMethod.DRAFT_MODEL:
        speculative: dict[str, Any] = {
            "decoding_type": "DraftTarget",
            "max_draft_len": config.num_speculative_tokens,
            # the field of 1.2's DecodingBaseConfig (a strict model: `speculative_model` is refused there)
            "speculative_model_dir": draft_source,
        }
    elif config.method is SpecMethod.EAGLE3:
        # 1.2's from_dict knows "Eagle" (EagleDecodingConfig, whose eagle3_one_model mode is EAGLE-3)
        speculative = {"decoding_type": "Eagle", "max_draft_len": config.num_speculative_tokens,
                       "speculative_model_dir": draft_source, "eagle3_one_model": True}
    elif config.method is SpecMethod.MTP:
        # "N modules produce N draft tokens": refusal keeps k equal to the layer count
        speculative = {"decoding_type": "MTP", "num_nextn_predict_layers": config.num_speculative_tokens}
    else:
        speculative = {"decoding_type": "NGram", "max_draft_len": config.num_speculative_tokens}
        if config.prompt_lookup_max is not None:
            speculative["max_matching_ngram_size"] = config.prompt_lookup_max
    if config.max_batch_size_for_speculation:
        speculative["max_concurrency"] = config.max_batch_size_for_speculation
    tau = overall.get("mean_acceptance_length")
    if isinstance(tau, (int, float)):
        speculative["acceptance_length_threshold"] = acceptance_threshold(tau, opts["tolerance"])
        speculative["acceptance_window"] = opts["acceptance_window"]
    return speculative


def acceptance_threshold(mean_acceptance_length: float, tolerance: float) -> float:
    """TensorRT-LLM 1.2's SpeculationGate threshold for a baseline tau and a tolerance.

    The gate averages ``avg_decoded_tokens_per_iter - 1`` per completed request, i.e. accepted
    draft tokens per iteration without the bonus token, and turns speculation off for good below
    the threshold; our tau counts the bonus token, so the engine's baseline is tau - 1.
    """
    return round(max(0.0, mean_acceptance_length - 1.0) * (1.0 - tolerance), 6)
