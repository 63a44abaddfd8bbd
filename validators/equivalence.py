"""Golden-prompt equivalence (docs/design.md §3): speculative greedy decoding must emit exactly the
tokens of target-only greedy decoding, on the same device and dtype.

``decode_golden`` is the one pass over the golden prompts that the runtime checks share: per
prompt, target-only greedy, speculative greedy and (for sampled prompts) speculative sampling
with the prompt's own settings. ``check_equivalence`` compares the greedy pairs; at the first
divergence it recomputes the target's logits by plain decoding (one full forward, no cache) and
records both tokens and the top-1/top-2 margin there: a margin below the tolerance with the
speculative token in the top two is a numerical near-tie (warn, with evidence); anything else
is a real difference (fail).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from specreg.errors import ModelReferenceError
from specreg.core.types import FAIL, PASS, SKIP, WARN, CheckResult
from specreg.validators.context import Check, CheckContext

CHECK_NAME = "equivalence"
# Logit margins under which fp rounding between one-position and (k+1)-position forwards can
# flip an argmax: float32 rounding is ~1e-6 relative; half precisions are coarser.
NEAR_TIE_TOLERANCE = {"float32": 1e-3, "float16": 5e-2, "bfloat16": 2.5e-1}
MAX_EVIDENCE = 20


@dataclass
class PromptRun:
    """The decodes of one golden prompt. ``sampled`` is None for greedy prompts, whose
    acceptance is that of ``speculative``."""

    record_id: str
    category: str
    prompt_ids: list[int]
    temperature: float
    speculative: Any  # runtime Generation, greedy
    target_only: Any  # runtime Generation, greedy
    sampled: Any = None  # runtime Generation with the record's temperature/top-p/top-k/seed

    @property
    def acceptance_generation(self):
        """The generation whose acceptance counts: the prompt decoded as its record asks."""
        return self.sampled if self.sampled is not None else self.speculative


@dataclass
class GoldenDecodes:
    runs: list[PromptRun] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # records that could not be encoded
    batch_size: int = 1  # the most prompts decoded at once in `runs`
    # the first prompts, decoded one at a time (greedy, target-only and speculative): the latency
    # one request sees alone; their runs are the first of `runs` (all of `runs` at batch size 1)
    single: list[PromptRun] = field(default_factory=list)
    # the cores other work kept busy while the batched passes decoded (runtime/process.
    # other_work_since; None: not read), which their throughputs share the machine with
    other_work_cores: float | None = None

    @property
    def batched(self) -> list[PromptRun]:
        """The runs decoded in batches of batch_size, whose times make the throughput figures
        (every run at batch size 1)."""
        alone = {id(run) for run in self.single} if self.batch_size > 1 else set()
        return [run for run in self.runs if id(run) not in alone]


# prompts decoded alone for the latency figures when the golden set is decoded batched: a tenth
# of the set, at least one and at most LATENCY_PROMPTS; their decodes count as the others do
LATENCY_PROMPTS = 4
LATENCY_SHARE = 0.1
DEFAULT_BATCH_SIZE = 16
WARM_UP_PROMPT_TOKENS = 16


def decode_config(record, settings, *, greedy: bool, seed: int = 0):
    """The DecodeConfig of one golden record: settings (the pair's DecodeConfig,
    DecodeConfig.from_spec) with the record's budget, sampling and seed, on the serving engines'
    schedule (the prefill emits the first token alone and drafting starts from it,
    DecodeConfig.prefill_alone), so that the engine comparison of `validate --engine` reads the very
    decodes validate counted. The parsed tree is shared, not parsed again."""
    return dataclasses.replace(
        settings, max_new_tokens=record.max_new_tokens,
        temperature=0.0 if greedy else float(record.temperature or 0.0),
        top_k=None if greedy else record.top_k, top_p=None if greedy else record.top_p,
        seed=record.seed if record.seed is not None else seed, prefill_alone=True,
    )


def latency_prompts(encoded: int, batch_size: int) -> int:
    """How many of the first prompts decode alone for the latency figures (all at batch size 1)."""
    if batch_size == 1:
        return encoded
    return max(1, min(LATENCY_PROMPTS, round(encoded * LATENCY_SHARE)))


def decode_golden(pair, golden, settings, *, seed: int = 0,
                  progress: Callable[[int, int, str], None] | None = None, hooks: dict | None = None,
                  batch_size: int = DEFAULT_BATCH_SIZE) -> GoldenDecodes:
    """Decode every golden record on the runtime -> GoldenDecodes.

    settings: the pair's DecodeConfig (DecodeConfig.from_spec); hooks: for the speculative decodes
    (tests inject broken rules). Each record is decoded target-only greedy and speculative greedy,
    a sampled one also speculative with its own sampling. The first prompts (a tenth, 1 to
    LATENCY_PROMPTS; all at batch_size 1) decode greedy one at a time, target-only then
    speculative (GoldenDecodes.single: the latency one request sees); the others in two batched
    passes of at most batch_size rows side by side (runtime/generate.generate_interleaved: their
    throughputs make the speedup), target-only and speculative, the sampled records' rows in the
    speculative one too, each row decoding as it would alone (runtime/decode.decode_rows).
    progress(done, total, record_id) as a record's decode ends. Records the target's tokenizer
    cannot encode are skipped and listed (the chat_template check says why)."""
    from specreg.runtime.generate import Pass, generate_interleaved
    from specreg.runtime.process import other_work_since, read_cpus

    hooks = hooks or {}
    decodes = GoldenDecodes(batch_size=batch_size)
    encoded = encode_records(golden, pair.tokenizer, decodes.skipped)
    sampled, total = [item for item in encoded if not item[0].is_greedy], decoded_rows(golden)
    done = [total - 2 * len(encoded) - len(sampled)]  # a skipped record's decodes count as done
    if progress and decodes.skipped:
        progress(done[0], total, decodes.skipped[-1]["record"])
    if not encoded:
        return decodes
    batch_size = decodes.batch_size = min(batch_size, len(encoded))  # the most rows decoded at once

    def decoding(items, *, greedy: list[bool], speculate: bool = True, rows: int = batch_size) -> Pass:
        def finished(index: int) -> None:
            done[0] += 1
            if progress:
                progress(done[0], total, items[index][0].id)

        configs = [decode_config(record, settings, greedy=row_greedy, seed=seed)
                   for (record, _), row_greedy in zip(items, greedy)]
        return Pass([list(ids) for _, ids in items], configs, speculate,
                    {"max_rows": rows, "finished": finished, **(hooks if speculate else {})})

    warm_up(pair, encoded[0], settings, seed=seed, hooks=hooks)
    count = latency_prompts(len(encoded), batch_size)
    single = [tuple(generate_interleaved(pair, [decoding([item], greedy=[True], speculate=speculate, rows=1)])[0][0]
                    for speculate in (False, True)) for item in encoded[:count]]  # (target-only, speculative)
    rest, together = encoded[count:], encoded[count:] + sampled
    # the batched passes side by side, so that a change of load during them slows both alike
    passes = ([decoding(rest, greedy=[True] * len(rest), speculate=False)] if rest else []) + \
        ([decoding(together, greedy=[True] * len(rest) + [False] * len(sampled))] if together else [])
    reading = read_cpus()
    batched = generate_interleaved(pair, passes) if passes else []
    decodes.other_work_cores = other_work_since(reading) if passes else None  # no pass timed: no figure
    target_only = [plain for plain, _ in single] + (batched[0] if rest else [])
    speculative = batched[-1] if together else []
    by_record = dict(zip((record.id for record, _ in sampled), speculative[len(rest):]))
    speculative = [spec for _, spec in single] + speculative[:len(rest)]
    decodes.runs = [PromptRun(record.id, record.category, list(ids), float(record.temperature or 0.0),
                              spec, plain, by_record.get(record.id))
                    for (record, ids), spec, plain in zip(encoded, speculative, target_only)]
    decodes.single = decodes.runs[:count]
    return decodes


def encode_records(golden, tokenizer, skipped: list[dict]) -> list[tuple]:
    """[(record, prompt ids)] of the records the tokenizer can encode; the others are appended to
    skipped with the reason."""
    import jinja2

    encoded = []
    for record in golden:
        try:
            encoded.append((record, record.encode(tokenizer)))
        except (ModelReferenceError, jinja2.TemplateError) as exc:
            skipped.append({"record": record.id, "reason": " ".join(str(exc).split())[:200]})
    return encoded


def decoded_rows(golden) -> int:
    """The rows decode_golden decodes: two per record, three per sampled one."""
    return sum(2 if record.is_greedy else 3 for record in golden)


def warm_up(pair, item: tuple, settings, *, seed: int, hooks: dict) -> None:
    """A few tokens of both decodes (one drafting step) after the start of one record's prompt,
    untimed: first calls pay one-off allocation and kernel selection, which must stay out of the
    timings; a whole prompt's prefill would add nothing to that."""
    from specreg.runtime.generate import generate_batch

    record, ids = item
    config = decode_config(record, settings, greedy=True, seed=seed)
    start = list(ids)[:WARM_UP_PROMPT_TOKENS]
    # target-only: the prefill and one cached step, every shape its decode runs; speculative: the
    # prefill, then one drafting step and its verification
    generate_batch(pair, [start], dataclasses.replace(config, max_new_tokens=min(2, record.max_new_tokens)),
                   speculate=False)
    generate_batch(pair, [start], dataclasses.replace(config, max_new_tokens=min(4, record.max_new_tokens)), **hooks)


