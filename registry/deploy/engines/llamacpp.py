"""llama.cpp's llama-server (llama-server.sh): a draft-model pair or an EAGLE-3 head served on CPU,
with the GGUF files it loads made from the registered files by llama.cpp's own
convert_hf_to_gguf.py (a head against its target: --target-model-dir), and a Python handle to
start and stop that server (llamacpp_server.py).

Facts from the llama.cpp this specreg builds (llamacpp_build: the source vendored by the
llama-cpp-python 0.3.36 sdist): the flags are those of common/arg.cpp, listed in
templates/engines/llamacpp-0.3.36.json and checked against the built binary's --help by the
tests. ``--spec-type draft-simple`` makes ``-md`` draft (without a type the draft model is
loaded and nothing is drafted); ``draft-eagle3`` runs an EAGLE-3 head from ``-md`` on the
target's layer inputs named by the GGUF's ``eagle3.target_layers`` (the head's
eagle_aux_hidden_state_layer_ids, copied by conversion/llama.py); ``--spec-draft-n-max`` is k;
``--spec-draft-p-min 0`` drafts every position greedily, as our runtime does (the server's own
default is 0 in this build, but it has changed between builds); ``--parallel`` (-np) is the number of slots (requests decoded
together). The long spelling of each flag is used (-m, -md, -np, -t, -a are its aliases).
Each completion's ``timings`` carries ``draft_n`` and ``draft_n_accepted`` when it drafted;
``--metrics`` serves /metrics with ``llamacpp:spec_decode_*`` counters (server-task.cpp).

An export with -o DIR writes DIR/gguf/target/ and DIR/gguf/draft/ (``write_models``) before the
lock is built, and the lock binds those files as each role's files (its ``layout`` gguf/<role>, as
for SGLang's EAGLE-3 head layout): they are what the server loads, and `specreg verify --target
DIR/gguf/target --draft DIR/gguf/draft` checks them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specreg.errors import SpecregError, UsageError
from specreg.registry.deploy.engines import llamacpp_build, vllm
from specreg.registry.deploy.engines.common import (Export, no_head_layout, point_mass_check, schedule_depth,
                                                    trained_aux_layers)
from specreg.registry.store.entities import PairVersion, SpecMethod

ENGINE = "llamacpp"
VERSIONS = (llamacpp_build.VERSION,)
SCHEMA = f"llamacpp-{llamacpp_build.VERSION}.json"
FILES = ("llama-server.sh",)
WRITES_MODELS = True  # GGUF files, made from the registered folders
WRITES_LOCK = True
# what it needs nothing of its own for: the shared defaults (engines.EngineModule)
head_layout = no_head_layout
check = point_mass_check(
    "llama.cpp drafts its draft sampler's top token (common/speculative.cpp:363 cur_p->data[0], a top-k 10 chain "
    "set up at :232-240) and accepts a draft while the target's sampled token equals it (common/sampling.cpp:696 "
    "common_sampler_sample_and_accept_n): q is a point mass")

# -np slots; -t threads (None: llama.cpp's own choice); GGUF type of the converted files
OPTIONS: dict[str, Any] = {"parallel": 1, "threads": None, "gguf_type": "f32"}
GGUF_DIR = "gguf"
ROLES = ("target", "draft")

DRAFTS = "llamacpp:spec_decode_num_drafts_total"
DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


def alert_expressions(selector: str, window: str) -> dict[str, str]:
    """PromQL of the live figures from llama-server's counters: vLLM's formulas on its names
    (tools/server/server-task.cpp writes the series without labels; Prometheus adds the target's)."""
    return vllm.alert_expressions(selector, window, (DRAFTS, DRAFT_TOKENS, ACCEPTED))


def baseline_engine(opts: dict[str, Any]) -> str | None:
    return ENGINE


def check_options(opts: dict[str, Any]) -> None:
    try:
        opts["parallel"] = int(opts["parallel"])
        if opts["threads"] is not None:
            opts["threads"] = int(opts["threads"])
    except (TypeError, ValueError) as exc:
        raise UsageError(f"export option has a bad value: {exc}") from None
    if opts["parallel"] < 1 or (opts["threads"] is not None and opts["threads"] < 1):
        raise UsageError("export options parallel and threads must be >= 1")
    if opts["gguf_type"] not in llamacpp_build.CONVERT_TYPES:
        raise UsageError(f"export option gguf_type={opts['gguf_type']!r} must be one of "
                         f"{', '.join(llamacpp_build.CONVERT_TYPES)}")


# Why llama.cpp would not serve a pair as it was validated, each with the line of the vendored
# llama.cpp source (llamacpp_build.source(): the llama-cpp-python 0.3.36 sdist) that decides it.
MEDUSA_REFUSAL = ("llama-server has no Medusa drafting: its --spec-type values are none, draft-simple, draft-eagle3, "
                  "draft-mtp, draft-dflash, draft-dspark and ngram-* (common/speculative.cpp:33-45)")
SUFFIX_REFUSAL = ("llama-server has no suffix decoding: its --spec-type values are none, draft-simple, draft-eagle3, "
                  "draft-mtp, draft-dflash, draft-dspark and ngram-* (common/speculative.cpp:33-45); its ngram-cache "
                  "and ngram-map-* keep n-gram tables, not suffix trees with their counts")
TREE_REFUSAL = ("the registered candidate tree cannot be served: llama.cpp's EAGLE-3 drafter proposes one chain, "
                "the top candidate at each position (common/speculative.cpp:808 cur_p->data[0].id); register the "
                "head without --tree")
PEAGLE_REFUSAL = ("llama-server has no parallel drafting of an EAGLE-3 head: its --spec-type values are none, "
                  "draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark and ngram-* "
                  "(common/speculative.cpp:33-45), and draft-eagle3 decodes one token a head forward, each fed the "
                  "previous draft and the head's pre-norm output (common/speculative.cpp:783-840); its converter has "
                  "no class for speculators' PEagleSpeculator (conversion/__init__.py:163-166 and conversion/llama.py:"
                  "25-28 name the EAGLE-3 ones only)")
# our MTP families (specreg.core.heads.mtp_checkpoint) whose layers llama.cpp builds a graph for
# (src/models/deepseek2.cpp, glm4-moe.cpp, mimo2.cpp, qwen3next.cpp, qwen35.cpp read n_layer_nextn)
MTP_FAMILIES = ("deepseek", "mimo", "qwen3_next", "qwen3_5")


def refusal(pair_version: PairVersion) -> str | None:
    """Why llama-server cannot serve ``pair_version`` as it was validated, or None."""
    method = pair_version.config.method
    if method is SpecMethod.DRAFT_MODEL:
        return None
    if method is SpecMethod.EAGLE3:
        return eagle3_refusal(pair_version)
    if method is SpecMethod.MEDUSA:
        return MEDUSA_REFUSAL
    if method is SpecMethod.PEAGLE:
        return PEAGLE_REFUSAL
    if method is SpecMethod.SUFFIX:
        return SUFFIX_REFUSAL
    if method is SpecMethod.DFLASH:
        return dflash_refusal(pair_version)
    if method is SpecMethod.DSPARK:
        return ("llama-server's draft-dspark conditions each Markov step on the previous slot's argmax, not on the "
                "token it drafted (src/models/dflash.cpp:347-348), so sampled drafts differ from the validated ones; "
                "its export is not written or checked yet")
    if method is SpecMethod.MTP:
        family = ((pair_version.config.head or {}).get("layout") or "").removeprefix("mtp:")
        if family not in MTP_FAMILIES:
            return (f"llama.cpp builds MTP layers only for DeepSeek, GLM-4-MoE, MiMo and Qwen3-Next/3.5 targets; on "
                    f"this one ({family or 'no MTP layers'}) llama-server's draft-mtp stops with \"context type MTP "
                    f"requested but model doesn't contain MTP layers\" (src/llama-context.cpp:3881-3884)")
    spec_type = "draft-mtp" if method is SpecMethod.MTP else "ngram-*"
    return (f"this export writes llama-server's separate draft model (--spec-type draft-simple), EAGLE-3 heads "
            f"(draft-eagle3) and DFlash heads (draft-dflash) only; its {method.value} drafting ({spec_type}) reads "
            f"other files and options that were not checked against our runtime")


def variant_refusal(head_path: str) -> str | None:
    """An EAGLE-3 variant our runtime ran as vLLM does that llama.cpp's converter or graph would not."""
    from specreg.core.heads.eagle3_variants import read_eagle3_variant

    variant = read_eagle3_variant(head_path)
    if variant.logit_scale <= 0:
        # a positive scale leaves the top candidate it drafts where vLLM's scaled logits have it
        return (f"the head's logit_scale is {variant.logit_scale:g}: vLLM drafts from its logits scaled by it; "
                f"llama.cpp's converter writes no logit_scale for an EAGLE-3 head (conversion/llama.py:74-104), its "
                f"graph applies lm_head alone (src/models/eagle3.cpp:295-304) and draft-eagle3 drafts the top "
                f"candidate (common/speculative.cpp:808), which a scale of 0 or below changes")
    if variant.num_layers != 1:
        return (f"the head has {variant.num_layers} decoder layers; llama.cpp's converter takes an EAGLE-3 head for "
                f"one with num_hidden_layers 1 only (conversion/llama.py:50, 216)")
    if variant.layer_kind == "deepseek_v2":
        return (f"the head's layer is deepseek_v2 ({variant.architecture}, MLA); llama.cpp's converter knows no such "
                f"architecture (conversion/__init__.py:163-166 maps its EAGLE-3 names to llama; "
                f"convert_hf_to_gguf.py:250-253 \"is not supported\") and its EAGLE-3 graph builds a Llama layer "
                f"(src/models/eagle3.cpp:78-97)")
    if variant.layer_kind != "llama":
        return (f"the head's layer is {variant.layer_kind} ({variant.architecture}); llama.cpp's EAGLE-3 graph builds "
                f"a Llama layer, no q_norm/k_norm (src/models/eagle3.cpp:78-97)")
    unread = [flag for flag in ("norm_output", "fc_norm") if getattr(variant, flag)]
    if unread:
        return (f"the head sets {' and '.join(unread)}; llama.cpp's EAGLE-3 reads norm_before_residual and "
                f"norm_before_fc only (src/models/eagle3.cpp:24-33), so it would draft otherwise than validated")
    return None


def dflash_refusal(pair_version: PairVersion) -> str | None:
    """A DFlash head llama.cpp would load otherwise than our runtime ran it, or not at all. Its
    converter writes dflash.target_layers as target_layer_ids + 1, the states entering those
    layers (conversion/qwen.py:735-738), as our runtime reads them; llama-server drafts a block of
    --spec-draft-n-max + 1 (the registered k + 1: the head's block) and reads slots 1.. of it
    (common/speculative.cpp:1205, 1290-1293)."""
    head = pair_version.config.head or {}
    block = head.get("block") or {}
    if head.get("layout") != "dflash":
        return ("llama.cpp's converter takes the engine-native DFlashDraftModel layout only (conversion/qwen.py:664), "
                "not speculators' DFlashSpeculator: register the head in that layout")
    if block.get("sample_from_anchor"):
        return ("the head drafts from its anchor slot; llama-server's draft-dflash reads slots 1.. of the block "
                "(common/speculative.cpp:1290-1293)")
    layers = target_layers_of(pair_version)
    if layers in (head.get("fit") or {}).get("aux_layer_ids", ()):
        return (f"the head reads layer {layers - 1}'s output, the target's last: llama.cpp reads it, our runtime does "
                f"not, so the head was never validated as llama-server would run it")
    return None


def target_layers_of(pair_version: PairVersion) -> int:
    from specreg.core.heads.spec import read_target_shape

    return read_target_shape(pair_version.target.path).num_hidden_layers


def eagle3_refusal(pair_version: PairVersion) -> str | None:
    """An EAGLE-3 head llama.cpp would load otherwise than our runtime ran it, or not at all."""
    from specreg.core.heads import read_head
    from specreg.core.heads.spec import read_target_shape
    from specreg.core.heads.vocabulary import read_vocab_map

    config = pair_version.config
    if config.tree is not None:
        return TREE_REFUSAL
    variant = variant_refusal(pair_version.draft.path)
    if variant is not None:
        return variant
    head = read_head(pair_version.draft.path, method="eagle3")
    layers = read_target_shape(pair_version.target.path).num_hidden_layers
    aux = list(((config.head or {}).get("fit") or {}).get("aux_layer_ids") or head.aux_layer_ids or ())
    if len(aux) != 3:
        return (f"the head reads {len(aux)} target layers {aux}; llama.cpp's EAGLE-3 needs exactly 3 "
                f"(src/models/eagle3.cpp:9-11, common/speculative.cpp:502-505)")
    if any(i > layers for i in aux):
        return (f"aux layer ids {aux} name a layer above the target's {layers}: llama-server aborts "
                f"(common/speculative.cpp:546-547 \"EAGLE3: target layer id exceeds target n_layer\")")
    vocab_map = read_vocab_map(head) if head.has_vocab_map else None
    if vocab_map is not None:
        target_vocab = read_target_shape(pair_version.target.path).vocab_size
        ids = vocab_map.draft_to_target
        outside = [t for t in ids if not 0 <= t < target_vocab]
        if outside:
            return (f"d2t maps draft ids to target ids {outside[:5]} outside the target's {target_vocab}: llama.cpp's "
                    f"converter refuses it (conversion/llama.py:346-347)")
        if len(set(ids)) != len(ids):
            return ("d2t maps two draft ids to one target id: llama.cpp's converter refuses it "
                    "(conversion/llama.py:348-349)")
    return None


def sources(pair_version: PairVersion, opts: dict[str, Any]) -> tuple[str, str | None]:
    """The GGUF folders, relative to the export folder (llama-server.sh runs from there): what
    `specreg verify --target/--draft` checks."""
    return f"{GGUF_DIR}/target", f"{GGUF_DIR}/draft" if pair_version.draft is not None else None


def gguf_file(role: str, opts: dict[str, Any]) -> str:
    return f"{GGUF_DIR}/{role}/{gguf_name(opts)}"


def gguf_name(opts: dict[str, Any]) -> str:
    return f"model-{opts['gguf_type']}.gguf"


def context(export: Export) -> dict[str, Any]:
    # every export renders every engine's keys (for user templates): decided by the method alone
    # here, the head's files are read by refusal() when the export is llama.cpp's
    if export.config.method not in (SpecMethod.DRAFT_MODEL, SpecMethod.EAGLE3, SpecMethod.DFLASH) \
            or export.draft_source is None:
        return {"llamacpp_command": None}
    name = gguf_name(export.opts)
    schedule = ((export.baselines or {}).get("engine_baseline") or {}).get("speculation_schedule")
    # llama-server has no per-batch switch: its slots (-np) are the batch it runs at most, so the
    # measured schedule's k at that many decides whether it drafts at all
    off = bool(schedule) and schedule_depth(schedule, int(export.opts["parallel"])) == 0
    draft = None if off else f"{export.draft_source}/{name}"
    return {"llamacpp_command": command(f"{export.target_source}/{name}", draft,
                                        export.config.num_speculative_tokens, export.opts, export.served_name,
                                        spec_type=spec_type(export.pair_version)),
            "llamacpp_schedule": schedule, "llamacpp_speculation_off": off}


def spec_type(pair_version: PairVersion) -> str:
    """llama-server's --spec-type for the pair's -md file: an EAGLE-3 head drafts from the target's
    layer inputs (draft-eagle3), a draft model on its own (draft-simple)."""
    return SPEC_TYPES.get(pair_version.config.method.value, "draft-simple")


# what reads the -md file beside the target, by the method registered (a draft model: draft-simple)
SPEC_TYPES = {"eagle3": "draft-eagle3", "dflash": "draft-dflash"}


def command(target_gguf: str, draft_gguf: str | None, k: int, opts: dict[str, Any], served_name: str,
            program: str = "llama-server", spec_type: str = "draft-simple") -> list[list[str]]:
    """llama-server's argument lines (long flag names): the target, the draft (``spec_type``:
    draft-simple, draft-eagle3 or draft-dflash) drafting k tokens greedily at every step (none without a
    draft), the slots, /metrics, the name and the address."""
    lines = [[program], ["--model", target_gguf]]
    if draft_gguf is not None:
        lines.append(["--spec-draft-model", draft_gguf, "--spec-type", spec_type])
        lines.append(["--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"])
    lines.append(["--parallel", str(opts["parallel"])])
    if opts.get("threads"):
        lines.append(["--threads", str(opts["threads"])])
    lines.append(["--metrics", "--alias", served_name])
    lines.append(["--host", str(opts["host"]), "--port", str(opts["port"])])
    return lines


def write_models(pair_version: PairVersion, out_dir: str | Path, opts: dict[str, Any],
                 overwrite: bool = False, log=None, *, records) -> dict[str, tuple[str, dict[str, str]]]:
    """The registered target and draft folders as GGUF files under out_dir/gguf/<role>/
    (convert_hf_to_gguf.py of the built llama.cpp, through its conversion cache,
    llamacpp_build.converted); returns {role: ("gguf/<role>", {file: sha256})}, what the pair lock
    binds for each role (lock.build_lock engine_layouts); ``records``: the registry's recorded
    conversions (registry.store.engine_artifacts.ArtifactRecords). Called once the models were checked
    against their fingerprints. An EAGLE-3 head's GGUF is read back first (gguf_values): one naming
    other layers or another vocabulary map than registered is refused (ReadBackError), nothing copied.
    An existing file is refused unless ``overwrite``; each file is copied beside its place, hashed as
    written and moved there whole."""
    import shutil

    from specreg.core.digests import sha256_file

    layouts = {}
    ggufs = converted_files(pair_version, opts["gguf_type"], log=log, records=records)
    if pair_version.config.method is SpecMethod.EAGLE3:
        # what llama-server feeds the head, read back from the cached GGUF before anything is copied
        from specreg.registry.deploy import read_back

        read_back.check_values("llamacpp export", pair_version,
                               llamacpp_build.gguf_values(ggufs["draft"][0], gguf_file("draft", opts)))
    for role, (cached, digest) in ggufs.items():
        path = Path(out_dir) / gguf_file(role, opts)
        if path.exists() and not overwrite:
            raise SpecregError(f"{path} exists; refusing to overwrite it (use --overwrite)")
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob("*.gguf"):
            stale.unlink()
        partial = path.with_name(f".{path.name}.partial")
        shutil.copyfile(cached, partial)
        written = sha256_file(partial)
        if written != digest:
            partial.unlink()
            raise SpecregError(f"{cached} changed while it was copied to {path}; export again")
        os.replace(partial, path)
        layouts[role] = (f"{GGUF_DIR}/{role}", {path.name: written})
    return layouts


def converted_files(pair_version: PairVersion, gguf_type: str, log=None, *,
                    records) -> dict[str, tuple[Path, str]]:
    """{role: (cached GGUF, its sha256)} of the pair's registered folders, through llama.cpp's
    conversion cache (llamacpp_build.converted, its digests recorded in ``records``); an EAGLE-3
    head is converted against its target (--target-model-dir, both fingerprints in its key). The
    caller has checked the folders against their fingerprints."""
    target = pair_version.target
    files = {"target": llamacpp_build.converted(target.path, target.fingerprint, gguf_type, log=log,
                                                records=records)}
    if pair_version.draft is not None:
        head_of, updates = None, None
        if pair_version.config.method.has_head:  # a head is converted against its target: its GGUF takes the target's vocabulary
            head_of = (target.path, target.fingerprint)
        if pair_version.config.method is SpecMethod.EAGLE3:
            # the converter reads the ids from the head config's top level only, else its default
            # (conversion/llama.py:74-81): ModelOpt and SpecForge write them inside eagle_config alone,
            # so the registered ids are written where it reads them
            updates = {"eagle_aux_hidden_state_layer_ids": list(trained_aux_layers(pair_version))}
        files["draft"] = llamacpp_build.converted(pair_version.draft.path, pair_version.draft.fingerprint, gguf_type,
                                                  log=log, records=records, target=head_of, config_updates=updates)
    return files


def read_back(export: Export, files: dict[str, Any]) -> list:
    """What llama-server will run from llama-server.sh's exec line (common/arg.cpp's flags, the last
    one given winning): the target GGUF's folder, and where it drafts, the draft's --spec-type
    (SPEC_TYPES read backwards; draft-simple: draft_model) and --spec-draft-n-max (k). The GGUF files
    are read back in write_models, before they are copied."""
    from specreg.registry.deploy import read_back as rb

    if "llama-server.sh" not in files:
        return []
    where = "llama-server.sh"
    flags = rb.flag_values(rb.exec_argv(files[where], where)[1:],
                           {"--model", "--spec-draft-model", "--spec-type", "--spec-draft-n-max"})
    read = [rb.ReadValue("target", str(Path(flags["--model"]).parent) if "--model" in flags else None,
                         f"{where} --model")]
    if "--spec-draft-model" not in flags:  # speculation measured off at these slots: nothing drafts
        return read
    kinds = {"draft-simple": "draft_model", **{spec_type: method for method, spec_type in SPEC_TYPES.items()}}
    read.append(rb.ReadValue("method", kinds.get(flags.get("--spec-type"), flags.get("--spec-type")),
                             f"{where} --spec-type {flags.get('--spec-type')}"))
    read.append(rb.ReadValue("k", rb.as_int(flags.get("--spec-draft-n-max"), where), f"{where} --spec-draft-n-max"))
    return read
