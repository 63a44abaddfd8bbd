"""The demo EAGLE-3 head reads the layers it was validated with: served with its aux ids one layer
earlier or one later (an engine on other layers, an off-by-one between layer inputs and outputs),
its acceptance collapses, so `validate --engine` catches such an engine on the demo pair itself.

The demo pair and head are the real builds (runtime/demo_pair.py, runtime/demo_heads.py: about
3 CPU-minutes once), cached in $SPECREG_ENGINE_CACHE/demo-pair while their recipe is unchanged."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def demo_head_pair():
    from specreg.core.packages import cache_root
    from specreg.builders.demo_heads import build_demo_head
    from specreg.builders.demo_pair import build_demo_pair
    from specreg.runtime.methods import load_pair

    directory = cache_root() / "demo-pair"
    target_dir, _ = build_demo_pair(directory)
    head_dir = build_demo_head(directory, "eagle3", target_dir=target_dir)
    return load_pair(target_dir, head_dir, method="eagle3")


def smoke_acceptance(pair, aux_layer_ids) -> float:
    """Greedy acceptance on the smoke set at k 4 on the engines' schedule, the head reading aux_layer_ids."""
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate

    saved, pair.draft.aux_layer_ids = pair.draft.aux_layer_ids, tuple(aux_layer_ids)
    try:
        drafted = accepted = 0
        for record in load_golden_set("smoke"):
            metrics = speculative_generate(pair, record.encode(pair.tokenizer), DecodeConfig(
                method="eagle3", k=4, max_new_tokens=record.max_new_tokens, prefill_alone=True)).metrics
            drafted, accepted = drafted + metrics.drafted, accepted + metrics.accepted
        return accepted / drafted
    finally:
        pair.draft.aux_layer_ids = saved


@pytest.mark.slow
def test_the_demo_head_collapses_one_layer_off_either_way(demo_head_pair):
    aux = demo_head_pair.draft.aux_layer_ids
    assert aux == (1, 10, 18)  # not vLLM's default (2, 10, 17)
    right = smoke_acceptance(demo_head_pair, aux)
    assert right > 0.6, right
    for shift in (-1, 1):
        wrong = smoke_acceptance(demo_head_pair, [i + shift for i in aux])
        assert right - wrong >= 0.3, (shift, right, wrong)
