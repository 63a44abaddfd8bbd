"""The decode loop: draft k tokens, verify them in one target forward, accept, roll both KV
caches back to the accepted length, emit, repeat. decode_rows runs one step as its parts, in order:
fall_back (rows that stop speculating), draft (the method's Drafter, runtime/methods/), verify
(one target forward), accept_rows (acceptance_rule.py's rules), roll_back (the target cache and the
drafter), emit (tokens, stops, metrics), leave (finished rows). No part knows which method drafts. The first step's target forward is the prefill: it runs
over the prompt and the first k drafts at once, so no forward is spent on the prompt alone.
Target-only decoding is the same loop with no drafts (k = 0: the prefill, then one-token
steps), so both share one cache code path.

With a candidate tree (DecodeConfig.tree: Medusa, EAGLE-3 top-k) the drafts are a tree: the same
loop, with the tree's mask and per-depth positions in the verification forward (tree.py) and the
tree acceptance rules.

The loop decodes many prompts at once (decode_rows): the rows share one KV cache whose columns
are valid or not per row (row_cache.RowCache: left-aligned padding, rejected drafts and tree nodes
off the accepted path are masked, each row at its own positions), each row with its own budget,
stops, random generator and metrics; a row leaves the batch when it ends. One prompt is the batch
of one (stream_generate, speculative_generate, target_only_generate). Passes whose speeds are
compared run side by side, taking turns (generate_interleaved), each timed on its own clock.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from specreg.core.suffix_settings import SuffixSettings
from specreg.errors import RuntimeConfigError
from specreg.runtime.acceptance_rule import greedy_accept, rejection_sample, tree_greedy_accept, tree_rejection_sample
from specreg.runtime.metrics import GenerationMetrics
from specreg.runtime.methods.base import DraftRequest, Proposal
from specreg.runtime.pair import ModelPair
from specreg.runtime.sampling import logits_to_probs, sample
from specreg.runtime.tree import CandidateTree, parse_tree


@dataclass
class DecodeConfig:
    """How to decode. temperature 0 is greedy; the fallback hooks are off when None."""

    method: str = "draft_model"
    k: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    eos_token_ids: tuple[int, ...] | None = None  # None: the target's generation config
    stop_strings: tuple[str, ...] = ()
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    suffix: SuffixSettings | None = None  # method suffix: vLLM's suffix_decoding_* (None: its defaults)
    disable_above_batch_size: int | None = None  # serve target-only above this concurrency
    min_free_memory_bytes: int | None = None  # fall back when the accelerator has less free
    acceptance_length_threshold: float | None = None  # fall back when rolling tau drops below
    acceptance_window: int = 16  # verification steps in the rolling tau
    # the candidate tree (tree methods; k = its depth): paths of ranks as registered, parsed once
    # here into a CandidateTree that the loop, the drafters and the validators share
    tree: CandidateTree | tuple[tuple[int, ...], ...] | None = None
    # the serving engines' schedule (llama.cpp's server, vLLM): the prefill emits the first token
    # alone and drafting starts from it. Off (ours): the prefill forward verifies the first drafts
    # too. `validate --engine` decodes with it on, so that both loops draft the same windows.
    prefill_alone: bool = False
    # vLLM's schedule: every step drafts k tokens whatever the budget has left (0.33.0's scheduler caps
    # a step at max_model_len only, vllm/v1/core/sched/scheduler.py:838-856) and counts every draft
    # the target agrees with, past the budget and past a stop token (scheduler.py:2350-2354); the
    # output still ends at the budget. Off (ours, llama.cpp's server): a step drafts at most what
    # the budget can still take after the bonus token.
    draft_past_budget: bool = False
    # what one serving engine keeps across the requests it serves (the method's session(config):
    # vLLM's suffix cache of earlier responses), shared by the configs of the requests it served
    # in order; None: each request is a fresh server's first
    session: object = None

    def __post_init__(self):
        if self.tree is not None and not isinstance(self.tree, CandidateTree):
            self.tree = parse_tree(self.tree)

    @classmethod
    def from_spec(cls, spec) -> "DecodeConfig":
        """A registered SpecConfig (specreg.core.methods) as the runtime decodes it: its method,
        k, prompt lookup and parsed tree; the rest as the defaults (each golden record sets its own)."""
        return cls(method=spec.method.value, k=spec.num_speculative_tokens,
                   prompt_lookup_min=spec.prompt_lookup_min or 1, prompt_lookup_max=spec.prompt_lookup_max or 3,
                   tree=spec.tree, suffix=spec.suffix)


@dataclass
class Generation:
    token_ids: list[int]
    text: str | None
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)


def check_config(config: DecodeConfig) -> None:
    """RuntimeConfigError for settings that cannot run, before any forward pass."""
    from specreg.core.methods import METHODS, tree_methods
    from specreg.runtime.methods import drafting_method

    method = drafting_method(config.method)  # refuses an unknown method
    if not isinstance(config.k, int) or config.k < 1:
        raise RuntimeConfigError(f"k = {config.k!r}: the speculative depth must be an integer >= 1")
    if config.max_new_tokens < 1:
        raise RuntimeConfigError(f"max_new_tokens = {config.max_new_tokens}: must be >= 1")
    if config.temperature < 0:
        raise RuntimeConfigError(f"temperature = {config.temperature}: must be >= 0")
    if config.top_p is not None and not 0 < config.top_p <= 1:
        raise RuntimeConfigError(f"top_p = {config.top_p}: must be in (0, 1]")
    if not 1 <= config.prompt_lookup_min <= config.prompt_lookup_max:
        raise RuntimeConfigError(f"prompt_lookup_min/max = {config.prompt_lookup_min}/"
                                 f"{config.prompt_lookup_max}: need 1 <= min <= max")
    tree_rule = METHODS[config.method].tree
    if tree_rule == "required" and config.tree is None:
        raise RuntimeConfigError(f"method {config.method!r} verifies a candidate tree: give its paths (tree)")
    if config.tree is not None:
        if tree_rule == "never":
            raise RuntimeConfigError(f"a candidate tree applies to {', '.join(tree_methods())}, not {config.method!r}")
        if config.k != config.tree.depth:
            raise RuntimeConfigError(f"k = {config.k} differs from the tree's depth {config.tree.depth}")
    method.check(config)


def default_memory_probe(device) -> Callable[[], int] | None:
    """Free accelerator bytes: torch.cuda.mem_get_info on CUDA; no probe elsewhere."""
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.mem_get_info(device)[0]
    return None


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


def synchronize(device) -> None:
    """Make wall-clock timings honest on asynchronous devices."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
    elif device.type == "mps":
        import torch

        torch.mps.synchronize()


