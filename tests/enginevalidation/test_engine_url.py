"""`specreg validate NAME@V --engine vllm --engine-url URL` against a loopback server whose
counters and per-request figures are made by vLLM 0.33.0's own metrics code
(vllm_spec_server.py): the deltas specreg computes are exactly the engine's counts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "engines"))
sys.path.insert(0, str(HERE.parent / "governance"))
sys.path.insert(0, str(HERE))  # expected_counts

from expected_counts import scripted  # noqa: E402
from govstate import record_validation  # noqa: E402

K = 3
MODEL = "served-pair"


SWAP_AT = 2
MARGINS = (0.1, 2.0)  # under and over the bfloat16 near-tie tolerance (0.25)


def runtime_baselines(registry, ref: str, tiny_models) -> dict:
    """What validate --engine vllm compares the engine with: our runtime's greedy decode of the
    smoke prompts on vLLM's schedule, counted its way (engine_validation.runtime_rows.runtime_pass)."""
    from specreg.engine_validation.runtime_rows import golden_prompts, runtime_pass
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.methods import load_pair
    from specreg.validators.engine import baselines_of

    pair = load_pair(str(tiny_models["target"]), str(tiny_models["draft"]))
    prompts, _ = golden_prompts(load_golden_set("smoke"), pair.tokenizer)
    return baselines_of(runtime_pass(pair, prompts, registry.get(ref), engine="vllm"), K)


@pytest.fixture(scope="module")
def vllm_servers(terminal_line):
    """{"per-request": URL, "speculative": URL, 0.1: URL, 2.0: URL}: vllm_spec_server.py on loopback,
    started together once for this file (vLLM's import is the slow part; each test reads counter
    deltas, so sharing a server between tests changes nothing they see): one with vLLM's
    per-request metrics, one parting from the target at token SWAP_AT, a target-only reference
    per margin. Stopped at the end."""
    from engine_env import engine_env_or_skip, loopback_servers

    env = engine_env_or_skip("vllm", log=terminal_line, VLLM_TARGET_DEVICE="cpu")
    plans = {"per-request": [str(K), MODEL, "--per-request"], "speculative": [str(K), MODEL, "--swap-at", str(SWAP_AT)],
             **{margin: ["0", MODEL, "--margin", str(margin)] for margin in MARGINS}}
    with loopback_servers(HERE / "vllm_spec_server.py", plans, env) as urls:
        yield urls


@pytest.mark.slow
def test_engine_url_reads_vllm_counters_and_per_request_metrics(db_url, tiny_models, vllm_servers):
    from clirun import run_specreg

    from specreg.api import Registry
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.loading import load_tokenizer
    from specreg.validators import engine

    registry = Registry(db_url)
    ref = registry.register("pair", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                            num_speculative_tokens=K).version.label
    run_id = record_validation(registry, ref, golden="smoke", acceptance_rate=0.5)
    vllm_server = vllm_servers["per-request"]
    done = run_specreg(["validate", ref, "--engine", "vllm", "--engine-url", vllm_server, "--golden", "smoke",
                        "--concurrency", "1,2", "--db", db_url, "--json"])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    baseline = json.loads(done.stdout)
    tokenizer = load_tokenizer(str(tiny_models["target"]))
    rows = []
    for record in load_golden_set("smoke"):
        accepted = scripted(record.encode(tokenizer), record.max_new_tokens, K)
        rows.append((record.category, accepted))
    steps = sum(len(a) for _, a in rows)
    total = sum(sum(a) for _, a in rows)
    overall = baseline["baselines"]["overall"]
    assert (overall["num_drafts"], overall["drafted"], overall["accepted"]) == (steps, K * steps, total)
    assert overall["acceptance_rate"] == pytest.approx(total / (K * steps))
    assert overall["mean_acceptance_length"] == pytest.approx(1 + total / steps)  # vLLM's tau
    assert overall["per_position_acceptance"] == pytest.approx(
        [sum(1 for _, a in rows for j in a if j > i) / steps for i in range(K)])
    code = [a for category, a in rows if category == "code"]
    assert baseline["baselines"]["per_category"]["code"]["accepted"] == sum(sum(a) for a in code)
    # the per-request metrics.speculative_decoding agree with the /metrics deltas, prompt by prompt
    for row in baseline["report"]["per_prompt"]:
        assert (row["response_drafted"], row["response_accepted"]) == (row["drafted"], row["accepted"])
    assert baseline["engine"] == "vllm" and baseline["engine_version"] == "0.33.0"
    assert baseline["source"] == vllm_server and baseline["validation_run_id"] == run_id
    assert [t["concurrency"] for t in baseline["report"]["throughput"]] == [1, 2]
    # concurrency 2: the counters read around the whole pass (the requests overlap), the same prompts
    assert [t["acceptance_rate"] for t in baseline["report"]["throughput"]] == [round(total / (K * steps), 6)] * 2
    checks = {c["name"]: c["status"] for c in baseline["report"]["checks"]}
    assert checks["engine_equivalence"] == "skip"  # no --engine-reference-url
    # parity against our runtime's decode of the same ids on vLLM's schedule (not the recorded
    # run's 0.5): passes or fails by the tolerance, exit code to match
    ours = runtime_baselines(registry, ref, tiny_models)
    assert baseline["report"]["ours"]["overall"] == ours["overall"]
    expected_pass = abs(total / (K * steps) - ours["overall"]["acceptance_rate"]) <= 0.03
    ours_code = ours["per_category"]["code"]
    code_off = abs(sum(sum(a) for a in code) / (K * sum(len(a) for a in code)) - ours_code["acceptance_rate"]) > 0.03
    # a category is judged from k / tolerance drafted tokens on both sides
    code_judged = min(ours_code["drafted"], K * sum(len(a) for a in code)) >= engine.category_min_drafted(K, 0.03)
    parity = "fail" if not expected_pass or (code_off and code_judged) else "warn" if code_off else "pass"
    assert checks["engine_parity"] == parity
    assert done.returncode == (100 if parity == "fail" else 0), done.stderr


