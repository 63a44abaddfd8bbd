"""Validation in a serving engine, end to end (``specreg validate NAME@V --engine ENGINE``).

Local llama.cpp: start ``llama-server`` from the pair's ``llamacpp`` export (with the draft, and
the same command without it). Local vLLM (``--engine vllm`` without ``--engine-url``): start vLLM
for the CPU (`make vllm`) on the pair's ``vllm`` export, with and without its speculative config
(registry/deploy/engines/vllm_server.py). Then send every golden prompt as token ids (greedy;
llama.cpp's export drafts with ``--spec-draft-p-min 0`` from F32/BF16 GGUF), read acceptance the
engine's way (per response counts and the ``/metrics`` counters around each request), decode the
same token ids on our runtime, and judge parity, equivalence in the engine and throughput per
concurrency tier. ``--engine-url URL --engine vllm|sglang``: the same against a server someone
else started (a GPU cluster, tensor parallel). The result is the pair's engine baseline, stamped
with the engine's name, version and build; every server started here is stopped (a vLLM by its
process group), also on Ctrl-C, SIGTERM and errors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from specreg.core.types import FAIL
from specreg.errors import SpecregError, UsageError
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.store import Store
from specreg.validators.equivalence import DEFAULT_BATCH_SIZE

DEFAULT_TIERS = (1, 4)
MAX_CONCURRENCY = 64
MAX_DEADLINE_S = 86_400.0
IDENTITY_DEADLINE_S = 30.0  # /version, /props: an engine answers those at once


@dataclass(frozen=True)
class EngineOptions:
    engine: str = "llamacpp"
    engine_url: str | None = None  # a server someone else started (vllm, sglang)
    reference_url: str | None = None  # the same engine serving the target without speculation
    model_name: str | None = None  # vLLM's served model name (its metrics label)
    tiers: tuple[int, ...] = DEFAULT_TIERS
    parity_tolerance: float = 0.03
    near_tie_tolerance: float | None = None  # default by the GGUF / engine dtype
    dtype: str = "float32"
    threads: int | None = None
    deadline_s: float = 600.0  # one engine request, connect to last byte

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "engine_url": self.engine_url, "reference_url": self.reference_url,
                "model_name": self.model_name, "tiers": list(self.tiers), "parity_tolerance": self.parity_tolerance,
                "near_tie_tolerance": self.near_tie_tolerance, "dtype": self.dtype, "threads": self.threads,
                "deadline_s": self.deadline_s}


def check_options(options: EngineOptions) -> EngineOptions:
    """UsageError (one line) for a combination that cannot run."""
    from specreg.registry.deploy.engine_client import ENGINES, check_url

    if options.engine not in ENGINES:
        raise UsageError(f"invalid --engine {options.engine!r}: use one of {', '.join(ENGINES)}")
    if options.engine == "sglang" and not options.engine_url:
        raise UsageError(f"--engine {options.engine} runs against a server you started: pass --engine-url URL")
    if options.engine == "llamacpp" and options.engine_url:
        raise UsageError("--engine llamacpp starts llama-server itself from the pair's export: drop --engine-url")
    if options.engine == "vllm" and not options.engine_url and options.model_name:
        raise UsageError("--engine-model goes with --engine-url: a vLLM started here serves the export's name")
    if options.reference_url and not options.engine_url:
        raise UsageError("--engine-reference-url goes with --engine-url")
    for url in (options.engine_url, options.reference_url):
        if url:
            check_url(url)
    if not options.tiers or any(not 1 <= tier <= MAX_CONCURRENCY for tier in options.tiers):
        raise UsageError(f"invalid --concurrency {','.join(map(str, options.tiers))}: tiers from 1 to {MAX_CONCURRENCY}")
    if options.threads is not None and not 1 <= options.threads <= 256:
        raise UsageError(f"invalid --engine-threads {options.threads}: 1 to 256")
    if not 0 < options.parity_tolerance < 1:  # NaN fails this too
        raise UsageError(f"invalid parity tolerance {options.parity_tolerance!r}: use a fraction in (0, 1)")
    if not 0 < options.deadline_s <= MAX_DEADLINE_S:
        raise UsageError(f"invalid --engine-deadline {options.deadline_s!r}: seconds, more than 0 and at most "
                         f"{MAX_DEADLINE_S:g}")
    if options.dtype not in ("float32", "bfloat16"):
        raise UsageError(f"invalid --dtype {options.dtype} for an engine validation: float32 or bfloat16 "
                         f"(comparable numerics)")
    tiers = tuple(sorted(set(options.tiers) | {1}))  # concurrency 1 always: parity and equivalence run there
    return EngineOptions(**{**options.__dict__, "tiers": tiers})


@dataclass
class EngineRun:
    """What one engine pass over the golden prompts returned."""

    completions: list  # engine_client.EngineCompletion per prompt, in prompt order
    rows: list[dict[str, Any]]  # counts rows (validators.engine)
    tokens_per_s: float | None
    counted: Any = None  # engine_client.Counters of the whole pass (vLLM above concurrency 1), or None


@dataclass
class EngineOutcome:
    baseline: Any  # registry.store.engine_baselines.EngineBaseline
    checks: tuple
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.baseline.status == "passed"  # an unaccepted one is no baseline yet


Progress = Callable[[str, int, int, str], None]  # (what, done, total, detail): specreg.cli.progress.Progress


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
    from specreg.registry.deploy import engine_client

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


COUNTED = ("generated_tokens", "drafted", "accepted", "draft_steps", "accepted_per_position")


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
    from specreg.registry.deploy.engine_client import complete

    def top_of(record, position):
        again = complete(engine, base_url, record["prompt_ids"], position + 1, model=model, top_logprobs=2,
                         timeout=deadline_s)
        return again.top_logprobs[position] if again.top_logprobs and len(again.top_logprobs) > position else None

    return top_of


def runtime_margin(pair) -> Callable[[list[int], list[int]], dict]:
    """(prompt ids, generated prefix) -> our runtime's plain-decoding top-2 there."""
    from specreg.validators.equivalence import plain_next_token_logits

    def margin(prompt_ids, prefix):
        top = plain_next_token_logits(pair, list(prompt_ids) + list(prefix)).topk(2)
        return {"top2_ids": [int(i) for i in top.indices], "margin": float(top.values[0] - top.values[1])}

    return margin


