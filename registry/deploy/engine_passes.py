"""Passes of the golden prompts through a serving engine (``specreg validate-engine``): every
prompt sent as token ids at one concurrency, each answer turned into a counts row the engine's
way (registry/deploy/engine_client.py reads the engines; validators/engine.py says what a row
holds), and what the passes give the engine checks: each tier's tokens/s and acceptance, the
outputs with and without the draft, the target-only top-2 where they part."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from specreg.registry.deploy import engine_client

Progress = Callable[[str, int, int, str], None]  # (what, done, total, detail): specreg.cli.progress.Progress


@dataclass
class EngineRun:
    """What one engine pass over the golden prompts returned."""

    completions: list  # engine_client.EngineCompletion per prompt, in prompt order
    rows: list[dict[str, Any]]  # counts rows (validators.engine)
    tokens_per_s: float | None
    counted: Any = None  # engine_client.Counters of the whole pass (vLLM above concurrency 1), or None


def counting(progress: Progress | None, what: str, total: int) -> Callable[[str], None]:
    """A callable that reports one more of ``total`` done under ``what`` (thread-safe: the tiers
    above 1 send requests from several threads)."""
    import threading

    lock, done = threading.Lock(), [0]
    if progress is not None:
        progress(what, 0, total, "")

    def one_more(detail: str) -> None:
        if progress is None:
            return
        with lock:
            done[0] += 1
            progress(what, done[0], total, detail)

    return one_more


def drive(engine: str, base_url: str, prompts: list[dict[str, Any]], *, concurrency: int, model: str | None,
          counters: bool, progress: Progress | None = None, what: str = "engine",
          deadline_s: float = 600.0, counted: bool = False) -> EngineRun:
    """Every prompt through the engine at ``concurrency``. ``counters`` (concurrency 1): read the
    /metrics counters around each request, so steps and per-position acceptance are per prompt;
    ``counted``: around the whole pass (EngineRun.counted; a tier above 1, whose requests overlap).
    ``progress(what, done, total, record)`` after each prompt."""
    one_more = counting(progress, what, len(prompts))

    def one(prompt):
        before = engine_client.read_counters(engine, base_url, model) if counters else None
        done = engine_client.complete(engine, base_url, prompt["prompt_ids"], prompt["max_new_tokens"], model=model,
                                      timeout=deadline_s)
        row = {"record": prompt["record"], "category": prompt["category"], "generated_tokens": len(done.token_ids),
               "drafted": done.drafted, "accepted": done.accepted, "draft_steps": done.draft_steps,
               "accepted_per_position": done.accepted_per_position}
        if before is not None:
            delta = engine_client.read_counters(engine, base_url, model).minus(before, base_url)
            row["draft_steps"] = int(delta.drafts)
            row["drafted"], row["accepted"] = int(delta.draft_tokens), int(delta.accepted_tokens)
            row["accepted_per_position"] = [int(delta.accepted_per_position[p]) for p in sorted(delta.accepted_per_position)]
            row["response_drafted"], row["response_accepted"] = done.drafted, done.accepted
        one_more(prompt["record"])
        return done, row

    around = engine_client.read_counters(engine, base_url, model) if counted else None
    results, wall = engine_client.run_concurrently(one, prompts, concurrency)
    completions = [done for done, _ in results]
    generated = sum(len(done.token_ids) for done in completions)
    counted = None
    if around is not None:
        counted = engine_client.read_counters(engine, base_url, model).minus(around, base_url)
    # at concurrency 1 the scrapes between requests are not the engine's time: sum the requests
    seconds = sum(done.seconds for done in completions) if concurrency == 1 else wall
    return EngineRun(completions, [row for _, row in results], generated / seconds if seconds > 0 else None,
                     counted)


def tier_acceptance(rows: list[dict[str, Any]], counted=None) -> float | None:
    """The engine's acceptance over one tier's prompts, from the counters read around the pass
    (``counted``) or what each response or the counters around it reported (None when the engine
    reported no drafts: a server without per-response counts)."""
    if counted is not None:
        return round(counted.accepted_tokens / counted.draft_tokens, 6) if counted.draft_tokens else None
    drafted = sum(row["drafted"] or 0 for row in rows if row.get("drafted") is not None)
    accepted = sum(row["accepted"] or 0 for row in rows if row.get("accepted") is not None)
    return round(accepted / drafted, 6) if drafted else None


def tier_figures(tiers: tuple[int, ...], spec: dict[int, EngineRun], plain: dict[int, EngineRun]) -> list[dict]:
    """Each concurrency tier's tokens/s with the draft (``spec``) and without it (``plain``, where
    run) and the engine's acceptance there (EngineCheckContext.tiers)."""
    return [{"concurrency": tier, "with_draft_tokens_per_s": spec[tier].tokens_per_s,
             "without_draft_tokens_per_s": plain[tier].tokens_per_s if tier in plain else None,
             "acceptance_rate": tier_acceptance(spec[tier].rows, spec[tier].counted)} for tier in tiers]


def outputs_of(prompts: list[dict[str, Any]], spec: EngineRun, plain: EngineRun) -> list[dict[str, Any]]:
    """The engine's token ids per prompt with and without the draft (EngineCheckContext.outputs)."""
    return [{"record": p["record"], "category": p["category"], "prompt_ids": p["prompt_ids"],
             "speculative": s.token_ids, "target_only": t.token_ids}
            for p, s, t in zip(prompts, spec.completions, plain.completions)]


def target_only_top(engine: str, base_url: str, model: str | None, deadline_s: float):
    """(record, position) -> the top-2 log-probabilities there of the engine at ``base_url``
    serving the target alone (the near-tie evidence where the outputs part), or None."""
    def top_of(record, position):
        again = engine_client.complete(engine, base_url, record["prompt_ids"], position + 1, model=model,
                                       top_logprobs=2, timeout=deadline_s)
        return again.top_logprobs[position] if again.top_logprobs and len(again.top_logprobs) > position else None

    return top_of
