"""vLLM 0.33: `vllm serve TARGET --speculative-config JSON` (vllm-serve.sh, and the same JSON in
vllm-speculative-config.json), its alert expressions and its metrics reader.

Facts from the released vllm 0.33.0 wheel (tests/engines runs the exports through it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specreg.errors import EngineRefusal, SpecregError, UsageError
from specreg.registry.deploy.engines.common import (DRAFT_LAW_METHODS, Export, mtp_refusal, no_head_layout,
                                                    no_model_files, registered_sources, served_draft_sampling,
                                                    served_dtype)
from specreg.registry.store.entities import PairVersion, SpecMethod

ENGINE = "vllm"
VERSIONS = ("0.33",)
SCHEMA = "vllm-0.33.json"
FILES = ("vllm-serve.sh", "vllm-speculative-config.json")
WRITES_MODELS = False
WRITES_LOCK = True
# what it needs nothing of its own for: the shared defaults (engines.EngineModule)
sources, head_layout, write_models = registered_sources, no_head_layout, no_model_files

# --max-num-seqs; also the end of the k=0 range of a batch cutoff
OPTIONS: dict[str, Any] = {"max_num_seqs": None}

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
MAX_POSITION_DIGITS = 3  # speculative depths are tens of tokens at most


def check_options(opts: dict[str, Any]) -> None:
    if opts["max_num_seqs"] is not None:
        try:
            opts["max_num_seqs"] = int(opts["max_num_seqs"])
        except (TypeError, ValueError) as exc:
            raise UsageError(f"export option has a bad value: {exc}") from None
        if opts["max_num_seqs"] < 1:
            raise UsageError(f"export option max_num_seqs={opts['max_num_seqs']} must be >= 1")


def baseline_engine(opts: dict[str, Any]) -> str | None:
    return ENGINE


MEDUSA_REFUSAL = "vLLM 0.33 has no medusa method (vllm/config/speculative.py:74-82 SpeculativeMethod)"
# vllm/config/speculative.py:407 SpeculativeConfig has no token-tree field: eagle3 and mtp draft a chain
TREE_REFUSAL = ("the registered candidate tree is static; vLLM 0.33's eagle3 and mtp draft a chain "
                "(vllm/config/speculative.py:407 SpeculativeConfig has no token-tree field)")


SUFFIX_CUTOFF_REFUSAL = (
    "vLLM 0.33 runs suffix decoding on its V1 model runner only (vllm/config/vllm.py:3067-3068 lists it among "
    "what V2 does not support), and V1 drops num_speculative_tokens_per_batch_size for it, falling back to "
    "the static k at every batch size (config/vllm.py:1088-1108 _maybe_disable_dynamic_sd_for_v1): "
    "speculation would not be off above the cutoff; register the pair without max_batch_size_for_speculation")


SUFFIX_SCHEDULE_REFUSAL = (
    "the engine baseline's concurrency tiers turn speculation off at batch sizes {off} (the draft slowed them "
    "down), but vLLM 0.33 runs suffix decoding on its V1 model runner only and V1 drops "
    "num_speculative_tokens_per_batch_size for it (vllm/config/vllm.py:1088-1108 _maybe_disable_dynamic_sd_for_v1): "
    "it would speculate at every batch size; serve it below those batch sizes (--option max_num_seqs) or "
    "measure again")


BLOCK_D2T_REFUSAL = (
    "the head carries a d2t tensor while its draft vocabulary is the target's ({vocab} ids): vLLM 0.33 then builds "
    "no draft_id_to_target_id parameter and its weight loader raises on the d2t it renames to one "
    "(model_executor/models/qwen3_dflash.py:769-775, 863-864; qwen3_dspark.py:262-268, 322-323); save the head "
    "without d2t")


def refusal(pair_version: PairVersion) -> str | None:
    if pair_version.config.method is SpecMethod.MEDUSA:
        return MEDUSA_REFUSAL
    if pair_version.config.method is SpecMethod.SUFFIX and pair_version.config.max_batch_size_for_speculation:
        return SUFFIX_CUTOFF_REFUSAL
    head = pair_version.config.head or {}
    if (pair_version.config.method in (SpecMethod.DFLASH, SpecMethod.DSPARK) and head.get("has_vocab_map")
            and head.get("draft_vocab_size") == head.get("target_vocab_size")):
        return BLOCK_D2T_REFUSAL.format(vocab=head.get("target_vocab_size"))
    if pair_version.config.tree is not None and pair_version.config.method.has_head:
        return TREE_REFUSAL
    if pair_version.config.method in (SpecMethod.EAGLE3, SpecMethod.PEAGLE):
        return head_refusal(pair_version)
    return mtp_refusal(pair_version)


def head_refusal(pair_version: PairVersion) -> str | None:
    """Why vLLM 0.33 cannot build or load this EAGLE-3 / P-EAGLE head from its registered folder
    (None: it can), from the head as vLLM reads it (specreg.core.heads.eagle3_variants): DeepSeek
    layers of a model_type vLLM rewrites into its MTP drafter (eagle3_mla.vllm_model_type_refusal),
    or an fc sized for another number of target states than its fc.weight reads (num_aux_hidden_states,
    else eagle_config's ids, else 3, never the top-level ids)."""
    from specreg.core.heads import read_head
    from specreg.core.heads.eagle3_mla import vllm_model_type_refusal
    from specreg.core.heads.eagle3_variants import read_eagle3_variant

    variant = read_eagle3_variant(pair_version.draft.path)
    if variant.layer_kind == "deepseek_v2":
        reason = vllm_model_type_refusal(variant.model_type, variant.architecture)
        if reason is not None:
            return reason
    return variant.fc_width_refusal(read_head(pair_version.draft.path, method=pair_version.config.method.value))


def check(pair_version: PairVersion, baselines: dict[str, Any] | None, opts: dict[str, Any]) -> None:
    """A suffix pair whose engine baseline measured speculation off at some batch size is refused: V1
    would speculate there anyway (SUFFIX_SCHEDULE_REFUSAL), unless max_num_seqs keeps them away."""
    measured = ((baselines or {}).get("engine_baseline") or {}).get("speculation_schedule")
    if pair_version.config.method is not SpecMethod.SUFFIX or not measured:
        return
    ceiling = opts["max_num_seqs"]
    off = [f"{start}-{end}" for start, end, depth in measured if depth == 0 and (ceiling is None or start <= ceiling)]
    if off:
        raise EngineRefusal(f"{pair_version.label} is a suffix pair: "
                            + SUFFIX_SCHEDULE_REFUSAL.format(off=", ".join(off)))


def context(export: Export) -> dict[str, Any]:
    speculative = speculative_config(export.pair_version, export.draft_source, export.opts, export.baselines)
    lines = command(export.target_source, export.pair_version.target.revision, speculative, export.served_name,
                    export.opts, served_dtype(export))
    return {"speculative_config": speculative, "vllm_command": lines,
            "vllm_argv": [word for line in lines for word in line]}


def speculative_config(pair_version: PairVersion, draft_source: str | None, opts: dict[str, Any],
                       baselines: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dict vLLM 0.33 takes as --speculative-config; ``baselines`` (the export's, with the vLLM
    engine baseline merged in) give the per-batch schedule its tiers measured."""
    config = pair_version.config
    k = config.num_speculative_tokens
    speculative: dict[str, Any] = {"method": config.method.value, "num_speculative_tokens": k}
    if config.method is SpecMethod.PEAGLE:
        # vLLM serves a P-EAGLE head as eagle3 with parallel drafting (transformers_utils/configs/speculators/
        # base.py:133-134 says so only for `vllm serve HEAD`); without the key it would draft the head one token
        # a forward and skip its mask_hidden (model_executor/models/llama_eagle3.py:433-441). parallel_drafting
        # is SpeculativeConfig's own field (config/speculative.py:511); the mask token it reads from the head's
        # config (pard_token, v1/spec_decode/llm_base_proposer.py:355-381)
        speculative.update(method="eagle3", parallel_drafting=True)
    if config.method in (SpecMethod.DRAFT_MODEL, SpecMethod.EAGLE3, SpecMethod.DFLASH, SpecMethod.DSPARK,
                         SpecMethod.PEAGLE):
        # eagle3, dflash, dspark: `model` is the head; vLLM builds its draft ModelConfig with the
        # target's tokenizer. Block drafters: k is the head's block less the anchor (or the whole block
        # with sample_from_anchor), as registration fixed it; verification stays vLLM's default
        # "standard" rejection sampling: the lossy "fly" and fake "synthetic" are never written
        # (vllm/config/speculative.py:562-569)
        speculative["model"] = draft_source
        speculative["draft_tensor_parallel_size"] = opts["draft_tensor_parallel_size"]
        if pair_version.draft.revision:
            speculative["revision"] = pair_version.draft.revision
    elif config.method is SpecMethod.MTP:
        # No `model`: vLLM drafts with the target's own MTP layers, building the draft ModelConfig from
        # the target's path but with the speculative config's `revision` (None: the default branch;
        # vllm/config/speculative.py SpeculativeConfig.revision and __post_init__), so pin it too.
        if pair_version.target.revision:
            speculative["revision"] = pair_version.target.revision
    elif config.method is SpecMethod.SUFFIX:
        # every setting written, defaults too: the export serves what was validated, whatever a later
        # vLLM defaults to (vllm/config/speculative.py:538-556 SpeculativeConfig.suffix_decoding_*)
        speculative.update(config.suffix.vllm_keys())
    else:
        if config.prompt_lookup_min is not None:
            speculative["prompt_lookup_min"] = config.prompt_lookup_min
        if config.prompt_lookup_max is not None:
            speculative["prompt_lookup_max"] = config.prompt_lookup_max
    if config.method in DRAFT_LAW_METHODS:
        # how the baselines' sampled records drafted, written even when it is vLLM's default "greedy" (the
        # argmax drafted, q one-hot in the rejection sampler: vllm/config/speculative.py:634-640). The
        # proposers of exactly these methods read it: v1/spec_decode/llm_base_proposer.py:257-260 and 477-506
        # (draft_model, eagle3 with P-EAGLE's parallel drafting, mtp, dflash) and model runner V2's
        # speculators (v1/worker/gpu/spec_decode/speculator.py:180-190, dspark/speculator.py builds on
        # DFlash's); n-gram and suffix decoding propose without a draft law and never read it
        speculative["draft_sample_method"] = served_draft_sampling(baselines)
    cutoff = config.max_batch_size_for_speculation
    measured = ((baselines or {}).get("engine_baseline") or {}).get("speculation_schedule")
    if config.method is SpecMethod.SUFFIX:
        # V1 falls back to the static k for suffix: no schedule is written (check refuses one that turns
        # speculation off)
        measured = None
    if measured:
        # what the engine baseline's tiers measured: off where the draft slowed a tier down, and
        # off above the registered cutoff too
        schedule = [list(row) for row in measured]
        if cutoff:
            schedule = [[start, min(end, cutoff), depth] for start, end, depth in schedule if start <= cutoff]
            schedule[-1][1] = cutoff  # the last measured range's k up to the cutoff, as vLLM carries it
            if opts["max_num_seqs"] is None or opts["max_num_seqs"] > cutoff:
                schedule.append([cutoff + 1, max(opts["max_num_seqs"] or 0, cutoff + 1), 0])
        speculative["num_speculative_tokens_per_batch_size"] = schedule
    elif cutoff:
        # Ranges are inclusive and vLLM carries the last range's k to every larger batch size
        # (build_dynamic_sd_schedule_lookup), so "off above the cutoff" needs a last range with k = 0.
        schedule = [[1, cutoff, k]]
        if opts["max_num_seqs"] is None or opts["max_num_seqs"] > cutoff:
            schedule.append([cutoff + 1, max(opts["max_num_seqs"] or 0, cutoff + 1), 0])
        speculative["num_speculative_tokens_per_batch_size"] = schedule
    return speculative


def command(target_source: str, revision: str | None, speculative: dict[str, Any], served_name: str,
            opts: dict[str, Any], dtype: str | None) -> list[list[str]]:
    lines = [["vllm", "serve", target_source], ["--speculative-config", json.dumps(speculative)]]
    if revision:
        lines.append(["--revision", revision])
    if dtype:
        lines.append(["--dtype", dtype])  # the baselines' (common.served_dtype), not vLLM's auto
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--tensor-parallel-size", str(opts["tensor_parallel_size"])])
    if opts["max_num_seqs"] is not None:
        lines.append(["--max-num-seqs", str(opts["max_num_seqs"])])
    # The served name becomes the `model_name` label of the metrics observe and the rules filter on.
    lines.append(["--served-model-name", served_name])
    lines.append(["--host", str(opts["host"]), "--port", str(opts["port"])])
    return lines


# ---------------------------------------------------------------------------------------------
# Metrics: counters, so live figures come from deltas between scrapes (live_metrics.live_figures).


def alert_expressions(selector: str, window: str,
                      counters: tuple[str, str, str] = (DRAFTS, DRAFT_TOKENS, ACCEPTED)) -> dict[str, str]:
    """PromQL of the live figures: alpha = rate(accepted) / rate(draft tokens), tau = 1 +
    rate(accepted) / rate(drafts). With no traffic the ratios are NaN and a comparison with NaN
    is false, so an idle server does not fire. ``counters``: (drafts, draft tokens, accepted),
    another engine's names for the same counters (llama.cpp's)."""
    drafts, draft_tokens, accepted = counters

    def rate(metric: str) -> str:
        return f"sum(rate({metric}{selector}[{window}]))"

    return {"acceptance_rate": f"{rate(accepted)} / {rate(draft_tokens)}",
            "mean_acceptance_length": f"1 + {rate(accepted)} / {rate(drafts)}"}


def read_metrics(samples, model_name: str | None, source: str) -> dict[str, Any]:
    """Counter totals of one vLLM scrape, summed over the remaining series (engines, ranks)."""
    from specreg.registry.deploy.live_metrics import select

    totals = {
        "drafts": sum(value for _, value in select(samples, DRAFTS, model_name, source)),
        "draft_tokens": sum(value for _, value in select(samples, DRAFT_TOKENS, model_name, source)),
        "accepted_tokens": sum(value for _, value in select(samples, ACCEPTED, model_name, source)),
    }
    per_position: dict[int, float] = {}
    for name, labels, value in samples:
        # Optional: older or differently configured engines do not export it.
        if name == ACCEPTED_PER_POS and (model_name is None or labels.get("model_name") == model_name):
            position = draft_position(labels.get("position"), source)
            per_position[position] = per_position.get(position, 0.0) + value
    totals["accepted_per_position"] = per_position
    return totals


def draft_position(label: str | None, source: str) -> int:
    """A per-position counter's position label as vLLM writes it (str(pos), pos in 0..k-1) -> pos.
    Anything else ("²" and "٣" pass str.isdigit, 5000 digits break int(), "-1", "1.5") -> one-line
    SpecregError: the page is not what vLLM serves."""
    if label is None or not (label.isascii() and label.isdigit() and len(label) <= MAX_POSITION_DIGITS):
        shown = repr(label)[:40] + ("..." if len(repr(label)) > 40 else "")
        raise SpecregError(f"{source}: {ACCEPTED_PER_POS} has position label {shown}, not a draft position "
                           f"(0 to {10 ** MAX_POSITION_DIGITS - 1}); is this vLLM's /metrics?")
    return int(label)


# ---------------------------------------------------------------------------------------------
# Read back (registry/deploy/read_back.py): the written files as vLLM 0.33 parses them.


def read_back(export: Export, files: dict[str, Any]) -> list:
    """What `vllm serve` will run from vllm-serve.sh (its exec line: the positional model, --revision,
    --speculative-config) and from vllm-speculative-config.json, as read_back.ReadValues."""
    from specreg.registry.deploy import read_back as rb

    if "vllm-serve.sh" not in files:
        return []
    argv = rb.exec_argv(files["vllm-serve.sh"], "vllm-serve.sh")
    read = serve_args(export, argv[2:] if argv[:2] == ["vllm", "serve"] else argv, "vllm-serve.sh")
    if "vllm-speculative-config.json" in files:
        read += speculative_values(export, json.loads(files["vllm-speculative-config.json"]),
                                   "vllm-speculative-config.json")
    return read


def serve_args(export: Export, argv: list[str], where: str) -> list:
    """ReadValues of `vllm serve` arguments (after `serve`): the positional model is the target (and
    never a speculators head folder: maybe_override_with_speculators would serve its
    verifier.name_or_path instead, vllm/transformers_utils/config.py:800-876), its --revision and the
    --speculative-config JSON, the last one given winning (argparse)."""
    from specreg.registry.deploy import read_back as rb

    flags = rb.flag_values(argv, {"--speculative-config", "--revision", "--model", "--dtype"})
    target = flags.get("--model", argv[0] if argv and not argv[0].startswith("-") else None)
    read = [rb.ReadValue("target", target, f"{where} model"),
            rb.ReadValue("target_revision", flags.get("--revision"), f"{where} --revision"),
            rb.ReadValue("dtype", flags.get("--dtype"), f"{where} --dtype")]
    if target is not None and (Path(target) / "config.json").is_file():
        try:
            served = json.loads((Path(target) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            served = {}
        if served.get("speculators_config") is not None:
            verifier = (served["speculators_config"].get("verifier") or {}).get("name_or_path")
            read.append(rb.ReadValue("target", verifier, f"{where} model {target} (a speculators head: vLLM serves "
                                                         f"its verifier.name_or_path)"))
    if "--speculative-config" in flags:
        try:
            speculative = json.loads(flags["--speculative-config"])
        except ValueError as exc:
            raise SpecregError(f"{where}: --speculative-config is not JSON ({exc})") from None
        read += speculative_values(export, speculative, f"{where} --speculative-config")
    return read


def speculative_values(export: Export, speculative: dict[str, Any], where: str) -> list:
    """ReadValues of a --speculative-config mapping: method, num_speculative_tokens and, for an
    EAGLE-3 head, the layers and vocabulary map vLLM builds from the head folder it names."""
    from specreg.registry.deploy import read_back as rb

    method = speculative.get("method")
    # eagle3 with parallel_drafting is how vLLM runs a P-EAGLE head: read as the registry names it
    read_as = "peagle" if method == "eagle3" and speculative.get("parallel_drafting") is True else method
    read = [rb.ReadValue("method", read_as, f"{where} method" + (" with parallel_drafting" if read_as != method
                                                                    else "")),
            rb.ReadValue("k", rb.as_int(speculative.get("num_speculative_tokens"), where),
                         f"{where} num_speculative_tokens")]
    if export.config.method in DRAFT_LAW_METHODS:
        # absent, vLLM drafts with its default (vllm/config/speculative.py:634)
        read.append(rb.ReadValue("draft_sampling", speculative.get("draft_sample_method", "greedy"),
                                 f"{where} draft_sample_method"))
    if method == "eagle3" and export.pair_version.draft is not None:
        read += eagle3_head_values(export, speculative.get("model"), f"{where} model")
    return read


def eagle3_head_values(export: Export, model: str | None, where: str) -> list:
    """The aux layers and vocabulary map vLLM 0.33 gives the EAGLE-3 head folder ``model`` (a hub id
    is read from the registered folder, whose files the export checked against their fingerprints).

    Layers: its config as vLLM loads it (a speculators config: transformer_layer_config with the
    top-level ids copied in only when set, speculators/algos.py update_eagle3), then each model runner's
    rule: the top-level eagle_aux_hidden_state_layer_ids, else eagle_config's ids (the V1 runner, on a
    CPU or with VLLM_USE_V2_MODEL_RUNNER=0: eagle_config["eagle_aux_hidden_state_layer_ids"],
    v1/worker/gpu_model_runner.py:5207-5219; the V2 runner, vLLM's default with Triton:
    eagle_config["layer_ids"], v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:113-150), else the
    target's default (2, N // 2, N - 3); sorted and unique (models/interfaces.py:1617). Vocabulary:
    d2t only when draft_vocab_size differs from the target's vocabulary (llama_eagle3.py:339-345)."""
    from specreg.core.heads.eagle3_checkpoint import default_aux_layer_ids
    from specreg.core.heads.spec import read_target_shape
    from specreg.registry.deploy import read_back as rb

    folder = Path(model) if model and Path(model).is_dir() else Path(export.pair_version.draft.path)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecregError(f"{where}: cannot read {folder / 'config.json'} ({exc})") from None
    if "speculators_model_type" in config:
        hf_config = dict(config.get("transformer_layer_config") or {})
        hf_config["draft_vocab_size"] = config.get("draft_vocab_size")
        if config.get("eagle_aux_hidden_state_layer_ids"):
            hf_config["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    else:
        hf_config = config
    target = read_target_shape(export.pair_version.target.path)
    eagle_config = hf_config.get("eagle_config") if isinstance(hf_config.get("eagle_config"), dict) else {}
    top = hf_config.get("eagle_aux_hidden_state_layer_ids")
    read = []
    for runner, key in (("V2 model runner (GPU default)", "layer_ids"),
                        ("V1 model runner (CPU, VLLM_USE_V2_MODEL_RUNNER=0)", "eagle_aux_hidden_state_layer_ids")):
        ids = top or eagle_config.get(key) or default_aux_layer_ids(target.num_hidden_layers)
        read.append(rb.ReadValue("aux_layers", sorted(set(ids)),
                                 f"{where} {folder / 'config.json'} aux layers as vLLM's {runner} reads them"))
    draft_vocab = hf_config.get("draft_vocab_size") or hf_config.get("vocab_size")
    ids = rb.d2t_in(folder, draft_vocab, f"{where} {folder}") if draft_vocab != target.vocab_size else None
    read.append(rb.ReadValue("vocab_map", rb.vocab_map(ids), f"{where} {folder} d2t (draft_vocab_size "
                                                             f"{draft_vocab}, target vocabulary {target.vocab_size})"))
    return read