def validate_in_engine(store: Store, version: PairVersion, golden, options: EngineOptions, *, actor: str,
                       progress: Progress | None = None, export_argv: list[str] | None = None) -> EngineOutcome:
    """Run ``version`` through the engine, compare with our runtime, store the engine baseline.
    ``export_argv``: the vllm export's command (vllm_server.export_argv), what a local vLLM runs.

    progress(stage, done, total, record_id) after each prompt of each pass. SIGINT/SIGTERM raise
    ValidationInterrupted after every server started here was stopped; nothing is stored then."""
    from specreg.registry.deploy.engines.common import measured_schedule
    from specreg.registry.store.engine_baselines import EngineBaselineStore
    from specreg.registry.store.validations import ValidationStore
    from specreg.runtime_validation import interrupt_on_signals

    options = check_options(options)
    started = time.time()
    with interrupt_on_signals():
        if options.engine == "llamacpp":
            report, baselines, checks, identity = _local_llamacpp(store, version, golden, options, progress,
                                                                  actor=actor)
        elif options.engine == "vllm" and not options.engine_url:
            if export_argv is None:
                raise UsageError("--engine vllm without --engine-url starts the pair's vllm export: no export "
                                 "command was planned")
            report, baselines, checks, identity = _local_vllm(store, version, golden, options, progress,
                                                              actor=actor, export_argv=export_argv)
        else:
            report, baselines, checks, identity = _remote(store, version, golden, options, progress)
    report["seconds"] = round(time.time() - started, 1)
    report["checks"] = [check.to_dict() for check in checks]
    # the per-batch schedule the measured tiers support: speculation off where a tier was slower
    report["speculation_schedule"] = measured_schedule(report.get("throughput"), version.config.num_speculative_tokens)
    failed = [check.name for check in checks if check.status == FAIL]
    report["reason"] = f"{', '.join(failed)} failed" if failed else None
    status, report["acceptance_reason"] = baseline_status(checks, options)
    run = ValidationStore(store).latest_passed(version.name, version.version)
    baseline = EngineBaselineStore(store).record(
        version, engine=options.engine, engine_version=identity["version"] or "unknown",
        engine_build=identity["build"] or "unknown", source=options.engine_url or "local", status=status,
        golden_set=golden.name, golden_sha256=golden.content_sha256,
        validation_run_id=run.id if run is not None else None, baselines=baselines, report=report, actor=actor)
    return EngineOutcome(baseline, tuple(checks), report)


