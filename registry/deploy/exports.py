"""Deployment exports: a pair version rendered as serving-engine configs that carry its identity
(name@version, fingerprints) and its acceptance baselines.

Python builds every value (engine argument lists, the speculative-config dict, PromQL
expressions); the Jinja2 templates in templates/exports/ only lay them out, and every value
goes through a quoting filter (``shquote``, ``json``, ``yaml``), so that model paths with
spaces or quotes cannot break a shell line, a JSON document or a YAML file.

Engine names and keys follow DESIGN.md section 4; the schema files in templates/engines/ list
them for each targeted engine version and the tests hold every output to them.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

from specreg.errors import PolicyViolation, SpecregError, UsageError
from specreg.core.types import ModelRef
from specreg.registry.store.entities import PairState, PairVersion, SpecMethod

FORMATS = ("vllm", "sglang", "trtllm", "tgi", "k8s-vllm", "prometheus-rules")

# The files each format writes; each is rendered from templates/exports/<file name>.j2.
FORMAT_FILES = {
    "vllm": ("vllm-serve.sh", "vllm-speculative-config.json"),
    "sglang": ("sglang-launch.sh",),
    "trtllm": ("trtllm-serve.sh", "trtllm-config.yaml"),
    "tgi": ("tgi-launch.sh",),
    "k8s-vllm": ("k8s-vllm.yaml",),
    "prometheus-rules": ("prometheus-rules.yaml",),
}

# Engine schema files kept in the repository, one per targeted engine version; the vLLM and
# SGLang ones are generated from the engines' released code by scripts/engine_schemas.py.
ENGINE_SCHEMAS = {
    "vllm": "vllm-0.33.json",
    "sglang": "sglang-0.5.23.json",
    "trtllm": "trtllm-1.2.json",
    "tgi": "tgi-3.3.json",
}

# The engine and the engine versions each format is written for (option engine_version picks
# one; any other is refused: keys and their meaning change between releases, e.g. TensorRT-LLM
# 1.3 replaced the 1.2 acceptance-length gate keys by rate-based ones).
FORMAT_ENGINES: dict[str, tuple[str, tuple[str, ...]]] = {
    "vllm": ("vllm", ("0.33",)),
    "sglang": ("sglang", ("0.5.23",)),
    "trtllm": ("trtllm", ("1.2",)),
    "tgi": ("tgi", ("3.3",)),
    "k8s-vllm": ("vllm", ("0.33",)),
    "prometheus-rules": ("vllm/sglang", ("0.33/0.5.23",)),
}

OPTION_DEFAULTS: dict[str, Any] = {
    "host": "0.0.0.0",
    "port": 8000,
    "tensor_parallel_size": 1,
    "draft_tensor_parallel_size": 1,
    "served_model_name": None,  # None: the pair name, which is also the `model_name` metric label
    "model_source": "reference",  # "reference" (as registered) or "path" (where it was found)
    "tolerance": 0.1,  # alert / auto-off below baseline * (1 - tolerance)
    "for": "10m",  # how long a Prometheus alert condition must hold
    "rate_window": "5m",
    "rules_engine": "all",  # prometheus-rules for "vllm", "sglang" or "all"
    "image": "vllm/vllm-openai:v0.33.0",
    "namespace": None,
    "replicas": 1,
    "acceptance_window": 128,  # TensorRT-LLM rolling window for acceptance_length_threshold
    "engine_version": None,  # None: the version the format targets (FORMAT_ENGINES); others refused
    "max_num_seqs": None,  # vLLM --max-num-seqs; also the end of the k=0 range of a batch cutoff
    # k8s-vllm: the volume holding the models ("pvc:CLAIM" or "hostPath:/DIR", required), where
    # it is mounted in the container, and the target's and draft's folders inside it.
    "model_volume": None,
    "model_mount_path": "/models",
    "target_subpath": "target",
    "draft_subpath": "draft",
    # k8s: the initContainer running `specreg verify` (an image with specreg + model-signing,
    # no torch: see the README) and the ConfigMap holding the team's public key.
    "verify_image": "specreg-verify:0.1.0",
    "verify_key_configmap": "specreg-signing-key",
}

# The pair kinds the formats below are written for; head_refusal says which format cannot
# serve which head pair, and why (tests/engines run the vLLM and SGLang outputs).
EXPORTED_METHODS = (SpecMethod.DRAFT_MODEL, SpecMethod.NGRAM, SpecMethod.EAGLE3, SpecMethod.MTP)
MEDUSA_REFUSAL = (
    "no engine version specreg targets serves Medusa heads stored apart from their base model: vLLM 0.33 "
    "has no medusa method (not in its SpeculativeMethod list), SGLang 0.5.23 has no Medusa algorithm, "
    "TensorRT-LLM's Medusa decoding runs only on its TensorRT engine flow (not trtllm-serve's PyTorch backend), "
    "and TGI 3.3 reads Medusa heads only from a combined model repository")

PROMETHEUS_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
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
# Quoting filters shared by the shipped and the user templates.


def shell_lines(lines: list[list[str]]) -> str:
    """One command over several lines: each inner list is quoted word by word and the lines are
    joined with backslash continuations."""
    return " \\\n    ".join(" ".join(shlex.quote(str(word)) for word in words) for words in lines)


def to_json(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False)


def to_yaml_scalar(value: Any) -> str:
    """A YAML flow value on one line: strings double-quoted by the YAML emitter itself
    (escapes newlines, quotes and colons), everything else as JSON, which YAML reads too."""
    import yaml

    if isinstance(value, str):
        return yaml.safe_dump(value, default_style='"', width=math.inf, allow_unicode=True).strip()
    return json.dumps(value)


def one_line(value: Any) -> str:
    """Text safe inside a one-line comment: a newline would end the comment."""
    return re.sub(r"[\r\n\x0b\x0c\x85\u2028\u2029]+", " ", str(value))


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal (Go escapes; JSON's are a subset)."""
    return json.dumps(value)


