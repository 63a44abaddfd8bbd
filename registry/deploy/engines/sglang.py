"""SGLang 0.5.23: `python -m sglang.launch_server` (sglang-launch.sh), its alert expressions and
its metrics reader.

Facts from the released sglang 0.5.23 wheel (tests/engines runs the exports through it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specreg.errors import SpecregError
from specreg.registry.deploy.engines.common import (Export, accept_options, mtp_family, mtp_refusal, no_model_files,
                                                    point_mass_check, registered_sources, served_dtype,
                                                    trained_aux_layers)
from specreg.registry.deploy.export_files import Link
from specreg.registry.store.entities import PairVersion, SpecMethod

ENGINE = "sglang"
VERSIONS = ("0.5.23",)
SCHEMA = "sglang-0.5.23.json"
FILES = ("sglang-launch.sh",)
WRITES_MODELS = False
WRITES_LOCK = True
# what it needs nothing of its own for: the shared defaults (engines.EngineModule)
check_options, sources, write_models = accept_options, registered_sources, no_model_files
# SGLang 0.5.23 drafts the top-1 and verifies target-only (q a point mass) unless
# --speculative-use-rejection-sampling (off by default; EAGLE top-k 1 only), which these exports do not write
check = point_mass_check(
    "SGLang 0.5.23 as exported drafts the top-1 (sglang/srt/speculative/eagle_worker_v2.py:1085 fast_topk; DFlash "
    "greedy tokens, dflash_worker_v2.py:500-505) and verifies target-only with a zero draft law (eagle_utils.py:718, "
    "745-749 tree_speculative_sampling_target_only): it drafts from q only under --speculative-use-rejection-sampling "
    "(off by default, sglang/srt/arg_groups/fields/spec.py:117-119), which these exports do not write")

OPTIONS: dict[str, Any] = {}

ACCEPT_LENGTH = "sglang:spec_accept_length"
ACCEPT_RATE = "sglang:spec_accept_rate"


def baseline_engine(opts: dict[str, Any]) -> str | None:
    return ENGINE


MEDUSA_REFUSAL = ("SGLang 0.5.23 has no Medusa algorithm (sglang/srt/speculative/spec_info.py:39-47 "
                  "SpeculativeAlgorithm)")
NGRAM_REFUSAL = (
    "SGLang 0.5.23's NGRAM drafts a token tree (--speculative-num-draft-tokens nodes, BFS breadth 1-10) from one "
    "corpus shared by all requests (sglang/srt/speculative/ngram_worker.py:114-123 builds a single NgramCorpus "
    "of --speculative-ngram-capacity), matching suffixes of up to --speculative-ngram-max-trie-depth tokens with "
    "no minimum; prompt_lookup_min/max have no counterpart, so the validated baselines would not describe what it "
    "serves; use vllm or trtllm")
TREE_REFUSAL = ("the registered candidate tree is static; SGLang 0.5.23's EAGLE drafts a dynamic top-k tree "
                "(--speculative-eagle-topk, sglang/srt/arg_groups/fields/spec.py:62) and has no static-tree flag")


SUFFIX_REFUSAL = ("SGLang 0.5.23 has no suffix decoding: its built-in --speculative-algorithm values are DFLASH, "
                  "UNO, DSPARK, EAGLE, EAGLE3, FROZEN_KV_MTP, STANDALONE, NGRAM and NONE "
                  "(sglang/srt/speculative/spec_info.py:39-47 SpeculativeAlgorithm)")


PEAGLE_REFUSAL = ("SGLang 0.5.23 has no parallel drafting of an EAGLE-3 head: its EAGLE3 worker runs one draft "
                  "forward per step, each fed the previous step's tokens (sglang/srt/speculative/eagle_worker_v2.py:"
                  "808-830 draft_forward), no algorithm reads a mask token or mask_hidden "
                  "(sglang/srt/speculative/spec_info.py:39-47 SpeculativeAlgorithm), and it cannot load the "
                  "speculators layout; as EAGLE3 it would draft other tokens than the validated ones")


def refusal(pair_version: PairVersion) -> str | None:
    config = pair_version.config
    if config.method is SpecMethod.MEDUSA:
        return MEDUSA_REFUSAL
    if config.method is SpecMethod.PEAGLE:
        return PEAGLE_REFUSAL
    if config.method is SpecMethod.NGRAM:
        return NGRAM_REFUSAL
    if config.method is SpecMethod.SUFFIX:
        return SUFFIX_REFUSAL
    if config.tree is not None and config.method.has_head:
        return TREE_REFUSAL
    if config.method is SpecMethod.EAGLE3:
        return eagle3_refusal(pair_version)
    if config.method in (SpecMethod.DFLASH, SpecMethod.DSPARK):
        return block_refusal(pair_version)
    reason = mtp_refusal(pair_version)
    if reason is None and config.method is SpecMethod.MTP and mtp_family(pair_version) != "deepseek":
        # sglang/srt/configs/model_config.py:1032-1036 turns DeepseekV3/V32ForCausalLM drafts into their
        # NextN model; the other families' NEXTN paths were not checked here
        reason = (f"its NEXTN/MTP drafting is checked here for DeepSeek-family targets only "
                  f"(sglang/srt/configs/model_config.py:1032-1036), not {mtp_family(pair_version)}")
    return reason


def context(export: Export) -> dict[str, Any]:
    # ngram, suffix and peagle have no SGLang command (refusal above); the key stays, None, for user templates
    if export.config.method in (SpecMethod.NGRAM, SpecMethod.SUFFIX, SpecMethod.PEAGLE):
        return {"sglang_command": None}
    draft: str | dict | None = export.draft_source
    if export.config.method is SpecMethod.EAGLE3:
        draft = {"export_dir": HEAD_DIR}  # the layout this export writes beside the script (head_layout)
    return {"sglang_command": command(export.pair_version, export.target_source, draft, export.served_name,
                                      export.opts, served_dtype(export))}


def command(pair_version: PairVersion, target_source: str, draft_source: str | dict | None, served_name: str,
            opts: dict[str, Any], dtype: str | None) -> list[list[str]]:
    k = pair_version.config.num_speculative_tokens
    lines = [["python", "-m", "sglang.launch_server"], ["--model-path", target_source]]
    if pair_version.target.revision:
        lines.append(["--revision", pair_version.target.revision])
    if dtype:
        lines.append(["--dtype", dtype])  # the baselines' (common.served_dtype), not SGLang's auto
    # NEXTN (MTP) is SGLang's alias of EAGLE whose draft defaults to the target itself.
    method = pair_version.config.method
    algorithm = {SpecMethod.DRAFT_MODEL: "STANDALONE", SpecMethod.EAGLE3: "EAGLE3", SpecMethod.MTP: "NEXTN",
                 SpecMethod.DFLASH: "DFLASH", SpecMethod.DSPARK: "DSPARK"}[method]
    lines.append(["--speculative-algorithm", algorithm])
    if draft_source is not None:
        lines.append(["--speculative-draft-model-path", draft_source])
        if pair_version.draft.revision:
            lines.append(["--speculative-draft-model-revision", pair_version.draft.revision])
    # a block drafter drafts its block in one step (SGLang forces num_steps 1 for DFLASH and DSPARK,
    # sglang/srt/arg_groups/speculative_hook.py:329-349, 755-766)
    lines.append(["--speculative-num-steps", str(1 if (pair_version.config.head or {}).get("block") else k)])
    lines.append(["--speculative-eagle-topk", "1"])
    # SGLang counts the verified root token among the draft tokens: with top-k 1 that is k + 1 (DFLASH:
    # the block size, speculative_hook.py:364-385; DSPARK: gamma + 1, speculative_hook.py:822-839).
    lines.append(["--speculative-num-draft-tokens", str(k + 1)])
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--tp-size", str(opts["tensor_parallel_size"])])
    # /metrics (sglang:spec_accept_length / _rate, read by the alert rules and observe) is off by default.
    lines.append(["--enable-metrics"])
    lines.append(["--served-model-name", served_name])
    lines.append(["--host", str(opts["host"]), "--port", str(opts["port"])])
    return lines


# ---------------------------------------------------------------------------------------------
# EAGLE-3: SGLang 0.5.23 has no reader for the speculators layout (no model_type: its get_config ->
# transformers AutoConfig raises before any weight loads). It loads the original EAGLE-3 layout:
# architectures LlamaForCausalLMEagle3 (sglang/srt/models/llama_eagle3.py:272, EntryClass at 387),
# model_type llama, the transformer fields at the top level, the aux ids in eagle_config
# (model_runner_components/spec_aux_hidden_state.py:184-196 reads eagle_config only). Its weight
# loader takes the speculators tensor names as they are (llama_eagle3.py:325-384: layers.0.*, fc,
# norm, lm_head, d2t), so the layout is a new config.json beside links to the head's own files. A
# head with DeepSeek (MLA) layers is Eagle3DeepseekV2ForCausalLM (kimi_k25_eagle3.py:315, EntryClass
# at 523) with the head's DeepSeek model_type; its loader maps layers.0.* to midlayer.* and fuses
# q_a_proj with kv_a_proj_with_mqa (kimi_k25_eagle3.py:428-500).

HEAD_DIR = "sglang-eagle3-head"
# Targets whose SGLang class captures aux id v at the input of layer v + 1 (i.e. layer v's output), the
# rule the translation below relies on; other classes differ (gpt_oss.py:1347-1350 keeps ids that reach
# the last layer as they are), so their heads are refused until checked.
PLUS_ONE_CAPTURE = {
    "LlamaForCausalLM": "sglang/srt/models/llama.py:929-941",
    "MistralForCausalLM": "sglang/srt/models/mistral.py:33 (LlamaForCausalLM's)",
    "Qwen2ForCausalLM": "sglang/srt/models/qwen2.py:781-794",
    "Qwen3ForCausalLM": "sglang/srt/models/qwen3.py:778-791",
}


def sglang_aux_ids(aux: tuple[int, ...]) -> list[int]:
    """The head's trained ids (vLLM's numbering: the state entering layer i) as SGLang's eagle_config
    ids: SGLang captures id v at the input of layer v + 1 (llama.py:939-941, the loop at 486-492)."""
    return [i - 1 for i in aux]


def eagle3_refusal(pair_version: PairVersion) -> str | None:
    """Why SGLang cannot load this EAGLE-3 head in the layout head_layout writes, or capture the
    target states it was trained on (None: it can)."""
    if pair_version.config.tree is not None:
        return TREE_REFUSAL
    aux = trained_aux_layers(pair_version)
    if not aux:
        return "the registration records no aux layer ids for the head (config.head.fit.aux_layer_ids)"
    architecture = pair_version.target.fingerprint.architecture
    if architecture not in PLUS_ONE_CAPTURE:
        return (f"which target states SGLang 0.5.23 captures for an EAGLE-3 head depends on the target's model class "
                f"(set_eagle3_layers_to_capture); it is checked for {', '.join(PLUS_ONE_CAPTURE)}, not {architecture}")
    layers = target_layers(pair_version)
    if max(aux) >= layers:
        return (f"the head reads the state after the target's last layer (aux id {max(aux)} of {list(aux)}, "
                f"{layers} layers); SGLang captures layer inputs inside its layer loop only "
                f"({PLUS_ONE_CAPTURE[architecture]}, llama.py:486-492)")
    from specreg.core.heads.eagle3_variants import read_eagle3_variant

    variant = read_eagle3_variant(pair_version.draft.path)  # either layout: speculators' or the original
    if variant.logit_scale <= 0:
        return LOGIT_SCALE_REFUSAL.format(scale=variant.logit_scale)
    if variant.layer_kind not in HEAD_CLASSES:
        return (f"the head's layer is {variant.model_type!r}; SGLang 0.5.23's EAGLE-3 heads are "
                f"LlamaForCausalLMEagle3 (sglang/srt/models/llama_eagle3.py:272) and, with DeepSeek MLA layers, "
                f"Eagle3DeepseekV2ForCausalLM ({MLA_MODEL}:315)")
    if variant.layer_kind == "deepseek_v2":
        return mla_refusal(variant)
    if variant.num_layers != 1:
        return (f"the head has {variant.num_layers} decoder layers; SGLang 0.5.23 norms each layer "
                f"after the first with a hidden_norm (sglang/srt/models/llama_eagle3.py:104-105) where vLLM and the "
                f"head's own layers use their input_layernorm")
    if variant.norm_before_residual:
        return ("the head was trained with norm_before_residual; SGLang's first EAGLE-3 layer keeps the un-normed "
                "hidden state as the residual (sglang/srt/models/llama_eagle3.py:96-99)")
    return None


# SGLang computes the head's logits without its logit_scale; with --speculative-eagle-topk 1 and no rejection
# sampling (this export) it drafts their argmax, which a positive scale leaves as vLLM's scaled logits have it
LOGIT_SCALE_REFUSAL = ("the head's logit_scale is {scale:g}: vLLM drafts from its logits scaled by it, SGLang 0.5.23 "
                       "computes them unscaled (sglang/srt/models/llama_eagle3.py:320 and kimi_k25_eagle3.py:369 give "
                       "LogitsProcessor no logit_scale, layers/logits_processor.py:462, 1008-1009) and drafts their "
                       "argmax (sglang/srt/speculative/eagle_worker_v2.py:866-879), which a scale of 0 or below "
                       "changes")
# SGLang 0.5.23's EAGLE-3 head classes by the layers vLLM builds (specreg.core.heads.eagle3_variants)
MLA_MODEL = "sglang/srt/models/kimi_k25_eagle3.py"
HEAD_CLASSES = {"llama": "LlamaForCausalLMEagle3", "deepseek_v2": "Eagle3DeepseekV2ForCausalLM"}


def mla_refusal(variant) -> str | None:
    """Why SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM (kimi_k25_eagle3.py) would run a DeepSeek-layer
    head otherwise than vLLM 0.33's deepseek_eagle3.py, which the runtime validated (None: it runs it
    the same: MLA over cat([input_layernorm(embeds), hidden_norm(hidden)]), dense MLP, fc_norm,
    norm_output, the residual the un-normed hidden, no input_norm)."""
    fields = variant.layer_fields
    rope = fields.get("rope_parameters") or fields.get("rope_scaling") or {}
    if variant.num_layers != 1:
        return (f"the head has {variant.num_layers} decoder layers; SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM builds "
                f"one (\"EAGLE3 currently only supports 1 layer\", {MLA_MODEL}:243-244)")
    if "q_lora_rank" in fields and fields["q_lora_rank"] is None:
        return (f"the head's attention has no q_lora_rank (q_proj); SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM "
                f"requires one (\"Eagle3 MLA layer requires q_lora_rank\", {MLA_MODEL}:114-117)")
    if variant.norm_before_residual:
        return (f"the head was trained with norm_before_residual; SGLang's Eagle3DeepseekV2ForCausalLM keeps the "
                f"un-normed hidden state as the residual ({MLA_MODEL}:159)")
    if fields.get("rope_interleave") is False:
        return ("the head's config sets rope_interleave false; SGLang 0.5.23 then rotates its rope dimensions in "
                "halves (sglang/srt/models/deepseek_v2.py:2166), vLLM 0.33 always in interleaved pairs "
                "(model_executor/models/deepseek_v2.py:1122-1127, is_neox_style=False)")
    if (rope.get("rope_type") or rope.get("type") or "default") != "default" and rope.get("attention_factor") == 1.0:
        return ("the head's rope sets attention_factor 1.0: vLLM 0.33 runs it as deepseek_llama_scaling, without the "
                "softmax mscale (model_executor/models/deepseek_v2.py:1115-1136), SGLang 0.5.23 as deepseek_yarn "
                "with it (sglang/srt/models/deepseek_v2.py:2065-2066, 2177-2178)")
    return None


def block_refusal(pair_version: PairVersion) -> str | None:
    """Why SGLang 0.5.23 cannot serve this DFlash / DSpark head as registered (None: it can)."""
    block = (pair_version.config.head or {}).get("block") or {}
    if pair_version.config.head.get("layout") == "speculators":
        return ("SGLang 0.5.23 reads a block drafter's config through transformers (the speculators layout has no "
                "model_type: get_config raises) and its target layers from dflash_config.target_layer_ids "
                "(sglang/srt/speculative/dflash_utils.py:657-660); register the head in its engine-native layout")
    if pair_version.config.method is SpecMethod.DSPARK and not block.get("sample_from_anchor"):
        return ("the head drafts block_size - 1 tokens after a bonus anchor; SGLang 0.5.23's DSPARK drafts gamma = "
                "block_size from the anchor (sglang/srt/speculative/dspark_components/dspark_config.py:29-31, "
                "speculative_hook.py:806-822)")
    if pair_version.config.method is SpecMethod.DSPARK and not names_markov_head_type(head_config(pair_version)):
        return ("the head's config names no markov_head_type (registration, as vLLM, reads it as 'vanilla'); SGLang "
                "0.5.23 refuses such a DSpark draft: \"DSpark requires markov_head_type when markov_rank > 0\" "
                "(sglang/srt/speculative/dspark_components/dspark_config.py:253-268)")
    architecture = pair_version.target.fingerprint.architecture
    if architecture not in PLUS_ONE_CAPTURE:
        return (f"which target states SGLang 0.5.23 captures for a block drafter depends on the target's model class "
                f"(set_dflash_layers_to_capture); it is checked for {', '.join(PLUS_ONE_CAPTURE)}, not {architecture}")
    return None


def names_markov_head_type(config: dict[str, Any]) -> bool:
    """Whether SGLang's parse_dspark_draft_config finds a markov_head_type, or needs none: the prefixed
    dspark_* keys, dflash_config / dspark_config, text_config, the top level (dspark_config.py:206-268)."""
    prefixed = ("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids",
                "dspark_markov_head_type")
    if any(config.get(key) is not None for key in prefixed):
        return True
    places = [config, *(config.get(key) for key in ("dflash_config", "dspark_config", "text_config"))]
    return any(isinstance(place, dict) and place.get("markov_head_type") is not None for place in places)


def head_config(pair_version: PairVersion) -> dict[str, Any]:
    """The head's own config.json (speculators layout) from its registered directory."""
    path = Path(pair_version.draft.path) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecregError(f"cannot read the EAGLE-3 head's config {path}: {exc}") from None


