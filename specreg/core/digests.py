"""Content hashes, and the process-wide caches that keep a file from being hashed twice.

Every content hash specreg records is the sha256 of canonical JSON (canonical_json) or of a
file's bytes (sha256_file). A validation reads the same weight files to fingerprint them and
to build the models: the digests computed here are remembered by the file's identity, and the
files can be read and hashed ahead on a thread of their own (read_ahead) while the caller goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Future


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> bytes:
    """The one canonical serialisation used for every content hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    if (known := read_ahead_digest(path)) is not None:
        return known
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        before = os.fstat(handle.fileno())
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
        after = os.fstat(handle.fileno())
    hexdigest = digest.hexdigest()
    remember_digest(before, after, hexdigest)
    return hexdigest


# Digests this process computed, by the identity of the file hashed (device, inode, size, mtime and
# ctime to the nanosecond): the weight files a validation fingerprints (integrity check) are read
# again to build the models, and a file whose identity has not changed since is not hashed twice
# (1 GB of weights costs about 0.6 s a pass; a 16 GB model 10 s). Any write, rename or copy over
# it changes the inode, size, mtime or ctime (ctime cannot be set back by a user). As git does
# with "racily clean" entries, a file changed less than RACY_NS before it was hashed is never
# remembered: a write in the same timestamp tick would keep its identity.
_DIGESTS: dict[tuple[int, ...], str] = {}
RACY_NS = 2_000_000_000


def file_identity(stat: os.stat_result) -> tuple[int, ...]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def remember_digest(before: os.stat_result, after: os.stat_result, digest: str) -> None:
    """Keep the digest of a file whose identity was the same before and after it was read."""
    import time

    identity = file_identity(after)
    settled = time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) > RACY_NS
    if file_identity(before) == identity and settled:
        _DIGESTS[identity] = digest


def read_digested(path: Path) -> tuple[bytearray | mmap.mmap, str]:
    """A file's bytes, read once into a buffer of their own (tensors can be built over it without
    a copy: runtime/loading.safetensors_tensors), and their sha256: remembered from this process's
    earlier read when the file's identity is unchanged, else computed from the bytes read. A file
    read ahead (read_ahead) whose identity has not changed since is taken from there."""
    ahead = _READ_AHEAD.pop(str(path), None)
    if ahead is not None:
        with contextlib.suppress(Exception):  # a read that failed or was cancelled: read it now
            data, digest, identity = ahead.result()
            with contextlib.suppress(OSError):
                if file_identity(os.stat(path)) == identity:
                    return data, digest
    data, digest, _ = read_now(path)
    return data, digest


def read_now(path: Path) -> tuple[bytearray | mmap.mmap, str, tuple[int, ...]]:
    """read_digested's read -> (bytes, sha256, the file's identity after the read). The buffer is an
    anonymous mapping: a zero-filled bytearray would touch every page once more, holding the GIL
    (0.4 s for 540 MB), where reading into fresh pages faults them in with the GIL released."""
    with open(path, "rb") as handle:
        before = os.fstat(handle.fileno())
        data = mmap.mmap(-1, max(before.st_size, 1))
        view, filled = memoryview(data), 0
        try:
            while filled < before.st_size and (count := handle.readinto(view[filled:before.st_size])):
                filled += count
        finally:
            view.release()
        rest = handle.read()
        after = os.fstat(handle.fileno())
    if filled < before.st_size or rest or not before.st_size:  # shrank, grew or empty: its identity says so
        data = bytearray(data[:filled]) + rest
    known = _DIGESTS.get(file_identity(after)) if file_identity(before) == file_identity(after) else None
    if known is None:
        known = sha256_hex(data)
        remember_digest(before, after, known)
    return data, known, file_identity(after)


# Files read ahead (read_ahead): path -> the future of read_now's result, taken by read_digested.
_READ_AHEAD: dict[str, Future] = {}


@contextlib.contextmanager
def read_ahead(paths: Iterable[Path]) -> Iterator[None]:
    """Read and hash ``paths`` on a thread of their own, in order, while the caller goes on: a
    validation imports torch and transformers and checks tokenizers (work that holds one core and
    the GIL) before it fingerprints and loads the weights, and reading and hashing release the GIL.
    The integrity check's sha256_file then waits for the file's read instead of hashing it again,
    and read_digested takes its bytes while the file's identity is unchanged. What was not taken is
    dropped on leaving."""
    from concurrent.futures import ThreadPoolExecutor

    names = [str(path) for path in dict.fromkeys(paths) if str(path) not in _READ_AHEAD]
    if not names:
        yield
        return
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specreg-read-ahead")
    try:
        for name in names:
            _READ_AHEAD[name] = executor.submit(read_now, Path(name))
        yield
    finally:
        for name in names:
            if (future := _READ_AHEAD.pop(name, None)) is not None:
                future.cancel()
        executor.shutdown(wait=True, cancel_futures=True)


def read_ahead_digest(path: Path) -> str | None:
    """The sha256 of a file being read ahead, once read, when it is remembered for the file's
    identity now (remember_digest's rules); None when the file is not read ahead."""
    ahead = _READ_AHEAD.get(str(path))
    if ahead is None:
        return None
    with contextlib.suppress(Exception):
        ahead.result()
    try:
        return _DIGESTS.get(file_identity(os.stat(path)))
    except OSError:
        return None
