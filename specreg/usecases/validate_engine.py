"""Validate in a serving engine: run the golden set through llama.cpp (started here from the
pair's files) or a running vLLM / SGLang and record the engine baseline (specreg.engine_validation
does the run). The pair's state does not move."""

from __future__ import annotations


def validate_engine(registry, ref, *, engine: str, golden: str | None = None, engine_url: str | None = None,
                    reference_url: str | None = None, model_name: str | None = None,
                    concurrency: tuple[int, ...] = (1, 4), parity_tolerance: float = 0.03,
                    near_tie_tolerance: float | None = None, dtype: str = "float32", threads: int | None = None,
                    deadline_s: float = 600.0, progress=None):
    """Validate a version in ``engine`` and record its engine baseline (see
    Registry.validate_engine) -> engine_validation.EngineOutcome."""
    from specreg.engine_validation import EngineOptions, check_options, validate_in_engine
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.usecases.validate import validation_settings

    options = check_options(EngineOptions(
        engine=engine, engine_url=engine_url, reference_url=reference_url, model_name=model_name,
        tiers=tuple(concurrency), parity_tolerance=parity_tolerance, near_tie_tolerance=near_tie_tolerance,
        dtype=dtype, threads=threads, deadline_s=deadline_s))
    version = registry.get(ref)
    golden_set = load_golden_set(validation_settings(registry, golden, 0.0)["golden_set"])
    return validate_in_engine(registry.store, version, golden_set, options, actor=registry.user, progress=progress)


def build_llama_server(registry, log=None, progress=None):
    """llama-server built (once, cached) and its sha256 recorded in this registry (audited): what
    `validate --engine llamacpp` checks the binary against before every start. Returns its path."""
    from specreg.registry.deploy.engines.llamacpp_build import build_and_record
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    return build_and_record(ArtifactRecords(registry.store, registry.user), log=log, progress=progress)
