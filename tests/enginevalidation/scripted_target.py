"""The scripted generation the loopback engine servers (vllm_spec_server.py,
sglang_spec_server.py) serve instead of a model: which tokens, how many drafts each verify step
accepts, and the target's top log-probabilities at each position. No engine code here: the
servers hand these numbers to the engines' own code, which builds every figure specreg reads."""

from __future__ import annotations

import math
import sys


def schedule(prompt_ids: list[int], max_tokens: int, k: int) -> tuple[list[int], list[int]]:
    """The scripted generation: step s accepts (len(prompt) + s) % (k + 1) of its k drafts and
    emits them plus one token. -> (token ids, accepted per step)."""
    tokens, accepted = [], []
    step = 0
    while len(tokens) < max_tokens:
        j = (len(prompt_ids) + step) % (k + 1)
        accepted.append(j)
        tokens += [(prompt_ids[-1] + len(tokens) + i) % 97 + 3 for i in range(j + 1)]
        step += 1
    return tokens[:max_tokens], accepted


def rival(token: int) -> int:
    """The scripted target's second choice after ``token`` (another id of the same 3..99 range)."""
    return (token - 2) % 97 + 3


def target_top(token: int, margin: float) -> tuple[list[int], list[float]]:
    """The scripted target at a position whose top-1 is ``token`` -> (ids, log-probabilities), best first."""
    ids = [token, rival(token), rival(rival(token))]
    logits = [0.0, -margin, -margin - 3.0]
    norm = math.log(sum(math.exp(logit) for logit in logits))
    return ids, [logit - norm for logit in logits]


def generation(prompt_ids: list[int], max_tokens: int, k: int,
               swap_at: int) -> tuple[list[int], list[int], list[tuple[slice, int]]]:
    """One request: (emitted tokens, the target's top-1 at each position, per verify step the
    positions it emits and the drafts it accepted). k 0: a target-only server, one token a step.
    The rival is emitted at position ``swap_at`` (-1: never)."""
    targets, accepted = schedule(prompt_ids, max_tokens, max(k, 1))
    tokens = [rival(t) if i == swap_at else t for i, t in enumerate(targets)]
    if k == 0:
        accepted = [0] * len(targets)
    steps, start = [], 0
    for j in accepted:
        steps.append((slice(start, min(start + j + 1, len(tokens))), j))
        start += j + 1
    return tokens, targets, steps


def option(name: str, default: float) -> float:
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default
