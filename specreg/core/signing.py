"""Keys and DSSE signatures, one way for everything specreg signs: the pair lock and approvals.

Keys are ECDSA P-256 (``create_key_pair``; model-signing 1.1's key signer takes P-256/384/521,
not Ed25519). A signature is a Sigstore bundle holding a DSSE envelope over an in-toto
Statement v1, made and checked by model-signing's own elliptic-key signer and verifier
(``model_signing._signing.sign_ec_key``). The lock signs model-signing's own predicate (its
manifest of file digests, registry/deploy/lock.py); an approval signs specreg's predicate
(``sign_statement`` / ``verified_statement``, registry/governance/signatures.py).

A key is named by its id: the sha256 (hex) of its public key in SubjectPublicKeyInfo PEM, the
value model-signing puts in a bundle's ``verificationMaterial.publicKey.hint``.

cryptography and model-signing are imported inside the functions (core stays light).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from specreg.errors import PathTooLongError, SpecregError, UsageError

PRIVATE_KEY_FILE = "specreg-signing.key"
PUBLIC_KEY_FILE = "specreg-signing.pub"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
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

    from specreg.core.files import write_fresh

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
    # overwrite=False: a file created between the check above and here is still not overwritten;
    # the mode is set before the key is written, so the private key is never readable by others
    write_fresh(private_path, private_pem, "signing key", mode=0o600, overwrite=False)
    write_fresh(public_path, public_pem, "public key", mode=0o644, overwrite=False)
    return private_path, public_path


def public_key_pem(text: str | bytes, what: str) -> str:
    """``text`` as a normalised SubjectPublicKeyInfo PEM of an ECDSA P-256/384/521 public key;
    SpecregError naming ``what`` otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = text.encode() if isinstance(text, str) else text
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise SpecregError(f"{what}: not a public key in PEM ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in ("secp256r1", "secp384r1", "secp521r1"):
        raise SpecregError(f"{what}: not an ECDSA P-256/384/521 public key (make one with `specreg keys create`)")
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def key_id(public_pem: str) -> str:
    """The id of a public key: sha256 of its SubjectPublicKeyInfo PEM (model-signing's key hint)."""
    return hashlib.sha256(public_pem.encode()).hexdigest()


MAX_KEY_BYTES = 64 * 1024  # a PEM key is a few hundred bytes


def load_signer(private_key: str | Path):
    """model-signing's elliptic-key Signer for a private key file; SpecregError naming the file."""
    model_signing_package()
    from model_signing._signing import sign_ec_key

    from specreg.core.files import check_regular_file

    key_path = check_regular_file(private_key, MAX_KEY_BYTES, "signing key")
    try:
        return sign_ec_key.Signer(key_path)
    except (ValueError, TypeError, AttributeError) as exc:
        # TypeError: an encrypted key; AttributeError/ValueError: not an EC P-256/384/521 key
        raise SpecregError(f"signing key {key_path}: not an unencrypted ECDSA P-256/384/521 private key "
                           f"in PEM ({type(exc).__name__}: {exc})") from None


def signer_key_id(signer) -> str:
    """The key id of a Signer's public key."""
    from cryptography.hazmat.primitives import serialization

    pem = signer._private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    return key_id(pem.decode())


# --- statements ------------------------------------------------------------------------------

class _StatementPayload:
    """What model-signing's Signer.sign reads of a payload: ``statement.pb``."""

    def __init__(self, subject_name: str, subject_sha256: str, predicate_type: str, predicate: dict[str, Any]):
        from in_toto_attestation.v1 import resource_descriptor, statement

        subject = resource_descriptor.ResourceDescriptor(name=subject_name, digest={"sha256": subject_sha256}).pb
        self.statement = statement.Statement(subjects=[subject], predicate_type=predicate_type, predicate=predicate)


def sign_statement(signer, *, subject_name: str, subject_sha256: str, predicate_type: str,
                   predicate: dict[str, str | None]) -> dict[str, Any]:
    """A Sigstore bundle (as JSON data) holding a DSSE envelope over an in-toto Statement v1 with
    one subject and ``predicate`` (string values: protobuf's Struct would turn numbers into
    floats), signed by ``signer`` (load_signer)."""
    bundle = signer.sign(_StatementPayload(subject_name, subject_sha256, predicate_type, predicate))
    return json.loads(bundle.bundle.to_json())


def bundle_key_id(bundle: Any) -> str | None:
    """The key id a bundle says it was signed with (unverified: a hint to pick the key)."""
    try:
        hint = bundle["verificationMaterial"]["publicKey"]["hint"]
    except (TypeError, KeyError):
        return None
    return hint if isinstance(hint, str) else None


def verified_statement(bundle: Any, public_pem: str, predicate_type: str) -> dict[str, Any]:
    """The in-toto statement of ``bundle`` once its DSSE signature verifies with ``public_pem``
    and it is a Statement v1 of ``predicate_type``. ValueError with the reason otherwise."""
    model_signing_package()
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from model_signing._signing import sign_ec_key, sign_sigstore_pb

    if not isinstance(bundle, dict):
        raise ValueError("the signature is not a Sigstore bundle")
    verifier = sign_ec_key.Verifier.__new__(sign_ec_key.Verifier)
    verifier._public_key = serialization.load_pem_public_key(public_pem.encode())
    try:
        signature = sign_sigstore_pb.Signature(_bundle_from_dict(bundle))
        payload_type, payload = verifier._verify_signed_content(signature)
    except InvalidSignature:
        raise ValueError("the signature does not match the signed statement") from None
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        raise ValueError(f"not a valid signature bundle ({type(exc).__name__}: {exc})") from None
    if payload_type != PAYLOAD_TYPE:
        raise ValueError(f"the envelope holds {payload_type!r}, not an in-toto statement")
    try:
        statement = json.loads(payload if isinstance(payload, (bytes, str)) else base64.b64decode(payload))
    except (ValueError, TypeError):
        raise ValueError("the signed payload is not JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE \
            or statement.get("predicateType") != predicate_type:
        raise ValueError(f"the signed statement is not an in-toto Statement v1 of {predicate_type}")
    return statement


def _bundle_from_dict(bundle: dict[str, Any]):
    from sigstore_models.bundle import v1 as bundle_pb

    data = json.loads(json.dumps(bundle))  # a copy: the library adjusts older layouts in place
    material = data.setdefault("verificationMaterial", {})
    material.setdefault("tlogEntries", [])
    return bundle_pb.Bundle.from_dict(data)