def test_engine_url_usage_errors_are_one_line(db_url, tiny_models):
    """The same one line and exit code from `validate --engine` and `validate-engine`."""
    from clirun import run_specreg

    from specreg.api import Registry

    registry = Registry(db_url)
    ref = registry.register("pair", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                            num_speculative_tokens=K).version.label
    # vLLM without a URL is started here (tests/vllmengine); SGLang only runs where someone started it
    for args, message in ((["--engine", "sglang"], "--engine sglang runs against a server you started: pass --engine-url URL"),
                          (["--engine", "vllm", "--engine-model", "m"], "--engine-model goes with --engine-url"),
                          (["--engine", "llamacpp", "--engine-url", "http://127.0.0.1:9"], "drop --engine-url"),
                          (["--engine-url", "http://127.0.0.1:9"], "need --engine"),
                          (["--engine", "vllm", "--engine-url", "ftp://x"], "must be http://HOST:PORT"),
                          (["--engine", "vllm", "--engine-url", "http://127.0.0.1:9", "--concurrency", "0"],
                           "invalid --concurrency 0"),
                          (["--engine", "vllm", "--engine-url", "http://127.0.0.1:9", "--concurrency", "1,x"],
                           "invalid --concurrency '1,x': comma-separated integers"),
                          (["--engine", "llamacpp", "--near-tie-tolerance", "-1"], "invalid near-tie tolerance -1.0")):
        done = run_specreg(["validate", ref, *args, "--db", db_url])
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr
        if "--engine" in args:
            own = run_specreg(["validate-engine", ref, *args, "--db", db_url])
            assert (own.returncode, own.stdout, own.stderr) == (done.returncode, done.stdout, done.stderr)
    for command in ("validate", "validate-engine"):
        unreachable = run_specreg([command, ref, "--engine", "vllm", "--engine-url", "http://127.0.0.1:9", "--db", db_url])
        assert unreachable.returncode == 1 and "cannot reach http://127.0.0.1:9" in unreachable.stderr
    assert registry.engine_baselines(ref) == []


def target_token(prompt_ids, position):
    """The scripted target's greedy token at a generated position (vllm_spec_server.schedule)."""
    return (prompt_ids[-1] + position) % 97 + 3


@pytest.mark.slow
@pytest.mark.parametrize("margin,status", [(0.1, "warn"), (2.0, "fail")])
def test_engine_url_judges_each_difference_by_the_reference_servers_logprobs(db_url, tiny_models, vllm_servers,
                                                                             margin, status):
    """The speculative server parts from the target-only one at token 2 of every prompt; the
    reference server's top-2 there, from vLLM's own logprobs code, has the two tokens ``margin``
    apart: under the bfloat16 tolerance (0.25) a near-tie (warn), above it a failure, each listed."""
    from clirun import run_specreg

    from specreg.api import Registry
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.loading import load_tokenizer

    swap_at = SWAP_AT
    speculative, reference = vllm_servers["speculative"], vllm_servers[margin]
    registry = Registry(db_url)
    ref = registry.register("pair", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                            num_speculative_tokens=K).version.label
    tokenizer = load_tokenizer(str(tiny_models["target"]))
    prompts = {record.id: record.encode(tokenizer) for record in load_golden_set("smoke")}
    steps = [scripted(ids, record.max_new_tokens, K) for record, ids in zip(load_golden_set("smoke"), prompts.values())]
    alpha = sum(map(sum, steps)) / (K * sum(map(len, steps)))
    record_validation(registry, ref, golden="smoke", acceptance_rate=alpha)
    # a parity tolerance no difference reaches: only equivalence judges (a difference beyond the
    # registry's 0.03 still leaves the baseline unaccepted)
    done = run_specreg(["validate", ref, "--engine", "vllm", "--engine-url", speculative, "--engine-reference-url",
                        reference, "--golden", "smoke", "--concurrency", "1", "--parity-tolerance", "0.99",
                        "--db", db_url, "--json"])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(done.stdout)["report"]["checks"]}
    assert checks["engine_parity"]["status"] != "fail"
    unaccepted = abs(runtime_baselines(registry, ref, tiny_models)["overall"]["acceptance_rate"] - alpha) > 0.03
    equivalence = checks["engine_equivalence"]
    assert equivalence["status"] == status, equivalence["summary"]
    assert equivalence["figures"]["near_tie" if status == "warn" else "fail"] == len(prompts)
    differences = {d["record"]: d for d in equivalence["evidence"]["differences"]}
    assert sorted(differences) == sorted(prompts)  # every difference listed
    for record_id, ids in prompts.items():
        found = differences[record_id]
        expected = target_token(ids, swap_at)
        rival = (expected - 2) % 97 + 3
        assert (found["position"], found["target_only_token_id"], found["speculative_token_id"]) == (swap_at, expected, rival)
        assert [token for token, _ in found["engine_top2"]] == [expected, rival]
        assert found["engine_margin"] == pytest.approx(margin, abs=1e-6)
        assert found["near_tie"] is (status == "warn") and found["tolerance"] == 0.25
    assert done.returncode == (0 if status == "warn" and not unaccepted else 100), done.stderr[-2000:]
