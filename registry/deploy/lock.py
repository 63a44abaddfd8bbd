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
directory itself when it signs; we hand it the digests fingerprint.sha256_file computed
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
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from specreg.errors import ModelReferenceError, PathTooLongError, SpecregError, UsageError
from specreg.core.fingerprint import canonical_json, sha256_file, sha256_hex

LOCK_FILE = "specreg.lock.json"
LOCK_FORMAT = "specreg.lock/v1"
PRIVATE_KEY_FILE = "specreg-signing.key"
PUBLIC_KEY_FILE = "specreg-signing.pub"
ROLES = ("target", "draft")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# Not part of what an engine loads: VCS metadata (model-signing ignores the same by default)
# and the download metadata `huggingface-cli download --local-dir` leaves in .cache/.
IGNORED_NAMES = (".git", ".gitattributes", ".github", ".gitignore", ".cache")


# --- the model-signing library ----------------------------------------------------------

MODEL_SIGNING_PUBLIC = ("hashing", "manifest", "signing", "verifying")


def model_signing_package():
    """Import ``model_signing`` without running its ``__init__`` when nothing has imported it yet.

    Its ``__init__`` eagerly imports every signer, including the keyless Sigstore client
    (sigstore, tuf, requests) and the certificate signer (pyOpenSSL), which a key signature
    never uses: measured, more than half the start time of `specreg verify`. The package object
    put in sys.modules is the real package directory (its real submodules load from it) and
    imports the public submodules, and ``__version__``, on first attribute access."""
    import sys

    if "model_signing" in sys.modules:
        return sys.modules["model_signing"]
    import importlib
    import importlib.util
    import types

    spec = importlib.util.find_spec("model_signing")
    if spec is None or not spec.submodule_search_locations:
        raise SpecregError("the model-signing package is not installed (pip install 'model-signing>=1.1.1,<1.2')")
    package = types.ModuleType("model_signing")
    package.__spec__, package.__path__, package.__file__ = spec, list(spec.submodule_search_locations), spec.origin

    def lazy_attribute(name: str):
        if name in MODEL_SIGNING_PUBLIC:
            return importlib.import_module(f"model_signing.{name}")
        if name == "__version__":
            from importlib.metadata import version

            return version("model-signing")
        raise AttributeError(f"module 'model_signing' has no attribute {name!r}")

    package.__getattr__ = lazy_attribute
    sys.modules["model_signing"] = package
    return package


# --- keys --------------------------------------------------------------------------------

