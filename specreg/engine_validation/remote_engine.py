"""An engine validation against a server someone else started (``--engine-url``: vLLM or SGLang on
a GPU cluster, tensor parallel): the golden set through it at every concurrency tier, its
acceptance read its way, compared with our runtime's (vLLM: our greedy decodes of the same token
ids on its schedule; SGLang: the version's recorded baselines), and, with
``--engine-reference-url``, its outputs against the same engine serving the target alone."""

from __future__ import annotations

from specreg.engine_validation.request import EngineValidationRequest
from specreg.errors import SpecregError
from specreg.registry.deploy.engine_passes import (EngineRun, Progress, drive, outputs_of, target_only_top,
                                                   tier_figures)
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.store import Store

IDENTITY_DEADLINE_S = 30.0  # /version, /props: an engine answers those at once


def run_remote(store: Store, version: PairVersion, golden, request: EngineValidationRequest,
               progress: Progress | None):
    """vLLM / SGLang someone else started: drive, read, compare with our runtime -> (report,
    baselines, checks, identity)."""
    from specreg.engine_validation.runtime_rows import agreement, golden_prompts, vllm_runtime_rows
    from specreg.registry.deploy import engine_client
    from specreg.registry.store.validations import ValidationStore
    from specreg.runtime.loading import load_tokenizer
    from specreg.runtime.methods import drafting_method
    from specreg.validators.context import EngineCheckContext
    from specreg.validators.engine import baselines_of, run_engine_checks
    from specreg.validators.suite import default_near_tie_tolerance

    engine, url = request.engine, engine_client.check_url(request.engine_url)
    identity = engine_client.server_identity(engine, url, timeout=min(IDENTITY_DEADLINE_S, request.deadline_s))
    tokenizer = load_tokenizer(version.target.path, expected=version.target.fingerprint)
    prompts, skipped = golden_prompts(golden, tokenizer)
    if not prompts:
        raise SpecregError(f"no prompt of golden set {golden.name} could be encoded with the target's tokenizer")
    model = request.model_name or identity.get("model")
    # what the server drafted before this run: a method whose drafts depend on earlier requests (the
    # suffix cache) then drafts from traffic our runtime never saw
    earlier = engine_client.read_counters(engine, url, model) if engine == "vllm" else None
    # above concurrency 1 the requests overlap: vLLM's counters are read around the whole tier (its
    # responses carry no counts without --per-request-spec-decode-metrics)
    spec = {tier: drive(engine, url, prompts, concurrency=tier, model=model, counters=tier == 1 and engine == "vllm",
                        progress=progress, what=f"{engine} with speculation, concurrency {tier}",
                        deadline_s=request.deadline_s, counted=tier > 1 and engine == "vllm")
            for tier in request.tiers}
    run = ValidationStore(store).latest_passed(version.name, version.version)
    if run is None or not run.baselines:
        raise SpecregError(f"{version.label} has no passed validation on our runtime to compare {engine} with: "
                           f"run `specreg validate {version.label}` first")
    ours_rows = None
    if engine == "vllm":
        # the same token ids decoded greedily on vLLM's schedule and counted its way: the validation
        # run's baselines decode sampled records as sampled and count llama.cpp's way
        ours_rows = vllm_runtime_rows(version, prompts, request.dtype, progress)
        ours = {**baselines_of(ours_rows, version.config.num_speculative_tokens),
                "source": f"our runtime in {request.dtype}, greedy, same token ids, vLLM's schedule (first token from "
                          f"the prefill alone, k drafted to the end, every agreed draft counted)"}
        if drafting_method(version.config.method.value).session is not None and earlier is not None \
                and earlier.drafts > 0:
            ours["caveat"] = (f"the server had drafted {int(earlier.drafts)} times before this run and "
                              f"{version.config.method.value} drafts from the requests a server served before "
                              f"(vLLM's cache is the server's); our runtime decoded as a freshly started server")
    else:
        ours = {**run.baselines, "source": f"validation run {run.id} (our runtime; sampled records as their records ask)"}
    plain: dict[int, EngineRun] = {}
    reference = engine_client.check_url(request.reference_url) if request.reference_url else None
    for tier in request.tiers if reference else ():
        plain[tier] = drive(engine, reference, prompts, concurrency=tier, model=model, counters=False,
                            progress=progress, what=f"{engine} without speculation, concurrency {tier}",
                            deadline_s=request.deadline_s)
    engine_baselines = baselines_of(spec[1].rows, version.config.num_speculative_tokens)
    tiers = tier_figures(request.tiers, spec, plain)
    checks = run_engine_checks(EngineCheckContext(
        engine, spec[1].rows, engine_baselines, ours, tiers, request.parity_tolerance,
        outputs=outputs_of(prompts, spec[1], plain[1]) if reference else None,
        no_outputs=f"no --engine-reference-url: no {engine} without speculation to compare outputs with",
        near_tie_tolerance=request.near_tie_tolerance if request.near_tie_tolerance is not None
        else default_near_tie_tolerance("bfloat16"),
        top_of=target_only_top(engine, reference, model, request.deadline_s) if reference else None))
    report = {"engine": engine, "identity": identity, "url": url, "options": request.to_dict(),
              "prompts": len(prompts), "skipped": skipped, "ours": ours, "per_prompt": spec[1].rows,
              "throughput": tiers}
    if ours_rows is not None:
        report.update(agreement(ours_rows, spec[1]))
        report["per_prompt_runtime"] = [{key: value for key, value in row.items()} for row in ours_rows]
    return report, engine_baselines, checks, identity
