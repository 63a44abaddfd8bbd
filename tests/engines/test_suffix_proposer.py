"""The validation runtime's suffix drafter against vLLM 0.33.0's own suffix decoding proposer.

`method: suffix` in our vLLM export is served by vllm/v1/spec_decode/suffix_decoding.py, which
calls Arctic Inference's SuffixDecodingCache (C++ suffix trees). A pair's validated acceptance
describes what vLLM serves only if runtime/methods/suffix.py's SuffixDrafter drafts the same
tokens. Arctic Inference 0.3.0 is built from its source archive on this CPU
(engine_env.prepare_arctic: cmake, nanobind), vLLM's SuffixDecodingProposer.propose runs on
requests decoded step by step (suffix_check.py, one subprocess), ours on the same steps; the
drafts must be identical token ids at every step. A request is served by a fresh proposer (no
earlier responses in the global tree), and series of requests by one proposer, one after another,
as vLLM serves them at concurrency 1 (ours: one SuffixCache shared by the requests' drafters,
each request's last step handed over by finish as the decode loop does). Skips without the engine cache,
the package index or a C++ toolchain locally, fails in CI (conftest.run_or_skip).
"""

from __future__ import annotations

import random

import pytest
from engine_env import ENGINES_DIR

from specreg.runtime.methods.suffix import SuffixCache, SuffixDrafter, SuffixSettings

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

# id: (requests [(prompt, steps)], k, max_model_len, settings, the second request's first draft by hand)
NAMED_SERIES = {
    # the first response [1, 2, 3, 4] is in the global tree when the second request samples 1:
    # node [1] counts 2 (both responses), its child [2] 1 (p = 1/2): [2]; alone it would draft nothing
    "earlier-response-drafts": ([([7, 8, 9], [[1], [2], [3, 4]]), ([5, 6], [[1], [2]])], 4, 64, DEFAULTS, [2]),
    # one cached response: the first is evicted as the second starts
    "evicted-first-in-first-out": ([([7, 8, 9], [[1], [2], [3, 4]]), ([5, 6], [[1], [2]])], 4, 64,
                                   DEFAULTS | {"max_cached_requests": 1}, []),
    # the last step of the first request sampled 3 and 4 (4 past its end): the second drafts 4 after 3
    "last-step-tokens-cached": ([([7, 8, 9], [[1], [2, 3, 4]]), ([5, 6], [[3], [4]])], 4, 64, DEFAULTS, [4]),
}


def random_series() -> dict[str, tuple]:
    """Seeded series of 2 to 5 requests sharing one alphabet (responses that repeat each other),
    the settings varied over what vLLM accepts, eviction included."""
    rng = random.Random(20261206)
    cases = {}
    for index in range(60):
        alphabet, k = rng.choice([3, 4, 6]), rng.randint(1, 6)
        requests = []
        for _ in range(rng.randint(2, 5)):
            prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 20))]
            response = [rng.randrange(alphabet) for _ in range(rng.randint(2, 30))]
            steps, position = [], 0
            while position < len(response):
                size = rng.randint(1, k + 1)
                steps.append(response[position:position + size])
                position += size
            requests.append((prompt, steps))
        settings = {"max_tree_depth": rng.choice([1, 2, 4, 24]), "max_cached_requests": rng.choice([0, 1, 2, 10000]),
                    "max_spec_factor": rng.choice([0.5, 1.0, 2.0]), "min_token_prob": rng.choice([0.0, 0.1, 0.5])}
        cases[f"series-{index}"] = (requests, k, 200, settings)
    return cases


SERIES = {name: case[:4] for name, case in NAMED_SERIES.items()} | random_series()


@pytest.fixture(scope="module")
def vllm_drafts(engine_runner, tmp_path_factory):
    cases = [{"id": name, "prompt": prompt, "steps": steps, "k": k, "max_model_len": max_model_len, **settings}
             for name, (prompt, steps, k, max_model_len, settings) in CASES.items()]
    cases += [{"id": name, "series": [{"prompt": prompt, "steps": steps} for prompt, steps in requests], "k": k,
               "max_model_len": max_model_len, **settings}
              for name, (requests, k, max_model_len, settings) in SERIES.items()]
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


def ours_series(requests: list[tuple], k: int, max_model_len: int, settings: dict) -> list[list[list[int]]]:
    """The requests one after another on one SuffixCache, as the decode loop drives their drafters:
    each step but the last drafted from; the last step's tokens handed over by finish (the row
    ends there, vLLM proposes once more and its draft goes unused: it is not compared)."""
    cache = SuffixCache(SuffixSettings(**settings))
    drafts = []
    for prompt, steps in requests:
        drafter = SuffixDrafter(16, SuffixSettings(**settings), cache=cache)
        drafter.rollback(len(prompt))
        sequence, own = list(prompt), []
        for sampled in steps[:-1]:
            sequence += sampled
            wanted = min(k, max_model_len - len(sequence) - 1)
            own.append(drafter.draft(sequence, wanted) if wanted > 0 else [])
        drafter.finish(sequence + steps[-1])
        drafts.append(own)
    return drafts


@pytest.mark.parametrize("name", list(NAMED_SERIES))
def test_vllm_and_the_runtime_draft_from_earlier_responses_as_derived(vllm_drafts, name):
    *case, expected = NAMED_SERIES[name]
    assert vllm_drafts[name][1][0] == expected
    assert ours_series(*case) == [request[:-1] for request in vllm_drafts[name]]


def test_the_runtime_drafts_what_vllm_drafts_across_requests(vllm_drafts):
    differing = []
    for name, case in SERIES.items():
        theirs = [request[:-1] for request in vllm_drafts[name]]
        if ours_series(*case) != theirs:
            differing.append((name, theirs, ours_series(*case)))
    assert not differing, f"{len(differing)} of {len(SERIES)} series differ, first (case, vLLM, ours): {differing[:1]}"
    later = [draft for name in SERIES for request in vllm_drafts[name][1:] for draft in request]
    assert sum(bool(draft) for draft in later) > len(later) // 4