def target_layers(pair_version: PairVersion) -> int:
    from specreg.core.heads.spec import read_target_shape

    return read_target_shape(pair_version.target.path).num_hidden_layers


def head_layout(export: Export) -> dict[str, str | Link] | None:
    """The EAGLE-3 head as SGLang 0.5.23 loads it: {name in HEAD_DIR: config.json text, or a Link to
    the head's file of that name where the engine finds the head}. None for other pair kinds."""
    pair_version = export.pair_version
    if pair_version.config.method is not SpecMethod.EAGLE3:
        return None
    from specreg.registry.deploy.lock import list_model_files

    if not Path(export.draft_source).is_absolute():
        raise SpecregError(f"{pair_version.label}: the SGLang EAGLE-3 layout links the head's files by absolute path, "
                           f"and {export.draft_source!r} is not one (--option model_source=path uses the path the "
                           f"head was registered from)")
    from specreg.core.heads.eagle3_variants import read_eagle3_variant

    speculators = head_config(pair_version)
    variant = read_eagle3_variant(pair_version.draft.path)
    # the decoder layer's fields: a speculators head's transformer_layer_config, or (the original layout
    # ModelOpt and SpecForge write) the head's own config, its eagle_config rewritten below
    architecture = HEAD_CLASSES[variant.layer_kind]
    model_type = variant.layer_fields["model_type"] if variant.layer_kind == "deepseek_v2" else "llama"
    config = {**variant.layer_fields}
    config.pop("eagle_aux_hidden_state_layer_ids", None)  # SGLang reads eagle_config's only
    # SGLang's Llama class sizes fc by num_aux_hidden_states before eagle_config's ids (llama_eagle3.py:156-161;
    # kimi_k25_eagle3.py:49-60 by the ids only): without it, by the registered ids below, as fc.weight reads them
    config.pop("num_aux_hidden_states", None)
    config.update({
        "architectures": [architecture], "model_type": model_type, "num_hidden_layers": 1,
        "draft_vocab_size": speculators.get("draft_vocab_size"), "tie_word_embeddings": False,
        "eagle_config": {"use_aux_hidden_state": True,
                         "eagle_aux_hidden_state_layer_ids": sglang_aux_ids(trained_aux_layers(pair_version))},
    })
    if speculators.get("target_hidden_size"):
        config["target_hidden_size"] = speculators["target_hidden_size"]
    if variant.norm_before_fc:
        config["eagle_config"]["norm_before_fc"] = True
    for flag in ("norm_output", "fc_norm"):  # read from the config (sglang/srt/models/llama_eagle3.py:185, 207)
        config.pop(flag, None)
        if getattr(variant, flag):
            config[flag] = True
    layout: dict[str, str | Link] = {"config.json": json.dumps(config, indent=2, sort_keys=True) + "\n"}
    for name in list_model_files(pair_version.draft.path):
        if name != "config.json":
            layout[name] = Link(str(Path(export.draft_source) / name))
    return {f"{HEAD_DIR}/{name}": value for name, value in layout.items()}