def baseline_status(checks, options: EngineOptions) -> tuple[str, str | None]:
    """(passed | failed | unaccepted, why it needs acceptance or None). A check other than parity
    failing fails the baseline. An acceptance rate beyond the parity tolerance, the run's or, when
    the run was given a looser one, the registry's own (validators.engine.PARITY_TOLERANCE), makes
    it unaccepted: recorded, used by nothing until an approver accepts it."""
    from specreg.registry.store.engine_baselines import FAILED, PASSED, UNACCEPTED
    from specreg.validators.engine import PARITY_TOLERANCE

    if any(check.status == FAIL and check.name != "engine_parity" for check in checks):
        return FAILED, None
    parity = next((check for check in checks if check.name == "engine_parity"), None)
    if parity is None:
        return PASSED, None
    tolerance = min(options.parity_tolerance, PARITY_TOLERANCE)
    delta = (parity.figures or {}).get("alpha_delta")
    if parity.status == FAIL or (delta is not None and delta > tolerance):
        alpha = (parity.figures or {})
        if delta is not None and delta <= tolerance:  # overall within: a category failed it
            shown = parity.summary
        else:
            shown = (f"alpha {alpha['alpha_engine']:.4f} in the engine vs {alpha['alpha_ours']:.4f} on our runtime "
                     f"(|d| {delta:.4f} > {tolerance:g})" if delta is not None else "no acceptance to compare")
        return UNACCEPTED, shown
    return PASSED, None


GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16"}


def llamacpp_ggufs(version: PairVersion, dtype: str, records) -> dict[str, Any]:
    """The GGUF files llama-server loads for ``version``: converted by the llamacpp export's own
    converter (llama.cpp's convert_hf_to_gguf.py) from the registered folders, after checking they
    still match their fingerprints, through llama.cpp's conversion cache (the export's too)."""
    from specreg.registry.deploy.engines import llamacpp
    from specreg.registry.governance.queries import fingerprint_changes

    why = llamacpp.refusal(version)
    if why:
        raise UsageError(f"validate --engine llamacpp: {why}")
    changes = fingerprint_changes(version)
    if changes:
        raise SpecregError(f"{version.label}: the models changed since registration ({'; '.join(changes)}); "
                           f"nothing is converted or served")
    return {role: path for role, (path, _) in llamacpp.converted_files(version, GGUF_TYPES[dtype],
                                                                         records=records).items()}


def llamacpp_identity(server) -> dict[str, Any]:
    """Engine version and build of a running llama-server: the vendored llama.cpp commit, /props
    build_info and the binary's sha256 (the one checked against the registry before it started)."""
    from specreg.registry.deploy.engine_client import server_identity
    from specreg.registry.deploy.engines import llamacpp_build

    props = server_identity("llamacpp", server.url)
    digest = str(server.info.get("sha256"))[:16]
    commit = (server.info or {}).get("llama_cpp_commit") or "unknown"
    return {"version": f"llama.cpp {commit[:12]} ({llamacpp_build.PACKAGE} {llamacpp_build.VERSION} sdist)",
            "build": f"{props.get('build')}; llama-server sha256 {digest}", "model": props.get("model"),
            "slots": props.get("slots")}


@dataclass
class LocalEngine:
    """An engine started here (llama.cpp, vLLM): how to start it with and without speculation."""

    name: str  # engine_client's name: llamacpp, vllm
    label: str  # as reports say it
    serve: Callable[[bool], Any]  # speculative? -> a started server (a context manager with .url, .argv)
    identity: Callable[[Any], dict[str, Any]]  # a running server -> {"version", "build", ...}
    model: str | None  # the served model name requests carry (vLLM's metrics label), None: llama.cpp's own
    report: dict[str, Any]  # what only this engine reports (its files, its config)


