"""One engine validation, start to record: the engine started here (local_engines.py) or reached
at a URL (remote_engine.py) runs the golden set, the engine checks judge it beside our runtime
(validators/engine.py), and the outcome is stored as the pair's engine baseline, stamped with the
engine's name, version and build; its status is governance's rule
(registry/governance/engine_baseline_standing.baseline_status). Nothing is stored when the run is
interrupted."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from specreg.core.types import FAIL
from specreg.engine_validation.request import EngineValidationRequest
from specreg.errors import UsageError
from specreg.registry.deploy.engine_passes import Progress
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.store import Store


@dataclass
class EngineOutcome:
    baseline: Any  # registry.store.engine_baselines.EngineBaseline
    checks: tuple
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.baseline.status == "passed"  # an unaccepted one is no baseline yet


def validate_in_engine(store: Store, version: PairVersion, golden, request: EngineValidationRequest, *, actor: str,
                       progress: Progress | None = None, export_argv: list[str] | None = None) -> EngineOutcome:
    """Run ``version`` through the engine, compare with our runtime, store the engine baseline.
    ``export_argv``: the vllm export's command (vllm_server.export_argv), what a local vLLM runs.

    progress(stage, done, total, record_id) after each prompt of each pass. SIGINT/SIGTERM raise
    ValidationInterrupted after every server started here was stopped; nothing is stored then."""
    from specreg.engine_validation.local_engines import local_llamacpp, local_vllm
    from specreg.engine_validation.remote_engine import run_remote
    from specreg.registry.deploy.engines.common import measured_schedule
    from specreg.registry.governance.engine_baseline_standing import baseline_status
    from specreg.registry.store.engine_baselines import EngineBaselineStore
    from specreg.registry.store.validations import ValidationStore
    from specreg.runtime_validation import interrupt_on_signals

    started = time.time()
    with interrupt_on_signals():
        if request.engine == "llamacpp":
            report, baselines, checks, identity = local_llamacpp(store, version, golden, request, progress,
                                                                 actor=actor)
        elif request.engine == "vllm" and request.starts_server:
            if export_argv is None:
                raise UsageError("--engine vllm without --engine-url starts the pair's vllm export: no export "
                                 "command was planned")
            report, baselines, checks, identity = local_vllm(store, version, golden, request, progress,
                                                             actor=actor, export_argv=export_argv)
        else:
            report, baselines, checks, identity = run_remote(store, version, golden, request, progress)
    report["seconds"] = round(time.time() - started, 1)
    report["checks"] = [check.to_dict() for check in checks]
    # the per-batch schedule the measured tiers support: speculation off where a tier was slower
    report["speculation_schedule"] = measured_schedule(report.get("throughput"), version.config.num_speculative_tokens)
    failed = [check.name for check in checks if check.status == FAIL]
    report["reason"] = f"{', '.join(failed)} failed" if failed else None
    status, report["acceptance_reason"] = baseline_status(checks, request.parity_tolerance)
    run = ValidationStore(store).latest_passed(version.name, version.version)
    baseline = EngineBaselineStore(store).record(
        version, engine=request.engine, engine_version=identity["version"] or "unknown",
        engine_build=identity["build"] or "unknown", source=request.engine_url or "local", status=status,
        golden_set=golden.name, golden_sha256=golden.content_sha256,
        validation_run_id=run.id if run is not None else None, baselines=baselines, report=report, actor=actor)
    return EngineOutcome(baseline, tuple(checks), report)
