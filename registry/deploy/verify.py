"""`specreg verify`: a pair lock checked again where the engine is about to load the models,
without trusting the registry database: the lock's signature, the approvers' signatures it
carries against the keyring file the platform mounts (with the policy's threshold), the
exported engine files (``--config``), optionally the registry, then every model file (stat
before and after hashing: a file replaced while it is read is a mismatch)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreg.core.files import read_bounded, read_text_bounded
from specreg.core.digests import sha256_file
from specreg.core.signing import model_signing_package
from specreg.errors import SpecregError, UsageError
from specreg.registry.deploy.lock import (LOCK_FILE, LOCK_FORMAT, ROLES, SHA256_HEX, exported_digests,
                                          list_model_files, statement_manifest)

MAX_LOCK_BYTES = 64 * 1024 * 1024  # a lock names every model file: thousands of lines, never gigabytes
MAX_INTEGER_DIGITS = 20  # versions and counts: a 5000-digit integer is not one


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


def bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def read_lock(path: str | Path) -> dict[str, Any]:
    """Parse a lock file; SpecregError when it is not readable JSON or not a specreg lock. At
    most MAX_LOCK_BYTES are read (a bigger file is refused, never read whole), integers are at
    most MAX_INTEGER_DIGITS long and nesting is bounded by the parser's recursion limit."""
    lock_path = Path(path)
    data = read_bounded(lock_path, MAX_LOCK_BYTES, "lock")
    try:
        lock = json.loads(data.decode("utf-8"), parse_int=bounded_int)
    except RecursionError:
        raise SpecregError(f"lock {lock_path}: not readable JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as exc:
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

    from specreg.core.files import check_regular_file
    from specreg.core.signing import MAX_KEY_BYTES

    check_regular_file(public_key, MAX_KEY_BYTES, "public key")
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


def check_approvals(report: VerifyReport, lock: dict[str, Any], keyring_path: Path) -> bool:
    """The approvers' signatures the lock carries, checked against the keyring file (not the
    registry): enough people other than the registrant approved since the newest rejection."""
    from specreg.registry.governance.signatures import check_decision, read_keyring_file, tally

    keyring, file_threshold = read_keyring_file(keyring_path)
    pair = lock["pair"]
    policy = lock.get("approval_policy") if isinstance(lock.get("approval_policy"), dict) else {}
    threshold = max(int(policy.get("approvals_required") or 1), file_threshold or 1)
    scope = policy.get("environment") if policy.get("environment") not in (None, "*") else None
    approvers = tuple(a for a in policy.get("approvers") or () if isinstance(a, str))
    decisions, refused = [], []
    for index, approval in enumerate(lock.get("approvals") or []):
        who = approval.get("actor") if isinstance(approval, dict) else None
        try:
            decisions.append(check_decision(approval.get("signature") if isinstance(approval, dict) else None,
                                            keyring, pair=pair["name"], version=pair["version"],
                                            binding_sha256=pair["binding_sha256"]))
        except ValueError as exc:
            refused.append(f"approvals[{index}] by {who}: {exc}")
    result = tally(decisions, registrant=str(pair.get("registered_by")), approvers=approvers, scope=scope,
                   threshold=threshold, what=pair["label"])
    detail = result.reason + (f" (keyring {keyring_path})" if result.passed else "")
    if refused:
        detail += "; not counted: " + "; ".join(refused)
    return report.add("approvals", result.passed, detail)


def check_registry(report: VerifyReport, lock: dict[str, Any], registry_url: str, environment: str | None) -> bool:
    """The version still exists with the same binding, is not retired, no signed rejection
    withdrew its approval since, and (with ``environment``) still holds that environment. A
    SQLite file that does not exist is an error, never created."""
    from specreg.errors import NotFoundError
    from specreg.registry.governance.approvals import rejection_standing
    from specreg.registry.governance.queries import holder_of
    from specreg.registry.store.database import sqlite_file
    from specreg.registry.store.entities import PairState
    from specreg.registry.store.store import Store

    try:
        database_file = sqlite_file(registry_url)
    except ValueError:  # any unparsable URL is the user's: one line
        raise SpecregError(f"--registry {registry_url!r} is not a database URL") from None
    if database_file is not None and not database_file.is_file():
        raise SpecregError(f"--registry {registry_url}: no such database file (verify never creates one)")
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
    if lock.get("approved") is True:
        rejecter = rejection_standing(store, pair["name"], pair["version"])
        if rejecter is not None:
            return report.add("registry", False, f"{label}: its approval was withdrawn by a signed rejection by "
                                                 f"{rejecter} after the export")
    if environment is not None:
        holder = holder_of(store, pair["name"], environment)
        if holder != pair["version"]:
            now = f"{pair['name']}@{holder}" if holder is not None else "no version"
            return report.add("registry", False, f"{label} no longer holds {environment} ({now} does)")
        return report.add("registry", True, f"{label} is {version.state.value} and holds {environment}")
    return report.add("registry", True, f"{label} is {version.state.value} (not retired)")


def check_configs(report: VerifyReport, lock: dict[str, Any], configs: list[Path]) -> bool:
    """Each exported engine file given matches the digest the lock records for it (a serve
    script or config by its bytes, a Kubernetes manifest by each container's image, command
    and args)."""
    recorded = lock.get("exported") if isinstance(lock.get("exported"), dict) else {}
    for path in configs:
        name = path.name
        text = read_text_bounded(path, MAX_LOCK_BYTES, "--config")
        if name not in recorded:
            return report.add("configs", False, f"{name} is not an engine file this lock's export wrote "
                                                f"(recorded: {', '.join(sorted(recorded)) or 'none'})", name)
        now = exported_digests([(name, text)]).get(name)
        if now != recorded[name]:
            return report.add("configs", False, f"{name} differs from what was signed at export"
                                                + describe_difference(recorded[name], now), name)
    return report.add("configs", True, f"{len(configs)} engine file(s) match the lock")


def describe_difference(recorded: Any, now: Any) -> str:
    if isinstance(recorded, dict) and isinstance(now, dict):
        changed = sorted(k for k in recorded.keys() | now.keys() if recorded.get(k) != now.get(k))
        files = [k.removeprefix("ConfigMap ") for k in changed if k.startswith("ConfigMap ")]
        containers = [k for k in changed if not k.startswith("ConfigMap ")]
        parts = ([f"container(s) {', '.join(containers)}"] if containers else []) + \
                ([f"ConfigMap file(s) {', '.join(files)}"] if files else [])
        return f" ({'; '.join(parts)})"
    return " (sha256)"


def file_identity(path: Path) -> tuple[int, int, int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def check_files(report: VerifyReport, role: str, recorded: dict[str, str], directory: Path,
                seen: dict[str, tuple[Path, tuple[int, int, int, int]]]) -> bool:
    """Compare the files of ``directory`` with the lock: names first (no hashing), then the
    digests in name order, stopping at the first difference. Each file is stat'ed (device,
    inode, size, mtime_ns) before and after it is hashed: a file replaced or written while it
    was read is a mismatch, whatever its digest came out as. ``seen`` collects each file's
    identity for check_unchanged, which stats them all again once everything is hashed."""
    on_disk = list_model_files(directory)
    for name in sorted(recorded.keys() ^ on_disk.keys()):
        if name in recorded:
            return report.add(f"{role}_files", False, f"{role} file {name} is missing from {directory}", f"{role}/{name}")
        return report.add(f"{role}_files", False, f"{role} file {name} in {directory} is not in the lock",
                          f"{role}/{name}")
    for name, path in on_disk.items():
        try:
            before = file_identity(path)
            digest = sha256_file(path)
            after = file_identity(path)
        except FileNotFoundError:
            return report.add(f"{role}_files", False, f"{role} file {name} disappeared while it was verified",
                              f"{role}/{name}")
        except OSError as exc:  # e.g. shards written 0600 by another user than the one verify runs as
            raise SpecregError(f"{role} file {path}: cannot read ({exc.strerror or exc}) as uid {os.getuid()}: "
                               "the user that verifies (and serves) needs read access to the model files") from None
        if before != after:
            return report.add(f"{role}_files", False, f"{role} file {name} changed while it was verified "
                                                      f"(inode, size or mtime): refusing", f"{role}/{name}")
        seen[f"{role}/{name}"] = (path, after)
        if digest != recorded[name]:
            return report.add(f"{role}_files", False, f"{role} file {name} differs from the lock (sha256)",
                              f"{role}/{name}")
    return report.add(f"{role}_files", True, f"{len(recorded)} file(s) in {directory} match the lock")


def verify_lock(lock_path: str | Path, *, public_key: str | Path | None, target: str | Path,
                draft: str | Path | None = None, registry_url: str | None = None, environment: str | None = None,
                allow_unsigned: bool = False, allow_unapproved: bool = False, keyring: str | Path | None = None,
                configs: list[str | Path] = ()) -> VerifyReport:
    """Check a lock against the directories an engine is about to load.

    In order, stopping at the first failure: the signature (model-signing bundle over the lock
    body and the file digests), the lock records an approved export whose approvers' signatures
    verify against ``keyring`` (the platform's keyring file) with the policy's threshold, the
    exported engine files ``configs``, the registry (with ``registry_url``: same binding, not
    retired, not rejected since, holds ``environment``), then the files of ``target`` and
    ``draft``. Returns the VerifyReport (``passed``: all matched).
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
    if lock.get("approved") is True and report.signed and keyring is None and not allow_unapproved:
        raise UsageError("the lock records an approved export: pass --keyring FILE (the approvers' public keys, "
                         "`specreg keys export`) to check its approvers' signatures")
    if lock.get("approved") is not True:
        if not report.add("approved", allow_unapproved,
                          "lock records an UNAPPROVED export (--force)"
                          + (" (accepted with --allow-unapproved)" if allow_unapproved else "")):
            return report
    elif keyring is not None and not check_approvals(report, lock, Path(keyring).expanduser()):
        return report
    if configs and not check_configs(report, lock, [Path(c) for c in configs]):
        return report
    if registry_url is not None and not check_registry(report, lock, registry_url, environment):
        return report
    seen: dict[str, tuple[Path, tuple[int, int, int, int]]] = {}
    for role, directory in (("target", target), ("draft", draft)):
        if role in models and not check_files(report, role, models[role]["files"], Path(directory), seen):
            return report
    check_unchanged(report, seen)
    return report


def check_unchanged(report: VerifyReport, seen: dict[str, tuple[Path, tuple[int, int, int, int]]]) -> bool:
    """Every file hashed is still the file that was hashed (same device, inode, size, mtime_ns)
    once all are hashed: one replaced after its own hash but before verify ends is refused."""
    for name, (path, identity) in seen.items():
        try:
            now = file_identity(path)
        except FileNotFoundError:
            now = None
        if now != identity:
            return report.add("unchanged", False, f"{name} was replaced or changed after it was hashed, while "
                                                  f"verify ran: refusing", name)
    return report.add("unchanged", True, f"{len(seen)} file(s) unchanged since they were hashed")
