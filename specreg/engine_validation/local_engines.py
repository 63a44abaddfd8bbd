"""Engines started here for an engine validation: llama.cpp (``llama-server`` from the pair's
``llamacpp`` export: its GGUF files, with the draft and the same command without it) and vLLM for
the CPU (`make vllm`: the pair's ``vllm`` export verbatim, with and without its speculative
config; registry/deploy/engines/vllm_server.py). Each server is stopped when its pass ends (a
vLLM by its process group), also on Ctrl-C, SIGTERM and errors; two vLLM servers that fit in
memory start together and stop together. The golden set goes through each server at every
concurrency tier, against our runtime's greedy decodes of the same token ids."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable

from specreg.engine_validation.request import EngineValidationRequest
from specreg.errors import EngineRefusal, SpecregError
from specreg.registry.deploy.engine_passes import Progress, drive, outputs_of, target_only_top, tier_figures
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.store import Store

GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16"}


@dataclass
class LocalEngine:
    """An engine started here (llama.cpp, vLLM): how to start it with and without speculation."""

    name: str  # engine_client's name: llamacpp, vllm
    label: str  # as reports say it
    serve: Callable[[bool], Any]  # speculative? -> a started server (a context manager with .url, .argv)
    identity: Callable[[Any], dict[str, Any]]  # a running server -> {"version", "build", ...}
    model: str | None  # the served model name requests carry (vLLM's metrics label), None: llama.cpp's own
    report: dict[str, Any]  # what only this engine reports (its files, its config)
    # both servers started together -> a context manager of (with the draft, without it), or None
    # where they are started one after the other (serve)
    serve_both: Callable[[], Any] | None = None


def llamacpp_ggufs(version: PairVersion, dtype: str, records) -> dict[str, Any]:
    """The GGUF files llama-server loads for ``version``: converted by the llamacpp export's own
    converter (llama.cpp's convert_hf_to_gguf.py) from the registered folders, after checking they
    still match their fingerprints, through llama.cpp's conversion cache (the export's too)."""
    from specreg.registry.deploy.engines import llamacpp
    from specreg.registry.governance.queries import fingerprint_changes

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


def local_llamacpp(store: Store, version: PairVersion, golden, request: EngineValidationRequest,
                   progress: Progress | None, *, actor: str):
    """llama-server started here on the pair's GGUF files -> (report, baselines, checks, identity)."""
    from specreg.registry.deploy.engines import llamacpp_build
    from specreg.registry.deploy.engines.llamacpp import refusal, spec_type
    from specreg.registry.deploy.engines.llamacpp_server import start_server
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    why = refusal(version)
    if why:  # as the llamacpp export refuses it, before anything is checked, converted or started
        raise EngineRefusal(f"validate --engine llamacpp: {why}")
    records = ArtifactRecords(store, actor)
    # the binary first: an unknown one is refused before minutes of conversion and decoding
    llamacpp_build.trusted_server(records)
    ggufs = llamacpp_ggufs(version, request.dtype, records)
    top_tier = max(request.tiers)

    def serve(speculative: bool):
        return start_server(ggufs["target"], ggufs["draft"] if speculative else None, records=records,
                            k=version.config.num_speculative_tokens, parallel=top_tier, threads=request.threads,
                            **({"spec_type": spec_type(version)} if speculative else {}))

    engine = LocalEngine("llamacpp", "llama.cpp", serve, llamacpp_identity, None,
                         {"gguf": {role: str(path) for role, path in ggufs.items()}})
    return run_local(version, golden, request, progress, engine, store)


def local_vllm(store: Store, version: PairVersion, golden, request: EngineValidationRequest,
               progress: Progress | None, *, actor: str, export_argv: list[str]):
    """vLLM for the CPU (`make vllm`) started here on the pair's vllm export, verbatim
    (registry/deploy/engines/vllm_server.py says what this build changes), and without its
    --speculative-config -> (report, baselines, checks, identity)."""
    from specreg.registry.deploy.engines import vllm_install, vllm_server
    from specreg.registry.governance.queries import fingerprint_changes
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    records = ArtifactRecords(store, actor)
    # a missing install is refused before our runtime's pass; its tree digest (56k files, seconds)
    # is checked against the registry before the servers start
    vllm_install.require_installed()
    changes = fingerprint_changes(version)
    if changes:
        raise SpecregError(f"{version.label}: the models changed since registration ({'; '.join(changes)}); "
                           f"nothing is served")

    def serve(speculative: bool):
        return vllm_server.start(export_argv, records=records, speculative=speculative, dtype=request.dtype,
                                 threads=request.threads)

    def serve_both():
        folders = [version.target.path] + ([version.draft.path] if version.draft is not None else [])
        if not vllm_server.fit_side_by_side(folders):
            return None
        return vllm_server.start_both(export_argv, records=records, dtype=request.dtype, threads=request.threads)

    engine = LocalEngine("vllm", "vLLM", serve, vllm_server.identity, vllm_server.served_name(export_argv),
                         {"export_argv": export_argv,
                          "speculative_config": vllm_server.speculative_config(export_argv)}, serve_both)
    return run_local(version, golden, request, progress, engine, store)


