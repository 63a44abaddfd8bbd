"""Every export of the tools' heads (conftest.tool_heads), run as a user runs it: each head is
registered once, and each export format that serves an EAGLE-3 pair is either written, with its
lock binding files whose read-back (the engine module's read_back over the files on disk, and each
engine's own key read here directly) equals the registration, or refused in one line naming the
engine fact (exit 2 where the format cannot serve the pair, 1 where its files would read back
otherwise than registered), with nothing written. OUTCOMES pins the outcome of every head x format, so a change of behaviour
fails here. llama.cpp's conversion is the slow part: it runs only where the export is not refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clirun import run  # tests/ is on sys.path (tests/conftest.py)

pytestmark = [pytest.mark.slow, pytest.mark.engine_process]  # the session fixture builds the heads with both tools (about a minute)

HEADS = ("speculators-defaults", "speculators-qwen3", "modelopt", "speculators-converted", "specforge")
FORMATS = ("vllm", "k8s-vllm", "sglang", "trtllm", "llamacpp")
OPTIONS = {"k8s-vllm": ["--option", "model_volume=pvc:models"]}
K = 3

# (head, format) -> None: written and read back as registered; else (exit code, what the one line says):
# exit 1 both where the engine module refuses the pair (exports.refuse_pair: the format cannot serve it)
# and where the written files read back otherwise than registered (read_back.ReadBackError), both an
# EngineRefusal
VLLM_V2 = (1, "aux layers as vLLM's V2 model runner (GPU default) reads them reads back [2, 4, 5], "
              "registered [1, 3, 4]")  # ModelOpt's and SpecForge's ids sit in eagle_config only
SGLANG_RESIDUAL = (1, "the head was trained with norm_before_residual; SGLang's first EAGLE-3 layer keeps the "
                      "un-normed hidden state as the residual (sglang/srt/models/llama_eagle3.py:96-99)")
SGLANG_QWEN3 = (1, "the head's layer is 'qwen3'; SGLang 0.5.23's EAGLE-3 heads are LlamaForCausalLMEagle3 "
                   "(sglang/srt/models/llama_eagle3.py:272) and, with DeepSeek MLA layers, Eagle3DeepseekV2ForCausalLM")
TRTLLM_NORMS = (1, "the head sets norm_before_fc and norm_output; TensorRT-LLM 1.2's Eagle3DraftModel reads only "
                   "eh_proj_before_attn and return_hidden_post_norm of its norms")
TRTLLM_QWEN3 = (1, "the head's layer is qwen3 (Eagle3Qwen3ForCausalLM); TensorRT-LLM 1.2 builds its EAGLE-3 layer "
                   "with Eagle3Attention, Llama attention without q_norm/k_norm")
LLAMACPP_NORM = (1, "the head sets norm_output; llama.cpp's EAGLE-3 reads norm_before_residual and norm_before_fc "
                    "only (src/models/eagle3.cpp:24-33)")
LLAMACPP_LAYERS = (1, "the head has 2 decoder layers; llama.cpp's converter takes an EAGLE-3 head for one with "
                      "num_hidden_layers 1 only (conversion/llama.py:50, 216)")
OUTCOMES: dict[tuple[str, str], tuple[int, str] | None] = {
    ("speculators-defaults", "vllm"): None,
    ("speculators-defaults", "k8s-vllm"): None,
    ("speculators-defaults", "sglang"): SGLANG_RESIDUAL,
    ("speculators-defaults", "trtllm"): TRTLLM_NORMS,
    ("speculators-defaults", "llamacpp"): LLAMACPP_NORM,
    ("speculators-qwen3", "vllm"): None,
    ("speculators-qwen3", "k8s-vllm"): None,
    ("speculators-qwen3", "sglang"): SGLANG_QWEN3,
    ("speculators-qwen3", "trtllm"): TRTLLM_QWEN3,
    ("speculators-qwen3", "llamacpp"): LLAMACPP_LAYERS,
    ("modelopt", "vllm"): VLLM_V2,
    ("modelopt", "k8s-vllm"): VLLM_V2,
    ("modelopt", "sglang"): None,
    ("modelopt", "trtllm"): None,
    ("modelopt", "llamacpp"): None,
    ("speculators-converted", "vllm"): None,
    ("speculators-converted", "k8s-vllm"): None,
    ("speculators-converted", "sglang"): None,
    ("speculators-converted", "trtllm"): None,
    ("speculators-converted", "llamacpp"): None,
    ("specforge", "vllm"): VLLM_V2,
    ("specforge", "k8s-vllm"): VLLM_V2,
    ("specforge", "sglang"): None,
    ("specforge", "trtllm"): None,
    ("specforge", "llamacpp"): None,
}


@pytest.fixture(scope="module")
def registered(tool_heads, tmp_path_factory):
    """Every head registered once in one registry -> (database URL, its folder)."""
    root = tmp_path_factory.mktemp("tool-head-exports")
    db = f"sqlite:///{root / 'registry.db'}"
    for name in HEADS:
        result = run("register", name, "--target", tool_heads["target"], "--draft", tool_heads[name], "--method",
                     "eagle3", "-k", str(K), "--db", db)
        assert result.returncode == 0, result.stderr
    return db, root


def files_on_disk(out: Path) -> dict[str, str]:
    """The export's files as written: text, or a Link for a symbolic link (a layout's weights)."""
    from specreg.registry.deploy.export_files import Link

    files = {}
    for path in sorted(out.rglob("*")):
        name = str(path.relative_to(out))
        if path.is_symlink():
            files[name] = Link(os.readlink(path))
        elif path.is_file() and path.suffix != ".gguf" and name != "specreg.lock.json":
            files[name] = path.read_text(encoding="utf-8")
    return files


def engine_layers(fmt: str, out: Path, files: dict[str, str], draft: Path) -> list[int]:
    """The target layers (as layer inputs) each engine feeds the head, read from its own key here:
    vLLM the head folder's top-level ids else its eagle_config ids (both runners agree where the export
    is written); SGLang eagle_config ids + 1; TensorRT-LLM eagle3_layers_to_capture + 1; llama.cpp the
    GGUF's eagle3.target_layers."""
    if fmt in ("vllm", "k8s-vllm"):
        config = json.loads((draft / "config.json").read_text())
        return sorted(config.get("eagle_aux_hidden_state_layer_ids")
                      or config.get("transformer_layer_config", {}).get("eagle_aux_hidden_state_layer_ids")
                      or config["eagle_config"]["layer_ids"])
    if fmt == "sglang":
        config = json.loads(files["sglang-eagle3-head/config.json"])
        return sorted(v + 1 for v in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    if fmt == "trtllm":
        import yaml

        config = yaml.safe_load(files["trtllm-config.yaml"])["speculative_config"]
        return sorted(v + 1 for v in config["eagle3_layers_to_capture"])
    from specreg.registry.deploy.engines import llamacpp_build

    fields = llamacpp_build.gguf_package().GGUFReader(out / "gguf" / "draft" / "model-f32.gguf").fields
    field = fields["eagle3.target_layers"]
    return [int(field.parts[i][0]) for i in field.data]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", HEADS)
def test_each_export_of_a_tool_head_is_written_as_registered_or_refused_in_one_line(registered, tool_heads, name,
                                                                                      fmt):
    from specreg.api import Registry
    from specreg.core.fingerprint import sha256_file
    from specreg.registry.deploy import read_back
    from specreg.registry.deploy.exports import plan_export

    db, root = registered
    out = root / f"{name}-{fmt}"
    result = run("export", f"{name}@1", "--format", fmt, "-o", out, "--force", *OPTIONS.get(fmt, []), "--db", db)
    expected = OUTCOMES[name, fmt]
    if expected is not None:
        code, words = expected
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        assert (result.returncode, len(errors)) == (code, 1) and words in errors[0], (result.returncode,
                                                                                        result.stderr)
        assert errors[0].startswith("specreg: error: ") and not out.exists()
        return
    assert result.returncode == 0, result.stderr
    registry = Registry(db, user="alice")
    version = registry.get(f"{name}@1")
    plan = plan_export(version, None, fmt, approved=True, force=True,
                       options={"model_volume": "pvc:models"} if fmt == "k8s-vllm" else None)
    files = files_on_disk(out)
    read = plan.engine.read_back(plan, files)
    if fmt == "llamacpp":  # the GGUF's own metadata, as gguf-py reads it (llama-server reads the same keys)
        from specreg.registry.deploy.engines import llamacpp_build

        read += llamacpp_build.gguf_values(out / "gguf" / "draft" / "model-f32.gguf", "gguf/draft/model-f32.gguf")
    wanted = read_back.registered(version, plan.target_source)
    fields = {item.field for item in read}
    assert {"method", "k", "aux_layers", "vocab_map"} <= fields, fields
    for item in read:
        assert item.field not in wanted or item.value == wanted[item.field], (item, wanted[item.field])
    aux = version.config.head["fit"]["aux_layer_ids"]
    assert engine_layers(fmt, out, files, Path(version.draft.path)) == aux
    # the lock binds the files the engine loads: the registered head's, or the layout written beside it
    lock = json.loads((out / "specreg.lock.json").read_text())
    draft = lock["models"]["draft"]
    folder = out / draft["layout"] if "layout" in draft else Path(version.draft.path)
    assert draft["files"] and all(sha256_file(folder / file) == digest for file, digest in draft["files"].items())
