"""The rows of a batch: each prompt's decoding (Row: its verified tokens, budget, stops, random
generator and metrics) and the rows decoding together (Batch: one KV cache whose columns are valid
or not per row, row_cache.RowCache, and one drafter). A row leaves the batch when it ends (leave);
the wall time of work done for rows is shared among them (charge).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from specreg.errors import RuntimeConfigError
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.metrics import GenerationMetrics
from specreg.runtime.methods.base import DraftRequest
from specreg.runtime.pair import ModelPair
from specreg.runtime.sampling import logits_to_probs, sample


def eos_ids_of(pair: ModelPair, config: DecodeConfig) -> set[int]:
    if config.eos_token_ids is not None:
        return set(config.eos_token_ids)
    eos = getattr(getattr(pair.target, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(pair.target.config, "eos_token_id", None)
    if eos is None and pair.tokenizer is not None:
        eos = pair.tokenizer.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


@dataclass
class Row:
    """One prompt's decoding inside a batch: its verified tokens, budget, random stream and metrics."""

    index: int  # its place in the caller's list of prompts
    config: DecodeConfig
    tokens: object  # [1, length] the verified sequence
    token_list: list[int]
    max_length: int
    generator: object  # torch.Generator of its own seed (None when greedy): the stream one row alone draws from
    eos_ids: set[int]
    metrics: GenerationMetrics
    speculating: bool
    cached_length: int = 0  # leading tokens whose keys/values the target cache holds
    start: float = 0.0  # the pass's clock (PassClock) when the row joined the batch: its latencies count from here
    generated: list[int] = field(default_factory=list)
    rolling_tau: deque = field(default_factory=deque)
    stop: str | None = None
    position_limit: int | None = None  # the target's max_position_embeddings (None: none known)
    unemitted: list[int] = field(default_factory=list)  # what the last step sampled past the row's end

    @property
    def sampling(self) -> bool:
        return self.config.temperature > 0

    def probs(self, logits):  # [n, vocab] -> [n, vocab] under the row's temperature / top-k / top-p
        return logits_to_probs(logits, self.config.temperature, self.config.top_k, self.config.top_p)

    def next_tokens(self, logits):  # [n, vocab] -> [n]
        return sample(self.probs(logits), self.generator) if self.sampling else logits.argmax(dim=-1)


def new_row(pair: ModelPair, index: int, prompt_ids, config: DecodeConfig, metrics: GenerationMetrics,
            speculate: bool) -> Row:
    """A prompt's Row, checked against the models' position limits."""
    import torch

    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=pair.device).view(1, -1)  # [1, n]
    length = prompt.shape[1]
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if limit is not None and length > limit:
            raise RuntimeConfigError(f"prompt of {length} tokens is longer than the {name}'s "
                                     f"max_position_embeddings {limit}")
    if length == 0:
        raise RuntimeConfigError("empty prompt: at least one token is needed")
    max_length = length + config.max_new_tokens
    target_limit = getattr(pair.target.config, "max_position_embeddings", None)
    if target_limit is not None:
        max_length = min(max_length, target_limit)
    generator = torch.Generator(device=pair.device).manual_seed(config.seed) if config.temperature > 0 else None
    metrics.prompt_tokens = length
    return Row(index, config, prompt, prompt[0].tolist(), max_length, generator, eos_ids_of(pair, config), metrics,
               speculate, rolling_tau=deque(maxlen=config.acceptance_window), position_limit=target_limit)


def leave(rows: list[Row], cache, drafter) -> list[Row]:
    """The rows still decoding; the finished ones leave the cache and the drafter."""
    going = [r for r, row in enumerate(rows) if not row.stop]
    ended = [r for r, row in enumerate(rows) if row.stop]
    if ended and hasattr(drafter, "finish"):
        drafter.finish(ended, [rows[r].token_list + rows[r].unemitted for r in ended])
    if len(going) < len(rows):
        rows = [rows[r] for r in going]
        if rows:
            cache.select(going)
            if drafter is not None:
                drafter.select(going)
    return rows


@dataclass
class Batch:
    """The rows decoding together, their target cache (row_cache.RowCache) and their drafter
    (None: target-only)."""

    rows: list[Row]
    cache: object
    drafter: object

    def extend(self, other: "Batch") -> None:
        """Take in other's rows, cache columns and drafter state after its first step (the drafter
        fed their tokens first, in a forward of their own)."""
        if other.drafter is not None:
            other.drafter.prefill([DraftRequest(row.tokens, row.token_list, int(row.speculating))
                                   for row in other.rows])
        self.rows += other.rows
        self.cache.extend(other.cache)
        if self.drafter is not None:
            self.drafter.extend(other.drafter)


def charge(rows: list[Row], seconds: float) -> None:
    """Share the wall time of work done for these rows equally among them (metrics.batch_time_s):
    the time of any set of rows is the sum of theirs, so rows of different kinds decoded together
    (greedy and sampled) each get a throughput, and every second of a decode is counted once."""
    for row in rows:
        row.metrics.batch_time_s = (row.metrics.batch_time_s or 0.0) + seconds / len(rows)
