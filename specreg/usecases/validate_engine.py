"""Validate in a serving engine: run the golden set through llama.cpp or vLLM (started here from
the pair's files) or a running vLLM / SGLang and record the engine baseline (specreg.engine_validation
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

    options = check_options(EngineOptions(
        engine=engine, engine_url=engine_url, reference_url=reference_url, model_name=model_name,
        tiers=tuple(concurrency), parity_tolerance=parity_tolerance, near_tie_tolerance=near_tie_tolerance,
        dtype=dtype, threads=threads, deadline_s=deadline_s))
    version = registry.get(ref)
    export_argv = local_vllm_argv(registry, version) if engine == "vllm" and not engine_url else None
    # resolved once, here: the set named, else the policy's (its validation environment's)
    golden_set = load_golden_set(golden if golden is not None else
                                 registry.policy().validation_environment().golden_set)
    return validate_in_engine(registry.store, version, golden_set, options, actor=registry.user, progress=progress,
                              export_argv=export_argv)


# the registered folders (a reference may be a hub id, and nothing is fetched from a hub) on loopback
LOCAL_VLLM_OPTIONS = {"model_source": "path", "host": "127.0.0.1"}


def local_vllm_argv(registry, version) -> list[str]:
    """The command `specreg export --format vllm` writes for ``version`` (its flags and speculative
    config), planned as an export is, so a pair the vLLM export refuses (Medusa, MTP without MTP
    layers, ...) is refused here for the same reason, and one the CPU build cannot run
    (vllm_server.cpu_refusal) before anything starts. Planned without baselines: an export
    carrying an earlier engine baseline writes the per-batch schedule it measured, which switches
    speculation off where that run found it slower, and the engine would then be measured without
    the speculation being validated; the registered configuration is what is measured."""
    from specreg.errors import UsageError
    from specreg.registry.deploy.engines.vllm_server import cpu_refusal, export_argv
    from specreg.registry.deploy.exports import plan_export

    try:
        plan = plan_export(version, None, "vllm", approved=False, force=True, options=LOCAL_VLLM_OPTIONS)
    except UsageError as exc:
        raise UsageError(f"validate --engine vllm: {exc}") from None
    why = cpu_refusal(version)
    if why:
        raise UsageError(f"validate --engine vllm: {version.label} cannot run on vLLM for the CPU: {why}")
    return export_argv(plan)


def build_llama_server(registry, log=None, progress=None):
    """llama-server built (once, cached) and its sha256 recorded in this registry (audited): what
    `validate --engine llamacpp` checks the binary against before every start. Returns its path."""
    from specreg.registry.deploy.engines.llamacpp_build import build_and_record
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    return build_and_record(ArtifactRecords(registry.store, registry.user), log=log, progress=progress)


def install_vllm(registry, log=None, cached: bool = False) -> dict:
    """vLLM for the CPU installed (once, cached) in its own venv and that venv's tree digest recorded
    in this registry (audited): what `validate --engine vllm` without --engine-url checks before
    every start; ``cached``: only an install the cache holds. Returns the install stamp
    (registry.deploy.engines.vllm_install)."""
    from specreg.registry.deploy.engines.vllm_install import install_and_record
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    return install_and_record(ArtifactRecords(registry.store, registry.user), log=log, cached=cached)
