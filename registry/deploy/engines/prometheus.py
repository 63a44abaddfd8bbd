"""Prometheus alerting rules (prometheus-rules.yaml) on the engines' own speculative-decoding
metrics, firing below baseline * (1 - tolerance). Each engine module with metrics gives its PromQL
(``alert_expressions``); this module lays them out as rules."""

from __future__ import annotations

import json
import re
from typing import Any

from specreg.errors import SpecregError, UsageError
from specreg.registry.deploy.engines import sglang, vllm
from specreg.registry.deploy.engines.common import (Export, no_head_layout, no_model_files, nothing_read_back,
                                                    registered_sources)
from specreg.registry.store.entities import PairVersion

RULE_ENGINES = {"vllm": vllm, "sglang": sglang}
ENGINE = "vllm/sglang"
VERSIONS = (f"{vllm.VERSIONS[0]}/{sglang.VERSIONS[0]}",)
SCHEMA = None
FILES = ("prometheus-rules.yaml",)
WRITES_MODELS = False
WRITES_LOCK = False  # the rules load no model: nothing for a lock to bind
# what it needs nothing of its own for: the shared defaults (engines.EngineModule)
sources, head_layout, write_models = registered_sources, no_head_layout, no_model_files
read_back = nothing_read_back

OPTIONS: dict[str, Any] = {
    "for": "10m",  # how long a Prometheus alert condition must hold
    "rate_window": "5m",
    "rules_engine": "all",  # prometheus-rules for "vllm", "sglang" or "all"
}
PROMETHEUS_DURATION = re.compile(r"([0-9]+(ms|s|m|h|d|w|y))+")
TAU_PART = " of its accepted part, tau - 1"
ALERT_NAMES = {"acceptance_rate": "SpecDecodeAcceptanceRateBelowBaseline",
               "mean_acceptance_length": "SpecDecodeAcceptanceLengthBelowBaseline"}


def check_options(opts: dict[str, Any]) -> None:
    if opts["rules_engine"] not in (*RULE_ENGINES, "all"):
        raise UsageError(f"export option rules_engine={opts['rules_engine']!r} must be vllm, sglang or all")
    for key in ("for", "rate_window"):
        if not PROMETHEUS_DURATION.fullmatch(str(opts[key])):  # fullmatch: "$" lets "10m\n" through
            raise UsageError(f"export option {key}={opts[key]!r} is not a Prometheus duration (e.g. 10m)")


def baseline_engine(opts: dict[str, Any]) -> str | None:
    """The engine whose measured baseline the rules compare with: the one rules_engine names; for
    rules on every engine, the validation's own figures."""
    return opts["rules_engine"] if opts["rules_engine"] in RULE_ENGINES else None


def refusal(pair_version: PairVersion) -> str | None:
    return None  # the rules load no model: any exported pair kind has them


def check(pair_version: PairVersion, baselines: dict[str, Any] | None, opts: dict[str, Any]) -> None:
    if not (baselines and baselines.get("overall")):
        raise SpecregError(
            f"{pair_version.label} has no recorded overall baseline: nothing to alert against "
            "(validate the version first)"
        )


def context(export: Export) -> dict[str, Any]:
    if not export.thresholds:
        return {"alert_rules": []}
    return {"alert_rules": alert_rules(export.pair_version, export.overall, export.thresholds, export.served_name,
                                       export.opts)}


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal (Go escapes; JSON's are a subset)."""
    return json.dumps(value)


def alert_rules(pair_version: PairVersion, overall: dict[str, Any], thresholds: dict[str, float],
                served_name: str, opts: dict[str, Any]) -> list[dict[str, Any]]:
    """Alerting rules on the engines' own metrics, firing below the thresholds (exports.py:
    specreg.core.baselines.drift_floor of baselines counted as the engines count them)."""
    selector = "{model_name=" + promql_string(served_name) + "}"
    engines = tuple(RULE_ENGINES) if opts["rules_engine"] == "all" else (opts["rules_engine"],)
    rules = []
    for engine in engines:
        expressions = RULE_ENGINES[engine].alert_expressions(selector, opts["rate_window"])
        for metric, floor in thresholds.items():
            rules.append({
                "alert": ALERT_NAMES[metric],
                "expr": f"({expressions[metric]}) < {floor}",
                "for": opts["for"],
                "labels": {"severity": "warning", "engine": engine, "specreg_pair": pair_version.name,
                           "specreg_version": str(pair_version.version)},
                "annotations": {
                    "summary": f"{pair_version.label}: live {metric} below its validated baseline on {engine}",
                    "description": (
                        f"{metric} of {served_name} has stayed below {floor} (baseline {overall[metric]}"
                        f" minus {opts['tolerance']:.0%}{TAU_PART if metric == 'mean_acceptance_length' else ''})"
                        f" for {opts['for']}; binding {pair_version.binding_sha256}"
                    ),
                    "baseline": str(overall[metric]),
                    "floor": str(floor),
                },
            })
    return rules
