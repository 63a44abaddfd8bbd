"""The validation runtime's n-gram drafter against vLLM 0.33.0's own n-gram proposer.

`method: ngram` in our vLLM export is served by vllm/v1/spec_decode/ngram_proposer.py; a pair's
validated acceptance describes what vLLM serves only if runtime/methods/ngram.py's NgramDrafter drafts
the same tokens. vLLM's NgramProposer.propose runs on each sequence from the cached wheel (numba
JIT included, ngram_check.py, one subprocess); ours on the same sequences; the proposals must be
identical token ids. Skips without the engine cache locally, fails in CI (conftest.run_or_skip).
"""

from __future__ import annotations

import random

import pytest
from engine_env import ENGINES_DIR

from specreg.runtime.methods.ngram import NgramDrafter

MAX_MODEL_LEN = 64

# id: (tokens, prompt_lookup_min, prompt_lookup_max, k, max_model_len, the draft derived by hand)
NAMED = {
    # [1, 2] occurs at 0 and 4 (the 3-gram [8, 1, 2] nowhere earlier): the earliest, 0, is continued
    # ([4, 8, 1] would be the latest's continuation)
    "several-earlier-occurrences": ([1, 2, 3, 9, 1, 2, 4, 8, 1, 2], 1, 3, 3, MAX_MODEL_LEN, [3, 9, 1]),
    # [5, 5, 5] occurs at 0, 1 (overlapping the tail): from 0, two tokens remain after it
    "overlapping-run": ([5, 5, 5, 5, 5], 1, 3, 4, MAX_MODEL_LEN, [5, 5]),
    # the 4-gram [1, 2, 1, 2] at 0 overlaps the tail (2..5); two tokens follow it
    "overlapping-period-2": ([1, 2, 1, 2, 1, 2], 2, 4, 3, MAX_MODEL_LEN, [1, 2]),
    # the 2-gram [1, 3] (at 2) wins over the 1-gram [3], whose earliest occurrence (0) is continued by [6, 1]
    "longest-n-first": ([3, 6, 1, 3, 5, 1, 3], 1, 2, 2, MAX_MODEL_LEN, [5, 1]),
    # a 3-gram and a 2-gram both occur; the 3-gram [4, 5, 6] at 3 wins over [5, 6] at 0
    "n-inside-range": ([5, 6, 9, 4, 5, 6, 7, 2, 4, 5, 6], 2, 3, 2, MAX_MODEL_LEN, [7, 2]),
    # only the 1-gram [4] occurs earlier, below prompt_lookup_min = 2: nothing
    "below-min": ([4, 9, 4, 2, 4], 2, 3, 3, MAX_MODEL_LEN, []),
    "no-match": ([1, 2, 3, 4, 5], 1, 3, 3, MAX_MODEL_LEN, []),
    # [8, 9] at 0: three tokens follow it, fewer than k = 5
    "near-end-fewer-than-k": ([8, 9, 1, 8, 9], 1, 3, 5, MAX_MODEL_LEN, [1, 8, 9]),
    # k = 4 capped at max_model_len - 5 = 2
    "max-model-len-caps-k": ([1, 2, 3, 1, 2], 1, 3, 4, 7, [3, 1]),
    "at-max-model-len": ([1, 2, 3, 1, 2], 1, 3, 4, 5, []),
    "max-beyond-length": ([2, 2], 1, 5, 3, MAX_MODEL_LEN, [2]),
    "single-token": ([4], 1, 3, 3, MAX_MODEL_LEN, []),
    "empty": ([], 1, 3, 3, MAX_MODEL_LEN, []),
}


def random_cases() -> dict[str, tuple]:
    """Seeded sequences over small alphabets (many repeats, overlaps, several occurrences)."""
    rng = random.Random(20261201)
    cases = {}
    for index in range(400):
        low = rng.randint(1, 3)
        tokens = [rng.randint(0, 3) for _ in range(rng.randint(0, 40))]
        cases[f"random-{index}"] = (tokens, low, low + rng.randint(0, 3), rng.randint(1, 6), 48)
    for index in range(20):  # longer, prompt-like: a larger alphabet, n up to 5
        tokens = [rng.randint(0, 11) for _ in range(300)]
        cases[f"long-{index}"] = (tokens, rng.randint(1, 2), 5, rng.randint(3, 8), 512)
    return cases


CASES = {name: case[:5] for name, case in NAMED.items()} | random_cases()


@pytest.fixture(scope="module")
def vllm_proposals(engine_runner, tmp_path_factory):
    cases = [{"id": name, "tokens": tokens, "min": low, "max": high, "k": k, "max_model_len": max_model_len}
             for name, (tokens, low, high, k, max_model_len) in CASES.items()]
    output = engine_runner("vllm", cases, tmp_path_factory.mktemp("ngram-check"), script=ENGINES_DIR / "ngram_check.py")
    return {result["id"]: result["proposal"] for result in output["results"]}


def ours(tokens: list[int], low: int, high: int, k: int, max_model_len: int) -> list[int]:
    """NgramDrafter.propose as the decode loop asks it (a DraftRequest); vLLM's cap of k at
    max_model_len is the caller's cap at the token budget in our runtime (step.draft), applied
    here the same way."""
    import torch

    from specreg.runtime.methods.base import DraftRequest

    k = min(k, max_model_len - len(tokens))
    if k <= 0:
        return []
    request = DraftRequest(torch.tensor([tokens], dtype=torch.long), list(tokens), k)
    draft_ids, _ = NgramDrafter(16, low, high).propose(request)
    return draft_ids.tolist()


@pytest.mark.parametrize("name", list(NAMED))
def test_vllm_and_the_runtime_propose_the_hand_derived_draft(vllm_proposals, name):
    *case, expected = NAMED[name]
    assert vllm_proposals[name] == expected
    assert ours(*case) == expected


def test_the_runtime_proposes_what_vllm_proposes_on_random_sequences(vllm_proposals):
    differing = [(name, CASES[name], vllm_proposals[name], ours(*CASES[name]))
                 for name in CASES if ours(*CASES[name]) != vllm_proposals[name]]
    assert not differing, f"{len(differing)} of {len(CASES)} differ, first (case, vLLM, ours): {differing[:3]}"
    assert sum(bool(vllm_proposals[name]) for name in CASES) > len(CASES) // 3  # most cases draft something
