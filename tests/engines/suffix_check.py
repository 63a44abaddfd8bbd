"""Run vLLM 0.33.0's own suffix decoding proposer, with Arctic Inference's suffix cache built from
its source, on requests decoded step by step; one process for all cases.

Usage: python suffix_check.py vllm CASES.json OUT.json

Runs with the unpacked vLLM wheel, its dependencies and the built arctic_inference first on
sys.path (engine_env.run_engine(..., arctic=True)); imports nothing from specreg. CASES.json is a
list of {"id", "prompt", "steps" (the tokens each step sampled), "k", "max_model_len",
"max_tree_depth", "max_cached_requests", "max_spec_factor", "min_token_prob"}; OUT.json gets
{"results": [{"id", "drafts": [per step the draft token ids]}], "seconds"}. A case with
"series" instead of "prompt" and "steps" (a list of {"prompt", "steps"}) is requests served one
after another by one proposer (a server at concurrency 1): its "drafts" are per request the
drafts of each step.

Each case without a series is one request on a fresh proposer (a server with no earlier responses). The drafts
come from SuffixDecodingProposer.propose (vllm/v1/spec_decode/suffix_decoding.py), the call the
model runner makes for `method: suffix` (gpu_model_runner.py), with the request's tokens in the
input batch's token_ids_cpu and its length in num_tokens_no_spec as the runner keeps them after a
step. SuffixDecodingProposer.__init__ reads num_speculative_tokens, the four suffix_decoding_*
settings and max_model_len out of a VllmConfig, which needs a model, so it is handed an object
with just those; the input batch likewise carries the five fields propose reads. Everything it
computes is the released code and Arctic Inference's.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from engine_script import run_cases, runner_tokens


def proposer(case: dict):
    """A SuffixDecodingProposer made by its own __init__ from the fields it reads."""
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    speculative = SimpleNamespace(num_speculative_tokens=case["k"],
                                  suffix_decoding_max_tree_depth=case["max_tree_depth"],
                                  suffix_decoding_max_cached_requests=case["max_cached_requests"],
                                  suffix_decoding_max_spec_factor=case["max_spec_factor"],
                                  suffix_decoding_min_token_prob=case["min_token_prob"])
    return SuffixDecodingProposer(SimpleNamespace(speculative_config=speculative,
                                                  model_config=SimpleNamespace(max_model_len=case["max_model_len"])))


def serve(made, request: str, prompt: list[int], steps: list[list[int]], case: dict) -> list[list[int]]:
    """One request's steps through ``made`` alone in the input batch -> each step's draft."""
    import numpy as np

    sequence = list(prompt)
    drafts = []
    for sampled in steps:
        sequence += sampled
        token_ids_cpu, num_tokens_no_spec = runner_tokens([sequence], case["max_model_len"])
        batch = SimpleNamespace(req_ids=[request], req_id_to_index={request: 0},
                                num_tokens_no_spec=num_tokens_no_spec,
                                num_prompt_tokens=np.array([len(prompt)], dtype=np.int32),
                                token_ids_cpu=token_ids_cpu)
        drafts.append([int(t) for t in made.propose(case["k"], batch, [list(sampled)])[0]])
    return drafts


def check_suffix(cases: list[dict]) -> list[dict]:
    results = []
    for case in cases:
        made = proposer(case)
        if "series" in case:
            drafts = [serve(made, f"{case['id']}-{index}", request["prompt"], request["steps"], case)
                      for index, request in enumerate(case["series"])]
        else:
            drafts = serve(made, str(case["id"]), case["prompt"], case["steps"], case)
        results.append({"id": case["id"], "drafts": drafts})
    return results


if __name__ == "__main__":
    sys.exit(run_cases({"vllm": lambda cases: {"results": check_suffix(cases)}}))
