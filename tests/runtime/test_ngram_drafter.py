"""NgramDrafter's rule, derived by hand: vLLM 0.33.0's (tests/engines/test_ngram_proposer.py runs
the engine's own proposer on these and many more sequences)."""

from __future__ import annotations

from specreg.runtime.methods.ngram import NgramDrafter


def test_the_earliest_occurrence_of_the_longest_ngram_is_continued():
    drafter = NgramDrafter(16, prompt_lookup_min=1, prompt_lookup_max=3)
    # the 3-gram [8, 1, 2] occurs nowhere earlier; [1, 2] at 0 and at 4: 0 is continued, not 4 ([4, 8, 1])
    assert drafter.lookup([1, 2, 3, 9, 1, 2, 4, 8, 1, 2], 3) == [3, 9, 1]
    # overlapping occurrences of [5, 5, 5] at 0 and 1: from 0 two tokens remain, fewer than k
    assert drafter.lookup([5, 5, 5, 5, 5], 4) == [5, 5]
    # the 2-gram [1, 3] at 2 wins over the 1-gram [3] at 0 (which would give [6, 1])
    assert NgramDrafter(16, 1, 2).lookup([3, 6, 1, 3, 5, 1, 3], 2) == [5, 1]


def test_nothing_is_proposed_below_prompt_lookup_min():
    # [4] occurs earlier, but n = 1 < prompt_lookup_min = 2
    assert NgramDrafter(16, prompt_lookup_min=2, prompt_lookup_max=3).lookup([4, 9, 4, 2, 4], 3) == []
    assert NgramDrafter(16).lookup([1, 2, 3, 4, 5], 3) == []
