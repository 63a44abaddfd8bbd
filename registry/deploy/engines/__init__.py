"""One module per serving engine (or deployment format), listed in one table, ``FORMATS``.

Each module owns, for its engine: the engine and the versions it targets (``ENGINE``,
``VERSIONS``), its schema file in templates/engines/ (``SCHEMA``, or None), the files it writes
(``FILES``, each rendered from templates/exports/<name>.j2), its own export options with their
defaults (``OPTIONS``, checked by an optional ``check_options(opts)``), why it cannot serve a pair
(``refusal(pair_version)``: one line, or None), any further precondition (optional
``check(pair_version, baselines, opts)``), where its engine finds the models (optional
``sources(pair_version, opts)``), the translation of the pair into the engine's terms as template
keys (``context(export)``), and, where the engine has Prometheus metrics, their PromQL
(``alert_expressions``) and reader (``read_metrics``, used by observe).

A new engine: its module here and one line in ``FORMATS``; exports.py and the templates' common
context need no change. Every engine's ``context`` runs for every export, so a user template can
combine them; a ``context`` therefore returns None values, not errors, for pairs it refuses.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# export format -> its module in this package, imported on first use (the CLI lists the formats
# without importing any engine module)
FORMATS: dict[str, str] = {
    "vllm": "vllm",
    "sglang": "sglang",
    "trtllm": "trtllm",
    "tgi": "tgi",
    "k8s-vllm": "k8s",
    "prometheus-rules": "prometheus",
    "llamacpp": "llamacpp",
    "argo-analysis": "argo",
}


def format_modules() -> dict[str, ModuleType]:
    """Export format -> its engine module, in FORMATS order."""
    return {fmt: importlib.import_module(f"{__name__}.{name}") for fmt, name in FORMATS.items()}


def engine_modules() -> dict[str, ModuleType]:
    """Engine name -> the module that targets it first (a format such as k8s-vllm reuses vllm)."""
    modules: dict[str, ModuleType] = {}
    for module in format_modules().values():
        if module.SCHEMA is not None:
            modules.setdefault(module.ENGINE, module)
    return modules
