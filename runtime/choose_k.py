"""Choice of the speculative depth k from measured acceptance and cost (docs/design.md §2)."""

from __future__ import annotations

import copy
import math
import time


def acceptance_by_position(conditional_acceptance, k: int) -> list[float]:
    """A constant alpha or the measured per-position conditional rates (metrics'
    per_position_acceptance_conditional; vLLM's unconditional per_position_acceptance already holds
    the products) -> k conditional acceptances.

    Positions past the measured ones reuse the last measured value: an extrapolation, which
    callers must name as such (validators/performance.py recommends within the measured depth).
    """
    if isinstance(conditional_acceptance, (int, float)):
        return [float(conditional_acceptance)] * k
    values = [float(a) for a in conditional_acceptance]
    if not values:
        return [0.0] * k
    return (values + [values[-1]] * k)[:k]


def expected_tokens_per_step(conditional_acceptance, k: int) -> float:
    """Expected tokens emitted per target forward: 1 + sum_j prod_{i<=j} a_i.

    With a constant alpha this is (1 - alpha^(k+1)) / (1 - alpha).
    """
    expected, reach = 1.0, 1.0
    for acceptance in acceptance_by_position(conditional_acceptance, k):
        reach *= acceptance
        expected += reach
    return expected


def expected_speedup(conditional_acceptance, k: int, cost_ratio: float) -> float:
    """Expected wall-clock speedup over target-only: tokens per step / (k * c + 1)."""
    return expected_tokens_per_step(conditional_acceptance, k) / (k * cost_ratio + 1.0)


def choose_k(conditional_acceptance, cost_ratio: float, k_max: int = 8) -> tuple[int, float]:
    """Measured acceptance (alpha or per-position conditional list) and c = draft/target step cost ->
    (k in 1..k_max maximising expected speedup, that expected speedup). No closed form: search."""
    best_k, best = 1, expected_speedup(conditional_acceptance, 1, cost_ratio)
    for k in range(2, k_max + 1):
        speedup = expected_speedup(conditional_acceptance, k, cost_ratio)
        if speedup > best:
            best_k, best = k, speedup
    return best_k, best


def head_draft_step_cost(summary: dict, one_step_s: float) -> float:
    """A head method's drafting cost per step in one-token target steps, from metrics.aggregate()
    over its generations: the drafting seconds over the steps that drafted (draft_steps: not a
    generation's prefill, where a head has no target states yet, nor a step the budget left no room
    to draft in); 0.0 without such a step."""
    drafting_steps = summary["draft_steps"]
    return summary["draft_time_s"] / drafting_steps / one_step_s if drafting_steps > 0 else 0.0


def choose_tree_depth(per_depth_acceptance, draft_step_cost: float, verify_costs: dict[int, float]) -> tuple[int, float]:
    """The depth to cut a candidate tree at: measured per-depth conditional acceptance (a tree's
    per_position_acceptance_conditional, position = depth), the drafting cost of one step and the verification cost of the
    tree cut at each depth d (verify_costs[d]), both in one-token target steps ->
    (depth, expected speedup = tokens per step / (draft_step_cost + verify_costs[depth])).
    A chain is the case verify cost 1 and draft cost k * c (expected_speedup)."""
    best_depth, best = 0, 0.0
    for depth, verify_cost in sorted(verify_costs.items()):
        speedup = expected_tokens_per_step(per_depth_acceptance, depth) / (draft_step_cost + verify_cost)
        if speedup > best:
            best_depth, best = depth, speedup
    return best_depth, best


