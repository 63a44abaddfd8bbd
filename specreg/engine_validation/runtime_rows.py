"""Our runtime's side of an engine validation: the golden prompts as the token ids both sides get,
and our greedy decodes of them on the engine's schedule, counted the engine's way, as counts rows
(validators/engine.py) beside the engine's."""

from __future__ import annotations

from typing import Any, Callable

from specreg.registry.deploy.engine_passes import Progress, counting
from specreg.registry.store.entities import PairVersion
from specreg.validators.equivalence import DEFAULT_BATCH_SIZE

COUNTED = ("generated_tokens", "drafted", "accepted", "draft_steps", "accepted_per_position")


def golden_prompts(golden, tokenizer) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Encode each record as our runtime does (the engine gets the same ids) -> (prompts, skipped)."""
    import jinja2

    from specreg.errors import ModelReferenceError

    prompts, skipped = [], []
    for record in golden:
        try:
            ids = record.encode(tokenizer)
        except (ModelReferenceError, jinja2.TemplateError) as exc:
            skipped.append({"record": record.id, "reason": " ".join(str(exc).split())[:200]})
            continue
        prompts.append({"record": record.id, "category": record.category, "prompt_ids": list(ids),
                        "max_new_tokens": record.max_new_tokens, "sampled_in_record": not record.is_greedy,
                        "golden": record})
    return prompts, skipped


def runtime_pass(pair, prompts, version: PairVersion, progress: Progress | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE, engine: str = "llamacpp") -> list[dict[str, Any]]:
    """Our runtime's greedy speculative decode of every prompt, batch_size at a time -> counts rows
    (+ "token_ids"), on the engine's schedule (DecodeConfig.prefill_alone: the prefill emits the
    first token alone, drafting starts from it) and counted its way, so both loops draft the same
    windows and count them the same way; the tokens are greedy decoding's either way.

    llama.cpp: a step drafts what the budget has left, and a matching end-of-generation draft ends
    acceptance (runtime.metrics.stop_draft_counts). vLLM: a step drafts k whatever the budget has
    left and every draft the target agrees with counts (DecodeConfig.draft_past_budget); a method
    whose drafts depend on the requests served before (the method's session: the suffix cache)
    decodes the prompts one after another in order on one session, as a fresh vLLM serves them at
    concurrency 1. What validate recorded (reused_rows) makes the llama.cpp pass unnecessary."""
    import dataclasses

    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import generate_batch
    from specreg.runtime.methods import drafting_method
    from specreg.runtime.metrics import stop_draft_counts
    from specreg.validators.equivalence import decode_config

    settings = DecodeConfig.from_spec(version.config)
    if engine == "vllm":
        settings = dataclasses.replace(settings, draft_past_budget=True)
        session = drafting_method(settings.method).session
        if session is not None:
            settings, batch_size = dataclasses.replace(settings, session=session(settings)), 1
    one_more = counting(progress, f"our runtime (greedy, {engine}'s schedule)", len(prompts))
    generations = generate_batch(pair, [prompt["prompt_ids"] for prompt in prompts],
                                 [decode_config(prompt["golden"], settings, greedy=True) for prompt in prompts],
                                 max_rows=batch_size, finished=lambda index: one_more(prompts[index]["record"]))
    k = settings.k
    counted = stop_draft_counts if engine == "llamacpp" else lambda metrics: vllm_counts(metrics, k)
    return [engine_row(prompt["record"], prompt["category"], counted(generation.metrics), generation.token_ids)
            for prompt, generation in zip(prompts, generations)]


def vllm_counts(metrics, k: int) -> dict[str, Any]:
    """The counts of one greedy decode as vLLM counts them: every verified draft and every draft
    the target agreed with (vllm/v1/core/sched/scheduler.py:2350-2354: accepted = sampled - 1),
    accepted per position for all k positions (its per-position counter has one series each)."""
    per_position = list(metrics.accepted_per_position)
    return {"drafted": metrics.drafted, "accepted": metrics.accepted, "draft_steps": metrics.draft_steps,
            "accepted_per_position": per_position + [0] * (k - len(per_position)),
            "generated_tokens": metrics.generated_tokens}


def engine_row(record: str, category: str, counts: dict[str, Any], token_ids) -> dict[str, Any]:
    """A counts row of our runtime (validators.engine) from stop_draft_counts and the tokens."""
    return {"record": record, "category": category, **{key: counts[key] for key in COUNTED},
            "token_ids": list(token_ids)}


def agreement(ours_rows: list[dict[str, Any]], run) -> dict[str, int]:
    """How many prompts the engine's pass (engine_passes.EngineRun) decoded to our runtime's very
    tokens, and how many it counted as our runtime did (COUNTED)."""
    return {"engine_matches_runtime_tokens": sum(1 for row, done in zip(ours_rows, run.completions)
                                                 if row["token_ids"] == done.token_ids),
            "engine_matches_runtime_counts": sum(1 for row, theirs in zip(ours_rows, run.rows)
                                                 if all(row[key] == theirs[key] for key in COUNTED))}


def reused_rows(run, golden, prompts, dtype: str) -> list[dict[str, Any]] | None:
    """The rows of `validate`'s own greedy decodes (its acceptance check's "greedy_rows"), when
    ``run`` (the version's latest passed validation) decoded these very prompts on the engines'
    schedule, on the CPU in ``dtype``; None otherwise (a run recorded before validate decoded on
    that schedule, another golden set, device or dtype: decode again)."""
    from specreg.core.baselines import ENGINE_SCHEDULE, schedule_of

    if run is None or run.golden_sha256 != golden.content_sha256 or schedule_of(run.baselines) != ENGINE_SCHEDULE:
        return None
    if (run.environment or {}).get("device") != "cpu" or (run.environment or {}).get("dtype") != dtype:
        return None
    acceptance = next((check for check in run.checks if check.name == "acceptance"), None)
    recorded = (acceptance.evidence or {}).get("greedy_rows") if acceptance is not None else None
    if not recorded or [row["record"] for row in recorded] != [prompt["record"] for prompt in prompts]:
        return None
    return [engine_row(row["record"], row["category"], row["stop_counts"], row["token_ids"]) for row in recorded]


def vllm_runtime_rows(version: PairVersion, prompts, dtype: str, progress) -> list[dict[str, Any]]:
    """Our runtime's rows of the golden prompts on vLLM's schedule (runtime_pass), the pair loaded
    in ``dtype`` from its registered folders, checked against their fingerprints."""
    from specreg.runtime.methods import load_pair

    pair = load_pair(version.target.path, version.draft.path if version.draft else None, device="cpu",
                     dtype=dtype, target_fingerprint=version.target.fingerprint,
                     draft_fingerprint=version.draft.fingerprint if version.draft else None,
                     method=version.config.method.value)
    return runtime_pass(pair, prompts, version, progress=progress, engine="vllm")


def runtime_margin(pair) -> Callable[[list[int], list[int]], dict]:
    """(prompt ids, generated prefix) -> our runtime's plain-decoding top-2 there."""
    from specreg.validators.equivalence import plain_next_token_logits

    def margin(prompt_ids, prefix):
        top = plain_next_token_logits(pair, list(prompt_ids) + list(prefix)).topk(2)
        return {"top2_ids": [int(i) for i in top.indices], "margin": float(top.values[0] - top.values[1])}

    return margin