def _local_llamacpp(store: Store, version: PairVersion, golden, options: EngineOptions, progress, *, actor: str):
    from specreg.registry.deploy.engines import llamacpp_build
    from specreg.registry.deploy.engines.llamacpp import spec_type
    from specreg.registry.deploy.engines.llamacpp_server import start_server
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    records = ArtifactRecords(store, actor)
    # the binary first: an unknown one is refused before minutes of conversion and decoding
    llamacpp_build.trusted_server(records)
    ggufs = llamacpp_ggufs(version, options.dtype, records)
    top_tier = max(options.tiers)

    def serve(speculative: bool):
        return start_server(ggufs["target"], ggufs["draft"] if speculative else None, records=records,
                            k=version.config.num_speculative_tokens, parallel=top_tier, threads=options.threads,
                            **({"spec_type": spec_type(version)} if speculative else {}))

    engine = LocalEngine("llamacpp", "llama.cpp", serve, llamacpp_identity, None,
                         {"gguf": {role: str(path) for role, path in ggufs.items()}})
    return _local(version, golden, options, progress, engine, store)


def _local_vllm(store: Store, version: PairVersion, golden, options: EngineOptions, progress, *, actor: str,
                export_argv: list[str]):
    """vLLM for the CPU (`make vllm`) started here on the pair's vllm export, verbatim
    (registry/deploy/engines/vllm_server.py says what this build changes), and without its
    --speculative-config."""
    from specreg.registry.deploy.engines import vllm_install, vllm_server
    from specreg.registry.governance.queries import fingerprint_changes
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    records = ArtifactRecords(store, actor)
    # a missing install is refused before our runtime's pass; its tree digest (56k files, seconds)
    # is checked against the registry before each of the two starts
    vllm_install.require_installed()
    changes = fingerprint_changes(version)
    if changes:
        raise SpecregError(f"{version.label}: the models changed since registration ({'; '.join(changes)}); "
                           f"nothing is served")

    def serve(speculative: bool):
        return vllm_server.start(export_argv, records=records, speculative=speculative, dtype=options.dtype,
                                 threads=options.threads)

    engine = LocalEngine("vllm", "vLLM", serve, vllm_server.identity, vllm_server.served_name(export_argv),
                         {"export_argv": export_argv,
                          "speculative_config": vllm_server.speculative_config(export_argv)})
    return _local(version, golden, options, progress, engine, store)


