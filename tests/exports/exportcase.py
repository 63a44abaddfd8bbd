"""Helpers for export tests: plain entities (no store needed), baselines, and the engine
schema checker."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import jsonschema

from specreg.core.types import ModelFingerprint, ModelRef
from specreg.registry.store.entities import PairState, PairVersion, SpecConfig, SpecMethod

# Model references with a space, both quote kinds and a '$': they must survive every format.
TARGET_REFERENCE = "/models/Target Model's \"v2\" $HOME"
DRAFT_REFERENCE = "/models/draft model"

BASELINES = {
    "golden_set": "default",
    "golden_sha256": "9" * 64,
    "validated_at": "2025-01-02T03:04:05+00:00",
    "k": 4,
    "tau_definition": "engines",  # tau = 1 + accepted / draft steps (specreg.core.baselines)
    "overall": {"acceptance_rate": 0.71, "mean_acceptance_length": 3.1,
                "per_position_acceptance": [0.9, 0.8, 0.7, 0.6]},
    "per_category": {
        "support": {"acceptance_rate": 0.8, "mean_acceptance_length": 3.5, "per_position_acceptance": [0.95, 0.85]},
        "code": {"acceptance_rate": 0.6, "mean_acceptance_length": 2.6, "per_position_acceptance": [0.8, 0.6]},
    },
    "memory": {"total_bytes": 3 * 2**30 + 1, "target_weight_bytes": 2 * 2**30},
}


def fingerprint(seed: str) -> ModelFingerprint:
    return ModelFingerprint(
        weights_sha256=seed * 64, weight_files={"model.safetensors": seed * 64}, weight_format="safetensors",
        config_sha256="c" * 64, tokenizer_sha256=("t" + seed) * 32, chat_template_sha256=None,
        architecture="LlamaForCausalLM", model_type="llama", vocab_size=512, tokenizer_length=500,
        parameter_count=10_000, dtype="float32", max_position_embeddings=256,
    )


def make_pair(method: SpecMethod = SpecMethod.DRAFT_MODEL, state: PairState = PairState.APPROVED,
              max_batch: int | None = 16, name: str = "chat-pair") -> PairVersion:
    if method == SpecMethod.DRAFT_MODEL:
        config = SpecConfig(method, 4, max_batch_size_for_speculation=max_batch)
        draft = ModelRef(DRAFT_REFERENCE, "/cache/draft", "d1e2f3", fingerprint("b"))
    else:
        config = SpecConfig(method, 4, prompt_lookup_min=2, prompt_lookup_max=5, max_batch_size_for_speculation=max_batch)
        draft = None
    return PairVersion(
        id=1, name=name, version=3, target=ModelRef(TARGET_REFERENCE, "/cache/target", "abc123", fingerprint("a")),
        draft=draft, config=config, binding_sha256="f" * 64, state=state, registered_by="tester",
        registered_at=datetime(2025, 1, 1, tzinfo=timezone.utc),
    )


def check_command(words: list[str], schema: dict) -> dict[str, str]:
    """Hold one engine command line to its schema file: the command words, the positional
    arguments, every flag known with a value of its type; JSON values validated by the JSON
    schema the flag names. Returns {flag: value}. Unknown names fail."""
    command = schema["command"]
    assert words[: len(command)] == command, f"command {words[:len(command)]} is not {command}"
    positional = list(schema["positional"])
    flags: dict[str, str] = {}
    rest = words[len(command):]
    index = 0
    while index < len(rest):
        word = rest[index]
        if word.startswith("--"):
            assert word in schema["flags"], f"{schema['engine']} {schema['engine_version']} has no flag {word}"
            spec = schema["flags"][word]
            if spec["type"] == "flag":  # takes no value
                assert word not in flags, f"flag {word} given twice"
                flags[word] = ""
                index += 1
                continue
            assert index + 1 < len(rest), f"flag {word} has no value"
            value = rest[index + 1]
            if spec["type"] == "number":
                float(value)
            elif spec["type"] == "integer":
                int(value)
            elif spec["type"] == "enum":
                assert value in spec["choices"], f"{word} {value} not in {spec['choices']}"
            elif spec["type"] == "json":
                jsonschema.validate(json.loads(value), schema[spec["schema"]])
            assert word not in flags, f"flag {word} given twice"
            flags[word] = value
            index += 2
        else:
            assert positional, f"unexpected positional argument {word!r}"
            positional.pop(0)
            index += 1
    assert not positional, f"missing positional arguments {positional}"
    return flags


ENGINE_PROGRAMS = ("vllm", "python", "trtllm-serve", "text-generation-launcher", "llama-server")


def record_argv(script_text: str, workdir: Path, script: Path | None = None) -> list[str]:
    """Run an exported shell script with the engine executables replaced by a recorder that
    writes its argv NUL-separated: the real shell does the word splitting and quoting.
    ``script``: run that file where the export wrote it (its paths relative to the script resolve
    there) instead of a copy of ``script_text`` under ``workdir``."""
    bin_dir, record = workdir / "fake-bin", workdir / "argv.bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for program in ENGINE_PROGRAMS:
        path = bin_dir / program
        path.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$(basename \"$0\")\" \"$@\" > '{record}'\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    if script is None:
        script = workdir / "out" / "script.sh"
        script.parent.mkdir(exist_ok=True)
        script.write_text(script_text)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", HOME="/should-not-expand")
    subprocess.run(["sh", str(script)], check=True, env=env, capture_output=True, timeout=30)
    return record.read_bytes().decode().split("\0")[:-1]


def k8s_engine(manifest: str) -> tuple[dict, list[str]]:
    """The Deployment of a k8s-vllm manifest and the `vllm serve` words its engine container runs:
    the container only points at the engine ConfigMap's file (`vllm serve --config FILE`), whose
    keys become `--key value` as vLLM's load_config_file makes them (a mapping as its JSON, `model`
    the positional model); tests/engines runs vLLM's own parser on that file."""
    import yaml

    documents = [d for d in yaml.safe_load_all(manifest) if d]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    argv = container["command"] + container["args"]
    assert argv[:3] == ["vllm", "serve", "--config"] and len(argv) == 4, argv
    volume = next(m["name"] for m in container["volumeMounts"] if argv[3].startswith(m["mountPath"] + "/"))
    configmap = next(v["configMap"]["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]
                     if v["name"] == volume)
    data = next(d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == configmap)["data"]
    arguments = yaml.safe_load(data[argv[3].rsplit("/", 1)[1]])
    words = ["vllm", "serve", arguments.pop("model")]
    for key, value in arguments.items():
        words += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return deployment, words
