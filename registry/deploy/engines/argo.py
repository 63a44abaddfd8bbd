"""Argo Rollouts: an AnalysisTemplate (argo-analysis.yaml, argoproj.io/v1alpha1) that holds a canary
to the pair's recorded acceptance floors. Its Prometheus queries are the alert rules' own
(``alert_expressions`` of the engine's module: vLLM's and llama.cpp's counters, SGLang's gauges),
narrowed to the canary's pods, and its conditions compare them with the floors the alert rules
fire below (exports.py ``resolve_export`` thresholds: specreg.core.baselines.drift_floor).

Checked against Argo Rollouts 1.9's released AnalysisTemplate CRD schema (templates/engines/
argo-rollouts-1.9.json, scripts/argo_schema.py) and the controller's metric rules
(utils/analysis/factory.go ValidateMetric), and with promtool on canary series (tests/exports/
test_export_argo.py)."""

from __future__ import annotations

import re
from typing import Any

from specreg.errors import UsageError
from specreg.registry.deploy.engines import llamacpp, prometheus, sglang, vllm
from specreg.registry.deploy.engines.common import (Export, no_head_layout, no_model_files, nothing_read_back,
                                                    registered_sources)
from specreg.registry.store.entities import PairVersion

ENGINE = "argo-rollouts"
VERSIONS = ("1.9",)
SCHEMA = "argo-rollouts-1.9.json"
FILES = ("argo-analysis.yaml",)
WRITES_MODELS = False
WRITES_LOCK = True
# what it needs nothing of its own for: the shared defaults (engines.EngineModule)
sources, head_layout, write_models = registered_sources, no_head_layout, no_model_files
read_back = nothing_read_back

# the engines whose metrics an analysis reads; llama-server's series carry no model_name label
ANALYSIS_ENGINES = {"vllm": vllm, "sglang": sglang, "llamacpp": llamacpp}
LABELLED_BY_MODEL = ("vllm", "sglang")
CANARY_ARG = "canary-hash"
OPTIONS: dict[str, Any] = {
    "analysis_engine": "vllm",  # whose metrics the canary serves: vllm, sglang or llamacpp
    "prometheus_address": "http://prometheus.monitoring.svc:9090",
    # the label Prometheus gives the canary pods' rollouts-pod-template-hash (a relabel rule),
    # matched to the Rollout's {{args.canary-hash}} (podTemplateHashValue: Latest)
    "canary_label": "rollouts_pod_template_hash",
    "interval": "5m",  # between measurements (a Go duration: Argo parses it with time.ParseDuration)
    "count": 4,  # measurements per analysis
    "failure_limit": 1,  # measurements below the floor tolerated; one more fails the canary
    "inconclusive_limit": 2,  # measurements without traffic (NaN) tolerated before a person decides
}
METRIC_NAMES = {"acceptance_rate": "acceptance-rate", "mean_acceptance_length": "mean-acceptance-length"}
GO_DURATION = re.compile(r"([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+")
# each used with fullmatch: "$" also matches before a final newline, which would reach the YAML
PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def check_options(opts: dict[str, Any]) -> None:
    if opts["analysis_engine"] not in ANALYSIS_ENGINES:
        raise UsageError(f"export option analysis_engine={opts['analysis_engine']!r} must be one of "
                         f"{', '.join(ANALYSIS_ENGINES)}")
    if not GO_DURATION.fullmatch(str(opts["interval"])):
        raise UsageError(f"export option interval={opts['interval']!r} is not a duration Argo Rollouts reads "
                         "(e.g. 5m, 90s, 1h30m)")
    if not PROMETHEUS_LABEL.fullmatch(str(opts["canary_label"])):
        raise UsageError(f"export option canary_label={opts['canary_label']!r} is not a Prometheus label name")
    if not re.fullmatch(r"https?://\S+", str(opts["prometheus_address"])):
        raise UsageError(f"export option prometheus_address={opts['prometheus_address']!r} must be an http(s) URL")
    for key in ("count", "failure_limit", "inconclusive_limit"):
        try:
            opts[key] = int(opts[key])
        except (TypeError, ValueError):
            raise UsageError(f"export option {key}={opts[key]!r} must be a whole number") from None
    # the controller's own rules (argo-rollouts utils/analysis/factory.go ValidateMetric)
    if opts["count"] < 1 or opts["failure_limit"] < 0 or opts["inconclusive_limit"] < 0:
        raise UsageError("export options count >= 1, failure_limit >= 0 and inconclusive_limit >= 0")
    if opts["count"] < max(opts["failure_limit"], opts["inconclusive_limit"]):
        raise UsageError(f"export option count={opts['count']} must be at least failure_limit="
                         f"{opts['failure_limit']} and inconclusive_limit={opts['inconclusive_limit']}")