def _local(version: PairVersion, golden, options: EngineOptions, progress, engine: LocalEngine, store: Store):
    """The golden set through a server started here with and without speculation, against our
    runtime's greedy decodes of the same token ids."""
    from specreg.registry.store.validations import ValidationStore
    from specreg.runtime.methods import load_pair
    from specreg.validators.context import EngineCheckContext
    from specreg.validators.engine import baselines_of, run_engine_checks
    from specreg.validators.suite import default_near_tie_tolerance

    config = version.config
    pair = load_pair(version.target.path, version.draft.path if version.draft is not None else None, device="cpu",
                     dtype=options.dtype, target_fingerprint=version.target.fingerprint,
                     draft_fingerprint=version.draft.fingerprint if version.draft is not None else None,
                     method=config.method.value)
    prompts, skipped = golden_prompts(golden, pair.tokenizer)
    if not prompts:
        raise SpecregError(f"no prompt of golden set {golden.name} could be encoded with the target's tokenizer")
    latest_run = ValidationStore(store).latest_passed(version.name, version.version)
    # validate's own greedy decodes are drafted and counted as llama.cpp does; vLLM drafts k past
    # the budget and counts every agreed draft, so its rows are decoded on its schedule here
    ours_rows = reused_rows(latest_run, golden, prompts, options.dtype) if engine.name == "llamacpp" else None
    reused = ours_rows is not None
    if not reused:
        ours_rows = runtime_pass(pair, prompts, version, progress=progress, engine=engine.name)
    k = config.num_speculative_tokens
    counted_as = ("count at a stop token (a matching end-of-generation draft ends acceptance)"
                  if engine.name == "llamacpp" else "vLLM's count (k drafted whatever the budget has left, every "
                  "draft the target agrees with counted)")
    ours = {**baselines_of(ours_rows, k),
            "source": ("our runtime, greedy, same token ids, the engines' schedule (first token from the prefill "
                       f"alone) and {counted_as}"
                       + (f": the decodes of validation run {latest_run.id}" if reused else ": decoded here"))}
    spec, plain, commands = {}, {}, {}
    with engine.serve(True) as server:
        identity = engine.identity(server)
        commands["with_draft"] = " ".join(server.argv)
        for tier in options.tiers:
            spec[tier] = drive(engine.name, server.url, prompts, concurrency=tier, model=engine.model,
                               counters=tier == 1, progress=progress,
                               what=f"{engine.label} with the draft, concurrency {tier}", deadline_s=options.deadline_s)
    with engine.serve(False) as server:
        commands["without_draft"] = " ".join(server.argv)
        for tier in options.tiers:
            plain[tier] = drive(engine.name, server.url, prompts, concurrency=tier, model=engine.model,
                                counters=False, progress=progress,
                                what=f"{engine.label} without the draft, concurrency {tier}",
                                deadline_s=options.deadline_s)
        engine_baselines = baselines_of(spec[1].rows, k)
        tiers = tier_figures(options.tiers, spec, plain)
        # while the target-only server runs: the equivalence check asks it for its top-2
        checks = run_engine_checks(EngineCheckContext(
            engine.label, spec[1].rows, engine_baselines, ours, tiers, options.parity_tolerance,
            outputs=outputs_of(prompts, spec[1], plain[1]),
            near_tie_tolerance=options.near_tie_tolerance if options.near_tie_tolerance is not None
            else default_near_tie_tolerance(options.dtype),
            top_of=target_only_top(engine.name, server.url, engine.model, options.deadline_s),
            our_margin=runtime_margin(pair)))
    same_as_runtime = sum(1 for row, done in zip(ours_rows, spec[1].completions) if row["token_ids"] == done.token_ids)
    same_counts = sum(1 for row, theirs in zip(ours_rows, spec[1].rows)
                      if all(row[key] == theirs[key] for key in COUNTED))
    report = {"engine": engine.name, "identity": identity, "command": commands["with_draft"],
              "command_without_draft": commands["without_draft"], **engine.report,
              "options": options.to_dict(), "prompts": len(prompts), "skipped": skipped, "ours": ours,
              "per_prompt": spec[1].rows, "runtime_rows_from_validation_run": latest_run.id if reused else None,
              "engine_matches_runtime_tokens": same_as_runtime,
              "engine_matches_runtime_counts": same_counts, "throughput": tiers,
              "per_prompt_runtime": [{key: value for key, value in row.items() if key != "token_ids"}
                                     for row in ours_rows]}
    return report, engine_baselines, checks, identity


