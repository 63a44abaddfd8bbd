"""The export cases the engine tests run through vLLM's and SGLang's own code
(test_engine_exports.py, test_sglang_exports.py): the tiny pairs, the rows of cases, and how a
case becomes the argv the engine receives from the written script. One file per engine so that
the two engine processes (vLLM's ~110 s, SGLang's ~55 s) can run on different test workers."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path

import yaml
from exportcase import BASELINES, fingerprint, record_argv

from specreg.core.suffix_settings import SuffixSettings
from specreg.core.types import ModelRef
from specreg.registry.store.entities import PairState, PairVersion, SpecConfig, SpecMethod
from specreg.registry.deploy.exports import render_export
from specreg.registry.deploy.export_files import write_export

K = 4
CUTOFF = 16

# a validated pair's baselines carry the dtype they were measured in, which the exports pin
EXPORTED_BASELINES = {**BASELINES, "dtype": "float32"}


# The layers the EAGLE-3 head was trained on, in the speculators' (and vLLM's) numbering: the
# state entering layers 1, 3 and 6 of an 8-layer target. SGLang reads explicit ids one layer later
# (the example: [1, 3, 6] in the head's config become [2, 4, 7] in SGLang).
TRAINED_AUX = [1, 3, 6]


def eagle3_target(models: dict[str, Path]) -> Path:
    """A tiny 8-layer Llama over the tiny tokenizer (tests/tinymodels.py), beside the others: deep
    enough for aux layers inside it."""
    from tinymodels import build_llama

    target = models["target"].parent / "llama-8-layers"
    if not target.exists():
        build_llama(target, models["tokenizer"], seed=4, hidden_size=96, num_layers=8)
    return target


def eagle3_head(models: dict[str, Path]) -> Path:
    """A speculators-format EAGLE-3 head for eagle3_target, trained on TRAINED_AUX (tests/headfiles.py)."""
    from headfiles import write_eagle3

    target = eagle3_target(models)
    config = json.loads((target / "config.json").read_text())
    head = models["target"].parent / "eagle3-head"
    if not head.exists():
        write_eagle3(head, hidden=config["hidden_size"], vocab=config["vocab_size"], draft_vocab=config["vocab_size"],
                     vocab_map=False, aux=TRAINED_AUX, verifier=str(target))
    return head


# A block drafter's target layers as the engine-native layouts name them (layer outputs: the states
# entering layers 2 and 5 of eagle3_target), the layer inputs registration records, and its block:
# DFlash drafts block - 1 = K tokens after the anchor, DSpark (sample_from_anchor, as SGLang's DSPARK
# drafts) the whole block of K.
BLOCK_LAYER_OUTPUTS = [1, 4]
BLOCK_LAYER_INPUTS = [i + 1 for i in BLOCK_LAYER_OUTPUTS]


def block_head(models: dict[str, Path], kind: str) -> Path:
    """An engine-native DFlash (DFlashDraftModel) or DSpark (Qwen3DSparkModel) head for
    eagle3_target (tests/headfiles.py), its mask token the target's last id."""
    from headfiles import write_block_drafter

    config = json.loads((eagle3_target(models) / "config.json").read_text())
    head = models["target"].parent / f"{kind}-head"
    if not head.exists():
        write_block_drafter(head, kind=kind, layout="native", hidden=config["hidden_size"], vocab=config["vocab_size"],
                            block_size=K + 1 if kind == "dflash" else K, mask_token_id=config["vocab_size"] - 1,
                            layer_ids=BLOCK_LAYER_OUTPUTS, sample_from_anchor=True if kind == "dspark" else None,
                            config_extra={"markov_head_type": "vanilla"} if kind == "dspark" else None)
    return head


def peagle_head(models: dict[str, Path]) -> Path:
    """A speculators-format P-EAGLE head for eagle3_target, trained on TRAINED_AUX, its mask token
    the target's last id (tests/headfiles.py)."""
    from headfiles import write_peagle

    config = json.loads((eagle3_target(models) / "config.json").read_text())
    head = models["target"].parent / "peagle-head"
    if not head.exists():
        write_peagle(head, hidden=config["hidden_size"], vocab=config["vocab_size"], draft_vocab=config["vocab_size"],
                     vocab_map=False, aux=TRAINED_AUX, verifier=str(eagle3_target(models)),
                     mask_token_id=config["vocab_size"] - 1)
    return head


