"""Approvals are signatures: a person approves with their own key, enrolled in
the registry's keyring by an enroller (the built-in policy's and the default ``[keyring]``
enroller is ``admin``). ``approval_key(db_url, "bob", folder)`` makes bob's key pair under
``folder/bob`` once, enrols it as ``admin`` (the PostgreSQL role admin on PostgreSQL) and
returns the private key's path, for ``Registry.approve(ref, key=...)`` / ``approve --key``."""

from __future__ import annotations

from pathlib import Path

from pgroles import as_user

ENROLLER = "admin"


def approval_key(db_url: str, person: str, folder: Path) -> str:
    from specreg.api import Registry
    from specreg.core.signing import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, create_key_pair

    home = Path(folder) / "approval-keys" / person
    if not (home / PRIVATE_KEY_FILE).exists():
        create_key_pair(home)
    from specreg.errors import SpecregError

    try:
        Registry(as_user(db_url, ENROLLER), user=ENROLLER).enrol_key(person, str(home / PUBLIC_KEY_FILE))
    except SpecregError as exc:
        if "is already enrolled to" not in str(exc):
            raise
    return str(home / PRIVATE_KEY_FILE)
