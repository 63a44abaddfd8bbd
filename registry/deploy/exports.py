"""Deployment exports: a pair version rendered as serving-engine configs that carry its identity
(name@version, fingerprints) and its acceptance baselines.

What every format shares lives here: the options, the refusals common to all engines, the
template context and rendering. Each engine's own part (version, options, refusals, the pair in
its terms, a head layout it loads, metrics) is its module in engines/, listed in engines.FORMATS.
Python builds every value; the Jinja2 templates in templates/exports/ only lay them out, and
every value goes through a quoting filter (rendering.py), so that model paths with spaces or
quotes cannot break a shell line, a JSON document or a YAML file.

Engine names and keys follow docs/design.md §4; the schema files in templates/engines/ list
them for each targeted engine version and the tests hold every output to them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specreg.errors import EngineRefusal, PolicyViolation, SpecregError, UsageError
from specreg.core.baselines import drift_floor, in_engine_terms, legacy_tau_note
from specreg.core.methods import METHODS
from specreg.core.types import ModelRef
from specreg.registry.deploy.engines import EngineModule, engine_modules, format_module, format_modules
from specreg.registry.deploy.rendering import FILTERS, render_user_template
from specreg.registry.deploy.engines.common import Export, served_reference
from specreg.registry.store.entities import PairState, PairVersion

ENGINE_FORMATS = format_modules()  # format -> its engine module (engines/__init__.py FORMATS)
FORMATS = tuple(ENGINE_FORMATS)
# Engine schema files kept in the repository, one per targeted engine version; the vLLM and
# SGLang ones are generated from the engines' released code by scripts/engine_schemas.py.
ENGINE_SCHEMAS = {engine: module.SCHEMA for engine, module in engine_modules().items()}

# Options every format reads; each engine module adds its own (engines/<engine>.py OPTIONS).
COMMON_OPTIONS: dict[str, Any] = {
    "host": "0.0.0.0",
    "port": 8000,
    "tensor_parallel_size": 1,
    "draft_tensor_parallel_size": 1,
    "served_model_name": None,  # None: the pair name, which is also the `model_name` metric label
    "model_source": "reference",  # "reference" (as registered) or "path" (where it was found)
    "tolerance": 0.1,  # alert / auto-off below baseline * (1 - tolerance)
    "engine_version": None,  # None: the version the format targets (its module's VERSIONS); others refused
}
OPTION_DEFAULTS: dict[str, Any] = {**COMMON_OPTIONS,
                                   **{key: value for module in ENGINE_FORMATS.values()
                                      for key, value in module.OPTIONS.items()}}

# The pair kinds the formats below are written for; each engine module's refusal says which
# format cannot serve which pair, and why (tests/engines run the vLLM and SGLang outputs).
EXPORTABLE_STATES = (PairState.VALIDATED, PairState.APPROVED, PairState.PROMOTED)


def templates_dir() -> Path:
    """The folder of the shipped templates (the specreg.templates package)."""
    import specreg.templates

    return Path(specreg.templates.__file__).parent


def engine_schema(engine: str) -> dict[str, Any]:
    """The schema file of one engine (``vllm``, ``sglang``, ``trtllm``, ``tgi``) as a dict."""
    if engine not in ENGINE_SCHEMAS:
        raise UsageError(f"unknown engine {engine!r}; known: {', '.join(ENGINE_SCHEMAS)}")
    return json.loads((templates_dir() / "engines" / ENGINE_SCHEMAS[engine]).read_text())


# ---------------------------------------------------------------------------------------------
# Public entry points.


def plan_export(pair_version: PairVersion, baselines: dict[str, Any] | None, fmt: str, *, approved: bool,
                force: bool = False, options: dict[str, Any] | None = None,
                unapproved_reason: str | None = None) -> Export:
    """The one place an export is judged and resolved: the format's engine module, whether the
    version may be exported (check_exportable) and every input resolved after every refusal
    (resolve_export). What an export writes (files, head layout, the lock's engine) is read from
    the Export this returns. UsageError for an unknown format or a bad option, EngineRefusal for a
    pair the format's engine does not serve, PolicyViolation for an unapproved version without
    ``force``."""
    engine = format_module(fmt)
    exportable = check_exportable(pair_version, baselines, approved, force, unapproved_reason)
    return resolve_export(engine, fmt, pair_version, baselines, exportable, options)


def baseline_engine(fmt: str, options: dict[str, Any] | None) -> str | None:
    """The engine whose measured baseline an export of format ``fmt`` with ``options`` carries (its
    engine module's baseline_engine)."""
    return format_module(fmt).baseline_engine(merge_options(options))


def render_export(
    pair_version: PairVersion,
    baselines: dict[str, Any] | None,
    fmt: str,
    approved: bool,
    force: bool = False,
    template_path: str | Path | None = None,
    options: dict[str, Any] | None = None,
    audit_head: str | None = None,
    lock: dict[str, Any] | None = None,
) -> list[tuple[str, str]]:
    """Render one deployment format for a pair version.

    In: the pair version, its recorded baselines (None if never validated), a format of
    FORMATS, whether the version is approved, ``force`` to export anyway (the output is then
    marked UNAPPROVED), an optional user template (rendered sandboxed instead of the shipped
    ones), options overriding OPTION_DEFAULTS and the pair lock (registry.deploy.lock) when one is
    written beside the files (the k8s manifest verifies it in an initContainer).
    Out: a list of (relative file name, text). Raises PolicyViolation for an unapproved
    version without force, EngineRefusal for a pair the format's engine does not serve (TGI + draft model).
    ``audit_head``: the registry's audit chain head, carried in the header comments so the
    export anchors the chain outside the database (`specreg audit verify --expect-head`).
    """
    export = plan_export(pair_version, baselines, fmt, approved=approved, force=force, options=options)
    return render_files(export, template_path=template_path, audit_head=audit_head, lock=lock)


def render_files(export: Export, *, template_path: str | Path | None = None, audit_head: str | None = None,
                 lock: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """The files of a planned export (plan_export) -> [(relative file name, text)]: the format's
    templates (or the user's ``template_path``) and the head layout its engine loads."""
    context = build_context(export)
    layout = list((export.engine.head_layout(export) or {}).items())
    if audit_head:
        context["audit_head"] = audit_head
        context["header_lines"] = [*context["header_lines"],
                                   f"audit_head: {audit_head} (check: specreg audit verify --expect-head)"]
    context["lock"] = lock_context(lock, context)
    if template_path is not None:
        return [render_user_template(Path(template_path), context), *layout]

    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(
        loader=FileSystemLoader(str(templates_dir() / "exports")),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # shell, JSON and YAML: quoting is done by the filters
    )
    env.filters.update(FILTERS)
    return [*((name, env.get_template(name + ".j2").render(context)) for name in export.engine.FILES), *layout]


def draft_layout(export: Export) -> tuple[str, dict[str, str]] | None:
    """(folder, {file: sha256}) of the head layout a planned export writes, for the pair lock to
    bind the files the engine loads: a written file by its text, a linked one by the registered
    head's file of that name. None when the engine loads the registered directory itself."""
    from specreg.core.digests import sha256_file, sha256_hex
    from specreg.registry.deploy.export_files import Link

    layout = export.engine.head_layout(export)
    if not layout:
        return None
    folder = next(iter(layout)).split("/", 1)[0]
    digests = {}
    for name, value in layout.items():
        inside = name.split("/", 1)[1]
        digests[inside] = (sha256_file(Path(export.pair_version.draft.path) / inside) if isinstance(value, Link)
                           else sha256_hex(value.encode("utf-8")))
    return folder, dict(sorted(digests.items()))


def check_exportable(pair_version: PairVersion, baselines: dict[str, Any] | None, approved: bool, force: bool,
                     unapproved_reason: str | None = None) -> bool:
    """Whether the version is validated and approved (the output then says so). Raises
    PolicyViolation when it is not and ``force`` is off, saying why (``unapproved_reason``: why the
    approvals do not stand, as the gate's rule says it)."""
    exportable = approved and baselines is not None and pair_version.state in EXPORTABLE_STATES
    if exportable or force:
        return exportable
    if not approved and unapproved_reason:
        why = unapproved_reason
    else:
        why = "no recorded baselines" if baselines is None else f"state {pair_version.state.value}"
        if not approved:
            why += ", not approved"
    raise PolicyViolation(f"{pair_version.label} is not validated and approved ({why}); export refused "
                          "(--force exports it marked UNAPPROVED)")


def lock_engine(export: Export) -> dict[str, Any]:
    """The engine (name, version, export format) the lock of a planned export is for, read from
    the engine's schema file."""
    schema = engine_schema(export.engine.ENGINE)
    return {"name": schema["engine"], "version": schema["engine_version"], "format": export.fmt}


LOCK_MOUNT = "/etc/specreg/lock"
PUBLIC_KEY_MOUNT = "/etc/specreg/key"
KEYRING_MOUNT = "/etc/specreg/keyring"


def lock_context(lock: dict[str, Any] | None, context: dict[str, Any]) -> dict[str, Any] | None:
    """What a template needs of the pair lock: its file name and text, whether it is signed, and
    the `specreg verify` command line that checks the model paths the engine is given against it
    (signed: with the team's public key; unsigned or forced exports: with the flags that say so)."""
    if lock is None:
        return None
    from specreg.registry.deploy.lock import LOCK_FILE, PUBLIC_KEY_FILE, lock_text

    signed = lock.get("signature") is not None
    argv = ["specreg", "verify", "--lock", f"{LOCK_MOUNT}/{LOCK_FILE}"]
    argv += ["--public-key", f"{PUBLIC_KEY_MOUNT}/{PUBLIC_KEY_FILE}"] if signed else ["--allow-unsigned"]
    if not lock.get("approved"):
        argv.append("--allow-unapproved")
    else:  # the approvers' signatures in the lock, against the keyring the platform mounts
        from specreg.registry.governance.signatures import KEYRING_FILE

        argv += ["--keyring", f"{KEYRING_MOUNT}/{KEYRING_FILE}"]
    argv += ["--target", context["target"]["source"]]
    if "draft" in lock["models"]:
        # a head pair's --draft directory is bound in the lock too, whether or not this format names it
        recorded = lock["models"]["draft"]
        by_reference = context["options"]["model_source"] == "reference" and recorded.get("revision") is not None
        fallback = recorded["reference"] if by_reference else recorded["registered_path"]
        argv += ["--draft", context["draft"]["source"] if context["draft"] is not None else fallback]
    return {"file": LOCK_FILE, "text": lock_text(lock), "signed": signed, "public_key_file": PUBLIC_KEY_FILE,
            "mount": LOCK_MOUNT, "key_mount": PUBLIC_KEY_MOUNT, "keyring_mount": KEYRING_MOUNT,
            "approved": bool(lock.get("approved")), "verify_argv": argv}


# ---------------------------------------------------------------------------------------------
# The template context: every value a template needs, computed here.


def merge_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """OPTION_DEFAULTS overridden by ``options``; unknown names and bad values are UsageErrors
    (the common options here, each engine's own by its module's check_options)."""
    merged = dict(OPTION_DEFAULTS)
    for key, value in (options or {}).items():
        if key not in OPTION_DEFAULTS:
            raise UsageError(f"unknown export option {key!r}; known: {', '.join(OPTION_DEFAULTS)}")
        # A line break would start a second line of a serve script or, with `---`, a second YAML
        # document of a manifest: no option of any engine needs one (nor a tab, nor DEL)
        if isinstance(value, str) and any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise UsageError(f"export option {key}={value[:40]!r}: the value holds a control character "
                             "(a line break, a tab); give it on one line")
        merged[key] = value
    try:
        for key in ("port", "tensor_parallel_size", "draft_tensor_parallel_size"):
            merged[key] = int(merged[key])
        merged["tolerance"] = float(merged["tolerance"])
    except (TypeError, ValueError) as exc:
        raise UsageError(f"export option has a bad value: {exc}") from None
    if not 0.0 <= merged["tolerance"] < 1.0:
        raise UsageError(f"export option tolerance={merged['tolerance']} must be in [0, 1)")
    if merged["draft_tensor_parallel_size"] not in (1, merged["tensor_parallel_size"]):
        raise UsageError(
            f"export option draft_tensor_parallel_size={merged['draft_tensor_parallel_size']} must be 1 "
            f"or the target's tensor_parallel_size={merged['tensor_parallel_size']}"
        )
    if merged["model_source"] not in ("reference", "path"):
        raise UsageError(f"export option model_source={merged['model_source']!r} must be 'reference' or 'path'")
    for module in ENGINE_FORMATS.values():
        module.check_options(merged)
    return merged


def resolve_export(engine: EngineModule, fmt: str, pair_version: PairVersion, baselines: dict[str, Any] | None,
                   approved: bool, options: dict[str, Any] | None = None) -> Export:
    """The export's inputs resolved (options, where the engine finds the models, thresholds), after
    every refusal (refuse_pair, the engine module's check). Baselines are read in the engines'
    terms (specreg.core.baselines): one recorded before tau was counted as the engines count it
    gives no tau threshold (nor alert); the header says why."""
    opts = merge_options(options)
    baselines = in_engine_terms(baselines)
    refuse_pair(engine, fmt, pair_version, opts)
    engine.check(pair_version, baselines, opts)
    target_source, draft_source = engine.sources(pair_version, opts)
    overall = (baselines or {}).get("overall") or {}
    thresholds = {
        key: round(drift_floor(key, overall[key], opts["tolerance"]), 6)
        for key in ("acceptance_rate", "mean_acceptance_length")
        if isinstance(overall.get(key), (int, float))
    }
    return Export(fmt=fmt, engine=engine, pair_version=pair_version, baselines=baselines, approved=approved,
                  opts=opts, target_source=target_source, draft_source=draft_source,
                  served_name=opts["served_model_name"] or pair_version.name, overall=overall,
                  thresholds=thresholds)


def refuse_pair(engine: EngineModule, fmt: str, pair_version: PairVersion, opts: dict[str, Any]) -> None:
    """Refuse a pair format ``fmt`` cannot serve: UsageError for an engine version it is not written
    for (an option), EngineRefusal (exit 1) with the engine module's own refusal, else the method's
    line (core.methods) for a method no format writes."""
    engine_version = opts["engine_version"] or engine.VERSIONS[0]
    if str(engine_version) not in engine.VERSIONS:
        raise UsageError(
            f"export format {fmt} is written for {engine.ENGINE} {', '.join(engine.VERSIONS)}; engine_version="
            f"{engine_version} is not one of them (its keys or their meaning may differ), so it is refused"
        )
    config = pair_version.config
    descriptor = config.method.descriptor
    reason = engine.refusal(pair_version) or unwritten_method(descriptor)
    if reason:
        raise EngineRefusal(f"{pair_version.label} is {descriptor.article} {descriptor.name} pair and cannot be "
                            f"exported to {fmt}: {reason}")
    if descriptor.takes_draft and pair_version.draft is None:
        raise SpecregError(f"{pair_version.label} is a {config.method.value} pair without its draft directory")


def unwritten_method(descriptor) -> str | None:
    """Why no format writes the method (core.methods export_refusal), for the formats whose engine
    module has no words of its own for it; None for an exported method."""
    if descriptor.exported:
        return None
    # Writing a draft_model or ngram config for a head pair would serve something else.
    exported = [m.name for m in METHODS.values() if m.exported]
    return descriptor.export_refusal or (f"no export format writes {descriptor.name} yet (exported methods: "
                                         f"{', '.join(exported)})")


def build_context(export: Export) -> dict[str, Any]:
    """The plain (JSON-like) context every template of the export's format renders from: the common keys
    here, and each engine module's own (engines/<engine>.py ``context``).

    Only dicts, lists, strings and numbers go in, never entity objects: a sandboxed user
    template then has no Python methods to reach through.
    """
    pair_version, baselines, approved, opts = export.pair_version, export.baselines, export.approved, export.opts
    fmt, config = export.fmt, pair_version.config
    engine, engine_version = export.engine.ENGINE, opts["engine_version"] or export.engine.VERSIONS[0]
    thresholds = export.thresholds
    has_draft_dir = pair_version.draft is not None
    context = {
        "format": fmt,
        "engine": engine,
        "engine_version": engine_version,
        "approved": approved,
        "approval": "approved" if approved else "UNAPPROVED",
        "pair": {
            "name": pair_version.name,
            "version": pair_version.version,
            "label": pair_version.label,
            "state": pair_version.state.value,
            "binding_sha256": pair_version.binding_sha256,
        },
        "target": model_context(pair_version.target, export.target_source),
        "draft": model_context(pair_version.draft, export.draft_source) if has_draft_dir else None,
        "config": config.to_dict(),
        "baselines": baselines,
        "thresholds": thresholds,
        "options": opts,
        "served_model_name": export.served_name,
        "header_lines": header_lines(pair_version, baselines, fmt, approved, thresholds, opts,
                                     f"{engine} {engine_version}"),
    }
    for each in ENGINE_FORMATS.values():  # every engine's keys, for user templates that combine them
        context.update(each.context(export))
    return context


def model_context(model: ModelRef, source: str) -> dict[str, Any]:
    fingerprint = model.fingerprint
    return {
        "reference": model.reference,
        "path": model.path,
        "source": source,
        "revision": model.revision,
        "weights_sha256": fingerprint.weights_sha256,
        "tokenizer_sha256": fingerprint.tokenizer_sha256,
        "config_sha256": fingerprint.config_sha256,
        "chat_template_sha256": fingerprint.chat_template_sha256,
        "vocab_size": fingerprint.vocab_size,
        "architecture": fingerprint.architecture,
    }


def format_figures(figures: dict[str, Any]) -> str:
    parts = []
    for key in ("acceptance_rate", "mean_acceptance_length"):
        if isinstance(figures.get(key), (int, float)):
            parts.append(f"{key}={figures[key]:.4f}")
    positions = figures.get("per_position_acceptance")
    if positions:
        parts.append("per_position_acceptance=[" + ", ".join(f"{p:.3f}" for p in positions) + "]")
    return " ".join(parts) or "(no figures)"


def header_lines(
    pair_version: PairVersion,
    baselines: dict[str, Any] | None,
    fmt: str,
    approved: bool,
    thresholds: dict[str, float],
    opts: dict[str, Any],
    target_engine: str,
) -> list[str]:
    """The identity block every output carries as comments: pair, fingerprints, baselines."""
    lines = [f"specreg export {fmt} of {pair_version.label} (state {pair_version.state.value}) for {target_engine}"]
    if not approved:
        lines.append("UNAPPROVED: exported with --force; this version is not validated and approved")
    lines.append(f"binding_sha256: {pair_version.binding_sha256}")
    models = [("target", pair_version.target)]
    if pair_version.draft is not None:
        models.append(("draft", pair_version.draft))
    for role, model in models:
        fingerprint = model.fingerprint
        where = f"revision {model.revision}" if model.revision else "local folder"
        lines.append(
            f"{role}: {served_reference(model)} ({where}) weights_sha256={fingerprint.weights_sha256}"
            + (f" tokenizer_sha256={fingerprint.tokenizer_sha256}" if fingerprint.tokenizer_sha256 else "")
        )
    config = pair_version.config
    # only the settings the pair has: an unset one is left out, never written as Python's None
    settings = [("method", config.method.value), ("num_speculative_tokens", config.num_speculative_tokens),
                ("prompt_lookup_min", config.prompt_lookup_min), ("prompt_lookup_max", config.prompt_lookup_max),
                ("max_batch_size_for_speculation", config.max_batch_size_for_speculation),
                *(config.suffix.vllm_keys().items() if config.suffix is not None else ())]
    lines.append("speculative config: " + " ".join(f"{key}={value}" for key, value in settings if value is not None))
    if not baselines:
        lines.append("baselines: none recorded")
        return lines
    lines.append(
        f"baselines: golden set {baselines.get('golden_set')} (sha256 {baselines.get('golden_sha256')}),"
        f" validated at {baselines.get('validated_at')}"
        + (f", dtype {baselines['dtype']}" if baselines.get("dtype") else "")
    )
    measured = baselines.get("engine_baseline")
    if measured:  # the engine's own figures (specreg validate --engine), ours kept beside them
        lines.append(f"  measured in {measured['engine']} {measured['engine_version']} ({measured['engine_build']}), "
                     f"engine baseline {measured['id']} at {measured['measured_at']}; our runtime: "
                     f"{format_figures((baselines.get('runtime') or {}).get('overall') or {})}")
    lines.append(f"  overall: {format_figures(baselines.get('overall') or {})}")
    for category, figures in sorted((baselines.get("per_category") or {}).items()):
        lines.append(f"  category {category}: {format_figures(figures or {})}")
    if thresholds:
        lines.append(
            f"drift floor (alpha-hat * (1 - {opts['tolerance']}); tau: 1 + (tau - 1) * (1 - {opts['tolerance']}), "
            f"tau = 1 + accepted / draft steps as the engines count it): "
            + " ".join(f"{key}={value}" for key, value in thresholds.items())
        )
    if legacy_tau_note(baselines):
        lines.append("no tau floor: " + legacy_tau_note(baselines, "this baseline"))
    return lines