# ---------------------------------------------------------------------------------------------
# Metrics: gauges that already hold both figures over SGLang's own logging window.


def alert_expressions(selector: str, window: str) -> dict[str, str]:
    return {"acceptance_rate": f"avg({ACCEPT_RATE}{selector})",
            "mean_acceptance_length": f"avg({ACCEPT_LENGTH}{selector})"}


def read_metrics(samples, model_name: str | None, source: str) -> dict[str, Any]:
    """Gauge values of one SGLang scrape, averaged over the remaining series (e.g. DP ranks)."""
    from specreg.registry.deploy.live_metrics import select

    figures = {}
    for key, name in (("mean_acceptance_length", ACCEPT_LENGTH), ("acceptance_rate", ACCEPT_RATE)):
        series = select(samples, name, model_name, source)
        figures[key] = sum(value for _, value in series) / len(series)
    return figures


# ---------------------------------------------------------------------------------------------
# Read back (registry/deploy/read_back.py): the written files as SGLang 0.5.23 parses them.

ALGORITHMS = {"STANDALONE": "draft_model", "EAGLE3": "eagle3", "NEXTN": "mtp", "DFLASH": "dflash", "DSPARK": "dspark"}
# Algorithms that draft their block in one step: SGLang forces --speculative-num-steps to 1 and reads
# the draft length from the verify window alone (speculative_hook.py:329-385, 806-839)
ONE_STEP = {"DFLASH", "DSPARK"}


