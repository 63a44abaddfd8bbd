"""The decode loop: draft k tokens, verify them in one target forward, roll both KV caches
back to the accepted length, repeat. The first step's target forward is the prefill: it runs
over the prompt and the first k drafts at once, so no forward is spent on the prompt alone.
Target-only decoding is the same loop with no drafts (k = 0: the prefill, then one-token
steps), so both share one cache code path.

With a candidate tree (DecodeConfig.tree: Medusa, EAGLE-3 top-k) the drafts are a tree: the same
loop, with tree_forward for the verification forward, the tree acceptance rules, and the cache
compacted to the accepted path (tree.py) where a chain is cropped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from specreg.errors import RuntimeConfigError
from specreg.runtime.acceptance import greedy_accept, rejection_sample, tree_greedy_accept, tree_rejection_sample
from specreg.runtime.metrics import GenerationMetrics
from specreg.runtime.pair import ModelPair, forward_logits
from specreg.runtime.sampling import logits_to_probs, sample

METHODS = ("draft_model", "ngram", "eagle3", "medusa", "mtp")
TREE_METHODS = ("medusa", "eagle3")  # methods that can verify a candidate tree (medusa always does)


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
    disable_above_batch_size: int | None = None  # serve target-only above this concurrency
    min_free_memory_bytes: int | None = None  # fall back when the accelerator has less free
    acceptance_length_threshold: float | None = None  # fall back when rolling tau drops below
    acceptance_window: int = 16  # verification steps in the rolling tau
    tree: tuple[tuple[int, ...], ...] | None = None  # candidate tree paths (tree methods); k = its depth
    # the serving engines' schedule (llama.cpp's server, vLLM): the prefill emits the first token
    # alone and drafting starts from it. Off (ours): the prefill forward verifies the first drafts
    # too. `validate --engine` decodes with it on, so that both loops draft the same windows.
    prefill_alone: bool = False


@dataclass
class Generation:
    token_ids: list[int]
    text: str | None
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)


def check_config(config: DecodeConfig) -> None:
    """RuntimeConfigError for settings that cannot run, before any forward pass."""
    if config.method not in METHODS:
        raise RuntimeConfigError(f"method {config.method!r} unknown: use one of {', '.join(METHODS)}")
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
    if config.method == "medusa" and config.tree is None:
        raise RuntimeConfigError(f"method {config.method!r} verifies a candidate tree: give its paths (tree)")
    if config.tree is not None:
        from specreg.runtime.tree import parse_tree

        if config.method not in TREE_METHODS:
            raise RuntimeConfigError(f"a candidate tree applies to {', '.join(TREE_METHODS)}, not {config.method!r}")
        depth = parse_tree(config.tree).depth
        if config.k != depth:
            raise RuntimeConfigError(f"k = {config.k} differs from the tree's depth {depth}")


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


def stream_generate(pair: ModelPair, prompt_ids, config: DecodeConfig, *, speculate: bool = True,
                    metrics: GenerationMetrics | None = None, batch_size: int = 1,
                    memory_probe: Callable[[], int] | None = None,
                    acceptance_rule: Callable = rejection_sample,
                    greedy_rule: Callable = greedy_accept,
                    tree_acceptance_rule: Callable = tree_rejection_sample,
                    tree_greedy_rule: Callable = tree_greedy_accept) -> Iterator[int]:
    """Yield verified token ids one by one (never a draft that was not accepted).

    prompt_ids: list[int] or a tensor # [1, n] / [n]. speculate=False decodes target-only
    through the same loop. batch_size is the concurrency the caller serves; above
    config.disable_above_batch_size speculation is off. memory_probe() -> free accelerator bytes
    (default torch.cuda.mem_get_info on CUDA). acceptance_rule / greedy_rule (chains) and
    tree_acceptance_rule / tree_greedy_rule (trees) replace the rules of acceptance.py (tests inject
    broken rules to show the validators catch them).
    Fills `metrics` (pass one in to read it) as it goes.
    """
    import torch
    from transformers import DynamicCache

    check_config(config)
    metrics = metrics if metrics is not None else GenerationMetrics()
    device = pair.device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).view(1, -1)  # [1, n]
    prompt_length = prompt.shape[1]
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if limit is not None and prompt_length > limit:
            raise RuntimeConfigError(f"prompt of {prompt_length} tokens is longer than the {name}'s "
                                     f"max_position_embeddings {limit}")
    if prompt_length == 0:
        raise RuntimeConfigError("empty prompt: at least one token is needed")
    max_length = prompt_length + config.max_new_tokens
    target_limit = getattr(pair.target.config, "max_position_embeddings", None)
    if target_limit is not None:
        max_length = min(max_length, target_limit)
    draft_limit = getattr(getattr(pair.draft, "config", None), "max_position_embeddings", None)

    sampling = config.temperature > 0
    generator = torch.Generator(device=device).manual_seed(config.seed) if sampling else None
    vocab_size = pair.vocab_size
    eos_ids = eos_ids_of(pair, config)
    stop_strings = tuple(config.stop_strings or ())
    stop_window = max((len(s) for s in stop_strings), default=0) + 8
    if memory_probe is None and config.min_free_memory_bytes is not None:
        memory_probe = default_memory_probe(device)

    tree = None
    if config.tree is not None:
        from specreg.runtime.tree import compact_cache, parse_tree, tree_forward

        tree = parse_tree(config.tree)
    drafter = None
    if speculate:
        from specreg.runtime.drafters import make_drafter

        drafter = make_drafter(pair, config, generator)
        if config.disable_above_batch_size is not None and batch_size > config.disable_above_batch_size:
            metrics.record_fallback("batch_size", batch_size)
            drafter = None
    rolling_tau = deque(maxlen=config.acceptance_window)

    def next_tokens(logits):  # [n, vocab] -> [n]
        if sampling:
            return sample(logits_to_probs(logits, config.temperature, config.top_k, config.top_p), generator)
        return logits.argmax(dim=-1)

    tokens = prompt  # [1, length] the verified sequence
    token_list = prompt[0].tolist()
    metrics.prompt_tokens = prompt_length
    cache = DynamicCache(config=pair.target.config)
    cached_length = 0  # leading tokens of `tokens` whose keys/values the target cache holds
    generated = []
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            while True:
                step_start = time.perf_counter()
                # fallbacks: each switches to target-only for the rest of the generation
                if drafter is not None and memory_probe is not None and config.min_free_memory_bytes is not None:
                    free = memory_probe()
                    if free < config.min_free_memory_bytes:
                        metrics.record_fallback("low_memory", int(free))
                        drafter = None
                if (drafter is not None and config.acceptance_length_threshold is not None
                        and len(rolling_tau) == rolling_tau.maxlen
                        and sum(rolling_tau) / len(rolling_tau) < config.acceptance_length_threshold):
                    metrics.record_fallback("low_acceptance_length", sum(rolling_tau) / len(rolling_tau))
                    drafter = None

                # draft: at most what the budget can still take after the bonus token
                k = min(config.k, max_length - len(token_list) - 1) if drafter is not None else 0
                if config.prefill_alone and cached_length == 0:
                    k = 0
                if draft_limit is not None and config.method == "draft_model":
                    k = min(k, draft_limit - len(token_list) + 1)
                draft_ids, draft_probs, step_tree = None, None, None
                if k > 0:
                    forwards = drafter.forwards
                    if tree is not None:
                        # the tree cut to the budget; draft_ids are its nodes' tokens, the root first
                        step_tree = tree.pruned(k)
                        draft_ids, draft_probs = drafter.propose_tree(tokens, step_tree)
                    elif config.method == "ngram":
                        draft_ids, draft_probs = drafter.propose(tokens, k, token_list)
                    else:
                        draft_ids, draft_probs = drafter.propose(tokens, k)
                    metrics.draft_forwards += drafter.forwards - forwards
                    synchronize(device)
                    if draft_ids.shape[0] == 0:  # ngram found no match; a head has no state before the first forward
                        k, step_tree = 0, None
                    elif step_tree is None:
                        k = draft_ids.shape[0]  # ngram may propose fewer
                    verify_start = time.perf_counter()
                    metrics.draft_time_s += verify_start - step_start
                else:
                    verify_start = step_start

                # verify: one target forward over what its cache lacks (the whole prompt on the first
                # step, so the prefill verifies the first drafts too; then the last emitted token)
                # followed by the k drafts (or the tree); only the positions after them need logits
                pending = tokens[:, cached_length:]  # [1, n]
                # a head drafter also reads the target's hidden states of every position fed
                hidden_state_ids = getattr(drafter, "hidden_state_ids", ())
                hidden = None
                if step_tree is not None:
                    logits, hidden = tree_forward(pair.target, cache, pending, draft_ids, step_tree, hidden_state_ids)
                    hidden = hidden.unsqueeze(0)  # [1, n - 1 + nodes+1, A * H]
                    logits = logits[:, :vocab_size]  # [nodes+1, vocab]
                else:
                    verify_input = pending if k == 0 else torch.cat([pending, draft_ids.view(1, -1)], dim=1)
                    logits = forward_logits(pair.target, verify_input, cache, k + 1, hidden_state_ids)
                    if hidden_state_ids:
                        logits, hidden = logits  # hidden # [1, n + k, A * H]
                    logits = logits[0, :, :vocab_size]  # [k+1, vocab]
                if k == 0:
                    num_accepted, emitted = 0, next_tokens(logits)
                elif step_tree is not None:
                    buffers = step_tree.buffers(device)
                    if sampling:
                        target_probs = logits_to_probs(logits, config.temperature, config.top_k, config.top_p)  # [nodes+1, vocab]
                        uniforms = torch.rand(draft_ids.shape[0], generator=generator, device=device)  # [nodes+1]
                        accepted_nodes, emitted = tree_acceptance_rule(draft_probs, target_probs, draft_ids,
                                                                       buffers.parent_ids, uniforms, generator)
                    else:
                        accepted_nodes, emitted = tree_greedy_rule(draft_ids, logits.argmax(dim=-1),
                                                                   buffers.retrieve_indices)
                    num_accepted = accepted_nodes.shape[0]
                elif sampling:
                    target_probs = logits_to_probs(logits, config.temperature, config.top_k, config.top_p)  # [k+1, vocab]
                    uniforms = torch.rand(k, generator=generator, device=device)  # [k]
                    num_accepted, emitted = acceptance_rule(draft_probs, target_probs, draft_ids, uniforms, generator)
                else:
                    num_accepted, emitted = greedy_rule(draft_ids, logits.argmax(dim=-1))
                # roll back: keep the verified tokens and the accepted drafts, drop the rejected ones
                # (a tree: keep the accepted path's nodes, in order); the emitted recovered/bonus
                # token is fed with the next step
                if step_tree is not None:
                    before_root = pending.shape[1] - 1
                    compact_cache(cache, len(token_list), accepted_nodes)
                    if hidden is not None:
                        kept_rows = torch.cat([torch.arange(before_root + 1, device=device), before_root + accepted_nodes])
                        hidden = hidden[:, kept_rows]
                elif k > num_accepted:
                    cache.crop(-(k - num_accepted))
                    if hidden is not None:
                        hidden = hidden[:, : hidden.shape[1] - (k - num_accepted)]
                cached_length = len(token_list) + num_accepted
                if drafter is not None:
                    drafter.rollback(cached_length, hidden)
                emitted_list = emitted.tolist()  # syncs, so the verify time below is honest
                now = time.perf_counter()
                metrics.verify_time_s += now - verify_start
                # a tree counts its depth as the positions drafted: per-position acceptance is per depth
                metrics.record_step(k, num_accepted, len(emitted_list))
                if k > 0:
                    rolling_tau.append(num_accepted + 1)

                # emit the verified tokens of this step, stopping at EOS / stop string / budget
                first_step = metrics.ttft_s is None
                if first_step:
                    metrics.ttft_s = now - start
                share = (now - step_start) / len(emitted_list)
                stop = None
                for token in emitted_list:
                    generated.append(token)
                    token_list.append(token)
                    metrics.generated_tokens += 1
                    if first_step:
                        metrics.ttft_tokens += 1
                    metrics.token_latencies_s.append(share)
                    yield token
                    if token in eos_ids:
                        stop = "eos"
                    elif stop_strings and any(s in pair.tokenizer.decode(generated[-stop_window:])
                                              for s in stop_strings):
                        stop = "stop_string"
                    elif len(token_list) >= max_length:
                        stop = "max_new_tokens" if len(generated) >= config.max_new_tokens else "max_position"
                    if stop:
                        break
                if stop:
                    metrics.stop_reason = stop
                    break
                tokens = torch.cat([tokens, emitted.view(1, -1)], dim=1)  # [1, length]
    finally:
        metrics.total_time_s = time.perf_counter() - start


def _generate(pair, prompt_ids, config, speculate, **hooks) -> Generation:
    metrics = GenerationMetrics()
    token_ids = list(stream_generate(pair, prompt_ids, config, speculate=speculate, metrics=metrics, **hooks))
    text = pair.tokenizer.decode(token_ids) if pair.tokenizer is not None else None
    return Generation(token_ids=token_ids, text=text, metrics=metrics)


def speculative_generate(pair: ModelPair, prompt_ids, config: DecodeConfig, **hooks) -> Generation:
    """Speculative decoding of one prompt -> Generation(token_ids, text, metrics).

    hooks: batch_size, memory_probe, acceptance_rule, greedy_rule, tree_acceptance_rule,
    tree_greedy_rule (see stream_generate).
    """
    return _generate(pair, prompt_ids, config, True, **hooks)


def target_only_generate(pair: ModelPair, prompt_ids, config: DecodeConfig, **hooks) -> Generation:
    """Plain target decoding through the same loop and cache code -> Generation."""
    return _generate(pair, prompt_ids, config, False, **hooks)