def plain_next_token_logits(pair, token_ids: list[int]):
    """The target's next-token logits after ``token_ids`` by one full forward without any
    cache -> logits # [vocab] (float32): the reference a near-tie is judged against."""
    import torch

    with torch.inference_mode():
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=pair.device)  # [1, n]
        return pair.target(input_ids=input_ids, use_cache=False).logits[0, -1, :pair.vocab_size].float()


def describe_divergence(pair, run: PromptRun, tolerance: float) -> dict:
    """Where speculative and target-only greedy outputs first differ, with the target's
    top-1/top-2 margin there recomputed by plain decoding -> evidence dict with "near_tie"."""
    spec, plain = run.speculative.token_ids, run.target_only.token_ids
    position = next((i for i, (a, b) in enumerate(zip(spec, plain)) if a != b), min(len(spec), len(plain)))
    spec_token = spec[position] if position < len(spec) else None
    target_token = plain[position] if position < len(plain) else None
    logits = plain_next_token_logits(pair, run.prompt_ids + plain[:position])  # [vocab]
    top = logits.topk(2)
    top_ids = [int(i) for i in top.indices]
    margin = float(top.values[0] - top.values[1])
    tokenizer = pair.tokenizer

    def label(token_id):
        return "<end>" if token_id is None else tokenizer.convert_ids_to_tokens(int(token_id))

    near_tie = margin < tolerance and spec_token in top_ids and target_token in top_ids
    return {
        "record": run.record_id, "category": run.category, "position": position,
        "speculative_token_id": spec_token, "speculative_token": label(spec_token),
        "target_only_token_id": target_token, "target_only_token": label(target_token),
        "plain_top2_ids": top_ids, "plain_top2_tokens": [label(i) for i in top_ids],
        "plain_top2_logits": [float(v) for v in top.values],
        "margin": margin, "tolerance": tolerance, "near_tie": near_tie,
        "speculative_length": len(spec), "target_only_length": len(plain),
    }