FILTERS = {
    "shquote": lambda value: shlex.quote(str(value)),
    "shell_lines": shell_lines,
    "json": to_json,
    "yaml": to_yaml_scalar,
    "comment": one_line,
}


# ---------------------------------------------------------------------------------------------
# Public entry points.


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
    version without force, UsageError for a format the pair cannot have (TGI + draft model).
    ``audit_head``: the registry's audit chain head, carried in the header comments so the
    export anchors the chain outside the database (`specreg audit verify --expect-head`).
    """
    exportable = check_exportable(pair_version, baselines, fmt, approved, force)
    context = build_context(pair_version, baselines, fmt, approved=exportable, options=options)
    if audit_head:
        context["audit_head"] = audit_head
        context["header_lines"] = [*context["header_lines"],
                                   f"audit_head: {audit_head} (check: specreg audit verify --expect-head)"]
    context["lock"] = lock_context(lock, context)
    if template_path is not None:
        return [render_user_template(Path(template_path), context)]

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
    return [(name, env.get_template(name + ".j2").render(context)) for name in FORMAT_FILES[fmt]]


def check_exportable(pair_version: PairVersion, baselines: dict[str, Any] | None, fmt: str, approved: bool,
                     force: bool) -> bool:
    """Whether the version is validated and approved (the output then says so). Raises
    UsageError for an unknown format, PolicyViolation when it is not and ``force`` is off."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    exportable = approved and baselines is not None and pair_version.state in EXPORTABLE_STATES
    if not exportable and not force:
        why = "no recorded baselines" if baselines is None else f"state {pair_version.state.value}"
        if not approved:
            why += ", not approved"
        raise PolicyViolation(
            f"{pair_version.label} is not validated and approved ({why}); export refused "
            "(--force exports it marked UNAPPROVED)"
        )
    return exportable


def lock_engine(fmt: str) -> dict[str, Any]:
    """The engine (name, version, export format) a lock of format ``fmt`` is for, read from the
    engine's schema file."""
    engine = "vllm" if fmt == "k8s-vllm" else fmt
    schema = engine_schema(engine)
    return {"name": schema["engine"], "version": schema["engine_version"], "format": fmt}


LOCK_MOUNT = "/etc/specreg/lock"
PUBLIC_KEY_MOUNT = "/etc/specreg/key"


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
    argv += ["--target", context["target"]["source"]]
    if "draft" in lock["models"]:
        # a head pair's --draft directory is bound in the lock too, whether or not this format names it
        recorded = lock["models"]["draft"]
        fallback = recorded["registered_path"] if context["options"]["model_source"] == "path" else recorded["reference"]
        argv += ["--draft", context["draft"]["source"] if context["draft"] is not None else fallback]
    return {"file": LOCK_FILE, "text": lock_text(lock), "signed": signed, "public_key_file": PUBLIC_KEY_FILE,
            "mount": LOCK_MOUNT, "key_mount": PUBLIC_KEY_MOUNT, "verify_argv": argv}