def measure_tree_step_time(model, prompt_ids, tree, steps: int = 16, repeats: int = 3) -> float:
    """Median seconds of one tree verification step of `model` after a prefill of prompt_ids: one
    tree_forward over the root and the tree's nodes, then the cache compacted to the root (what a
    step that accepts nothing costs), as the decode loop runs it."""
    import torch
    from transformers import DynamicCache

    from specreg.runtime.clock import synchronize
    from specreg.runtime.forward import forward_logits
    from specreg.runtime.tree import compact_cache, tree_forward

    device = next(model.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).view(1, -1)  # [1, n]
    nothing = torch.empty(0, dtype=torch.long, device=device)
    timings = []
    with torch.inference_mode():
        for _ in range(repeats):
            cache = DynamicCache(config=model.config)
            forward_logits(model, prompt[:, :-1], cache)
            root = prompt[:, -1:]  # [1, 1]
            synchronize(device)
            start = time.perf_counter()
            for _ in range(steps):
                keep_length = cache.get_seq_length() + 1
                # the nodes' tokens do not change the cost: the root repeated
                logits, _ = tree_forward(model, cache, root, root[0].expand(tree.num_nodes + 1), tree)
                compact_cache(cache, keep_length, nothing)
                root = logits[:1].argmax(dim=-1, keepdim=True)  # [1, 1]
            synchronize(device)
            timings.append((time.perf_counter() - start) / steps)
    return sorted(timings)[len(timings) // 2]


def step_timer(model, prompt_ids, width: int = 1):
    """One prefill of prompt_ids into a cache of `model` -> time(steps): the mean seconds of `steps`
    cached decode steps after that prefill, each call on a copy of the prefilled cache (any kind of
    cache layer, sliding windows too), so every call times the same steps and none pays the
    prefill again.

    width > 1 times a verification-shaped step instead: a forward over `width` tokens, then the
    cache cropped back to one new token (what a step that accepts nothing costs).
    """
    import torch
    from transformers import DynamicCache

    from specreg.runtime.clock import synchronize
    from specreg.runtime.forward import forward_logits

    device = next(model.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).view(1, -1)  # [1, n]
    prefilled = DynamicCache(config=model.config)
    with torch.inference_mode():
        first = forward_logits(model, prompt, prefilled)[:, -1].argmax(dim=-1, keepdim=True)  # [1, 1]

    def time_steps(steps: int) -> float:
        with torch.inference_mode():
            cache, token = copy.deepcopy(prefilled), first
            synchronize(device)
            start = time.perf_counter()
            for _ in range(steps):
                logits = forward_logits(model, token.expand(1, width), cache, width)
                if width > 1:
                    cache.crop(-(width - 1))
                token = logits[:, -1].argmax(dim=-1, keepdim=True)
            synchronize(device)
            return (time.perf_counter() - start) / steps

    return time_steps


def measure_step_time(model, prompt_ids, steps: int = 16, repeats: int = 3, width: int = 1) -> float:
    """Median seconds of one cached decode step of `model` after a prefill of prompt_ids, over
    `repeats` timings of `steps` steps (step_timer: width > 1 times a verification-shaped step)."""
    time_steps = step_timer(model, prompt_ids, width)
    timings = sorted(time_steps(steps) for _ in range(repeats))
    return timings[len(timings) // 2]


# each timing of measure_cost_ratio covers at least this long of target steps (up to MAX_TIMED_STEPS):
# one or two steps of a real model, dozens of a tiny one whose steps take a millisecond
TIMING_WINDOW_S = 0.1
MAX_TIMED_STEPS = 64


def measure_cost_ratio(target, draft, prompt_ids, steps: int = 1, repeats: int = 5) -> float:
    """c = draft step time / target step time, measured on this machine.

    Each repeat times the draft and the target back to back and the median of the per-repeat
    ratios is returned: a burst of load from another process then skews one ratio, not the
    result (timing all draft steps first and all target steps later gave c = 0.94 for a pair
    whose true c is 0.1 on a busy machine). Three repeats that agree within 5% end it
    (median_ratio). Each model's prompt is prefilled once (step_timer). steps: the fewest steps
    a timing runs; more when the target's steps are quick (TIMING_WINDOW_S). The models have
    decoded before (validate times them after the golden set): one step of each warms them up.
    """
    draft_steps, target_steps = step_timer(draft, prompt_ids), step_timer(target, prompt_ids)
    draft_steps(1)  # warm-up both
    target_step = target_steps(1)
    steps = max(steps, min(MAX_TIMED_STEPS, math.ceil(TIMING_WINDOW_S / max(target_step, 1e-6))))
    return median_ratio(lambda: draft_steps(steps), lambda: target_steps(steps), repeats)


# median_ratio stops after the first AGREEING_REPEATS ratios when they lie within AGREEING_SPREAD
# of their median: more repeats cannot move the median outside them (an idle machine), and each
# repeat costs `steps` forwards of both models
AGREEING_REPEATS = 3
AGREEING_SPREAD = 0.05


def median_ratio(numerator, denominator, repeats: int) -> float:
    """Median of numerator() / denominator(), each pair timed back to back, over `repeats` pairs,
    or over the first AGREEING_REPEATS when those already agree within AGREEING_SPREAD."""
    ratios: list[float] = []
    for _ in range(repeats):
        ratios.append(numerator() / denominator())
        if len(ratios) == AGREEING_REPEATS and repeats > AGREEING_REPEATS:
            median = sorted(ratios)[len(ratios) // 2]
            if median > 0 and (max(ratios) - min(ratios)) <= AGREEING_SPREAD * median:
                break
    ratios.sort()
    return ratios[len(ratios) // 2]
