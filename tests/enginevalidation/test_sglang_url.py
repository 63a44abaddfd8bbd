"""`specreg validate NAME@V --engine sglang --engine-url URL` against loopback servers whose
/generate answers are built by SGLang 0.5.23's own code (sglang_spec_server.py): meta_info's
spec_* fields from the scheduler's Req counters through TokenizerManager._handle_batch_output,
and output_top_logprobs from its convert_logprob_style, read by specreg the engine's way."""

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


SWAP_AT = 2
MARGINS = (0.1, 2.0)  # under and over the bfloat16 near-tie tolerance (0.25)


@pytest.fixture(scope="module")
def sglang_servers(tiny_models, terminal_line):
    """{"speculative": URL, 0.1: URL, 2.0: URL}: sglang_spec_server.py on loopback, started together
    (SGLang's import is the slow part): the speculative one launched with the tiny target and
    draft (SGLang's STANDALONE arguments, as our sglang export writes them) and parting from the
    target at token SWAP_AT; a target-only reference per margin. Stopped at the end."""
    from engine_env import engine_env_or_skip, loopback_servers

    env = engine_env_or_skip("sglang", log=terminal_line)
    target = ["--model-path", str(tiny_models["target"])]
    draft = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(tiny_models["draft"]),
             "--speculative-num-steps", str(K), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
             str(K + 1)]
    plans = {"speculative": [str(K), "--swap-at", str(SWAP_AT), "--", *target, *draft],
             **{margin: ["0", "--margin", str(margin), "--", *target] for margin in MARGINS}}
    with loopback_servers(HERE / "sglang_spec_server.py", plans, env) as urls:
        yield urls


@pytest.mark.slow
@pytest.mark.parametrize("margin,status", [(0.1, "warn"), (2.0, "fail")])
def test_sglang_meta_info_counts_and_near_ties(db_url, tiny_models, sglang_servers, margin, status):
    """Acceptance from SGLang's meta_info (tau = 1 + correct / verify steps, per position from its
    histogram) equals the scripted counts; the speculative server parts from the target-only one at
    token SWAP_AT of every prompt and the reference's output_top_logprobs judge each difference."""
    from clirun import run_specreg

    from specreg.api import Registry
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.loading import load_tokenizer

    speculative, reference = sglang_servers["speculative"], sglang_servers[margin]
    registry = Registry(db_url)
    ref = registry.register("pair", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                            num_speculative_tokens=K).version.label
    tokenizer = load_tokenizer(str(tiny_models["target"]))
    records = list(load_golden_set("smoke"))
    prompts = {record.id: record.encode(tokenizer) for record in records}
    steps = [scripted(prompts[record.id], record.max_new_tokens, K) for record in records]
    total, count = sum(map(sum, steps)), sum(map(len, steps))
    record_validation(registry, ref, golden="smoke", acceptance_rate=total / (K * count))
    done = run_specreg(["validate", ref, "--engine", "sglang", "--engine-url", speculative, "--engine-reference-url",
                        reference, "--golden", "smoke", "--concurrency", "1", "--db", db_url, "--json"])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    baseline = json.loads(done.stdout)
    overall = baseline["baselines"]["overall"]
    assert (overall["num_drafts"], overall["drafted"], overall["accepted"]) == (count, K * count, total)
    assert overall["mean_acceptance_length"] == pytest.approx(1 + total / count)
    assert overall["per_position_acceptance"] == pytest.approx(
        [sum(1 for a in steps for j in a if j > i) / count for i in range(K)])
    assert baseline["engine"] == "sglang" and baseline["engine_version"] == "0.5.23"
    checks = {c["name"]: c for c in baseline["report"]["checks"]}
    assert checks["engine_parity"]["status"] != "fail"
    equivalence = checks["engine_equivalence"]
    assert equivalence["status"] == status, equivalence["summary"]
    differences = {d["record"]: d for d in equivalence["evidence"]["differences"]}
    assert sorted(differences) == sorted(prompts)  # every difference listed
    for record_id, ids in prompts.items():
        found = differences[record_id]
        expected = (ids[-1] + SWAP_AT) % 97 + 3  # the scripted target's token there
        rival = (expected - 2) % 97 + 3
        assert (found["position"], found["target_only_token_id"], found["speculative_token_id"]) == (SWAP_AT, expected, rival)
        assert [token for token, _ in found["engine_top2"]] == [expected, rival]
        assert found["engine_margin"] == pytest.approx(margin, abs=1e-9)
        assert found["near_tie"] is (status == "warn")
    assert done.returncode == (0 if status == "warn" else 100), done.stderr[-2000:]