def create_key_pair(out_dir: str | Path) -> tuple[Path, Path]:
    """Write a new ECDSA P-256 key pair into ``out_dir``: the private key (PKCS#8 PEM, mode 0600)
    and the public key (SubjectPublicKeyInfo PEM). Refuses to overwrite either file.
    Returns (private key path, public key path)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(out_dir).expanduser()
    private_path, public_path = out / PRIVATE_KEY_FILE, out / PUBLIC_KEY_FILE
    PathTooLongError.refuse(out)  # before mkdir makes a folder on the way
    if out.is_symlink() and not out.exists():
        raise UsageError(f"--out {out}: a symlink to {os.readlink(out)}, which does not exist")
    for path in (private_path, public_path):
        if os.path.lexists(path):  # a dangling symlink too: O_EXCL below would refuse it with a traceback
            what = f"is a symlink to {os.readlink(path)}" if path.is_symlink() else "exists"
            raise SpecregError(f"{path} {what}; refusing to overwrite a signing key")
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    # O_EXCL: a file created between the check above and here is still not overwritten;
    # the mode is set at creation, so the private key is never readable by others.
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private_pem)
    descriptor = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(public_pem)
    return private_path, public_path


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


def model_files(directory: str | Path) -> dict[str, str]:
    """sha256 (hex) of every file list_model_files finds, by relative path."""
    return {name: sha256_file(path) for name, path in list_model_files(directory).items()}


# --- building and signing the lock --------------------------------------------------------

def build_lock(version, *, engine: dict[str, Any] | None, baselines: dict[str, Any] | None,
               approvals: list[dict[str, Any]], audit_head: dict[str, Any], approved: bool,
               exported_by: str, draft_layout: tuple[str, dict[str, str]] | None = None,
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
        "approvals": approvals,
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
    from model_signing._signing import sign_ec_key, signing

    key_path = Path(private_key).expanduser()
    if not key_path.is_file():
        raise SpecregError(f"signing key {key_path}: no such file")
    try:
        signer = sign_ec_key.Signer(key_path)
    except (ValueError, TypeError, AttributeError) as exc:
        # TypeError: an encrypted key; AttributeError/ValueError: not an EC P-256/384/521 key
        raise SpecregError(f"signing key {key_path}: not an unencrypted ECDSA P-256/384/521 private key "
                           f"in PEM ({type(exc).__name__}: {exc})") from None
    signed = {**lock, "signed": True}
    bundle = signer.sign(signing.Payload(statement_manifest(signed)))
    return {**signed, "signature": json.loads(bundle.bundle.to_json())}


def lock_text(lock: dict[str, Any]) -> str:
    return json.dumps(lock, indent=2, ensure_ascii=False) + "\n"


# --- verification ---------------------------------------------------------------------------

@dataclass
class VerifyReport:
    """The outcome of verify_lock: the checks run, in order, up to the first that failed."""

    pair: str | None
    signed: bool
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check["passed"] for check in self.checks)

    @property
    def failure(self) -> dict[str, Any] | None:
        return next((check for check in self.checks if not check["passed"]), None)

    def add(self, name: str, passed: bool, detail: str, file: str | None = None) -> bool:
        self.checks.append({"name": name, "passed": passed, "detail": detail, "file": file})
        return passed

    def to_dict(self) -> dict[str, Any]:
        failure = self.failure
        return {"pair": self.pair, "verdict": "match" if self.passed else "mismatch", "signed": self.signed,
                "reason": failure["detail"] if failure else None, "file": failure["file"] if failure else None,
                "checks": self.checks}


def read_lock(path: str | Path) -> dict[str, Any]:
    """Parse a lock file; SpecregError when it is not readable JSON or not a specreg lock."""
    lock_path = Path(path)
    try:
        lock = json.loads(lock_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecregError(f"lock {lock_path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecregError(f"lock {lock_path}: not readable JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(lock, dict) or lock.get("lock_format") != LOCK_FORMAT:
        raise SpecregError(f"lock {lock_path}: not a {LOCK_FORMAT} lock file")
    try:
        pair = lock["pair"]
        if not (isinstance(pair["name"], str) and isinstance(pair["version"], int) and isinstance(pair["label"], str)
                and isinstance(pair["binding_sha256"], str)):
            raise TypeError("pair needs name, version, label and binding_sha256")
        if not set(lock["models"]) <= set(ROLES) or "target" not in lock["models"]:
            raise KeyError("models must be target and optionally draft")
        for role, model in lock["models"].items():
            for name, digest in model["files"].items():
                if not (isinstance(digest, str) and SHA256_HEX.fullmatch(digest)):
                    raise ValueError(f"{role} file {name}: {digest!r} is not a sha256")
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SpecregError(f"lock {lock_path}: malformed ({type(exc).__name__}: {exc})") from None
    return lock


def signed_manifest(lock: dict[str, Any], public_key: Path):
    """Verify the lock's bundle with model-signing's elliptic-key verifier; returns the
    Manifest it signs. ValueError (or cryptography's InvalidSignature) when it does not verify;
    SpecregError when the public key file cannot be used."""
    model_signing_package()
    from model_signing._signing import sign_ec_key, sign_sigstore_pb

    try:
        verifier = sign_ec_key.Verifier(public_key)
    except FileNotFoundError:
        raise SpecregError(f"public key {public_key}: no such file") from None
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise SpecregError(f"public key {public_key}: not an ECDSA P-256/384/521 public key in PEM "
                           f"({type(exc).__name__}: {exc})") from None
    with tempfile.TemporaryDirectory() as tmp:
        # the library reads a bundle from a file (and normalises older bundle layouts there)
        bundle_path = Path(tmp) / "bundle.json"
        bundle_path.write_text(json.dumps(lock["signature"]), encoding="utf-8")
        signature = sign_sigstore_pb.Signature.read(bundle_path)
    return verifier.verify(signature)


def manifest_difference(signed, expected) -> str | None:
    """The first resource where two manifests differ (None: equal)."""
    signed_items = {d.identifier: d.digest.digest_hex for d in signed.resource_descriptors()}
    expected_items = {d.identifier: d.digest.digest_hex for d in expected.resource_descriptors()}
    for name in sorted(signed_items.keys() | expected_items.keys()):
        if signed_items.get(name) != expected_items.get(name):
            return name
    if signed.serialization_type != expected.serialization_type:
        return "serialization"
    return None


def check_signature(report: VerifyReport, lock: dict[str, Any], public_key: Path | None,
                    allow_unsigned: bool) -> bool:
    if lock.get("signature") is None:
        if allow_unsigned:
            return report.add("signature", True, "lock is unsigned (accepted with --allow-unsigned): "
                                                  "files are checked, their origin is not")
        return report.add("signature", False, "lock is unsigned; refusing it (--allow-unsigned accepts "
                                               "an unsigned lock, checking files only)")
    if public_key is None:
        raise UsageError("the lock is signed: pass --public-key KEY to verify it")
    if lock.get("signed") is not True:
        return report.add("signature", False, "lock carries a signature but says signed: false (edited)")
    try:
        manifest = signed_manifest(lock, public_key)
    except SpecregError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to verify is a refusal with its reason
        message = str(exc).strip() or type(exc).__name__
        if type(exc).__name__ == "InvalidSignature":
            message = "signature does not match the signed statement"
        return report.add("signature", False, f"signature does not verify with {public_key}: {message}")
    difference = manifest_difference(manifest, statement_manifest(lock))
    if difference == LOCK_FILE:
        return report.add("signature", False, "the lock was changed after it was signed "
                                               "(its content no longer matches the signed digest)", LOCK_FILE)
    if difference is not None:
        return report.add("signature", False, f"the lock's file list differs from the signed one at {difference}",
                          difference)
    return report.add("signature", True, f"signed statement verified with {public_key}")


def check_registry(report: VerifyReport, lock: dict[str, Any], registry_url: str, environment: str | None) -> bool:
    """The version still exists with the same binding, is not retired and (with ``environment``)
    still holds that environment."""
    from specreg.errors import NotFoundError
    from specreg.registry.governance.queries import holder_of
    from specreg.registry.store.entities import PairState
    from specreg.registry.store.store import Store

    pair = lock["pair"]
    label = pair["label"]
    store = Store(registry_url, auto_create=False)
    try:
        version = store.get_version(pair["name"], pair["version"])
    except NotFoundError as exc:
        return report.add("registry", False, f"{label}: not in the registry ({exc})")
    if version.binding_sha256 != pair["binding_sha256"]:
        return report.add("registry", False, f"{label}: the registry's binding {version.binding_sha256[:12]} is "
                                             f"not the lock's {pair['binding_sha256'][:12]}")
    if version.state is PairState.RETIRED:
        return report.add("registry", False, f"{label} is retired in the registry")
    if environment is not None:
        holder = holder_of(store, pair["name"], environment)
        if holder != pair["version"]:
            now = f"{pair['name']}@{holder}" if holder is not None else "no version"
            return report.add("registry", False, f"{label} no longer holds {environment} ({now} does)")
        return report.add("registry", True, f"{label} is {version.state.value} and holds {environment}")
    return report.add("registry", True, f"{label} is {version.state.value} (not retired)")


def check_files(report: VerifyReport, role: str, recorded: dict[str, str], directory: Path) -> bool:
    """Compare the files of ``directory`` with the lock: names first (no hashing), then the
    digests in name order, stopping at the first difference."""
    on_disk = list_model_files(directory)
    for name in sorted(recorded.keys() ^ on_disk.keys()):
        if name in recorded:
            return report.add(f"{role}_files", False, f"{role} file {name} is missing from {directory}", f"{role}/{name}")
        return report.add(f"{role}_files", False, f"{role} file {name} in {directory} is not in the lock",
                          f"{role}/{name}")
    for name, path in on_disk.items():
        if sha256_file(path) != recorded[name]:
            return report.add(f"{role}_files", False, f"{role} file {name} differs from the lock (sha256)",
                              f"{role}/{name}")
    return report.add(f"{role}_files", True, f"{len(recorded)} file(s) in {directory} match the lock")


def verify_lock(lock_path: str | Path, *, public_key: str | Path | None, target: str | Path,
                draft: str | Path | None = None, registry_url: str | None = None, environment: str | None = None,
                allow_unsigned: bool = False, allow_unapproved: bool = False) -> VerifyReport:
    """Check a lock against the directories an engine is about to load.

    In order, stopping at the first failure: the signature (model-signing bundle over the lock
    body and the file digests), the lock records an approved export, the registry (with
    ``registry_url``: same binding, not retired, holds ``environment``), then the files of
    ``target`` and ``draft``. Returns the VerifyReport (``passed``: all matched).
    Raises UsageError for arguments that do not fit the lock, SpecregError for unreadable input."""
    if environment is not None and registry_url is None:
        raise UsageError("--env needs --registry URL (the environment is looked up in the registry)")
    lock = read_lock(lock_path)
    models = lock["models"]
    if "draft" in models and draft is None:
        raise UsageError(f"the lock binds a draft model ({models['draft']['reference']}): pass --draft DIR")
    if "draft" not in models and draft is not None:
        raise UsageError("the lock binds no draft model (method ngram): do not pass --draft")
    report = VerifyReport(pair=lock["pair"]["label"], signed=lock.get("signature") is not None)
    key_path = Path(public_key).expanduser() if public_key is not None else None
    if not check_signature(report, lock, key_path, allow_unsigned):
        return report
    if lock.get("approved") is not True:
        if not report.add("approved", allow_unapproved,
                          "lock records an UNAPPROVED export (--force)"
                          + (" (accepted with --allow-unapproved)" if allow_unapproved else "")):
            return report
    if registry_url is not None and not check_registry(report, lock, registry_url, environment):
        return report
    for role, directory in (("target", target), ("draft", draft)):
        if role in models and not check_files(report, role, models[role]["files"], Path(directory)):
            return report
    return report