def read_back(export: Export, files: dict[str, Any]) -> list:
    """What sglang.launch_server will run from sglang-launch.sh (its ServerArgs flags: the last one
    given wins) and, for an EAGLE-3 head, from the head layout's config.json as SGLang reads it: the
    ids of eagle_config (spec_aux_hidden_state.py:184-196), each captured at the input of layer v + 1
    (PLUS_ONE_CAPTURE), or without ids the target class's default inputs (2, N // 2, N - 3)
    (llama.py:929-941); d2t from the weight file the layout links."""
    from specreg.registry.deploy import read_back as rb

    if "sglang-launch.sh" not in files:
        return []
    where = "sglang-launch.sh"
    argv = rb.exec_argv(files[where], where)
    flags = rb.flag_values(argv, {"--model-path", "--revision", "--dtype", "--speculative-algorithm",
                                  "--speculative-draft-model-path", "--speculative-num-steps",
                                  "--speculative-eagle-topk", "--speculative-num-draft-tokens"})
    algorithm = flags.get("--speculative-algorithm")
    read = [rb.ReadValue("target", flags.get("--model-path"), f"{where} --model-path"),
            rb.ReadValue("target_revision", flags.get("--revision"), f"{where} --revision"),
            rb.ReadValue("dtype", flags.get("--dtype"), f"{where} --dtype"),
            rb.ReadValue("method", ALGORITHMS.get(str(algorithm).upper(), algorithm),
                         f"{where} --speculative-algorithm {algorithm}")]
    if str(algorithm).upper() not in ONE_STEP:
        read.append(rb.ReadValue("k", rb.as_int(flags.get("--speculative-num-steps"), where),
                                 f"{where} --speculative-num-steps"))
    topk = rb.as_int(flags.get("--speculative-eagle-topk"), where)
    tokens = rb.as_int(flags.get("--speculative-num-draft-tokens"), where)
    if topk == 1 and tokens is not None:  # one chain: the verified root and k drafted tokens
        read.append(rb.ReadValue("k", tokens - 1, f"{where} --speculative-num-draft-tokens - 1"))
    draft = flags.get("--speculative-draft-model-path") or ""
    if export.config.method is SpecMethod.EAGLE3 and draft.startswith("$EXPORT_DIR/"):
        read += layout_values(export, files, draft.removeprefix("$EXPORT_DIR/"))
    elif export.config.method is SpecMethod.EAGLE3:
        read.append(rb.ReadValue("aux_layers", None, f"{where} --speculative-draft-model-path {draft} (not the "
                                                     f"head layout this export writes)"))
    return read


