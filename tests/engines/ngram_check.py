"""Run vLLM 0.33.0's own n-gram proposer on token sequences; one process for all cases.

Usage: python ngram_check.py vllm CASES.json OUT.json

Runs with the unpacked vLLM wheel and its dependencies (numba among them) first on sys.path
(engine_env.run_engine); imports nothing from specreg. CASES.json is a list of {"id", "tokens",
"min", "max", "k", "max_model_len"}; OUT.json gets {"results": [{"id", "proposal"}], "seconds"}.

The proposal comes from NgramProposer.propose (vllm/v1/spec_decode/ngram_proposer.py), the call
the model runner makes for `method: ngram` (gpu_model_runner.py, `self.drafter.propose(...)`),
with the request's tokens in token_ids_cpu and its length in num_tokens_no_spec, as the runner
keeps them. NgramProposer.__init__ only copies min/max/k/max_model_len/max_num_seqs out of a
VllmConfig, allocates the two draft buffers and warms the numba JIT; a VllmConfig needs a model,
so the instance is made with __new__ and given those same attributes (`proposer()` below).
Everything it computes is the released code.
"""

from __future__ import annotations

import sys

from engine_script import run_cases, runner_tokens


def proposer(min_n: int, max_n: int, k: int, max_model_len: int, max_num_seqs: int):
    """An NgramProposer with the attributes its __init__ sets (ngram_proposer.py:18-53)."""
    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    made = NgramProposer.__new__(NgramProposer)
    made.min_n, made.max_n, made.k, made.max_model_len = min_n, max_n, k, max_model_len
    made.valid_ngram_draft = np.zeros((max_num_seqs, k), dtype=np.int32)
    made.valid_ngram_num_drafts = np.zeros((max_num_seqs), dtype=np.int32)
    made.num_tokens_threshold = 8192
    made.num_numba_thread_available = 1
    return made


def check_ngram(cases: list[dict]) -> list[dict]:
    """Cases grouped by (min, max, k, max_model_len), each group one batch, as the runner batches requests."""
    groups: dict[tuple, list[dict]] = {}
    for case in cases:
        groups.setdefault((case["min"], case["max"], case["k"], case["max_model_len"]), []).append(case)
    results = []
    for (min_n, max_n, k, max_model_len), batch in groups.items():
        made = proposer(min_n, max_n, k, max_model_len, len(batch))
        token_ids_cpu, num_tokens_no_spec = runner_tokens([case["tokens"] for case in batch], max_model_len)
        # every request sampled a token this step (an empty list would skip it)
        sampled = [case["tokens"][-1:] or [0] for case in batch]
        proposals = made.propose(k, sampled, num_tokens_no_spec, token_ids_cpu)
        results += [{"id": case["id"], "proposal": [int(t) for t in proposal]} for case, proposal in zip(batch, proposals)]
    return results


if __name__ == "__main__":
    sys.exit(run_cases({"vllm": lambda cases: {"results": check_ngram(cases)}}))
