"""TensorRT-LLM 1.2: `trtllm-serve TARGET --config trtllm-config.yaml` (trtllm-serve.sh) with the
LLM API's speculative_config in the YAML.

Facts from TensorRT-LLM 1.2's llm_args.py source (the PyPI wheel is a stub); trtllm-serve 1.2
exposes no Prometheus speculative-decoding metrics specreg knows the names of, so there is no
metrics reader (observe refuses it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specreg.errors import UsageError
from specreg.registry.deploy.engines.common import (Export, mtp_family, mtp_refusal, no_head_layout, no_model_files,
                                                    point_mass_check, registered_sources, trained_aux_layers)
from specreg.registry.store.entities import PairVersion, SpecMethod

ENGINE = "trtllm"
# 1.3 replaced the 1.2 acceptance-length gate keys by rate-based ones
VERSIONS = ("1.2",)
SCHEMA = "trtllm-1.2.json"
FILES = ("trtllm-serve.sh", "trtllm-config.yaml")
WRITES_MODELS = False
WRITES_LOCK = True
# what it needs nothing of its own for: the shared defaults (engines.EngineModule)
sources, head_layout, write_models = registered_sources, no_head_layout, no_model_files

OPTIONS: dict[str, Any] = {"acceptance_window": 128}  # rolling window for acceptance_length_threshold


def check_options(opts: dict[str, Any]) -> None:
    try:
        opts["acceptance_window"] = int(opts["acceptance_window"])
    except (TypeError, ValueError) as exc:
        raise UsageError(f"export option has a bad value: {exc}") from None


def baseline_engine(opts: dict[str, Any]) -> str | None:
    return ENGINE


# Where TensorRT-LLM 1.2 says what each refusal and key below relies on (its source, the 1.2 line's
# tensorrt_llm/llmapi/llm_args.py and tensorrt_llm/_torch/; the PyPI wheel is a stub, so symbols, not lines).
EAGLE_CHOICES = ("tensorrt_llm/llmapi/llm_args.py EagleDecodingConfig.validate_eagle_choices warns \"The Draft "
                 "token tree is still under development, PLEASE DO NOT USE IT\"")
CAPTURE = ("tensorrt_llm/_torch/speculative/eagle3.py Eagle3SpecMetadata.maybe_capture_hidden_states, called with "
           "each decoder layer's index after the layer runs: its output")
MTP_LAYERS = ("tensorrt_llm/llmapi/llm_args.py MTPDecodingConfig.spec_dec_mode: vanilla MTP (a target with more "
              "than one MTP layer) runs num_nextn_predict_layers modules, one draft token each")
# The EAGLE-3 head TensorRT-LLM builds: tensorrt_llm/_torch/models/modeling_speculative.py as of the 1.2 line,
# whose Eagle3DraftModel reads only eh_proj_before_attn and return_hidden_post_norm from eagle_config (later
# versions read eagle_config's norm_before_fc and the config's norm_output). Which source is 1.2's was told by
# that content and its module layout, not by a release tag (the PyPI wheel is a stub): a head refused here for
# a flag a later TensorRT-LLM reads stays refused until that release is targeted and checked.
EAGLE3_MODEL = "tensorrt_llm/_torch/models/modeling_speculative.py"
NGRAM_MATCH = ("tensorrt_llm/_torch/speculative/ngram.py NGramPoolManager.get_draft_tokens tries pattern sizes "
               "from max_matching_ngram_size down to 1 (range(..., 0, -1)); there is no minimum")


MEDUSA_REFUSAL = ("TensorRT-LLM 1.2's Medusa runs only on its TensorRT engine flow (tensorrt_llm/llmapi/llm_args.py "
                  "MedusaDecodingConfig.supports_backend refuses pytorch, trtllm-serve's backend)")


SUFFIX_REFUSAL = ("TensorRT-LLM 1.2 has no suffix decoding: its speculative_config decoding_type is one of MTP, "
                  "Medusa, Eagle, Lookahead, NGram, DraftTarget, SaveState, UserProvided and AUTO "
                  "(tensorrt_llm/llmapi/llm_args.py of the 1.2 line, as templates/engines/trtllm-1.2.json records it)")


BLOCK_REFUSAL = ("TensorRT-LLM 1.2 has no block drafter: its speculative_config decoding_type is one of MTP, "
                 "Medusa, Eagle, Lookahead, NGram, DraftTarget, SaveState, UserProvided and AUTO "
                 "(tensorrt_llm/llmapi/llm_args.py of the 1.2 line, as templates/engines/trtllm-1.2.json records "
                 "it); DFlashDecodingConfig (mask_token_id, target_layer_ids) came after 1.2")


check = point_mass_check(
    "TensorRT-LLM 1.2's drafters draft the argmax (tensorrt_llm/_torch/speculative/eagle3.py "
    "Eagle3OneModelWorker.draft_decoder) and its speculative_config has no draft sampling key "
    "(tensorrt_llm/llmapi/llm_args.py of the 1.2 line, as templates/engines/trtllm-1.2.json records it)")


PEAGLE_REFUSAL = ("TensorRT-LLM 1.2 has no parallel drafting of an EAGLE-3 head: its speculative_config "
                  "decoding_type is one of MTP, Medusa, Eagle, Lookahead, NGram, DraftTarget, SaveState, UserProvided "
                  "and AUTO (tensorrt_llm/llmapi/llm_args.py of the 1.2 line, as templates/engines/trtllm-1.2.json "
                  "records it), and its Eagle drafts max_draft_len tokens one head forward each; the PARD decoding "
                  "of later releases drafts with a model of its own, without the target's hidden states")


def refusal(pair_version: PairVersion) -> str | None:
    config = pair_version.config
    if config.method is SpecMethod.MEDUSA:
        return MEDUSA_REFUSAL
    if config.method is SpecMethod.SUFFIX:
        return SUFFIX_REFUSAL
    if config.method is SpecMethod.PEAGLE:
        return PEAGLE_REFUSAL
    if config.method in (SpecMethod.DFLASH, SpecMethod.DSPARK):
        return BLOCK_REFUSAL
    if config.tree is not None and config.method.has_head:
        return f"the registered candidate tree is static and TensorRT-LLM 1.2's eagle_choices is not usable: {EAGLE_CHOICES}"
    reason = mtp_refusal(pair_version)
    if reason is not None:
        return reason
    if config.method is SpecMethod.EAGLE3:
        aux = trained_aux_layers(pair_version)
        if not aux:
            return "the registration records no aux layer ids for the head (config.head.fit.aux_layer_ids)"
        if 0 in aux:
            return (f"the head reads the embeddings (aux layer id 0 of {list(aux)}); TensorRT-LLM captures decoder "
                    f"layer outputs only ({CAPTURE})")
        reason = variant_refusal(pair_version.draft.path)
        if reason is not None:
            return reason
    if config.method is SpecMethod.MTP:
        if mtp_family(pair_version) != "deepseek":
            return (f"its MTP drafting is checked here for DeepSeek-family targets only (tensorrt_llm/_torch/models/"
                    f"modeling_deepseekv3.py), not {mtp_family(pair_version)}")
        layers = (config.head or {}).get("num_heads")
        if layers is not None and layers > 1 and config.num_speculative_tokens != layers:
            return (f"k = {config.num_speculative_tokens} but the target has {layers} MTP layers, and TensorRT-LLM "
                    f"drafts one token per layer on such targets ({MTP_LAYERS})")
    if config.method is SpecMethod.NGRAM and (config.prompt_lookup_min or 1) > 1:
        return (f"prompt_lookup_min = {config.prompt_lookup_min} was validated, but TensorRT-LLM's n-gram also "
                f"drafts from shorter matches ({NGRAM_MATCH})")
    return None


def variant_refusal(head_path: str) -> str | None:
    """An EAGLE-3 variant our runtime ran as vLLM does that TensorRT-LLM 1.2's Eagle3DraftModel would
    run otherwise (None: it runs it as validated)."""
    from specreg.core.heads.eagle3_variants import read_eagle3_variant

    variant = read_eagle3_variant(head_path)
    if variant.logit_scale <= 0:
        # a positive scale leaves the argmax it drafts where vLLM's scaled logits have it
        return (f"the head's logit_scale is {variant.logit_scale:g}: vLLM drafts from its logits scaled by it, "
                f"TensorRT-LLM 1.2 computes them unscaled ({EAGLE3_MODEL} Eagle3ForCausalLM.forward hands the layer "
                f"output to tensorrt_llm/_torch/modules/logits_processor.py LogitsProcessor, lm_head alone) and drafts "
                f"their argmax (tensorrt_llm/_torch/speculative/eagle3.py Eagle3OneModelWorker.draft_decoder), which "
                f"a scale of 0 or below changes")
    if variant.layer_kind != "llama":
        return (f"the head's layer is {variant.layer_kind} ({variant.architecture}); TensorRT-LLM 1.2 builds its "
                f"EAGLE-3 layer with Eagle3Attention, Llama attention without q_norm/k_norm or multi-head latent "
                f"attention ({EAGLE3_MODEL} Eagle3DecoderLayer)")
    if variant.num_layers != 1:
        return (f"the head has {variant.num_layers} decoder layers; TensorRT-LLM 1.2 norms the input of every layer "
                f"with its hidden_norm and adds the previous layer's residual ({EAGLE3_MODEL} Eagle3DecoderLayer."
                f"forward, Eagle3DraftModel.forward), where vLLM and the head's own later layers use their "
                f"input_layernorm")
    unread = [flag for flag in ("norm_before_fc", "fc_norm", "norm_output") if getattr(variant, flag)]
    if unread:
        return (f"the head sets {' and '.join(unread)}; TensorRT-LLM 1.2's Eagle3DraftModel reads only "
                f"eh_proj_before_attn and return_hidden_post_norm of its norms ({EAGLE3_MODEL} Eagle3DraftModel."
                f"__init__), so it would draft otherwise than validated")
    if variant.norm_before_residual:
        return (f"the head was trained with norm_before_residual; TensorRT-LLM 1.2 keeps the un-normed hidden state "
                f"as the residual ({EAGLE3_MODEL} Eagle3DecoderLayer.forward: residual = hidden_states before "
                f"hidden_norm)")
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
    k = config.num_speculative_tokens
    if config.method == SpecMethod.DRAFT_MODEL:
        # 1.2's DecodingBaseConfig field is `speculative_model` (`speculative_model_dir` is an alias of it)
        speculative: dict[str, Any] = {"decoding_type": "DraftTarget", "max_draft_len": k,
                                       "speculative_model": draft_source}
    elif config.method is SpecMethod.EAGLE3:
        # 1.2's from_dict knows "Eagle" (EagleDecodingConfig, whose eagle3_one_model mode is EAGLE-3).
        # eagle3_layers_to_capture counts layer outputs: the state entering layer i (the head's id i)
        # is layer i - 1's output; its default {1, N//2 - 1, N - 4} is the speculators' (2, N//2, N - 3).
        speculative = {"decoding_type": "Eagle", "max_draft_len": k, "speculative_model": draft_source,
                       "eagle3_one_model": True}
        aux = trained_aux_layers(pair_version)
        if aux:
            speculative["eagle3_layers_to_capture"] = [i - 1 for i in aux]
    elif config.method is SpecMethod.MTP:
        # a one-layer target (DeepSeek-V3/R1) runs MTP-Eagle: the one layer drafts all k tokens
        # (llm_args.py MTPDecodingConfig.spec_dec_mode with use_mtp_vanilla false); more layers: k = layers
        speculative = {"decoding_type": "MTP", "num_nextn_predict_layers": k, "use_mtp_vanilla": False}
    else:
        # a private pool per request, oldest match first, like vLLM's prompt lookup (ngram.py
        # NGramPoolManager: the public pool, shared by all requests, is the default)
        speculative = {"decoding_type": "NGram", "max_draft_len": k, "is_public_pool": False,
                       "is_use_oldest": True, "is_keep_all": True}
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


# ---------------------------------------------------------------------------------------------
# Read back (registry/deploy/read_back.py): the written files as TensorRT-LLM 1.2's LLM API reads them.

DECODING_TYPES = {"DraftTarget": "draft_model", "Eagle": "eagle3", "MTP": "mtp", "NGram": "ngram"}


def read_back(export: Export, files: dict[str, Any]) -> list:
    """What trtllm-serve will run: the target of trtllm-serve.sh's exec line and trtllm-config.yaml's
    speculative_config as llm_args.py's DecodingBaseConfig.from_dict reads it: decoding_type, k
    (max_draft_len; num_nextn_predict_layers for MTP), for an EAGLE-3 head the layers it captures
    (eagle3_layers_to_capture are layer outputs, so id + 1 in the registered numbering; without them
    its default {1, N // 2 - 1, N - 4}) and the head's d2t."""
    import yaml

    from specreg.registry.deploy import read_back as rb

    if "trtllm-config.yaml" not in files:
        return []
    where = "trtllm-config.yaml"
    argv = rb.exec_argv(files["trtllm-serve.sh"], "trtllm-serve.sh") if "trtllm-serve.sh" in files else []
    read = [rb.ReadValue("target", argv[1], "trtllm-serve.sh model")] if len(argv) > 1 else []
    speculative = (yaml.safe_load(files[where]) or {}).get("speculative_config") or {}
    decoding = speculative.get("decoding_type")
    read.append(rb.ReadValue("method", DECODING_TYPES.get(decoding, decoding), f"{where} decoding_type {decoding}"))
    key = "num_nextn_predict_layers" if decoding == "MTP" else "max_draft_len"
    read.append(rb.ReadValue("k", rb.as_int(speculative.get(key), where), f"{where} {key}"))
    if decoding == "Eagle" and export.pair_version.draft is not None:
        from specreg.core.heads.spec import read_target_shape

        target = read_target_shape(export.pair_version.target.path)
        captured = speculative.get("eagle3_layers_to_capture")
        if captured is None:
            layers = target.num_hidden_layers
            captured = [1, layers // 2 - 1, layers - 4]
        read.append(rb.ReadValue("aux_layers", sorted({int(i) + 1 for i in captured}),
                                 f"{where} eagle3_layers_to_capture {captured} (layer outputs: id + 1)"))
        model = speculative.get("speculative_model")
        folder = Path(model) if model and Path(model).is_dir() else Path(export.pair_version.draft.path)
        head = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        draft_vocab = head.get("draft_vocab_size") or (head.get("transformer_layer_config") or head).get("vocab_size")
        read.append(rb.ReadValue("vocab_map", rb.vocab_map(rb.d2t_in(folder, draft_vocab, f"{where} {folder}")),
                                 f"{where} speculative_model {folder} d2t"))
    return read