def run_local(version: PairVersion, golden, request: EngineValidationRequest, progress: Progress | None,
              engine: LocalEngine, store: Store):
    """The golden set through a server started here with and without speculation, against our
    runtime's greedy decodes of the same token ids -> (report, baselines, checks, identity)."""
    from specreg.engine_validation.runtime_rows import (agreement, golden_prompts, reused_rows, runtime_margin,
                                                        runtime_pass)
    from specreg.registry.store.validations import ValidationStore
    from specreg.runtime.methods import load_pair
    from specreg.validators.context import EngineCheckContext
    from specreg.validators.engine import baselines_of, run_engine_checks
    from specreg.validators.suite import default_near_tie_tolerance

    config = version.config
    pair = load_pair(version.target.path, version.draft.path if version.draft is not None else None, device="cpu",
                     dtype=request.dtype, target_fingerprint=version.target.fingerprint,
                     draft_fingerprint=version.draft.fingerprint if version.draft is not None else None,
                     method=config.method.value)
    prompts, skipped = golden_prompts(golden, pair.tokenizer)
    if not prompts:
        raise SpecregError(f"no prompt of golden set {golden.name} could be encoded with the target's tokenizer")
    latest_run = ValidationStore(store).latest_passed(version.name, version.version)
    # validate's own greedy decodes are drafted and counted as llama.cpp does; vLLM drafts k past
    # the budget and counts every agreed draft, so its rows are decoded on its schedule here
    ours_rows = reused_rows(latest_run, golden, prompts, request.dtype) if engine.name == "llamacpp" else None
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
    together = engine.serve_both() if engine.serve_both is not None else None
    with ExitStack() as servers:
        with_draft, without_draft = servers.enter_context(together) if together is not None else (None, None)
        with run_pass(with_draft, engine, True) as server:
            identity = engine.identity(server)
            commands["with_draft"] = " ".join(server.argv)
            for tier in request.tiers:
                spec[tier] = drive(engine.name, server.url, prompts, concurrency=tier, model=engine.model,
                                   counters=tier == 1, progress=progress,
                                   what=f"{engine.label} with the draft, concurrency {tier}",
                                   deadline_s=request.deadline_s)
        with run_pass(without_draft, engine, False) as server:
            commands["without_draft"] = " ".join(server.argv)
            for tier in request.tiers:
                plain[tier] = drive(engine.name, server.url, prompts, concurrency=tier, model=engine.model,
                                    counters=False, progress=progress,
                                    what=f"{engine.label} without the draft, concurrency {tier}",
                                    deadline_s=request.deadline_s)
            engine_baselines = baselines_of(spec[1].rows, k)
            tiers = tier_figures(request.tiers, spec, plain)
            # while the target-only server runs: the equivalence check asks it for its top-2
            checks = run_engine_checks(EngineCheckContext(
                engine.label, spec[1].rows, engine_baselines, ours, tiers, request.parity_tolerance,
                outputs=outputs_of(prompts, spec[1], plain[1]),
                near_tie_tolerance=request.near_tie_tolerance if request.near_tie_tolerance is not None
                else default_near_tie_tolerance(request.dtype),
                top_of=target_only_top(engine.name, server.url, engine.model, request.deadline_s),
                our_margin=runtime_margin(pair)))
    report = {"engine": engine.name, "identity": identity, "command": commands["with_draft"],
              "command_without_draft": commands["without_draft"], **engine.report,
              "options": request.to_dict(), "prompts": len(prompts), "skipped": skipped, "ours": ours,
              "per_prompt": spec[1].rows, "runtime_rows_from_validation_run": latest_run.id if reused else None,
              **agreement(ours_rows, spec[1]), "throughput": tiers,
              "per_prompt_runtime": [{key: value for key, value in row.items() if key != "token_ids"}
                                     for row in ours_rows]}
    return report, engine_baselines, checks, identity


def run_pass(started, engine: LocalEngine, speculative: bool):
    """The server a pass runs on, stopped when the pass ends: one started with the other, else its
    own, started now."""
    return started if started is not None else engine.serve(speculative)
