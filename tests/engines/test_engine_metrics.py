"""Our metrics readers on the exposition text the engines' own metric-logging code writes
(engine_metrics.py, in the released vLLM 0.33.0 wheel; SGLang's cannot be imported on a CPU
machine, see there), fed known counts and
our runtime's own steps: the figures `specreg observe` reads are exactly the engine's, and our
runtime's tau and per-position acceptance are the engine's for the same steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from specreg.registry.deploy.live_metrics import live_figures, read_engine
from specreg.runtime.metrics import GenerationMetrics
from steplog import StepLog  # tests/ is on sys.path (tests/conftest.py)

SCRIPT = Path(__file__).parent / "engine_metrics.py"
K = 4
SERVED = "chat-pair"
# (draft tokens, accepted) per verification, per engine index; (0, 0): an n-gram miss, no draft step
KNOWN = {"history": {"0": [(4, 3)] * 5, "1": [(4, 1)] * 2},
         "interval": {"0": [(4, 4), (4, 0), (0, 0), (2, 2), (4, 1)], "1": [(4, 2), (0, 0), (4, 3)]}}




def runtime_steps(models: dict[str, Path]) -> dict[str, StepLog]:
    """Our runtime's steps on the tiny target: drafted by itself (all accepted but where the budget cuts a
    step short) and by n-gram lookup (partly accepted, and missing now and then)."""
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import stream_generate
    from specreg.runtime.methods import load_pair

    logs = {}
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 5, 6]
    for name, draft, method in (("draft_model", models["target"], "draft_model"), ("ngram", None, "ngram")):
        pair = load_pair(models["target"], draft)
        logs[name] = StepLog()
        config = DecodeConfig(method=method, k=K, max_new_tokens=48, eos_token_ids=(), prompt_lookup_max=3)
        list(stream_generate(pair, prompt, config, metrics=logs[name]))
    return logs


def vllm_argv(models: dict[str, Path]) -> list[str]:
    config = f'{{"method": "ngram", "num_speculative_tokens": {K}, "prompt_lookup_min": 1, "prompt_lookup_max": 3}}'
    return ["vllm", "serve", str(models["target"]), "--speculative-config", config, "--served-model-name", SERVED]


@pytest.fixture(scope="module")
def steps(tiny_models):
    return runtime_steps(tiny_models)


@pytest.fixture(scope="module")
def vllm_text(tiny_models, steps, tmp_path_factory, engine_runner):
    cases = [{"id": "known", "argv": vllm_argv(tiny_models), **KNOWN}]
    for name, log in steps.items():
        cases.append({"id": name, "argv": vllm_argv(tiny_models), "history": {}, "interval": {"0": log.steps}})
    output = engine_runner("vllm", cases, tmp_path_factory.mktemp("vllm-metrics"), script=SCRIPT)
    assert output["stand_ins"] == []
    return {result["id"]: result for result in output["results"]}


def read_interval(result: dict) -> dict:
    first = read_engine(result["before"], "vllm", SERVED, "vllm")
    second = read_engine(result["after"], "vllm", SERVED, "vllm")
    return live_figures(first, second, "vllm", 60.0, "vllm")


def test_vllm_counters_read_exactly_with_steps_that_drafted_nothing(vllm_text):
    live = read_interval(vllm_text["known"])
    # interval: 6 draft steps (the two (0, 0) are not), 22 draft tokens, 12 accepted; engines 0 and 1 summed
    assert (live["drafts"], live["draft_tokens"], live["accepted_tokens"]) == (6, 22, 12)
    assert live["acceptance_rate"] == 12 / 22
    assert live["mean_acceptance_length"] == 1 + 12 / 6
    # vLLM's unconditional rate: accepted at position i / draft steps (5, 4, 2, 1 steps reached past i)
    assert live["per_position_acceptance"] == [5 / 6, 4 / 6, 2 / 6, 1 / 6]
    logged = vllm_text["known"]["vllm_log"]  # vLLM's own log line for the same interval
    assert logged["mean_acceptance_length"] == live["mean_acceptance_length"]
    assert (logged["accepted"], logged["drafted"]) == (12, 22)
    assert logged["per_position"] == [round(p, 3) for p in live["per_position_acceptance"]]
    assert logged["acceptance_rate_percent"] == pytest.approx(100 * live["acceptance_rate"])
    # our runtime's metrics on the same steps give the same figures
    ours = GenerationMetrics()
    for engine in ("0", "1"):
        for drafted, accepted in KNOWN["interval"][engine]:
            ours.record_step(drafted, accepted, accepted + 1)
    assert (ours.acceptance_rate, ours.mean_acceptance_length, ours.per_position_acceptance) == (
        live["acceptance_rate"], live["mean_acceptance_length"], live["per_position_acceptance"])
    assert ours.tokens_per_target_forward == 20 / 8 != live["mean_acceptance_length"]  # the old tau


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_our_runtime_counts_tau_as_vllm_does(method, vllm_text, steps):
    """Our runtime's steps on a real pair, fed through vLLM's scheduler accounting: vLLM's tau,
    alpha-hat and per-position acceptance equal what our runtime records as baselines."""
    log = steps[method]
    live = read_interval(vllm_text[method])
    ours = log.summary()
    assert live["drafts"] == ours["draft_steps"] and live["accepted_tokens"] == ours["accepted"]
    assert live["acceptance_rate"] == pytest.approx(ours["acceptance_rate"], rel=1e-12)
    assert live["mean_acceptance_length"] == pytest.approx(ours["mean_acceptance_length"], rel=1e-12)
    assert live["per_position_acceptance"] == pytest.approx(ours["per_position_acceptance"], rel=1e-12)
    assert vllm_text[method]["vllm_log"]["mean_acceptance_length"] == pytest.approx(ours["mean_acceptance_length"])
    if method == "ngram":  # lookups that found nothing: verified, not draft steps
        assert ours["draft_steps"] < len(log.steps)
        assert ours["tokens_per_target_forward"] < ours["mean_acceptance_length"]