HUB_VERIFIER = "meta-llama/Llama-3.1-8B-Instruct"  # a hub id the head names as its verifier, never fetched


def eagle3_head_variant(models: dict[str, Path], kind: str) -> Path:
    """The eagle3_head with its verifier.name_or_path a hub id (``kind`` "hub-verifier": what
    `vllm serve HEAD` would serve instead of the target), laid out as ModelOpt and SpecForge
    write it, the ids inside eagle_config only ("modelopt"), or with a DeepSeek (MLA) decoder layer
    in the original layout, Eagle3DeepseekV3ForCausalLM ("deepseek": model_type deepseek_v2, the one
    vLLM 0.33 builds it from; "deepseek-v3": model_type deepseek_v3; tests/headfiles.py)."""
    from headfiles import deepseek_layout, eagle_config_layout, write_eagle3

    head = models["target"].parent / f"eagle3-head-{kind}"
    if head.exists():
        return head
    if kind == "modelopt":
        return eagle_config_layout(eagle3_head(models), head)
    if kind in ("deepseek", "deepseek-v3"):
        return deepseek_layout(eagle3_head(models), head,
                               model_type="deepseek_v3" if kind == "deepseek-v3" else "deepseek_v2")
    config = json.loads((eagle3_target(models) / "config.json").read_text())
    return write_eagle3(head, hidden=config["hidden_size"], vocab=config["vocab_size"],
                        draft_vocab=config["vocab_size"], vocab_map=False, aux=TRAINED_AUX, verifier=HUB_VERIFIER)


def mtp_target(models: dict[str, Path]) -> Path:
    """A tiny DeepSeek-V3 target with one MTP layer over the tiny tokenizer (tests/tinymodels.py), beside them."""
    from tinymodels import build_deepseek_v3

    target = models["target"].parent / "deepseek-v3-mtp"
    if not target.exists():
        build_deepseek_v3(target, models["tokenizer"], num_nextn_predict_layers=1)
    return target


def llama_with_nextn_layers(models: dict[str, Path]) -> Path:
    """The tiny Llama target's config declaring num_nextn_predict_layers (DeepSeek's field name on a
    model type no engine rewrites into an MTP drafter), with its tokenizer, beside it."""
    from tinymodels import copy_tokenizer

    target = models["target"].parent / "llama-nextn"
    if not target.exists():
        copy_tokenizer(models["target"], target)
        config = json.loads((models["target"] / "config.json").read_text())
        (target / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=1)))
    return target


def target_ref(directory: Path) -> ModelRef:
    """The target as registered: its model_type and architecture read from its config.json."""
    config = json.loads((directory / "config.json").read_text())
    identity = dataclasses.replace(fingerprint("a"), model_type=config["model_type"],
                                   architecture=config["architectures"][0])
    return ModelRef(str(directory), str(directory), "abc123", identity)


