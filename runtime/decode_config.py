"""How the runtime decodes (DecodeConfig: the method, k, the budget, sampling, stops, fallbacks,
the candidate tree, the schedule) and the checks that refuse settings that cannot run, before any
forward pass: one row's (check_config) and a batch's (check_batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from specreg.core.suffix_settings import SuffixSettings
from specreg.errors import RuntimeConfigError
from specreg.runtime.sampling import DRAFT_SAMPLING
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
    # a sampled row's chain drafts (sampling.DRAFT_SAMPLING): "greedy", the argmax with a point-mass
    # q (what vLLM 0.33, SGLang 0.5.23 and llama.cpp run by default), or "probabilistic", a draw from
    # q (vLLM's draft_sample_method="probabilistic"); a greedy row drafts the argmax either way
    draft_sampling: str = "greedy"
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
    if config.draft_sampling not in DRAFT_SAMPLING:
        raise RuntimeConfigError(f"draft_sampling = {config.draft_sampling!r}: use one of {', '.join(DRAFT_SAMPLING)}")
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