class PassClock:
    """A decode pass's own time: perf_counter less the time its caller held the pass between two
    tokens. Every time in a pass's metrics reads it, so what the caller does between tokens (a
    stream's reader; the other pass generate_interleaved runs beside this one) counts in none."""

    def __init__(self):
        self.held = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.held

    def hand_over(self, tokens: Iterator[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """Yield ``tokens`` to the caller, counting the time it keeps each as held."""
        for item in tokens:
            handed = time.perf_counter()
            yield item
            self.held += time.perf_counter() - handed


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


def check_batch(configs: list[DecodeConfig]) -> None:
    """RuntimeConfigError unless the rows can share one batch: one method, k and tree (the
    budget, sampling settings, seeds and stops are each row's own)."""
    for config in configs:
        check_config(config)
    shared = {(c.method, c.k, c.tree, c.prompt_lookup_min, c.prompt_lookup_max, c.suffix, c.prefill_alone,
               c.draft_past_budget, id(c.session)) for c in configs}
    if len(shared) > 1:
        raise RuntimeConfigError("the rows of one batch must share method, k, tree, prompt lookup, suffix settings "
                                 "and schedule")


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


def line_up(rows: list[Row], proposals: list[tuple], ks: list[int], tree, device):
    """The verification forward's inputs: per row what the target cache lacks (the whole prompt on
    the first step, then the last emitted token) right-aligned to the longest, then its drafts (a
    chain, or the tree's nodes after the root, the last pending token), shorter rows padded.
    -> (input_ids # [b, P + N], query_valid # [b, P + N] bool, offsets # [b, P + N] positions
    after each row's cached tokens, new_mask # [P + N, P + N] bool for a tree else None, P)."""
    import torch

    pending = [row.tokens[0, row.cached_length:] for row in rows]
    width = max(piece.shape[0] for piece in pending)  # P
    drafts = tree.num_nodes if tree is not None else max(ks)  # N
    queries = width + drafts
    input_ids = torch.zeros(len(rows), queries, dtype=torch.long, device=device)  # [b, P + N]
    query_valid = torch.zeros(len(rows), queries, dtype=torch.bool, device=device)  # [b, P + N]
    offsets = torch.zeros(len(rows), queries, dtype=torch.long, device=device)  # [b, P + N]
    node_offsets = (tree.buffers(device).depths[1:] if tree is not None
                    else torch.arange(1, drafts + 1, device=device))  # [N] positions after the root
    for r, (piece, (draft_ids, _)) in enumerate(zip(pending, proposals)):
        n = piece.shape[0]
        input_ids[r, width - n:width] = piece
        query_valid[r, width - n:width] = True
        offsets[r, width - n:width] = torch.arange(n, device=device)
        offsets[r, width:] = n - 1 + node_offsets
        if ks[r]:
            nodes = draft_ids.shape[0] - (1 if tree is not None else 0)  # a tree's node ids start with the root
            input_ids[r, width:width + nodes] = draft_ids[-nodes:]
            query_valid[r, width:width + nodes] = True
    new_mask = None
    if tree is not None:
        # the nodes see the pending tokens and their own ancestors, root included (a pruned tree's
        # nodes are the first of the whole tree's: same mask, the rest is padding)
        new_mask = torch.ones(queries, queries, dtype=torch.bool, device=device).tril()
        new_mask[width - 1:, :width - 1] = True
        new_mask[width - 1:, width - 1:] = tree.buffers(device).attention_mask
    return input_ids, query_valid, offsets, new_mask, width


def accept(row: Row, logits, proposal: tuple, k: int, step_tree, rules: tuple):
    """One row's acceptance: logits # [N + 1, vocab] of its root and drafts; proposal
    (draft_ids, draft_probs); rules (acceptance_rule, greedy_rule, tree_acceptance_rule,
    tree_greedy_rule) -> (num_accepted, emitted # [num_accepted + 1], accepted draft columns after
    the root # [num_accepted] long: 1.. for a chain, the accepted nodes for a tree)."""
    import torch

    acceptance_rule, greedy_rule, tree_acceptance_rule, tree_greedy_rule = rules
    draft_ids, draft_probs = proposal
    device = logits.device
    if k == 0:
        return 0, row.next_tokens(logits[:1]), torch.empty(0, dtype=torch.long, device=device)
    if step_tree is not None:
        nodes = step_tree.num_nodes
        buffers = step_tree.buffers(device)
        if row.sampling:
            target_probs = row.probs(logits[:nodes + 1])  # [nodes+1, vocab]
            uniforms = torch.rand(nodes + 1, generator=row.generator, device=device)  # [nodes+1]
            accepted_nodes, emitted = tree_acceptance_rule(draft_probs, target_probs, draft_ids, buffers.parent_ids,
                                                           uniforms, row.generator)
        else:
            accepted_nodes, emitted = tree_greedy_rule(draft_ids, logits[:nodes + 1].argmax(dim=-1),
                                                       buffers.retrieve_indices)
        return accepted_nodes.shape[0], emitted, accepted_nodes
    if row.sampling:
        target_probs = row.probs(logits[:k + 1])  # [k+1, vocab]
        uniforms = torch.rand(k, generator=row.generator, device=device)  # [k]
        num_accepted, emitted = acceptance_rule(draft_probs, target_probs, draft_ids, uniforms, row.generator)
    else:
        num_accepted, emitted = greedy_rule(draft_ids, logits[:k + 1].argmax(dim=-1))
    return num_accepted, emitted, torch.arange(1, num_accepted + 1, device=device)


def stop_of(pair: ModelPair, row: Row, token: int) -> str | None:
    """Why the row ends at `token` just emitted (EOS, a stop string, its budget), or None."""
    if token in row.eos_ids:
        return "eos"
    stop_strings = row.config.stop_strings or ()
    if stop_strings:
        window = max(len(s) for s in stop_strings) + 8
        if any(s in pair.tokenizer.decode(row.generated[-window:]) for s in stop_strings):
            return "stop_string"
    if len(row.token_list) >= row.max_length:
        return "max_new_tokens" if len(row.generated) >= row.config.max_new_tokens else "max_position"
    return None


@dataclass
class Step:
    """One step's drafts, per row: the drafts asked and verified (k, 0: none; a tree's depth), the
    candidate tree pruned to them (None for a chain) and what the drafter proposed."""

    tree: CandidateTree | None  # the batch's whole tree: the verification forward's layout
    ks: list[int]
    trees: list
    proposals: list  # Proposal per row


def fall_back(rows: list[Row], config: DecodeConfig, memory_probe) -> None:
    """Switch rows to target-only for the rest of their generation: free accelerator memory below
    config.min_free_memory_bytes, or a row's rolling tau below its acceptance_length_threshold."""
    if memory_probe is not None and config.min_free_memory_bytes is not None \
            and any(row.speculating for row in rows):
        free = memory_probe()
        if free < config.min_free_memory_bytes:
            for row in rows:
                if row.speculating:
                    row.metrics.record_fallback("low_memory", int(free))
                    row.speculating = False
    for row in rows:
        window = row.rolling_tau
        if (row.speculating and row.config.acceptance_length_threshold is not None
                and len(window) == window.maxlen
                and sum(window) / len(window) < row.config.acceptance_length_threshold):
            row.metrics.record_fallback("low_acceptance_length", sum(window) / len(window))
            row.speculating = False


def draft(drafter, rows: list[Row], config: DecodeConfig, step_start: float, device,
          clock: PassClock) -> tuple[Step, float]:
    """Ask the drafter for every speculating row's drafts: at most what its budget can still take
    after the bonus token (on vLLM's schedule, DecodeConfig.draft_past_budget, what the target's
    positions can), none on the engines' schedule's prefill -> (Step, the time drafting ended). A
    row given none (n-gram without a match, a head before the target's first states) verifies no
    drafts this step; a chain may come back shorter than asked."""
    ks = []
    for row in rows:
        limit = row.max_length
        if config.draft_past_budget:
            limit = row.position_limit if row.position_limit is not None else len(row.token_list) + config.k + 1
        k = min(config.k, limit - len(row.token_list) - 1) if row.speculating else 0
        if config.prefill_alone and row.cached_length == 0:
            k = 0
        ks.append(max(k, 0))
    tree = config.tree
    trees = [tree.pruned(k) if tree is not None and k > 0 else None for k in ks]
    proposals = [Proposal(None)] * len(rows)
    drafting = [k > 0 for k in ks]
    if any(drafting):
        proposals = drafter.propose([DraftRequest(row.tokens, row.token_list, k, row_tree)
                                     for row, k, row_tree in zip(rows, ks, trees)])
        synchronize(device)
    drafted = clock.now()
    for r, row in enumerate(rows):
        if not drafting[r]:
            continue
        row.metrics.draft_time_s += drafted - step_start
        row.metrics.draft_forwards += drafter.last_forwards[r]
        draft_ids = proposals[r].draft_token_ids
        if draft_ids.shape[0] == 0:
            ks[r], trees[r], proposals[r] = 0, None, Proposal(None)
        elif trees[r] is None:
            ks[r] = draft_ids.shape[0]
    return Step(tree, ks, trees, proposals), drafted


def verify(pair: ModelPair, cache, rows: list[Row], step: Step, hidden_state_ids: tuple[int, ...], device):
    """One target forward per row over what its cache lacks (the whole prompt on the first step,
    so the prefill verifies the first drafts too; then the last emitted token) followed by its
    drafts (a chain, or the tree's nodes; the root is the last token before them). Rows line up:
    pending tokens right-aligned, drafts after them, shorter rows padded; only the root and draft
    positions need logits -> (logits # [b, N + 1, vocab] the root's then each draft's, hidden
    # [b, P + N, A * H] the states the drafter reads or None, query_valid # [b, P + N], P)."""
    input_ids, query_valid, offsets, new_mask, width = line_up(rows, step.proposals, step.ks, step.tree, device)
    drafts = input_ids.shape[1] - width  # N: the longest chain, or the tree's nodes
    logits = cache.forward(pair.target, input_ids, query_valid, offsets, new_mask, drafts + 1, hidden_state_ids)
    hidden = None
    if hidden_state_ids:
        logits, hidden = logits
    return logits[:, :, :pair.vocab_size], hidden, query_valid, width


def accept_rows(rows: list[Row], logits, step: Step, query_valid, width: int, rules: tuple):
    """Each row's acceptance, with its own rule and random stream -> (per row (num_accepted,
    emitted # [num_accepted + 1]), kept # [b, P + N] bool: the columns that stay, the verified
    tokens and the accepted drafts)."""
    kept = query_valid.clone()
    kept[:, width:] = False  # drafts off the accepted path are not kept
    accepted = []
    for r, row in enumerate(rows):
        num_accepted, emitted, accepted_columns = accept(row, logits[r], step.proposals[r], step.ks[r],
                                                         step.trees[r], rules)
        kept[r, width - 1 + accepted_columns] = True
        accepted.append((num_accepted, emitted))
    return accepted, kept


def roll_back(cache, drafter, rows: list[Row], accepted: list[tuple], kept, hidden) -> None:
    """Keep the verified tokens and the accepted drafts in the target cache, drop the rest (the
    emitted recovered/bonus token is fed with the next step); the drafter rolls back to the same
    lengths, given the kept positions' target states when it reads them."""
    cache.keep(kept)
    for row, (num_accepted, _) in zip(rows, accepted):
        row.cached_length = len(row.token_list) + num_accepted
    if drafter is not None:
        hiddens = [hidden[r:r + 1, kept[r]] for r in range(len(rows))] if hidden is not None else None
        drafter.rollback([row.cached_length for row in rows], hiddens)


def emit(pair: ModelPair, rows: list[Row], step: Step, accepted: list[tuple], step_start: float,
         verify_start: float, clock: PassClock) -> Iterator[tuple[int, int]]:
    """Yield each row's verified tokens (row index, token id), stopping a row at EOS, a stop string
    or its budget, and record the step in its metrics."""
    import torch

    emitted_lists = [emitted.tolist() for _, emitted in accepted]  # syncs, so the verify time is honest
    now = clock.now()
    for r, (row, (num_accepted, emitted), emitted_list) in enumerate(zip(rows, accepted, emitted_lists)):
        k, step_tree = step.ks[r], step.trees[r]
        row.metrics.verify_time_s += now - verify_start
        # a tree counts its depth as the positions drafted: per-position acceptance is per depth
        row.metrics.record_step(k if step_tree is None else step_tree.depth, num_accepted, len(emitted_list))
        if k > 0:
            row.rolling_tau.append(num_accepted + 1)
        first_step = row.metrics.ttft_s is None
        if first_step:
            row.metrics.ttft_s = now - row.start
        share = (now - step_start) / len(emitted_list)
        for position, token in enumerate(emitted_list):
            row.generated.append(token)
            row.token_list.append(token)
            row.metrics.generated_tokens += 1
            if first_step:
                row.metrics.ttft_tokens += 1
            row.metrics.token_latencies_s.append(share)
            yield row.index, token
            row.stop = stop_of(pair, row, token)
            if row.stop == "eos" and step_tree is None and position < min(num_accepted, k - 1):
                # an accepted draft ended the generation before the step's last draft:
                # llama.cpp counts only the drafts before it (metrics.stop_draft_counts)
                row.metrics.stop_draft = (position, num_accepted)
            if row.stop:
                row.unemitted = emitted_list[position + 1:]
                break
        if row.stop:
            row.metrics.stop_reason = row.stop
            row.metrics.total_time_s = clock.now() - row.start
        else:
            row.tokens = torch.cat([row.tokens, emitted.view(1, -1)], dim=1)  # [1, length]


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


def step(pair: ModelPair, batch: Batch, config: DecodeConfig, memory_probe, rules: tuple, device,
         clock: PassClock, finished: Callable[[int], None] | None = None) -> Iterator[tuple[int, int]]:
    """One step of every row of the batch, yielding (row index, token) as emit does; the rows that
    finished leave it (finished(row index) for each)."""
    step_start = clock.now()
    fall_back(batch.rows, config, memory_probe)
    drafts, verify_start = draft(batch.drafter, batch.rows, config, step_start, device, clock)
    hidden_state_ids = batch.drafter.hidden_state_ids if batch.drafter is not None else ()
    logits, hidden, query_valid, width = verify(pair, batch.cache, batch.rows, drafts, hidden_state_ids, device)
    accepted, kept = accept_rows(batch.rows, logits, drafts, query_valid, width, rules)
    roll_back(batch.cache, batch.drafter, batch.rows, accepted, kept, hidden)
    yield from emit(pair, batch.rows, drafts, accepted, step_start, verify_start, clock)
    charge(batch.rows, clock.now() - step_start)
    for row in batch.rows:
        if row.stop and finished is not None:
            finished(row.index)
    batch.rows = leave(batch.rows, batch.cache, batch.drafter)


def charge(rows: list[Row], seconds: float) -> None:
    """Share the wall time of work done for these rows equally among them (metrics.batch_time_s):
    the time of any set of rows is the sum of theirs, so rows of different kinds decoded together
    (greedy and sampled) each get a throughput, and every second of a decode is counted once."""
    for row in rows:
        row.metrics.batch_time_s = (row.metrics.batch_time_s or 0.0) + seconds / len(rows)


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