def tiny_pair(models: dict[str, Path], method: SpecMethod, max_batch: int | None,
              target: Path | None = None, head: Path | None = None) -> PairVersion:
    """A pair of the tiny local models (tests/tinymodels.py), registered by their paths; ``target``
    (default: the tiny Llama, or the tiny DeepSeek-V3 for mtp) is the target directory, ``head``
    another EAGLE-3 head than eagle3_head (registered with --allow-verifier-mismatch)."""
    default = {SpecMethod.MTP: mtp_target, SpecMethod.EAGLE3: eagle3_target, SpecMethod.DFLASH: eagle3_target,
               SpecMethod.DSPARK: eagle3_target, SpecMethod.PEAGLE: eagle3_target}.get(method, lambda m: m["target"])
    target = target_ref(target or default(models))
    if method == SpecMethod.MTP:
        # what registration reads of the target's MTP layers (core.heads.mtp_checkpoint.read_mtp)
        layers = json.loads((Path(target.reference) / "config.json").read_text()).get("num_nextn_predict_layers")
        config = SpecConfig(method, K, max_batch_size_for_speculation=max_batch,
                            head={"layout": "mtp:deepseek", "num_heads": layers})
        draft = None
    elif method in (SpecMethod.EAGLE3, SpecMethod.PEAGLE):
        # what registration records of the head (specreg.usecases.register.describe_head: read_head + check_head_fits)
        from specreg.usecases.register import describe_head

        folder = str(head or (eagle3_head if method == SpecMethod.EAGLE3 else peagle_head)(models))
        draft = ModelRef(folder, folder, None, fingerprint("e"))
        config = SpecConfig(method, K, max_batch_size_for_speculation=max_batch)
        config = dataclasses.replace(config, head=describe_head(config, target, draft,
                                                                allow_verifier_mismatch=head is not None))
    elif method in (SpecMethod.DFLASH, SpecMethod.DSPARK):
        # what registration records of a block head (describe_head), k its draft length (register: k
        # defaults to it)
        from specreg.core.heads import read_head
        from specreg.usecases.register import describe_head

        folder = str(head or block_head(models, method.value))
        draft = ModelRef(folder, folder, None, fingerprint("f"))
        k = read_head(folder, method=method.value).block["draft_length"]
        config = SpecConfig(method, k, max_batch_size_for_speculation=max_batch)
        config = dataclasses.replace(config, head=describe_head(config, target, draft, allow_verifier_mismatch=False))
    elif method == SpecMethod.DRAFT_MODEL:
        config = SpecConfig(method, K, max_batch_size_for_speculation=max_batch)
        draft = ModelRef(str(models["draft"]), str(models["draft"]), "d1e2f3", fingerprint("b"))
    elif method == SpecMethod.SUFFIX:
        config = SpecConfig(method, K, max_batch_size_for_speculation=max_batch, suffix=SuffixSettings(**SUFFIX))
        draft = None
    else:
        config = SpecConfig(method, K, prompt_lookup_min=2, prompt_lookup_max=5, max_batch_size_for_speculation=max_batch)
        draft = None
    return PairVersion(id=1, name="tiny-pair", version=1, target=target, draft=draft, config=config,
                       binding_sha256="f" * 64, state=PairState.APPROVED, registered_by="tester",
                       registered_at=datetime(2025, 1, 1, tzinfo=timezone.utc))


# The export cases: (id, format, method, max_batch_size_for_speculation, export options).
# New pair kinds get their rows here and a SpecMethod in tiny_pair; the engine checks below then
# run on them unchanged (mtp pairs are served by a tiny DeepSeek-V3 target, mtp_target).
VLLM_CASES = [
    ("vllm-draft-cutoff", "vllm", SpecMethod.DRAFT_MODEL, CUTOFF, {}),
    ("vllm-draft-cutoff-max-num-seqs", "vllm", SpecMethod.DRAFT_MODEL, CUTOFF, {"max_num_seqs": 64}),
    ("vllm-draft-no-cutoff", "vllm", SpecMethod.DRAFT_MODEL, None, {}),
    ("vllm-ngram-cutoff", "vllm", SpecMethod.NGRAM, CUTOFF, {}),
    ("k8s-draft-cutoff", "k8s-vllm", SpecMethod.DRAFT_MODEL, CUTOFF, {}),
    ("k8s-ngram", "k8s-vllm", SpecMethod.NGRAM, None, {}),
    ("vllm-eagle3-cutoff", "vllm", SpecMethod.EAGLE3, CUTOFF, {}),
    ("vllm-mtp", "vllm", SpecMethod.MTP, None, {}),
    ("vllm-mtp-cutoff", "vllm", SpecMethod.MTP, CUTOFF, {}),
    ("k8s-mtp-cutoff", "k8s-vllm", SpecMethod.MTP, CUTOFF, {}),
    # no cutoff: vLLM drops the per-batch-size ranges for suffix (the export refuses a cutoff,
    # test_suffix_pair.py; what vLLM does with one is the suffix-with-ranges case below)
    ("vllm-suffix", "vllm", SpecMethod.SUFFIX, None, {}),
    ("vllm-dflash", "vllm", SpecMethod.DFLASH, None, {}),
    ("vllm-dspark", "vllm", SpecMethod.DSPARK, None, {}),
    ("vllm-peagle", "vllm", SpecMethod.PEAGLE, None, {}),
    ("vllm-draft-probabilistic", "vllm", SpecMethod.DRAFT_MODEL, None, {}),
    ("vllm-eagle3-probabilistic", "vllm", SpecMethod.EAGLE3, None, {}),
    ("k8s-mtp-probabilistic", "k8s-vllm", SpecMethod.MTP, None, {}),
]
# the baselines a case exports past EXPORTED_BASELINES: sampled records drafted from q
CASE_BASELINES = {case_id: {"draft_sampling": "probabilistic"} for case_id in (
    "vllm-draft-probabilistic", "vllm-eagle3-probabilistic", "k8s-mtp-probabilistic")}
