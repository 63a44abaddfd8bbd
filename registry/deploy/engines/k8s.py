"""Kubernetes: a Deployment and Service running vLLM 0.33 (k8s-vllm.yaml), the models on a mounted
volume, the engine's arguments in a ConfigMap file (vllm-config.yaml, read by `vllm serve --config`),
and an initContainer running `specreg verify` on the models and that file against the pair lock."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from specreg.errors import UsageError
from specreg.registry.deploy.engines import vllm
from specreg.registry.deploy.engines.common import Export, no_head_layout, no_model_files, served_dtype
from specreg.registry.store.entities import PairVersion

ENGINE = vllm.ENGINE
VERSIONS = vllm.VERSIONS
SCHEMA = vllm.SCHEMA
# vllm-config.yaml is also the ConfigMap file the engine reads; the lock binds its sha256 (exported)
FILES = ("k8s-vllm.yaml", "vllm-config.yaml")
WRITES_MODELS = False
WRITES_LOCK = True
# what it needs nothing of its own for: the shared defaults (engines.EngineModule)
head_layout, write_models = no_head_layout, no_model_files
# vLLM runs in the pod: its baseline, its refusals
baseline_engine, refusal = vllm.baseline_engine, vllm.refusal

ENGINE_CONFIG = "vllm-config.yaml"
ENGINE_CONFIG_MOUNT = "/etc/specreg/engine"
OPTIONS: dict[str, Any] = {
    "image": "vllm/vllm-openai:v0.33.0",
    "namespace": None,
    "replicas": 1,
    # the volume holding the models ("pvc:CLAIM" or "hostPath:/DIR", required), where it is mounted
    # in the container, and the target's and draft's folders inside it.
    "model_volume": None,
    "model_mount_path": "/models",
    "target_subpath": "target",
    "draft_subpath": "draft",
    # the initContainer running `specreg verify` (an image with specreg + model-signing, no torch:
    # see the README) and the ConfigMap holding the team's public key.
    "verify_image": "specreg-verify:0.1.0",
    "verify_key_configmap": "specreg-signing-key",
    # the ConfigMap holding the approvers' keyring (`specreg keys export --out approvers.json`)
    "verify_keyring_configmap": "specreg-approvers",
}


def check_options(opts: dict[str, Any]) -> None:
    try:
        opts["replicas"] = int(opts["replicas"])
    except (TypeError, ValueError) as exc:
        raise UsageError(f"export option has a bad value: {exc}") from None
    if opts["model_volume"] is not None and not re.fullmatch(r"(pvc:[a-z0-9][a-z0-9.-]*|hostPath:/.*)",
                                                              str(opts["model_volume"])):
        raise UsageError(
            f"export option model_volume={opts['model_volume']!r} must be pvc:CLAIM_NAME or hostPath:/ABSOLUTE/DIR"
        )
    if not str(opts["model_mount_path"]).startswith("/"):
        raise UsageError(f"export option model_mount_path={opts['model_mount_path']!r} must be an absolute path")
    for key in ("target_subpath", "draft_subpath"):
        parts = Path(str(opts[key])).parts
        if not parts or Path(str(opts[key])).is_absolute() or ".." in parts:
            raise UsageError(f"export option {key}={opts[key]!r} must be a relative path inside the volume")


def check(pair_version: PairVersion, baselines: dict[str, Any] | None, opts: dict[str, Any]) -> None:
    if not opts["model_volume"]:
        raise UsageError(
            "export format k8s-vllm needs the volume that holds the models: --option model_volume=pvc:CLAIM_NAME "
            "or --option model_volume=hostPath:/DIR (mounted at model_mount_path, default /models; the target in "
            "its target_subpath folder, default 'target', the draft in draft_subpath, default 'draft')"
        )
    vllm.check(pair_version, baselines, opts)


def sources(pair_version: PairVersion, opts: dict[str, Any]) -> tuple[str, str | None]:
    """In the pod the engine reads the models from the mounted volume, not the registrant's paths."""
    mount = Path(opts["model_mount_path"])
    draft = str(mount / opts["draft_subpath"]) if pair_version.draft is not None else None
    return str(mount / opts["target_subpath"]), draft


def context(export: Export) -> dict[str, Any]:
    speculative = vllm.speculative_config(export.pair_version, export.draft_source, export.opts, export.baselines)
    k8s = k8s_context(export.pair_version, export.baselines, export.approved, speculative, export.opts,
                      export.target_source, export.draft_source)
    lines = vllm.command(export.target_source, export.pair_version.target.revision, speculative, export.served_name,
                         export.opts, served_dtype(export))
    k8s["engine_config"] = engine_config(lines, speculative)
    return {"k8s": k8s}