def check_equivalence(pair, decodes: GoldenDecodes, *, tolerance: float) -> CheckResult:
    """Exact token equality of speculative vs target-only greedy decoding of every prompt.

    pair: the runtime ModelPair the decodes ran on; decodes: from decode_golden; tolerance:
    the logit margin under which a divergence is a near-tie. Returns a CheckResult
    "equivalence": pass when every prompt matches, warn when all divergences are near-ties,
    fail otherwise (or when no prompt could be decoded).
    """
    divergences = []
    for run in decodes.runs:
        if run.speculative.token_ids != run.target_only.token_ids:
            divergences.append(describe_divergence(pair, run, tolerance))
    prompts = len(decodes.runs)
    near_ties = sum(1 for d in divergences if d["near_tie"])
    figures = {"prompts": prompts, "exact": prompts - len(divergences), "near_tie": near_ties,
               "fail": len(divergences) - near_ties, "skipped": len(decodes.skipped),
               "tokens_compared": sum(len(r.target_only.token_ids) for r in decodes.runs)}
    evidence = {"divergences": divergences[:MAX_EVIDENCE], "skipped": decodes.skipped, "tolerance": tolerance}
    if prompts == 0:
        return CheckResult(CHECK_NAME, SKIP if not decodes.skipped else FAIL,
                           "no golden prompt could be decoded", evidence, figures)
    hard = [d for d in divergences if not d["near_tie"]]
    if hard:
        first = hard[0]
        more = f" ({len(divergences)} of {prompts} prompts diverge)" if len(divergences) > 1 else ""
        summary = (f"'{first['record']}' diverges at token {first['position']}: speculative "
                   f"{first['speculative_token']!r} (id {first['speculative_token_id']}) vs target-only "
                   f"{first['target_only_token']!r} (id {first['target_only_token_id']}), "
                   f"top-1/top-2 margin {first['margin']:.4g} >= tolerance {tolerance:g}{more}")
        return CheckResult(CHECK_NAME, FAIL, summary, evidence, figures)
    if divergences:
        first = divergences[0]
        summary = (f"near-tie: {len(divergences)} of {prompts} prompts diverge only where the target's "
                   f"top-1/top-2 margin is below {tolerance:g} (first '{first['record']}' at token "
                   f"{first['position']}, margin {first['margin']:.3g})")
        return CheckResult(CHECK_NAME, WARN, summary, evidence, figures)
    skipped = f"; {len(decodes.skipped)} skipped" if decodes.skipped else ""
    return CheckResult(CHECK_NAME, PASS, f"{prompts} prompts, {figures['tokens_compared']} tokens: speculative "
                       f"output identical to target-only{skipped}", evidence, figures)


def default_near_tie_tolerance(dtype: str) -> float:
    return NEAR_TIE_TOLERANCE.get(dtype, NEAR_TIE_TOLERANCE["bfloat16"])


def run(context: CheckContext) -> CheckResult:
    """The equivalence check of a validation, over the runtime's golden decodes."""
    pair, decodes = context.runtime()
    tolerance = context.options.near_tie_tolerance
    if tolerance is None:
        tolerance = default_near_tie_tolerance(context.options.dtype)
    return check_equivalence(pair, decodes, tolerance=tolerance)


CHECK = Check(CHECK_NAME, run, runtime=True)
