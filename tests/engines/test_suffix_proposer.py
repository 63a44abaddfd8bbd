"""The validation runtime's suffix drafter against vLLM 0.33.0's own suffix decoding proposer.

`method: suffix` in our vLLM export is served by vllm/v1/spec_decode/suffix_decoding.py, which
calls Arctic Inference's SuffixDecodingCache (C++ suffix trees). A pair's validated acceptance
describes what vLLM serves only if runtime/methods/suffix.py's SuffixDrafter drafts the same
tokens. Arctic Inference 0.3.0 is built from its source archive on this CPU
(engine_env.prepare_arctic: cmake, nanobind), vLLM's SuffixDecodingProposer.propose runs on
requests decoded step by step (suffix_check.py, one subprocess), ours on the same steps; the
drafts must be identical token ids at every step. Each request is served by a fresh proposer, as
validation drafts it (no earlier responses in the global tree). Skips without the engine cache,
the package index or a C++ toolchain locally, fails in CI (conftest.run_or_skip).
"""

from __future__ import annotations

import random

import pytest
from engine_env import ENGINES_DIR

from specreg.runtime.methods.suffix import SuffixDrafter, SuffixSettings

DEFAULTS = {"max_tree_depth": 24, "max_cached_requests": 10000, "max_spec_factor": 1.0, "min_token_prob": 0.1}

# id: (prompt, steps, k, max_model_len, settings, the last step's draft derived by hand)
NAMED = {
    # [1, 2, 3] ends the sequence and occurs twice before: its node counts 3, the child [.., 1] 2, so
    # each drafted token has p = 2/3 (score 2.0, match length 3 allows 3 tokens); longer matches
    # continue only one earlier occurrence (p = 1/2) and shorter ones allow fewer tokens
    "periodic-prompt": ([1, 2, 3, 1, 2, 3, 1, 2], [[3]], 5, 64, DEFAULTS, [1, 2, 3]),
    # the same, with max_spec_factor 0.5: a match of length m drafts at most m / 2 tokens
    "spec-factor-halves": ([1, 2, 3, 1, 2, 3, 1, 2], [[3]], 5, 64, DEFAULTS | {"max_spec_factor": 0.5}, [1, 2, 3]),
    # nothing in the prompt repeats and the response is one token: nothing to draft
    "no-repeat": ([5, 6, 7, 8], [[9]], 4, 64, DEFAULTS, []),
    # p = 2/3 < min_token_prob 0.7: nothing
    "below-min-token-prob": ([1, 2, 3, 1, 2, 3, 1, 2], [[3]], 5, 64, DEFAULTS | {"min_token_prob": 0.7}, []),
    # 11 tokens, max_model_len 13: k capped at 13 - 11 - 1 = 1
    "max-model-len-caps-k": ([1, 2, 3, 1, 2, 3, 1, 2], [[3], [1, 2]], 5, 13, DEFAULTS, [3]),
}


def random_cases() -> dict[str, tuple]:
    """Seeded requests over small alphabets (many repeats), each decoded in steps of 1..k+1 tokens
    (what one verification emits), with the settings varied over what vLLM accepts."""
    rng = random.Random(20261202)
    cases = {}
    for index in range(240):
        alphabet = rng.choice([3, 4, 6, 12])
        prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 60))]
        k = rng.randint(1, 8)
        response = [rng.randrange(alphabet) for _ in range(rng.randint(1, 80))]
        if rng.random() < 0.5:  # responses that repeat the prompt, as summaries and code edits do
            start = rng.randrange(len(prompt))
            response = prompt[start:start + rng.randint(1, 40)] + response
        steps, position = [], 0
        while position < len(response):
            size = rng.randint(1, k + 1)
            steps.append(response[position:position + size])
            position += size
        settings = {"max_tree_depth": rng.choice([1, 2, 4, 8, 24, 64]),
                    "max_cached_requests": rng.choice([0, 1, 10000]),
                    "max_spec_factor": rng.choice([0.0, 0.5, 1.0, 1.5, 2.0, 4.0]),
                    "min_token_prob": rng.choice([0.0, 0.1, 0.25, 0.5, 1.0])}
        max_model_len = len(prompt) + len(response) + rng.choice([0, 2, 100])
        cases[f"random-{index}"] = (prompt, steps, k, max_model_len, settings)
    return cases


CASES = {name: case[:5] for name, case in NAMED.items()} | random_cases()


@pytest.fixture(scope="module")
def vllm_drafts(engine_runner, tmp_path_factory):
    cases = [{"id": name, "prompt": prompt, "steps": steps, "k": k, "max_model_len": max_model_len, **settings}
             for name, (prompt, steps, k, max_model_len, settings) in CASES.items()]
    output = engine_runner("vllm", cases, tmp_path_factory.mktemp("suffix-check"),
                           script=ENGINES_DIR / "suffix_check.py", arctic=True)
    return {result["id"]: result["drafts"] for result in output["results"]}


def ours(prompt: list[int], steps: list[list[int]], k: int, max_model_len: int, settings: dict) -> list[list[int]]:
    """SuffixDrafter as the decode loop drives it on the engines' schedule: the prefill's rollback
    fixes the prompt, then each step's verified sequence is drafted from; vLLM's cap of k at
    max_model_len - 1 is the caller's cap at the token budget in our runtime, applied the same way."""
    drafter = SuffixDrafter(16, SuffixSettings(**settings))
    drafter.rollback(len(prompt))
    sequence, drafts = list(prompt), []
    for sampled in steps:
        sequence += sampled
        wanted = min(k, max_model_len - len(sequence) - 1)
        drafts.append(drafter.draft(sequence, wanted) if wanted > 0 else [])
    return drafts


@pytest.mark.parametrize("name", list(NAMED))
def test_vllm_and_the_runtime_draft_the_hand_derived_tokens(vllm_drafts, name):
    *case, expected = NAMED[name]
    assert vllm_drafts[name][-1] == expected
    assert ours(*case) == vllm_drafts[name]


def test_the_runtime_drafts_what_vllm_drafts_at_every_step(vllm_drafts):
    differing = []
    for name, case in CASES.items():
        for step, (theirs, mine) in enumerate(zip(vllm_drafts[name], ours(*case))):
            if theirs != mine:
                differing.append((name, step, theirs, mine))
                break
    assert not differing, f"{len(differing)} of {len(CASES)} requests differ, first (case, step, vLLM, ours): {differing[:3]}"
    steps = [draft for name in CASES for draft in vllm_drafts[name]]
    assert sum(bool(draft) for draft in steps) > len(steps) // 4  # many steps draft something
    assert any(len(draft) >= 4 for draft in steps)
