"""A signed, audited decision: what approving a version, approving a policy change and accepting
an engine baseline each do before they sign. The approver is named as the registry names
people, their key file is read (a key that cannot be read is refused before anything is
locked), the write transaction takes its locks, and the audit chain must verify (a decision is
never appended to a chain that does not); the keyring is then read from that verified chain."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from specreg.core.user_names import normalize_user
from specreg.core.signing import load_signer, signer_key_id
from specreg.errors import SpecregError
from specreg.registry.governance.keyring import enrolled_entry, keyring_entries
from specreg.registry.governance.policy import Policy
from specreg.registry.governance.signatures import KeyringEntry
from specreg.registry.store.entities import AuditEvent
from specreg.registry.store.store import Session, Store, verified_chain


@dataclass
class SignedWrite:
    """The open transaction of one signed decision and what its preamble read."""

    session: Session
    actor: str  # normalised
    signer: Any  # the private key, for core.signing
    key_id: str
    key_path: str
    chain: list[AuditEvent]  # the verified audit chain, read under the locks
    locked: Any  # what the lock step returned (the version it locked, or None)

    def keyring(self, policy: Policy) -> dict[str, KeyringEntry]:
        """The keys that count under ``policy`` on this chain."""
        return keyring_entries(self.session, policy, self.chain)[0]

    def enrolled(self, policy: Policy) -> dict[str, KeyringEntry]:
        """The keyring under ``policy``, once the signing key is one it enrols to the actor
        (PolicyViolation naming the enrolment that fixes it otherwise)."""
        keyring = self.keyring(policy)
        enrolled_entry(keyring, self.key_id, self.key_path, self.actor)
        return keyring


def version_lock(store: Store, name: str, version: int) -> Callable[[Session], Any]:
    """The lock step of a signed decision on one pair version: the pair's lock, then the version's
    row, locked and returned (SignedWrite.locked)."""
    def lock(session: Session):
        store.lock_pair(session, name)
        return store.pair_version(session, name, version, lock=True)

    return lock


@contextlib.contextmanager
def signed_write(store: Store, *, actor: str, key: str, what: str,
                 lock: Callable[[Session], Any]) -> Iterator[SignedWrite]:
    """Open the write transaction of a signed decision by ``actor`` with the private key file
    ``key``: ``lock(session)`` takes its row locks first; then the audit chain must verify, else
    SpecregError "cannot ``what``: the audit chain does not verify". Commits when the block ends."""
    actor = normalize_user(actor, what="approver")
    signer = load_signer(key)
    kid = signer_key_id(signer)
    with store.session(write=True) as session:
        locked = lock(session)
        chain, problem = verified_chain(session)
        if problem is not None:
            raise SpecregError(f"cannot {what}: the audit chain does not verify ({problem})")
        yield SignedWrite(session, actor, signer, kid, key, chain, locked)
