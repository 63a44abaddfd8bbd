"""Generation through the decode loop (decode.decode_rows): one prompt is the batch of one
(stream_generate, speculative_generate, target_only_generate), many prompts a batch
(generate_batch). Passes whose speeds are compared run side by side, taking turns
(generate_interleaved), each timed on its own clock (clock.PassClock), so that a load that comes
or goes during them slows both alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from specreg.runtime.decode import decode_rows
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.metrics import GenerationMetrics
from specreg.runtime.pair import ModelPair


@dataclass
class Generation:
    token_ids: list[int]
    text: str | None
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)


def stream_generate(pair: ModelPair, prompt_ids, config: DecodeConfig, *, speculate: bool = True,
                    metrics: GenerationMetrics | None = None, **hooks) -> Iterator[int]:
    """Yield verified token ids of one prompt one by one: decode_rows with a single row.

    prompt_ids: list[int] or a tensor # [1, n] / [n]. Fills `metrics` (pass one in to read it) as
    it goes. hooks: batch_size, memory_probe, acceptance_rule, greedy_rule, tree_acceptance_rule,
    tree_greedy_rule (see decode_rows)."""
    metrics = metrics if metrics is not None else GenerationMetrics()
    hooks.setdefault("batch_size", 1)
    for _, token in decode_rows(pair, [prompt_ids], [config], speculate=speculate, metrics=[metrics], **hooks):
        yield token


def generate_batch(pair: ModelPair, prompts: list, configs, *, speculate: bool = True, **hooks) -> list[Generation]:
    """Decode many prompts, hooks["max_rows"] at once (default all) -> one Generation per prompt,
    in order; each row's metrics carry the batch's size (the rows decoded at once) and its share
    of the batch's wall time (metrics.batch_time_s: each step's time split equally among the rows
    in it), so pooled throughput is tokens / the wall time.

    configs: one DecodeConfig for all, or one per prompt (sharing method, k and tree). hooks: as
    decode_rows."""
    return generate_interleaved(pair, [Pass(prompts, configs, speculate, hooks)])[0]


@dataclass
class Pass:
    """One decode pass for generate_interleaved: what generate_batch takes."""

    prompts: list
    configs: object  # one DecodeConfig for all, or one per prompt
    speculate: bool = True
    hooks: dict = field(default_factory=dict)  # as decode_rows: max_rows, finished, the rules ...


def generate_interleaved(pair: ModelPair, passes: list[Pass]) -> list[list[Generation]]:
    """Decode several passes side by side -> per pass one Generation per prompt, as generate_batch.

    Each pass keeps its own rows, caches, drafter and clock (PassClock: a pass's times count only
    its own work); they take turns a token at a time, the next turn going to the pass with the
    least of its token budget emitted, so passes of different lengths end about together. A
    ratio of two passes' throughputs (validate's speedup) is then measured over the same stretch
    of time: timed one after the other, a load that started or ended between them (other work on
    a shared machine) slowed one pass alone and the ratio with it. Every pass's caches are held at
    once."""
    import torch

    runs = []
    try:
        for one in passes:
            configs = [one.configs] * len(one.prompts) if isinstance(one.configs, DecodeConfig) else list(one.configs)
            metrics = [GenerationMetrics() for _ in one.prompts]
            tokens = decode_rows(pair, list(one.prompts), configs, speculate=one.speculate, metrics=metrics,
                                 **one.hooks)
            runs.append(PassRun(tokens, metrics, [[] for _ in one.prompts],
                                budget=max(1, sum(config.max_new_tokens for config in configs))))
        # each pass enters and leaves inference mode in its own generator; entered here first, the
        # mode stays on while the passes' enters and exits interleave
        with torch.inference_mode():
            live = list(runs)
            while live:
                run = min(live, key=lambda run: run.emitted / run.budget)
                try:
                    index, token = next(run.tokens)
                except StopIteration:
                    live.remove(run)
                    continue
                run.token_ids[index].append(token)
                run.emitted += 1
    finally:
        for run in runs:
            run.tokens.close()
    results = []
    for one, run in zip(passes, runs):
        generations = []
        for ids, metrics in zip(run.token_ids, run.metrics):
            metrics.batch_size = min(one.hooks.get("max_rows") or len(one.prompts), len(one.prompts))
            text = pair.tokenizer.decode(ids) if pair.tokenizer is not None else None
            generations.append(Generation(token_ids=ids, text=text, metrics=metrics))
        results.append(generations)
    return results


@dataclass(eq=False)
class PassRun:
    """A pass of generate_interleaved under way: its token stream (decode_rows), each row's
    metrics and tokens so far, and how many of its budget's tokens (the rows' max_new_tokens) it
    has emitted."""

    tokens: Iterator[tuple[int, int]]
    metrics: list[GenerationMetrics]
    token_ids: list[list[int]]
    budget: int
    emitted: int = 0


def _generate(pair, prompt_ids, config, speculate, **hooks) -> Generation:
    return generate_batch(pair, [prompt_ids], [config], speculate=speculate, **{"batch_size": 1, **hooks})[0]


def speculative_generate(pair: ModelPair, prompt_ids, config: DecodeConfig, **hooks) -> Generation:
    """Speculative decoding of one prompt -> Generation(token_ids, text, metrics).

    hooks: batch_size, memory_probe, acceptance_rule, greedy_rule, tree_acceptance_rule,
    tree_greedy_rule (see decode_rows).
    """
    return _generate(pair, prompt_ids, config, True, **hooks)


def target_only_generate(pair: ModelPair, prompt_ids, config: DecodeConfig, **hooks) -> Generation:
    """Plain target decoding through the same loop and cache code -> Generation."""
    return _generate(pair, prompt_ids, config, False, **hooks)
