"""Reading a file a user names, bounded: every path option of the CLI reads through here.

A size check by ``stat`` says nothing about ``/dev/zero`` (size 0, endless), a FIFO (opening it
waits for a writer) or ``/proc`` files (size 0, any length): a file is opened without blocking,
must be a regular file, and is read up to its limit plus one byte, so a longer one is refused
without being read whole.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from specreg.errors import PathTooLongError, SpecregError


def read_bounded(path: str | Path, limit: int, what: str, error: type[SpecregError] = SpecregError) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``); ``error`` (one line naming
    ``what`` and the path) when it is missing, not a regular file, unreadable or longer."""
    path = Path(path).expanduser()
    name = f"{what} {path}" if what else str(path)
    try:
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{name}: no such file") from None
    except OSError as exc:
        raise error(f"{name}: cannot read ({exc.strerror or exc})") from None
    with os.fdopen(descriptor, "rb") as handle:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"
            raise error(f"{name}: {kind}, not a regular file")
        size = os.fstat(descriptor).st_size
        if size > limit:
            raise error(f"{name}: {size} bytes, over the limit of {limit}")
        try:
            data = handle.read(limit + 1)  # the size may grow while it is read
        except OSError as exc:
            raise error(f"{name}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise error(f"{name}: over the limit of {limit} bytes")
    return data


def read_text_bounded(path: str | Path, limit: int, what: str, error: type[SpecregError] = SpecregError) -> str:
    """read_bounded decoded as UTF-8 (one line naming the file when it is not UTF-8)."""
    data = read_bounded(path, limit, what, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        name = f"{what} {Path(path).expanduser()}" if what else str(Path(path).expanduser())
        raise error(f"{name}: cannot read (not UTF-8 text, byte {exc.start})") from None


def check_regular_file(path: str | Path, limit: int, what: str, error: type[SpecregError] = SpecregError) -> Path:
    """``path`` when it is a regular file of at most ``limit`` bytes (for a library that opens the
    path itself, e.g. model-signing's key loaders); ``error`` otherwise, as read_bounded."""
    read_bounded(path, limit, what, error)
    return Path(path).expanduser()