# a suffix pair's settings, none of them vLLM's defaults: the check reads each back from SpeculativeConfig
SUFFIX = {"max_tree_depth": 16, "max_cached_requests": 0, "max_spec_factor": 2.0, "min_token_prob": 0.05}
SGLANG_CASES = [
    ("sglang-draft", "sglang", SpecMethod.DRAFT_MODEL, CUTOFF, {}),
    ("sglang-eagle3", "sglang", SpecMethod.EAGLE3, None, {}),
    ("sglang-mtp", "sglang", SpecMethod.MTP, None, {}),
    ("sglang-dflash", "sglang", SpecMethod.DFLASH, None, {}),
    ("sglang-dspark", "sglang", SpecMethod.DSPARK, None, {}),
]


def export_argv(case: tuple, models: dict[str, Path], workdir: Path, head: Path | None = None
                ) -> tuple[list[str], dict]:
    """Render one case, write it as `specreg export -o` does, and return the engine argv as the
    engine would receive it from the written script (paths beside the script resolve there)."""
    case_id, fmt, method, max_batch, options = case
    options = dict(options)
    pair = tiny_pair(models, method, max_batch, head=head)
    if fmt == "k8s-vllm":
        # The manifest names in-container paths; mount "the volume" where the models lie here.
        options.update(model_volume="pvc:models", model_mount_path=str(models["target"].parent),
                       target_subpath=Path(pair.target.reference).name)
    baselines = {**EXPORTED_BASELINES, **CASE_BASELINES.get(case_id, {})}
    files = dict(render_export(pair, baselines, fmt, approved=True, options=options))
    if fmt == "k8s-vllm":
        # The engine container runs `vllm serve --config FILE`, FILE the engine ConfigMap's file:
        # written here from the manifest's ConfigMap, so vLLM's own parser reads what the pod mounts.
        engine_map, deployment, _ = yaml.safe_load_all(files["k8s-vllm.yaml"])
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        argv = container["command"] + container["args"]
        assert argv[:3] == ["vllm", "serve", "--config"] and len(argv) == 4, argv
        mounted = workdir / case_id / "engine" / Path(argv[3]).name
        mounted.parent.mkdir(parents=True)
        mounted.write_text(engine_map["data"][mounted.name])
        assert mounted.read_text() == files[mounted.name]  # the file the lock binds
        return [*argv[:3], str(mounted)], files
    script = {"vllm": "vllm-serve.sh", "sglang": "sglang-launch.sh"}[fmt]
    out = workdir / case_id / "export"
    write_export(list(files.items()), out)
    return record_argv(files[script], workdir / case_id, script=out / script), files


def export_cases(rows: list[tuple], models: dict[str, Path], workdir: Path) -> tuple[list[dict], dict]:
    """export_argv for each row -> (engine_check cases [{"id", "argv"}], {id: (argv, files)})."""
    cases, exported = [], {}
    for case in rows:
        argv, files = export_argv(case, models, workdir)
        cases.append({"id": case[0], "argv": argv})
        exported[case[0]] = (argv, files)
    return cases, exported


def ok(result: dict) -> dict:
    assert "error" not in result, f"{result['id']}: the engine refused it: {result['error']}\n{result.get('traceback')}"
    return result
