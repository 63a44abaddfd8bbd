"""Per-generation metrics, named as vLLM names them (docs/design.md §2), and their aggregate.

The engines' terms (vLLM's SpecDecodingStats/SpecDecodingLogging, SGLang's accept length): a
*draft step* is a verification that had drafts; a step that drafted nothing (n-gram found no
match, a head before its first target states, speculation off) is not one.
- acceptance_rate (alpha-hat) = accepted / drafted tokens
- mean_acceptance_length (tau) = 1 + accepted / draft_steps (vLLM ``1 + num_accepted_tokens /
  num_drafts``; SGLang ``completion_tokens / spec_verify_ct``)
- per_position_acceptance[i] = steps that accepted position i / draft_steps (vLLM's
  unconditional rate: the chance that drafts 0..i were all accepted)
Ours, under their own names, never to be compared with an engine's tau or per-position:
- tokens_per_target_forward = emitted tokens / all verification forwards (draft steps or not)
- per_position_acceptance_conditional[i] = accepted at i / draft steps that reached i (the
  factors of docs/design.md §2's speedup formula, which choose_k multiplies)
"""

from __future__ import annotations

from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile q in [0, 100] of values; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class GenerationMetrics:
    """Counters one generation fills as it runs; summary() gives the named figures.

    Counts: drafted / accepted draft tokens; draft_steps (verifications that had drafts);
    accepted_per_position[i] / reached_per_position[i] (a draft reaches position i when drafts
    0..i-1 were all accepted); verify_steps and verify_emitted (every verification forward, with or
    without drafts, and the tokens they emitted, bonus included); ttft_tokens: the
    tokens that came with the first one (the first step's, prefill included: up to k+1 when it
    verified drafts). Decode phase: everything after that first step, the part docs/design.md §2's
    speedup formula models (prefill is outside it). Times in seconds. Per-token latency: a
    step's time shared equally by the tokens it emitted.
    """

    drafted: int = 0
    accepted: int = 0
    draft_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    reached_per_position: list[int] = field(default_factory=list)
    target_forwards: int = 0
    draft_forwards: int = 0
    verify_steps: int = 0
    verify_emitted: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    total_time_s: float = 0.0
    ttft_s: float | None = None
    ttft_tokens: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    token_latencies_s: list[float] = field(default_factory=list)
    rejection_run: int = 0
    longest_rejection_run: int = 0
    fallbacks: list[dict] = field(default_factory=list)
    stop_reason: str | None = None
    # (position, accepted) of a step whose accepted draft at `position` was a stop token before its
    # last draft: what llama.cpp counts differently (stop_draft_counts)
    stop_draft: tuple[int, int] | None = None
    batch_size: int = 1  # rows decoded together: the throughput figures are at this batch size
    batch_time_s: float | None = None  # this row's share of its batch's steps' wall time (None: total_time_s)

    def record_step(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        """One verification forward: num_drafted proposals, num_accepted kept, num_emitted out."""
        self.verify_steps += 1
        self.target_forwards += 1
        self.verify_emitted += num_emitted
        self.drafted += num_drafted
        self.accepted += num_accepted
        if num_drafted > 0:
            self.draft_steps += 1
        # one entry per position drafted so far, as vLLM keeps one counter per position from 0 to k - 1
        for _ in range(len(self.reached_per_position), num_drafted):
            self.reached_per_position.append(0)
            self.accepted_per_position.append(0)
        for position in range(min(num_drafted, num_accepted + 1)):
            self.reached_per_position[position] += 1
            if position < num_accepted:
                self.accepted_per_position[position] += 1
        if num_drafted > 0:
            self.rejection_run = self.rejection_run + 1 if num_accepted == 0 else 0
            self.longest_rejection_run = max(self.longest_rejection_run, self.rejection_run)

    def record_fallback(self, reason: str, detail) -> None:
        self.fallbacks.append({"reason": reason, "at_token": self.generated_tokens, "detail": detail})

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """tau as the engines count it: 1 + accepted / draft steps; None without a draft step."""
        return 1.0 + self.accepted / self.draft_steps if self.draft_steps else None

    @property
    def tokens_per_target_forward(self) -> float | None:
        """Ours: emitted tokens / every verification forward, steps without drafts included."""
        return self.verify_emitted / self.verify_steps if self.verify_steps else None

    @property
    def per_position_acceptance(self) -> list[float]:
        """vLLM's per-position rate: steps that accepted position i / draft steps."""
        return [a / self.draft_steps for a in self.accepted_per_position] if self.draft_steps else []

    @property
    def per_position_acceptance_conditional(self) -> list[float]:
        """Accepted at position i / draft steps that reached it (what choose_k multiplies)."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_per_position, self.reached_per_position)]

    @property
    def tokens_per_s(self) -> float | None:
        return self.generated_tokens / self.total_time_s if self.total_time_s > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens per second after the first step (TTFT and its tokens left out); None without one."""
        return decode_rate(self.generated_tokens - self.ttft_tokens, self.total_time_s - (self.ttft_s or 0.0))

    def summary(self) -> dict:
        """The named figures of docs/design.md §2 as a flat JSON-able dict."""
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "draft_steps": self.draft_steps,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_acceptance": self.per_position_acceptance,
            "tokens_per_target_forward": self.tokens_per_target_forward,
            "per_position_acceptance_conditional": self.per_position_acceptance_conditional,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "generated_tokens": self.generated_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tokens_per_s": self.tokens_per_s,
            "ttft_s": self.ttft_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "latency_p50_s": percentile(self.token_latencies_s, 50),
            "latency_p95_s": percentile(self.token_latencies_s, 95),
            "latency_p99_s": percentile(self.token_latencies_s, 99),
            "longest_rejection_run": self.longest_rejection_run,
            "draft_time_s": self.draft_time_s,
            "verify_time_s": self.verify_time_s,
            "total_time_s": self.total_time_s,
            "fallbacks": list(self.fallbacks),
            "stop_reason": self.stop_reason,
        }


