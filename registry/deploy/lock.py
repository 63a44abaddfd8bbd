"""The pair lock (``specreg.lock.json``): what an export binds, signed, and checked again where
the engine is about to load the models.

The lock names the pair version and its binding hash, the sha256 of every file of the target
and draft directories, the speculative config, the engine the export is for, the recorded
baselines with their golden-set hash, the approvals and the audit chain head at export time.

Signature: the OpenSSF model-signing format, made by the ``model-signing`` library's own
signer: an in-toto Statement v1 (predicate ``https://model_signing/signature/v1.0``,
serialization ``files``/sha256) inside a DSSE envelope inside a Sigstore bundle. Its
resources are ``specreg.lock.json`` (sha256 of the lock's canonical JSON without the
``signature`` field), ``target/<file>`` and ``draft/<file>``. The library hashes a model
directory itself when it signs; we hand it the digests specreg.core.digests.sha256_file computed
instead (the same sha256 of each whole file), so a deploy reads each weight file once. The
same signature therefore verifies with model-signing's own verifier over a directory holding
``specreg.lock.json`` (that canonical JSON), ``target/`` and ``draft/`` (see the tests).

Keys: ECDSA on P-256 (the curves model-signing 1.1's key signer accepts are P-256/384/521;
it has no Ed25519). Nothing here imports torch, transformers or mlflow: ``specreg verify``
runs in a slim init container.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from specreg.core.digests import canonical_json, sha256_file, sha256_hex
from specreg.core.signing import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, load_signer, model_signing_package
from specreg.errors import ModelReferenceError

__all__ = ["PRIVATE_KEY_FILE", "PUBLIC_KEY_FILE"]
LOCK_FILE = "specreg.lock.json"
LOCK_FORMAT = "specreg.lock/v1"
ROLES = ("target", "draft")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# Not part of what an engine loads: VCS metadata (model-signing ignores the same by default)
# and the download metadata `huggingface-cli download --local-dir` leaves in .cache/.
IGNORED_NAMES = (".git", ".gitattributes", ".github", ".gitignore", ".cache")


# --- the files of a model directory -------------------------------------------------------

def list_model_files(directory: str | Path) -> dict[str, Path]:
    """Every file under ``directory`` (recursively, IGNORED_NAMES left out) by its relative
    POSIX path, sorted. Symlinked files count by their content (Hugging Face cache snapshots
    are symlinks into blobs/); a symlinked directory, a broken link or a special file is an
    error (ModelReferenceError)."""
    root = Path(directory)
    if not root.is_dir():
        raise ModelReferenceError(f"{root}: not a directory")
    found: dict[str, Path] = {}
    for current, dirs, names in os.walk(root):
        here = Path(current)
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_NAMES)
        for name in dirs:
            if (here / name).is_symlink():
                raise ModelReferenceError(f"{here / name}: a symlinked directory inside a model is not supported")
        for name in names:
            if name in IGNORED_NAMES:
                continue
            path = here / name
            if not path.is_file():
                raise ModelReferenceError(f"{path}: not a regular file (broken link or special file)")
            found[path.relative_to(root).as_posix()] = path
    return dict(sorted(found.items()))


def file_set_changes(version) -> list[str]:
    """The files added to or missing from each model directory since registration, by name
    (empty: the same set, or a version registered before file lists were recorded)."""
    changes: list[str] = []
    for role, recorded in (version.model_files or {}).items():
        model = getattr(version, role)
        now = set(list_model_files(model.path))
        changes += [f"{role} file {name} was added" for name in sorted(now - set(recorded))]
        changes += [f"{role} file {name} is missing" for name in sorted(set(recorded) - now)]
    return changes


def model_files(directory: str | Path) -> dict[str, str]:
    """sha256 (hex) of every file list_model_files finds, by relative path."""
    return {name: sha256_file(path) for name, path in list_model_files(directory).items()}


# --- building and signing the lock --------------------------------------------------------

def build_lock(version, *, engine: dict[str, Any] | None, baselines: dict[str, Any] | None,
               approvals: list[dict[str, Any]], audit_head: dict[str, Any], approved: bool,
               exported_by: str, approval_policy: dict[str, Any] | None = None,
               draft_layout: tuple[str, dict[str, str]] | None = None,
               engine_layouts: dict[str, tuple[str, dict[str, str]]] | None = None) -> dict[str, Any]:
    """The unsigned lock of a PairVersion (``signed: false``, ``signature: null``).

    Hashes every file of the models at their registered paths. The caller has checked that
    the models still match their registered fingerprints (governance.queries.fingerprint_changes).
    ``draft_layout``: (folder, {file: sha256}) when the engine loads the head from a layout the
    export writes (exports.draft_layout: SGLang's EAGLE-3); the lock then binds those files, and
    `verify --draft` is given that folder. ``engine_layouts``: the same for any role, by role
    (llamacpp's GGUF files, engines/llamacpp.write_models: `verify --target/--draft` get gguf/<role>)."""
    models: dict[str, Any] = {}
    for role in ROLES:
        model = getattr(version, role)
        if model is None:
            continue
        fingerprint = model.fingerprint
        models[role] = {
            "reference": model.reference,
            "revision": model.revision,
            "registered_path": model.path,
            "weights_sha256": fingerprint.weights_sha256,
            "config_sha256": fingerprint.config_sha256,
            "tokenizer_sha256": fingerprint.tokenizer_sha256,
            "chat_template_sha256": fingerprint.chat_template_sha256,
            "files": model_files(model.path),
        }
        if role == "draft" and draft_layout is not None:
            models[role]["layout"], models[role]["files"] = draft_layout
        if engine_layouts and role in engine_layouts:
            models[role]["layout"], models[role]["files"] = engine_layouts[role]
    return {
        "lock_format": LOCK_FORMAT,
        "pair": {"name": version.name, "version": version.version, "label": version.label,
                 "state": version.state.value, "binding_sha256": version.binding_sha256,
                 "registered_by": version.registered_by,
                 "registered_at": version.registered_at.isoformat(timespec="seconds") + "Z"},
        "approved": approved,
        "speculative_config": version.config.to_dict(),
        "engine": engine,
        "models": models,
        "baselines": baselines,
        "approvals": approvals,  # each with the approver's signature (governance/signatures.py)
        "approval_policy": approval_policy,  # environment, approvals_required, approvers, policy_sha256
        "exported": {},  # engine file -> digest (exported_digests), filled in before signing
        "audit_head": audit_head,
        "exported_by": exported_by,
        "exported_at": datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds") + "Z",
        "signed": False,
        "signature": None,
    }


def lock_body(lock: dict[str, Any]) -> dict[str, Any]:
    """What the signature covers: the lock without its ``signature`` field."""
    return {key: value for key, value in lock.items() if key != "signature"}


def statement_manifest(lock: dict[str, Any]):
    """The model-signing Manifest the signature is over: the lock body and every model file."""
    model_signing_package()
    from model_signing import manifest
    from model_signing._hashing.hashing import Digest

    def item(name: str, hex_digest: str):
        return manifest.FileManifestItem(path=PurePosixPath(name), digest=Digest("sha256", bytes.fromhex(hex_digest)))

    items = [item(LOCK_FILE, sha256_hex(canonical_json(lock_body(lock))))]
    for role, model in lock["models"].items():
        items += [item(f"{role}/{name}", digest) for name, digest in model["files"].items()]
    ignored = [f"{role}/{name}" for role in lock["models"] for name in IGNORED_NAMES]
    serialization = manifest._FileSerialization("sha256", allow_symlinks=True, ignore_paths=ignored)
    return manifest.Manifest(lock["pair"]["label"], items, serialization)


def sign_lock(lock: dict[str, Any], private_key: str | Path) -> dict[str, Any]:
    """The lock with ``signed: true`` and ``signature``: a Sigstore bundle (JSON) made by
    model-signing's elliptic-key signer over statement_manifest()."""
    model_signing_package()
    from model_signing._signing import signing

    signer = load_signer(private_key)
    signed = {**lock, "signed": True}
    bundle = signer.sign(signing.Payload(statement_manifest(signed)))
    return {**signed, "signature": json.loads(bundle.bundle.to_json())}


def exported_digests(files: list[tuple[str, str]]) -> dict[str, Any]:
    """What the lock records of the engine files an export wrote: the sha256
    of each file's text; for a Kubernetes manifest (``.yaml`` holding a Deployment) the sha256
    of each pod container's image, command and args instead, by container name, and of each
    ConfigMap file but the lock (the engine's arguments), as "ConfigMap NAME/FILE" (the manifest
    also carries the lock itself, so its bytes cannot be under the lock's signature)."""
    recorded: dict[str, Any] = {}
    for name, text in files:
        if name == LOCK_FILE:
            continue
        containers = manifest_containers(text) if name.endswith((".yaml", ".yml")) else None
        recorded[name] = containers if containers else sha256_hex(text.encode("utf-8"))
    return recorded


def manifest_containers(text: str) -> dict[str, str] | None:
    """container name -> sha256 of its canonical {image, command, args} for every container and
    initContainer of the Deployments in a Kubernetes manifest, "ConfigMap NAME/FILE" -> sha256 of
    every ConfigMap file but the lock; None when it holds no Deployment."""
    import yaml

    from specreg.core.documents import yaml_problem

    try:
        if yaml_problem(text):
            return None
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return None
    found: dict[str, str] = {}
    files: dict[str, str] = {}
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == "ConfigMap":
            name = (document.get("metadata") or {}).get("name")
            for key, value in (document.get("data") or {}).items():
                if key != LOCK_FILE:
                    files[f"ConfigMap {name}/{key}"] = sha256_hex(str(value).encode("utf-8"))
        if not isinstance(document, dict) or document.get("kind") != "Deployment":
            continue
        pod = (((document.get("spec") or {}).get("template") or {}).get("spec") or {})
        for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
            if isinstance(container, dict):
                what = {key: container.get(key) for key in ("image", "command", "args")}
                found[str(container.get("name"))] = sha256_hex(canonical_json(what))
    return {**found, **files} if found else None


def lock_text(lock: dict[str, Any]) -> str:
    return json.dumps(lock, indent=2, ensure_ascii=False) + "\n"


