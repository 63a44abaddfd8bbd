"""One module per serving engine (or deployment format), listed in one table, ``FORMATS``.

Every module satisfies ``EngineModule`` (tests/test_architecture.py holds each to it): the engine and
the versions it targets, its schema file in templates/engines/, the files it writes (each rendered
from templates/exports/<name>.j2), whether the pair lock is written beside them, its own export
options, the engine whose measured baseline its export carries, why it cannot serve a pair
(``refusal``; one that depends on the export's baselines or options is its ``check``'s, raised as
the same EngineRefusal), any further precondition, where its engine finds the models, a head layout
it loads, the model files it makes, the translation of the pair into the engine's terms as template
keys, and what the engine reads back from the written files (``read_back``,
registry/deploy/read_back.py). What most engines do not need has one shared default
in common.py, which a module names instead of writing its own. Where the engine has Prometheus
metrics, the module also has their PromQL (``alert_expressions``) and reader (``read_metrics``, used
by observe); those are reached through the tables that list them.

A new engine: its module here and one line in ``FORMATS``; exports.py, the export use case, the
CLI's list of formats and the templates' common context need no change. Every engine's ``context``
runs for every export, so a user template can combine them; a ``context`` therefore returns None
values, not errors, for pairs it refuses.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class EngineModule(Protocol):
    """What exports.py and the export use case read of an engine module, and nothing else."""

    ENGINE: str  # the engine's name, as its schema file and the pair lock name it
    VERSIONS: tuple[str, ...]  # the engine versions written for; option engine_version picks one
    SCHEMA: str | None  # its schema file in templates/engines/ (None: no engine of its own)
    FILES: tuple[str, ...]  # the files it writes
    OPTIONS: dict[str, Any]  # its own export options with their defaults
    WRITES_MODELS: bool  # whether the export makes the model files the engine loads (needs -o DIR)
    WRITES_LOCK: bool  # whether the pair lock is written beside its files (False: they load no model to bind)

    def check_options(self, opts: dict[str, Any]) -> None:
        """Refuse (UsageError) a bad value of its own options; may normalise them in place."""

    def baseline_engine(self, opts: dict[str, Any]) -> str | None:
        """The engine whose measured baseline (`specreg validate --engine`) the export carries, given
        the merged options; None: the validation's own figures only."""

    def refusal(self, pair_version) -> str | None:
        """Why its engine cannot serve this pair as registered, in one line naming the engine source
        that decides it, or None (exports.refuse_pair raises it as EngineRefusal, exit 1)."""

    def check(self, pair_version, baselines: dict[str, Any] | None, opts: dict[str, Any]) -> None:
        """Any further precondition of an export on its baselines and options: EngineRefusal where
        the engine would not serve what the export carries, UsageError for a missing option,
        SpecregError otherwise."""

    def sources(self, pair_version, opts: dict[str, Any]) -> tuple[str, str | None]:
        """(target, draft) as the engine is given them."""

    def head_layout(self, export) -> dict[str, Any] | None:
        """The head directory as the engine loads it where it differs from the registered one."""

    def write_models(self, pair_version, out_dir: str | Path, opts: dict[str, Any], overwrite: bool = False,
                     log=None, *, records) -> dict[str, tuple[str, dict[str, str]]] | None:
        """The model files the engine loads, written under ``out_dir``: {role: (folder, {file: sha256})}."""

    def context(self, export) -> dict[str, Any]:
        """Its template keys for one export."""

    def read_back(self, export, files: dict[str, Any]) -> list:
        """What its engine will run, read from the export's files as the engine parses them
        (registry/deploy/read_back.py ReadValues; empty for a format that loads no model)."""


def format_modules() -> dict[str, EngineModule]:
    """Export format -> its engine module, in FORMATS order."""
    return {fmt: importlib.import_module(f"{__name__}.{name}") for fmt, name in FORMATS.items()}


def engine_modules() -> dict[str, EngineModule]:
    """Engine name -> the module that targets it first (a format such as k8s-vllm reuses vllm)."""
    modules: dict[str, EngineModule] = {}
    for module in format_modules().values():
        if module.SCHEMA is not None:
            modules.setdefault(module.ENGINE, module)
    return modules


def format_module(fmt: str) -> EngineModule:
    """The engine module of export format ``fmt`` (UsageError naming the known formats)."""
    from specreg.errors import UsageError

    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    return importlib.import_module(f"{__name__}.{FORMATS[fmt]}")