def stop_draft_counts(metrics: GenerationMetrics) -> dict:
    """The counts of one greedy decode as llama.cpp's server counts them (common/sampling.cpp
    common_sampler_sample_and_accept_n): an accepted draft that is a stop token, unless it is the
    step's last draft, ends acceptance there and is not counted; the drafts after it that the
    target agreed with are not counted either (acceptance_rule.greedy_accept_stopping_at is the
    rule stated on its own). The tokens are the same either way -> {"drafted", "accepted",
    "draft_steps", "accepted_per_position", "generated_tokens"}."""
    accepted, per_position = metrics.accepted, list(metrics.accepted_per_position)
    if metrics.stop_draft is not None:
        position, num_accepted = metrics.stop_draft
        accepted -= num_accepted - position
        for index in range(position, num_accepted):
            per_position[index] -= 1
    return {"drafted": metrics.drafted, "accepted": accepted, "draft_steps": metrics.draft_steps,
            "accepted_per_position": per_position, "generated_tokens": metrics.generated_tokens}


def decode_rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if tokens > 0 and seconds > 0 else None


def aggregate(metrics: list[GenerationMetrics]) -> dict:
    """Many generations (e.g. one prompt category) -> the same named figures, pooled.

    Rates are ratios of summed counts (not means of ratios); latencies are pooled; ttft is the mean;
    decode_tokens_per_s is the decode-phase tokens over the decode-phase time of all of them.
    """
    total = GenerationMetrics()
    ttfts = []
    decode_tokens, decode_seconds = 0, 0.0
    for one in metrics:
        for name in ("drafted", "accepted", "draft_steps", "target_forwards", "draft_forwards", "verify_steps",
                     "verify_emitted", "generated_tokens", "prompt_tokens", "total_time_s",
                     "draft_time_s", "verify_time_s"):
            setattr(total, name, getattr(total, name) + getattr(one, name))
        for position, (accepted, reached) in enumerate(zip(one.accepted_per_position, one.reached_per_position)):
            if position >= len(total.reached_per_position):
                total.reached_per_position.append(0)
                total.accepted_per_position.append(0)
            total.accepted_per_position[position] += accepted
            total.reached_per_position[position] += reached
        total.token_latencies_s.extend(one.token_latencies_s)
        total.longest_rejection_run = max(total.longest_rejection_run, one.longest_rejection_run)
        total.fallbacks.extend(one.fallbacks)
        if one.ttft_s is not None:
            ttfts.append(one.ttft_s)
            decode_tokens += one.generated_tokens - one.ttft_tokens
            decode_seconds += one.total_time_s - one.ttft_s
    summary = total.summary()
    # rows decoded together share their batch's wall time: throughput is tokens over the batches'
    # time (tokens_per_s stays one row's rate: its tokens over its own time from start to end)
    batch_seconds = sum(one.batch_time_s if one.batch_time_s is not None else one.total_time_s for one in metrics)
    summary["batch_size"] = max((one.batch_size for one in metrics), default=1)
    summary["batch_tokens_per_s"] = decode_rate(total.generated_tokens, batch_seconds)
    summary["ttft_s"] = sum(ttfts) / len(ttfts) if ttfts else None
    summary["decode_tokens_per_s"] = decode_rate(decode_tokens, decode_seconds)
    summary["generations"] = len(metrics)
    summary.pop("stop_reason")
    return summary