def layout_values(export: Export, files: dict[str, Any], folder: str) -> list:
    from specreg.registry.deploy import read_back as rb

    where = f"{folder}/config.json"
    try:
        config = json.loads(files[where])
    except (KeyError, ValueError) as exc:
        raise SpecregError(f"{where}: not the head layout's config ({exc})") from None
    eagle_config = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    layers = [v + 1 for v in ids] if ids else default_aux_layer_ids(target_layers(export.pair_version))
    read = [rb.ReadValue("aux_layers", sorted(set(layers)),
                         f"{where} eagle_config.eagle_aux_hidden_state_layer_ids {ids} (captured at layer v + 1)")]
    weights = sorted(Path(value) for name, value in files.items()
                     if name.startswith(f"{folder}/") and isinstance(value, Link) and name.endswith(".safetensors"))
    ids = rb.d2t_in(weights[0].parent, config.get("draft_vocab_size") or config.get("vocab_size"),
                    f"{folder}/{weights[0].name}") if weights else None
    read.append(rb.ReadValue("vocab_map", rb.vocab_map(ids), f"{folder} d2t"))
    return read


def default_aux_layer_ids(layers: int) -> tuple[int, ...]:
    from specreg.core.heads.eagle3_checkpoint import default_aux_layer_ids as default

    return default(layers)