def read_back(export: Export, files: dict[str, Any]) -> list:
    """What `vllm serve --config` will run from the ConfigMap's file (vllm-config.yaml: each key
    `--key value`, `model` the served model), read back as the vllm format's serve arguments are
    (engines/vllm.py serve_args)."""
    import yaml

    if ENGINE_CONFIG not in files:
        return []
    arguments = yaml.safe_load(files[ENGINE_CONFIG]) or {}
    argv = [str(arguments.get("model"))]
    for key, value in arguments.items():
        if key != "model":
            argv += [f"--{key}", json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return vllm.serve_args(export, argv, ENGINE_CONFIG)


def engine_config(lines: list[list[str]], speculative: dict[str, Any]) -> dict[str, Any]:
    """The `vllm serve` arguments as the YAML file vLLM 0.33 reads with `--config FILE`
    (vllm/utils/argparse_utils.py FlexibleArgumentParser.load_config_file: each key becomes
    `--key value`, a mapping becomes its JSON, `model` the served model), and the container's
    command that only points at it. The same words as the vllm format's serve script."""
    import yaml

    argv = [word for line in lines for word in line]
    assert argv[:2] == ["vllm", "serve"] and len(argv[3:]) % 2 == 0, argv
    arguments: dict[str, Any] = {"model": argv[2]}
    for flag, value in zip(argv[3::2], argv[4::2]):
        arguments[flag.removeprefix("--")] = speculative if flag == "--speculative-config" else value
    text = ("# `vllm serve --config` arguments (vLLM 0.33); specreg.lock.json binds this file's sha256\n"
            + yaml.safe_dump(arguments, sort_keys=False, default_flow_style=False, width=1 << 16))
    path = f"{ENGINE_CONFIG_MOUNT}/{ENGINE_CONFIG}"
    return {"file": ENGINE_CONFIG, "text": text, "mount": ENGINE_CONFIG_MOUNT, "path": path,
            "argv": ["vllm", "serve", "--config", path]}


def dns_label(text: str, limit: int = 63) -> str:
    """A Kubernetes DNS-1123 label made from free text."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "specreg"


def k8s_context(pair_version: PairVersion, baselines: dict[str, Any] | None, approved: bool,
                speculative: dict[str, Any], opts: dict[str, Any], target_path: str,
                draft_path: str | None) -> dict[str, Any]:
    """Names, labels, annotations, resources and the model volume of the k8s-vllm manifest;
    target_path and draft_path are where the engine finds the models inside the container."""
    name = dns_label(f"{pair_version.name}-v{pair_version.version}")
    volume_kind, _, volume_name = str(opts["model_volume"] or "pvc:").partition(":")
    annotations = {
        "specreg.io/pair": pair_version.label,
        "specreg.io/approval": "approved" if approved else "UNAPPROVED",
        "specreg.io/binding-sha256": pair_version.binding_sha256,
        "specreg.io/target": pair_version.target.reference,
        "specreg.io/target-path": target_path,
        "specreg.io/target-weights-sha256": pair_version.target.fingerprint.weights_sha256,
        "specreg.io/target-tokenizer-sha256": pair_version.target.fingerprint.tokenizer_sha256 or "",
        "specreg.io/speculative-config": json.dumps(speculative, sort_keys=True),
        "specreg.io/baselines": json.dumps(baselines, sort_keys=True) if baselines else "none",
    }
    if pair_version.draft is not None:
        annotations["specreg.io/draft"] = pair_version.draft.reference
        if draft_path:
            annotations["specreg.io/draft-path"] = draft_path
        annotations["specreg.io/draft-weights-sha256"] = pair_version.draft.fingerprint.weights_sha256
        annotations["specreg.io/draft-tokenizer-sha256"] = pair_version.draft.fingerprint.tokenizer_sha256 or ""
    requests: dict[str, str] = {}
    memory = (baselines or {}).get("memory") or {}
    if isinstance(memory.get("total_bytes"), (int, float)) and memory["total_bytes"] > 0:
        # Host memory must at least hold both models' weights while the engine loads them.
        requests["memory"] = f"{math.ceil(memory['total_bytes'] / 2**20)}Mi"
        annotations["specreg.io/memory-estimate-bytes"] = str(int(memory["total_bytes"]))
    return {
        "name": name,
        "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "specreg",
                   "specreg.io/version": str(pair_version.version)},
        "annotations": annotations,
        "requests": requests,
        "limits": {"nvidia.com/gpu": str(opts["tensor_parallel_size"])},
        "volume": {"kind": volume_kind, "name": volume_name},
        "mount_path": opts["model_mount_path"],
        "target_path": target_path,
        "draft_path": draft_path,
    }
