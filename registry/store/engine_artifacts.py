"""Digests of the engine files specreg builds and then runs or serves (the ``llama-server``
binary, GGUF conversions), recorded in the registry database on its audit chain: a record file
beside a cached file is not trust (whoever can replace the file can replace its record), the
registry is.

A record is an ``engine_artifact`` audit event (pair ``-``, like the keying event) whose details
name the ``kind`` (``llama-server``, ``gguf``), the ``key`` (what the file was made from: the
llama.cpp source, or the model's fingerprint, the GGUF type and the llama.cpp it was converted
by), its ``sha256`` and where it was. A file counts when its digest is one recorded for its kind
and key in the verified chain: the same source built on two machines may give two binaries
(``-march=native``), each recorded by the `specreg llamacpp-build` that built it.
"""

from __future__ import annotations

from specreg.registry.store.store import Store, verified_chain

ACTION = "engine_artifact"
NO_PAIR = "-"


class ArtifactRecords:
    """Recorded digests of engine files in one registry; ``actor`` records them."""

    def __init__(self, store: Store, actor: str):
        self.store, self.actor = store, actor

    def digests(self, kind: str, key: str) -> set[str]:
        """The sha256 digests recorded for ``kind`` and ``key`` in the verified audit chain."""
        with self.store.session() as session:
            chain, _ = verified_chain(session)
        found = set()
        for event in chain:
            details = event.details or {}
            if event.action == ACTION and event.pair_name == NO_PAIR and details.get("kind") == kind \
                    and details.get("key") == key and isinstance(details.get("sha256"), str):
                found.add(details["sha256"])
        return found

    def record(self, kind: str, key: str, sha256: str, path: str) -> bool:
        """Append the record of one file (its audit event) unless that digest is recorded already
        for ``kind`` and ``key`` -> whether it was appended."""
        if sha256 in self.digests(kind, key):
            return False
        with self.store.session(write=True) as session:
            self.store.append_event(session, pair_name=NO_PAIR, version=None, action=ACTION, from_state=None,
                                    to_state=None, actor=self.actor, reason=f"{kind} {sha256[:12]} at {path}",
                                    details={"kind": kind, "key": key, "sha256": sha256, "path": path})
        return True