def _remote(store: Store, version: PairVersion, golden, options: EngineOptions, progress):
    """vLLM / SGLang someone else started: drive, read, compare with our recorded baselines."""
    from specreg.registry.deploy import engine_client
    from specreg.registry.store.validations import ValidationStore
    from specreg.runtime.loading import load_tokenizer
    from specreg.runtime.methods import drafting_method
    from specreg.validators.context import EngineCheckContext
    from specreg.validators.engine import baselines_of, run_engine_checks
    from specreg.validators.suite import default_near_tie_tolerance

    engine, url = options.engine, engine_client.check_url(options.engine_url)
    identity = engine_client.server_identity(engine, url, timeout=min(IDENTITY_DEADLINE_S, options.deadline_s))
    tokenizer = load_tokenizer(version.target.path, expected=version.target.fingerprint)
    prompts, skipped = golden_prompts(golden, tokenizer)
    if not prompts:
        raise SpecregError(f"no prompt of golden set {golden.name} could be encoded with the target's tokenizer")
    model = options.model_name or identity.get("model")
    # what the server drafted before this run: a method whose drafts depend on earlier requests (the
    # suffix cache) then drafts from traffic our runtime never saw
    earlier = engine_client.read_counters(engine, url, model) if engine == "vllm" else None
    # above concurrency 1 the requests overlap: vLLM's counters are read around the whole tier (its
    # responses carry no counts without --per-request-spec-decode-metrics)
    spec = {tier: drive(engine, url, prompts, concurrency=tier, model=model, counters=tier == 1 and engine == "vllm",
                        progress=progress, what=f"{engine} with speculation, concurrency {tier}",
                        deadline_s=options.deadline_s, counted=tier > 1 and engine == "vllm")
            for tier in options.tiers}
    run = ValidationStore(store).latest_passed(version.name, version.version)
    if run is None or not run.baselines:
        raise SpecregError(f"{version.label} has no passed validation on our runtime to compare {engine} with: "
                           f"run `specreg validate {version.label}` first")
    ours_rows = None
    if engine == "vllm":
        # the same token ids decoded greedily on vLLM's schedule and counted its way: the validation
        # run's baselines decode sampled records as sampled and count llama.cpp's way
        ours_rows = vllm_runtime_rows(version, prompts, options, progress)
        ours = {**baselines_of(ours_rows, version.config.num_speculative_tokens),
                "source": f"our runtime in {options.dtype}, greedy, same token ids, vLLM's schedule (first token from "
                          f"the prefill alone, k drafted to the end, every agreed draft counted)"}
        if drafting_method(version.config.method.value).session is not None and earlier is not None \
                and earlier.drafts > 0:
            ours["caveat"] = (f"the server had drafted {int(earlier.drafts)} times before this run and "
                              f"{version.config.method.value} drafts from the requests a server served before "
                              f"(vLLM's cache is the server's); our runtime decoded as a freshly started server")
    else:
        ours = {**run.baselines, "source": f"validation run {run.id} (our runtime; sampled records as their records ask)"}
    plain: dict[int, EngineRun] = {}
    reference = engine_client.check_url(options.reference_url) if options.reference_url else None
    for tier in options.tiers if reference else ():
        plain[tier] = drive(engine, reference, prompts, concurrency=tier, model=model, counters=False,
                            progress=progress, what=f"{engine} without speculation, concurrency {tier}",
                            deadline_s=options.deadline_s)
    engine_baselines = baselines_of(spec[1].rows, version.config.num_speculative_tokens)
    tiers = tier_figures(options.tiers, spec, plain)
    checks = run_engine_checks(EngineCheckContext(
        engine, spec[1].rows, engine_baselines, ours, tiers, options.parity_tolerance,
        outputs=outputs_of(prompts, spec[1], plain[1]) if reference else None,
        no_outputs=f"no --engine-reference-url: no {engine} without speculation to compare outputs with",
        near_tie_tolerance=options.near_tie_tolerance if options.near_tie_tolerance is not None
        else default_near_tie_tolerance("bfloat16"),
        top_of=target_only_top(engine, reference, model, options.deadline_s) if reference else None))
    report = {"engine": engine, "identity": identity, "url": url, "options": options.to_dict(),
              "prompts": len(prompts), "skipped": skipped, "ours": ours, "per_prompt": spec[1].rows,
              "throughput": tiers}
    if ours_rows is not None:
        report["engine_matches_runtime_tokens"] = sum(1 for row, done in zip(ours_rows, spec[1].completions)
                                                      if row["token_ids"] == done.token_ids)
        report["engine_matches_runtime_counts"] = sum(1 for row, theirs in zip(ours_rows, spec[1].rows)
                                                      if all(row[key] == theirs[key] for key in COUNTED))
        report["per_prompt_runtime"] = [{key: value for key, value in row.items()} for row in ours_rows]
    return report, engine_baselines, checks, identity


def vllm_runtime_rows(version: PairVersion, prompts, options: EngineOptions, progress) -> list[dict[str, Any]]:
    """Our runtime's rows of the golden prompts on vLLM's schedule (runtime_pass), the pair loaded
    in ``options.dtype`` from its registered folders, checked against their fingerprints."""
    from specreg.runtime.methods import load_pair

    pair = load_pair(version.target.path, version.draft.path if version.draft else None, device="cpu",
                     dtype=options.dtype, target_fingerprint=version.target.fingerprint,
                     draft_fingerprint=version.draft.fingerprint if version.draft else None,
                     method=version.config.method.value)
    return runtime_pass(pair, prompts, version, progress=progress, engine="vllm")