def render_user_template(template_path: Path, context: dict[str, Any]) -> tuple[str, str]:
    """Render a user template in Jinja2's sandbox; returns (output file name, text).

    The output name is the template's file name without a trailing ``.j2``. HTML and XML
    outputs are autoescaped. Anything the sandbox refuses (Python internals such as
    ``''.__class__``), a syntax error or an undefined name becomes one SpecregError line.
    """
    from jinja2 import StrictUndefined, TemplateSyntaxError
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import SandboxedEnvironment

    if not template_path.is_file():
        raise SpecregError(f"template {template_path}: no such file")
    out_name = template_path.name[: -len(".j2")] if template_path.name.endswith(".j2") else template_path.name
    escape = out_name.lower().endswith((".html", ".htm", ".xml", ".svg"))
    env = SandboxedEnvironment(
        undefined=StrictUndefined, autoescape=escape, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(FILTERS)
    try:
        text = env.from_string(template_path.read_text(encoding="utf-8")).render(context)
    except SecurityError as exc:
        raise SpecregError(f"template {template_path}: refused by the sandbox: {exc}") from None
    except TemplateSyntaxError as exc:
        raise SpecregError(f"template {template_path}:{exc.lineno}: syntax error: {exc.message}") from None
    except Exception as exc:  # a user template is user input: any failure is theirs, one line
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecregError(f"template {template_path}: {type(exc).__name__}: {first_line}") from None
    return out_name, text


def write_export(files: list[tuple[str, str]], out_dir: str | Path, overwrite: bool = False) -> list[Path]:
    """Write rendered files under ``out_dir`` (created if missing); returns the paths written.

    Every path is checked before anything is written: refuses (SpecregError, nothing written)
    any name that is absolute or resolves outside out_dir, an out_dir (or a folder on the way)
    that is a file, a name that is a directory, and any existing file unless ``overwrite``.
    Each file goes to a temporary file beside it and all are moved into place (os.replace) only
    once every one is written, so a failure leaves neither a half-written file nor a partial set.
    """
    out = Path(out_dir)
    _refuse_non_directory(out)
    root = out.resolve()
    targets: list[tuple[Path, str]] = []
    for name, text in files:
        if not name or Path(name).is_absolute():
            raise SpecregError(f"export file name {name!r} must be a relative path inside {root}")
        path = (root / name).resolve()  # resolves '..' and symlinks already present
        if path == root or not path.is_relative_to(root):
            raise SpecregError(f"export file name {name!r} escapes the output folder {root}")
        _refuse_non_directory(path.parent)
        if path.is_dir():
            raise SpecregError(f"cannot write {path}: it is a directory")
        if path.exists() and not overwrite:
            raise SpecregError(f"{path} exists; refusing to overwrite it (use --overwrite)")
        targets.append((path, text))
    umask = os.umask(0)
    os.umask(umask)
    temporary: list[tuple[Path, Path]] = []
    current = root
    try:
        for path, text in targets:
            current = path.parent
            path.parent.mkdir(parents=True, exist_ok=True)
            current = path
            handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            temporary.append((Path(name), path))
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                stream.write(text)
            # mkstemp makes 0600: keep an overwritten file's mode, else what a new file would get
            os.chmod(name, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~umask)
        for name, path in temporary:
            current = path
            os.replace(name, path)
    except OSError as exc:
        for name, _ in temporary:
            name.unlink(missing_ok=True)
        raise SpecregError(f"cannot write {current}: {exc.strerror or exc}") from None
    return [path for path, _ in targets]


def _refuse_non_directory(folder: Path) -> None:
    """SpecregError when ``folder`` or its nearest existing ancestor is not a directory."""
    for candidate in (folder, *folder.parents):
        if candidate.exists() or candidate.is_symlink():
            if not candidate.is_dir():
                raise SpecregError(f"cannot write to {folder}: {candidate} is not a directory")
            return


# ---------------------------------------------------------------------------------------------
# The template context: every value a template needs, computed here.


def merge_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """OPTION_DEFAULTS overridden by ``options``; unknown names and bad values are UsageErrors."""
    merged = dict(OPTION_DEFAULTS)
    for key, value in (options or {}).items():
        if key not in OPTION_DEFAULTS:
            raise UsageError(f"unknown export option {key!r}; known: {', '.join(OPTION_DEFAULTS)}")
        merged[key] = value
    try:
        for key in ("port", "tensor_parallel_size", "draft_tensor_parallel_size", "replicas", "acceptance_window"):
            merged[key] = int(merged[key])
        if merged["max_num_seqs"] is not None:
            merged["max_num_seqs"] = int(merged["max_num_seqs"])
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
    if merged["rules_engine"] not in ("vllm", "sglang", "all"):
        raise UsageError(f"export option rules_engine={merged['rules_engine']!r} must be vllm, sglang or all")
    if merged["max_num_seqs"] is not None and merged["max_num_seqs"] < 1:
        raise UsageError(f"export option max_num_seqs={merged['max_num_seqs']} must be >= 1")
    if merged["model_volume"] is not None and not re.fullmatch(r"(pvc:[a-z0-9][a-z0-9.-]*|hostPath:/.*)",
                                                                str(merged["model_volume"])):
        raise UsageError(
            f"export option model_volume={merged['model_volume']!r} must be pvc:CLAIM_NAME or hostPath:/ABSOLUTE/DIR"
        )
    if not str(merged["model_mount_path"]).startswith("/"):
        raise UsageError(f"export option model_mount_path={merged['model_mount_path']!r} must be an absolute path")
    for key in ("target_subpath", "draft_subpath"):
        parts = Path(str(merged[key])).parts
        if not parts or Path(str(merged[key])).is_absolute() or ".." in parts:
            raise UsageError(f"export option {key}={merged[key]!r} must be a relative path inside the volume")
    for key in ("for", "rate_window"):
        if not PROMETHEUS_DURATION.match(str(merged[key])):
            raise UsageError(f"export option {key}={merged[key]!r} is not a Prometheus duration (e.g. 10m)")
    return merged


def build_context(
    pair_version: PairVersion,
    baselines: dict[str, Any] | None,
    fmt: str,
    approved: bool,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The plain (JSON-like) context every template of ``fmt`` renders from.

    Only dicts, lists, strings and numbers go in, never entity objects: a sandboxed user
    template then has no Python methods to reach through.
    """
    opts = merge_options(options)
    engine, engine_versions = FORMAT_ENGINES[fmt]
    engine_version = opts["engine_version"] or engine_versions[0]
    if str(engine_version) not in engine_versions:
        raise UsageError(
            f"export format {fmt} is written for {engine} {', '.join(engine_versions)}; engine_version="
            f"{engine_version} is not one of them (its keys or their meaning may differ), so it is refused"
        )
    config = pair_version.config
    if config.method is SpecMethod.MEDUSA:
        raise UsageError(f"{pair_version.label} is a medusa pair and cannot be exported: {MEDUSA_REFUSAL}")
    if config.method not in EXPORTED_METHODS:
        # Writing a draft_model or ngram config for a head pair would serve something else.
        raise UsageError(
            f"{pair_version.label} is a {config.method.value} pair: no export format writes {config.method.value} "
            f"yet (exported methods: {', '.join(m.value for m in EXPORTED_METHODS)})"
        )
    refusal = head_refusal(pair_version, fmt)
    if refusal:
        raise UsageError(f"{pair_version.label} is a {config.method.value} pair and cannot be exported to {fmt}: "
                         f"{refusal}")
    draft_model = config.method == SpecMethod.DRAFT_MODEL
    has_draft_dir = pair_version.draft is not None  # a draft model or an EAGLE-3 head directory
    if config.method in (SpecMethod.DRAFT_MODEL, SpecMethod.EAGLE3) and pair_version.draft is None:
        raise SpecregError(f"{pair_version.label} is a {config.method.value} pair without its draft directory")
    if fmt == "tgi" and draft_model:
        raise UsageError(
            f"{pair_version.label} is a draft_model pair and cannot be exported to tgi: TGI 3.3 has no "
            "separate-draft mode (--speculate does Medusa or n-gram only); use vllm, sglang or trtllm"
        )
    if fmt == "sglang" and config.method == SpecMethod.NGRAM:
        raise UsageError(
            f"{pair_version.label} is an ngram pair and cannot be exported to sglang: SGLang 0.5.23's NGRAM drafts "
            "a token tree (--speculative-num-draft-tokens nodes, BFS breadth 1-10) from a trie shared by all "
            "requests (--speculative-ngram-capacity), matching suffixes of up to --speculative-ngram-max-trie-depth "
            "tokens with no minimum; prompt_lookup_min/max have no counterpart, so the validated baselines would "
            "not describe what it serves; use vllm or trtllm"
        )
    if fmt == "k8s-vllm" and not opts["model_volume"]:
        raise UsageError(
            "export format k8s-vllm needs the volume that holds the models: --option model_volume=pvc:CLAIM_NAME "
            "or --option model_volume=hostPath:/DIR (mounted at model_mount_path, default /models; the target in "
            "its target_subpath folder, default 'target', the draft in draft_subpath, default 'draft')"
        )
    if fmt == "prometheus-rules" and not (baselines and baselines.get("overall")):
        raise SpecregError(
            f"{pair_version.label} has no recorded overall baseline: nothing to alert against "
            "(validate the version first)"
        )

    source = (lambda ref: ref.reference) if opts["model_source"] == "reference" else (lambda ref: ref.path)
    served_name = opts["served_model_name"] or pair_version.name
    target_source = source(pair_version.target)
    draft_source = source(pair_version.draft) if has_draft_dir else None
    if fmt == "k8s-vllm":
        # In the pod the engine reads the models from the mounted volume, not the registrant's paths.
        target_source = str(Path(opts["model_mount_path"]) / opts["target_subpath"])
        draft_source = str(Path(opts["model_mount_path"]) / opts["draft_subpath"]) if has_draft_dir else None
    overall = (baselines or {}).get("overall") or {}
    floor = 1.0 - opts["tolerance"]
    thresholds = {
        key: round(overall[key] * floor, 6)
        for key in ("acceptance_rate", "mean_acceptance_length")
        if isinstance(overall.get(key), (int, float))
    }
    speculative = vllm_speculative_config(pair_version, draft_source, opts)
    vllm_lines = vllm_command(target_source, pair_version.target.revision, speculative, served_name, opts)

    return {
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
        "target": model_context(pair_version.target, target_source),
        "draft": model_context(pair_version.draft, draft_source) if has_draft_dir else None,
        "config": config.to_dict(),
        "baselines": baselines,
        "thresholds": thresholds,
        "options": opts,
        "served_model_name": served_name,
        "header_lines": header_lines(pair_version, baselines, fmt, approved, thresholds, opts,
                                     f"{engine} {engine_version}"),
        "speculative_config": speculative,
        "vllm_command": vllm_lines,
        "vllm_argv": [word for line in vllm_lines for word in line],
        "sglang_command": sglang_command(pair_version, target_source, draft_source, served_name, opts)
        if config.method is not SpecMethod.NGRAM else None,
        "trtllm_command": trtllm_command(target_source, opts),
        "trtllm_config": trtllm_config(pair_version, draft_source, overall, opts),
        "tgi_command": tgi_command(pair_version, target_source, opts) if config.method is SpecMethod.NGRAM else None,
        "k8s": k8s_context(pair_version, baselines, approved, speculative, opts, target_source, draft_source),
        "alert_rules": alert_rules(pair_version, overall, thresholds, served_name, opts) if thresholds else [],
    }


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
        lines.append(
            f"{role}: {model.reference} (revision {model.revision or 'unknown'}) "
            f"weights_sha256={fingerprint.weights_sha256} tokenizer_sha256={fingerprint.tokenizer_sha256}"
        )
    config = pair_version.config
    lines.append(
        f"speculative config: method={config.method.value} num_speculative_tokens={config.num_speculative_tokens}"
        f" prompt_lookup_min={config.prompt_lookup_min} prompt_lookup_max={config.prompt_lookup_max}"
        f" max_batch_size_for_speculation={config.max_batch_size_for_speculation}"
    )
    if not baselines:
        lines.append("baselines: none recorded")
        return lines
    lines.append(
        f"baselines: golden set {baselines.get('golden_set')} (sha256 {baselines.get('golden_sha256')}),"
        f" validated at {baselines.get('validated_at')}"
    )
    lines.append(f"  overall: {format_figures(baselines.get('overall') or {})}")
    for category, figures in sorted((baselines.get("per_category") or {}).items()):
        lines.append(f"  category {category}: {format_figures(figures or {})}")
    if thresholds:
        lines.append(
            f"drift floor (baseline * (1 - {opts['tolerance']})): "
            + " ".join(f"{key}={value}" for key, value in thresholds.items())
        )
    return lines


def vllm_speculative_config(pair_version: PairVersion, draft_source: str | None, opts: dict[str, Any]) -> dict[str, Any]:
    """The dict vLLM 0.33 takes as --speculative-config."""
    config = pair_version.config
    k = config.num_speculative_tokens
    speculative: dict[str, Any] = {"method": config.method.value, "num_speculative_tokens": k}
    if config.method in (SpecMethod.DRAFT_MODEL, SpecMethod.EAGLE3):
        # eagle3: `model` is the head; vLLM builds its draft ModelConfig with the target's tokenizer
        speculative["model"] = draft_source
        speculative["draft_tensor_parallel_size"] = opts["draft_tensor_parallel_size"]
        if pair_version.draft.revision:
            speculative["revision"] = pair_version.draft.revision
    elif config.method is SpecMethod.MTP:
        # No `model`: vLLM drafts with the target's own MTP layers, building the draft ModelConfig from
        # the target's path but with the speculative config's `revision` (None: the default branch;
        # vllm/config/speculative.py SpeculativeConfig.revision and __post_init__), so pin it too.
        if pair_version.target.revision:
            speculative["revision"] = pair_version.target.revision
    else:
        if config.prompt_lookup_min is not None:
            speculative["prompt_lookup_min"] = config.prompt_lookup_min
        if config.prompt_lookup_max is not None:
            speculative["prompt_lookup_max"] = config.prompt_lookup_max
    cutoff = config.max_batch_size_for_speculation
    if cutoff:
        # Ranges are inclusive and vLLM carries the last range's k to every larger batch size
        # (build_dynamic_sd_schedule_lookup), so "off above the cutoff" needs a last range with k = 0.
        schedule = [[1, cutoff, k]]
        if opts["max_num_seqs"] is None or opts["max_num_seqs"] > cutoff:
            schedule.append([cutoff + 1, max(opts["max_num_seqs"] or 0, cutoff + 1), 0])
        speculative["num_speculative_tokens_per_batch_size"] = schedule
    return speculative


def vllm_command(target_source: str, revision: str | None, speculative: dict[str, Any], served_name: str,
                 opts: dict[str, Any]) -> list[list[str]]:
    lines = [["vllm", "serve", target_source], ["--speculative-config", json.dumps(speculative)]]
    if revision:
        lines.append(["--revision", revision])
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--tensor-parallel-size", str(opts["tensor_parallel_size"])])
    if opts["max_num_seqs"] is not None:
        lines.append(["--max-num-seqs", str(opts["max_num_seqs"])])
    # The served name becomes the `model_name` label of the metrics observe and the rules filter on.
    lines.append(["--served-model-name", served_name])
    lines.append(["--host", str(opts["host"]), "--port", str(opts["port"])])
    return lines


def sglang_command(pair_version: PairVersion, target_source: str, draft_source: str | None, served_name: str,
                   opts: dict[str, Any]) -> list[list[str]] | None:
    k = pair_version.config.num_speculative_tokens
    lines = [["python", "-m", "sglang.launch_server"], ["--model-path", target_source]]
    if pair_version.target.revision:
        lines.append(["--revision", pair_version.target.revision])
    # ngram never reaches here (build_context refuses it: no faithful NGRAM mapping). NEXTN (MTP)
    # is SGLang's alias of EAGLE whose draft defaults to the target itself.
    method = pair_version.config.method
    algorithm = {SpecMethod.DRAFT_MODEL: "STANDALONE", SpecMethod.EAGLE3: "EAGLE3", SpecMethod.MTP: "NEXTN"}[method]
    lines.append(["--speculative-algorithm", algorithm])
    if draft_source is not None:
        lines.append(["--speculative-draft-model-path", draft_source])
        if pair_version.draft.revision:
            lines.append(["--speculative-draft-model-revision", pair_version.draft.revision])
    lines.append(["--speculative-num-steps", str(k)])
    lines.append(["--speculative-eagle-topk", "1"])
    # SGLang counts the verified root token among the draft tokens: with top-k 1 that is k + 1.
    lines.append(["--speculative-num-draft-tokens", str(k + 1)])
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--tp-size", str(opts["tensor_parallel_size"])])
    # /metrics (sglang:spec_accept_length / _rate, read by the alert rules and observe) is off by default.
    lines.append(["--enable-metrics"])
    lines.append(["--served-model-name", served_name])
    lines.append(["--host", str(opts["host"]), "--port", str(opts["port"])])
    return lines


def trtllm_command(target_source: str, opts: dict[str, Any]) -> list[list[str]]:
    lines = [["trtllm-serve", target_source], ["--config", "trtllm-config.yaml"]]
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--tp_size", str(opts["tensor_parallel_size"])])
    lines.append(["--host", str(opts["host"]), "--port", str(opts["port"])])
    return lines


def trtllm_config(pair_version: PairVersion, draft_source: str | None, overall: dict[str, Any],
                  opts: dict[str, Any]) -> dict[str, Any]:
    """The speculative_config mapping of a trtllm-serve YAML (TensorRT-LLM 1.2 LLM API)."""
    config = pair_version.config
    if config.method == SpecMethod.DRAFT_MODEL:
        speculative: dict[str, Any] = {
            "decoding_type": "DraftTarget",
            "max_draft_len": config.num_speculative_tokens,
            # the field of 1.2's DecodingBaseConfig (a strict model: `speculative_model` is refused there)
            "speculative_model_dir": draft_source,
        }
    elif config.method is SpecMethod.EAGLE3:
        # 1.2's from_dict knows "Eagle" (EagleDecodingConfig, whose eagle3_one_model mode is EAGLE-3)
        speculative = {"decoding_type": "Eagle", "max_draft_len": config.num_speculative_tokens,
                       "speculative_model_dir": draft_source, "eagle3_one_model": True}
    elif config.method is SpecMethod.MTP:
        # "N modules produce N draft tokens": head_refusal keeps k equal to the layer count
        speculative = {"decoding_type": "MTP", "num_nextn_predict_layers": config.num_speculative_tokens}
    else:
        speculative = {"decoding_type": "NGram", "max_draft_len": config.num_speculative_tokens}
        if config.prompt_lookup_max is not None:
            speculative["max_matching_ngram_size"] = config.prompt_lookup_max
    if config.max_batch_size_for_speculation:
        speculative["max_concurrency"] = config.max_batch_size_for_speculation
    tau = overall.get("mean_acceptance_length")
    if isinstance(tau, (int, float)):
        speculative["acceptance_length_threshold"] = trtllm_acceptance_threshold(tau, opts["tolerance"])
        speculative["acceptance_window"] = opts["acceptance_window"]
    return speculative


def trtllm_acceptance_threshold(mean_acceptance_length: float, tolerance: float) -> float:
    """TensorRT-LLM 1.2's SpeculationGate threshold for a baseline tau and a tolerance.

    The gate averages ``avg_decoded_tokens_per_iter - 1`` per completed request, i.e. accepted
    draft tokens per iteration without the bonus token, and turns speculation off for good below
    the threshold; our tau counts the bonus token, so the engine's baseline is tau - 1.
    """
    return round(max(0.0, mean_acceptance_length - 1.0) * (1.0 - tolerance), 6)


def head_refusal(pair_version: PairVersion, fmt: str) -> str | None:
    """Why format ``fmt`` cannot serve this eagle3 or mtp pair as registered (None: it can).

    Facts from the engines' released code (vLLM 0.33.0 and SGLang 0.5.23 wheels; TensorRT-LLM's
    llm_args.py source; see the README's engine table): vLLM has no static token tree for eagle3
    and builds MTP drafters only for the targets config/speculative.py hf_config_override
    rewrites; SGLang's EAGLE trees are dynamic top-k trees; TGI 3.3 does n-gram or Medusa only."""
    from specreg.core.heads.mtp import served_mtp_family

    config = pair_version.config
    if config.method not in (SpecMethod.EAGLE3, SpecMethod.MTP) or fmt == "prometheus-rules":
        return None
    if fmt == "tgi":
        return "TGI 3.3's --speculate does Medusa (from a combined repository) or n-gram only"
    if config.tree is not None:
        return ("the registered candidate tree is static; vLLM 0.33's eagle3 drafts a chain, SGLang 0.5.23 "
                "builds a dynamic top-k tree, and TensorRT-LLM's eagle_choices were not checked against its release")
    if config.method is SpecMethod.MTP:
        target = pair_version.target.fingerprint
        family = served_mtp_family(target.model_type, [target.architecture] if target.architecture else [])
        if family is None:
            return (f"no engine builds an MTP drafter for model_type {target.model_type!r} "
                    f"({target.architecture}): vLLM 0.33 rewrites only DeepSeek-V3/V3.2, GLM, MiMo, Qwen3-Next, "
                    f"Qwen3.5 and similar targets into MTP drafters (config/speculative.py hf_config_override)")
        if fmt in ("sglang", "trtllm") and family != "deepseek":
            return f"its NEXTN/MTP drafting is checked here for DeepSeek-family targets only, not {family}"
        layers = (config.head or {}).get("num_heads")
        if fmt == "trtllm" and layers is not None and config.num_speculative_tokens != layers:
            return (f"TensorRT-LLM's MTP drafts one token per MTP layer: k = {config.num_speculative_tokens} "
                    f"but the target has {layers}")
    return None


def tgi_command(pair_version: PairVersion, target_source: str, opts: dict[str, Any]) -> list[list[str]]:
    lines = [["text-generation-launcher"], ["--model-id", target_source]]
    if pair_version.target.revision:
        lines.append(["--revision", pair_version.target.revision])
    lines.append(["--speculate", str(pair_version.config.num_speculative_tokens)])
    if opts["tensor_parallel_size"] > 1:
        lines.append(["--num-shard", str(opts["tensor_parallel_size"])])
    lines.append(["--hostname", str(opts["host"]), "--port", str(opts["port"])])
    return lines


def dns_label(text: str, limit: int = 63) -> str:
    """A Kubernetes DNS-1123 label made from free text."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "specreg"


def k8s_context(pair_version: PairVersion, baselines: dict[str, Any] | None, approved: bool,
                speculative: dict[str, Any], opts: dict[str, Any], target_path: str,
                draft_path: str | None) -> dict[str, Any]:
    """Names, labels, annotations, resources and the model volume of the k8s-vllm manifest;
    target_path and draft_path are where the engine finds the models inside the container."""
    name = dns_label(f"{pair_version.name}-v{pair_version.version}")
    volume_kind, _, volume_name = str(opts["model_volume"] or "pvc:").partition(":")
    annotations = {
        "specreg.io/pair": pair_version.label,
        "specreg.io/approval": "approved" if approved else "UNAPPROVED",
        "specreg.io/binding-sha256": pair_version.binding_sha256,
        "specreg.io/target": pair_version.target.reference,
        "specreg.io/target-path": target_path,
        "specreg.io/target-weights-sha256": pair_version.target.fingerprint.weights_sha256,
        "specreg.io/target-tokenizer-sha256": pair_version.target.fingerprint.tokenizer_sha256 or "",
        "specreg.io/speculative-config": json.dumps(speculative, sort_keys=True),
        "specreg.io/baselines": json.dumps(baselines, sort_keys=True) if baselines else "none",
    }
    if pair_version.draft is not None:
        annotations["specreg.io/draft"] = pair_version.draft.reference
        if draft_path:
            annotations["specreg.io/draft-path"] = draft_path
        annotations["specreg.io/draft-weights-sha256"] = pair_version.draft.fingerprint.weights_sha256
        annotations["specreg.io/draft-tokenizer-sha256"] = pair_version.draft.fingerprint.tokenizer_sha256 or ""
    requests: dict[str, str] = {}
    memory = (baselines or {}).get("memory") or {}
    if isinstance(memory.get("total_bytes"), (int, float)) and memory["total_bytes"] > 0:
        # Host memory must at least hold both models' weights while the engine loads them.
        requests["memory"] = f"{math.ceil(memory['total_bytes'] / 2**20)}Mi"
        annotations["specreg.io/memory-estimate-bytes"] = str(int(memory["total_bytes"]))
    return {
        "name": name,
        "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "specreg",
                   "specreg.io/version": str(pair_version.version)},
        "annotations": annotations,
        "requests": requests,
        "limits": {"nvidia.com/gpu": str(opts["tensor_parallel_size"])},
        "volume": {"kind": volume_kind, "name": volume_name},
        "mount_path": opts["model_mount_path"],
        "target_path": target_path,
        "draft_path": draft_path,
    }


def alert_rules(pair_version: PairVersion, overall: dict[str, Any], thresholds: dict[str, float],
                served_name: str, opts: dict[str, Any]) -> list[dict[str, Any]]:
    """Alerting rules on the engines' own metrics, firing below baseline * (1 - tolerance).

    vLLM: alpha = rate(accepted) / rate(draft tokens), tau = 1 + rate(accepted) / rate(drafts).
    SGLang: its gauges already hold both figures. With no traffic the vLLM ratios are NaN and a
    comparison with NaN is false, so an idle server does not fire.
    """
    selector = "{model_name=" + promql_string(served_name) + "}"
    window = opts["rate_window"]

    def rate(metric: str) -> str:
        return f"sum(rate({metric}{selector}[{window}]))"

    expressions = {
        "vllm": {
            "acceptance_rate": f"{rate('vllm:spec_decode_num_accepted_tokens_total')}"
                               f" / {rate('vllm:spec_decode_num_draft_tokens_total')}",
            "mean_acceptance_length": f"1 + {rate('vllm:spec_decode_num_accepted_tokens_total')}"
                                      f" / {rate('vllm:spec_decode_num_drafts_total')}",
        },
        "sglang": {
            "acceptance_rate": f"avg(sglang:spec_accept_rate{selector})",
            "mean_acceptance_length": f"avg(sglang:spec_accept_length{selector})",
        },
    }
    engines = ("vllm", "sglang") if opts["rules_engine"] == "all" else (opts["rules_engine"],)
    alert_names = {"acceptance_rate": "SpecDecodeAcceptanceRateBelowBaseline",
                   "mean_acceptance_length": "SpecDecodeAcceptanceLengthBelowBaseline"}
    rules = []
    for engine in engines:
        for metric, floor in thresholds.items():
            rules.append({
                "alert": alert_names[metric],
                "expr": f"({expressions[engine][metric]}) < {floor}",
                "for": opts["for"],
                "labels": {"severity": "warning", "engine": engine, "specreg_pair": pair_version.name,
                           "specreg_version": str(pair_version.version)},
                "annotations": {
                    "summary": f"{pair_version.label}: live {metric} below its validated baseline on {engine}",
                    "description": (
                        f"{metric} of {served_name} has stayed below {floor} (baseline {overall[metric]}"
                        f" minus {opts['tolerance']:.0%}) for {opts['for']}; binding {pair_version.binding_sha256}"
                    ),
                    "baseline": str(overall[metric]),
                    "floor": str(floor),
                },
            })
    return rules