def baseline_engine(opts: dict[str, Any]) -> str | None:
    """The engine whose metrics the canary's analysis reads."""
    return opts["analysis_engine"]


def refusal(pair_version: PairVersion) -> str | None:
    return None  # the analysis loads no model: any exported pair kind has one


def check(pair_version: PairVersion, baselines: dict[str, Any] | None, opts: dict[str, Any]) -> None:
    prometheus.check(pair_version, baselines, opts)  # the same refusal as the alert rules: no floor, no rule


def context(export: Export) -> dict[str, Any]:
    if not export.thresholds:
        return {"analysis": None}
    return {"analysis": analysis(export.pair_version, export.overall, export.thresholds, export.served_name,
                                 export.opts)}


def canary_selector(served_name: str, opts: dict[str, Any]) -> str:
    """The PromQL selector of the canary's series: its pods (the Rollout fills the hash in) and,
    where the engine labels its series by model, the served name (as the alert rules select)."""
    matchers = [f'{opts["canary_label"]}="{{{{args.{CANARY_ARG}}}}}"']
    if opts["analysis_engine"] in LABELLED_BY_MODEL:
        matchers.insert(0, "model_name=" + prometheus.promql_string(served_name))
    return "{" + ",".join(matchers) + "}"


def analysis(pair_version: PairVersion, overall: dict[str, Any], thresholds: dict[str, float], served_name: str,
             opts: dict[str, Any]) -> dict[str, Any]:
    """The AnalysisTemplate's values: its name, the argument the Rollout fills in, and one metric
    per floor. A measurement passes at or above the floor, fails below it, and is inconclusive
    when the canary served no drafts (the ratio is NaN: neither condition holds)."""
    from specreg.registry.deploy.engines.k8s import dns_label

    engine = opts["analysis_engine"]
    expressions = ANALYSIS_ENGINES[engine].alert_expressions(canary_selector(served_name, opts), opts["rate_window"])
    metrics = []
    for figure, floor in thresholds.items():
        metrics.append({
            "name": METRIC_NAMES[figure],
            "interval": str(opts["interval"]),
            "count": opts["count"],
            "failureLimit": opts["failure_limit"],
            "inconclusiveLimit": opts["inconclusive_limit"],
            "successCondition": f"result[0] >= {floor}",
            "failureCondition": f"result[0] < {floor}",
            "address": str(opts["prometheus_address"]),
            "query": expressions[figure],
            "baseline": overall[figure],
            "floor": floor,
        })
    return {
        "name": dns_label(f"{pair_version.name}-v{pair_version.version}-acceptance", limit=253),
        "namespace": opts.get("namespace"),
        "engine": engine,
        "canary_arg": CANARY_ARG,
        "labels": {"app.kubernetes.io/part-of": "specreg", "specreg.io/version": str(pair_version.version)},
        "annotations": {"specreg.io/pair": pair_version.label, "specreg.io/binding-sha256": pair_version.binding_sha256,
                        "specreg.io/engine": engine, "specreg.io/tolerance": str(opts["tolerance"])},
        "metrics": metrics,
    }
