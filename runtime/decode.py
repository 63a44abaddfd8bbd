"""The decode loop: draft k tokens, verify them in one target forward, accept, roll both KV
caches back to the accepted length, emit, repeat (one step of it: step.py). Target-only decoding
is the same loop with no drafts (k = 0: the prefill, then one-token steps), so both share one
cache code path.

The loop decodes many prompts at once (decode_rows): the rows share one KV cache whose columns
are valid or not per row (row_cache.RowCache: left-aligned padding, rejected drafts and tree nodes
off the accepted path are masked, each row at its own positions), each row with its own budget,
stops, random generator and metrics (rows.py); a row leaves the batch when it ends and the rows
waiting join as it empties. Each pass keeps its own clock (clock.PassClock). The functions that
decode one prompt, a batch, or passes side by side are generate.py's.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterator

from specreg.errors import RuntimeConfigError
from specreg.runtime.acceptance_rule import greedy_accept, rejection_sample, tree_greedy_accept, tree_rejection_sample
from specreg.runtime.clock import PassClock
from specreg.runtime.decode_config import DecodeConfig, check_batch
from specreg.runtime.metrics import GenerationMetrics
from specreg.runtime.pair import ModelPair
from specreg.runtime.rows import Batch, charge, new_row
from specreg.runtime.step import step


def default_memory_probe(device) -> Callable[[], int] | None:
    """Free accelerator bytes: torch.cuda.mem_get_info on CUDA; no probe elsewhere."""
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.mem_get_info(device)[0]
    return None


def admits(free: int, waiting: int, max_rows: int) -> bool:
    """Whether rows waiting join now: when at least half the batch is free (or every row still
    waiting fits). A join costs a step of its own (the newcomers' drafting from their prompts and
    their prefill, which a batch in flight cannot share without computing padding as wide as a
    prompt for each of its rows), so joining one row at a time would cost nearly a step per row."""
    return waiting > 0 and free >= min(waiting, max(1, max_rows // 2))


def decode_rows(pair: ModelPair, prompts: list, configs: list[DecodeConfig], *, speculate: bool = True,
                metrics: list[GenerationMetrics] | None = None, batch_size: int | None = None,
                max_rows: int | None = None, finished: Callable[[int], None] | None = None,
                memory_probe: Callable[[], int] | None = None,
                acceptance_rule: Callable = rejection_sample,
                greedy_rule: Callable = greedy_accept,
                tree_acceptance_rule: Callable = tree_rejection_sample,
                tree_greedy_rule: Callable = tree_greedy_accept) -> Iterator[tuple[int, int]]:
    """Decode many prompts, at most max_rows at once; yield (row index, verified token id) as each
    is emitted (never a draft that was not accepted).

    prompts: per row a list[int] or a tensor # [1, n] / [n]; configs: per row a DecodeConfig (one
    method, k and tree for all: check_batch). Each row has its own acceptance, length, stops,
    random generator (seeded with its config.seed, drawn from in the order one row alone would)
    and metrics (metrics[r], filled as it goes, its times counted from when it joined); rows leave
    the batch as they finish and the rows waiting join it as it empties (admits): each joins
    with a first step of its own, its prompt's prefill, then decodes in the batch. Token for
    token a row decodes as it would alone, up to rounding where padding changes the order of a
    reduction (the equivalence check's near-tie rule covers that, as for verification).
    speculate=False decodes target-only through the same loop. max_rows: default all the rows at
    once. finished(row index) is called as each row ends. batch_size: the concurrency served (default min(max_rows, rows)); above
    config.disable_above_batch_size speculation is off. memory_probe() -> free accelerator bytes
    (default torch.cuda.mem_get_info on CUDA). acceptance_rule / greedy_rule (chains) and
    tree_acceptance_rule / tree_greedy_rule (trees) replace the rules of acceptance_rule.py (tests
    inject broken rules to show the validators catch them).
    """
    import torch

    from specreg.runtime.row_cache import RowCache

    check_batch(configs)
    config = configs[0]  # what the rows share
    device = pair.device
    metrics = metrics if metrics is not None else [GenerationMetrics() for _ in prompts]
    max_rows = max_rows if max_rows is not None else len(prompts)
    if max_rows < 1:
        raise RuntimeConfigError(f"max_rows = {max_rows}: at least one row decodes at a time")
    batch_size = batch_size if batch_size is not None else min(max_rows, len(prompts))
    waiting = deque(new_row(pair, index, prompt_ids, row_config, metrics[index], speculate)
                    for index, (prompt_ids, row_config) in enumerate(zip(prompts, configs)))
    if memory_probe is None and config.min_free_memory_bytes is not None:
        memory_probe = default_memory_probe(device)
    method = None
    if speculate:
        from specreg.runtime.methods import drafting_method

        method = drafting_method(config.method)
    serves_drafts = config.disable_above_batch_size is None or batch_size <= config.disable_above_batch_size
    rules = (acceptance_rule, greedy_rule, tree_acceptance_rule, tree_greedy_rule)

    clock = PassClock()

    def admit(count: int) -> Batch:
        rows = [waiting.popleft() for _ in range(count)]
        now = clock.now()
        for row in rows:
            row.start = now
            if speculate and not serves_drafts:
                row.metrics.record_fallback("batch_size", batch_size)
                row.speculating = False
        drafter = method.drafter(pair, [row.config for row in rows], [row.generator for row in rows]) if method else None
        return Batch(rows, RowCache(pair.target.config, len(rows), device), drafter)

    batch = None
    try:
        with torch.inference_mode():
            while waiting or batch is not None:
                free = max_rows - (len(batch.rows) if batch is not None else 0)
                if admits(free, len(waiting), max_rows):
                    joining = clock.now()
                    newcomers = admit(min(free, len(waiting)))
                    charge(newcomers.rows, clock.now() - joining)
                    yield from clock.hand_over(step(pair, newcomers, config, memory_probe, rules, device, clock,
                                                    finished))
                    if batch is None:
                        batch = newcomers
                    elif newcomers.rows:
                        joining = clock.now()  # their caches merged, a draft model fed their prompts
                        batch.extend(newcomers)
                        charge(newcomers.rows, clock.now() - joining)
                else:
                    yield from clock.hand_over(step(pair, batch, config, memory_probe, rules, device, clock, finished))
                if batch is not None and not batch.rows:
                    batch = None
    finally:
        for row in batch.rows if batch is not None else ():
            row.metrics.total_time_s = clock.now() - row.start
