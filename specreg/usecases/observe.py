"""Observe: scrape a serving engine's metrics twice, compare live acceptance with the version's
baselines in that engine's terms and store the observation (registry/deploy/live_metrics.py)."""

from __future__ import annotations

from specreg.registry.store.entities import Observation
from specreg.usecases.inputs import pair_ref, record_number

DEFAULT_TOLERANCE = 0.1  # without an environment whose policy says otherwise


def observe(registry, ref, metrics_url: str, *, engine: str = "vllm", interval: float = 30.0,
            model_name: str | None = None, tolerance: float | None = None, policy_path: str | None = None,
            sleep=None, deadline_s: float | None = None) -> dict:
    """The observation with "verdict" (ok|drift|no-data) and "exit_code" (0|100|1) (see
    Registry.observe)."""
    import time

    from specreg.registry.deploy.live_metrics import SCRAPE_DEADLINE_S, compare_with_baseline, observe as scrape
    from specreg.usecases.engine_baselines import in_engine_terms
    from specreg.usecases.validate import baselines as recorded

    ref = pair_ref(ref)
    version = registry.get(ref)
    policy = registry.policy()  # one snapshot: the tolerance (unless a file's) and which engine baseline counts
    if tolerance is None:
        governing = registry.policy(policy_path) if policy_path is not None else policy
        tolerance = governing.environment(ref.environment).acceptance_tolerance if ref.environment else DEFAULT_TOLERANCE
    baselines = in_engine_terms(registry, version, engine, recorded(registry, version.label), policy)
    live = scrape(metrics_url, engine=engine, interval=interval, model_name=model_name,
                  sleep=sleep or time.sleep, deadline_s=SCRAPE_DEADLINE_S if deadline_s is None else deadline_s)
    verdict = compare_with_baseline(live, baselines, tolerance)
    stored = registry.store.add_observation(version.name, version.version, environment=ref.environment,
                                            engine=engine, url=metrics_url, figures={**live, **verdict},
                                            verdict=verdict["verdict"])
    return {"pair": version.label, **stored.to_dict(), **verdict, "live": live}


def observations(registry, ref, limit: int = 5) -> list[Observation]:
    """The newest ``limit`` observations of a version, newest first."""
    record_number("limit", limit)
    version = registry.get(ref)
    return registry.store.observations(version.name, version.version, limit)
