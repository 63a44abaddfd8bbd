"""Files a user names: every path option of the CLI reads and writes through here.

Reading is bounded.
A size check by ``stat`` says nothing about ``/dev/zero`` (size 0, endless), a FIFO (opening it
waits for a writer) or ``/proc`` files (size 0, any length): a file is opened without blocking,
must be a regular file, and is read up to its limit plus one byte, so a longer one is refused
without being read whole. JSON is also bounded in nesting (specreg.core.documents).

Writing never goes through what stands at the path: a report, keyring or key is written to a
fresh file (a temporary file beside it, moved into place), and a symlink, dangling or not, or
anything but a regular file in its place is refused, so a checkout that commits ``gate.md`` as a
link to ``~/.bashrc`` cannot make a report land there. Appending ($GITHUB_OUTPUT,
$GITHUB_STEP_SUMMARY: files the runner creates and several steps add to) opens the existing
regular file without following a symlink.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from specreg.errors import ModelReferenceError, PathTooLongError, SpecregError


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
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):  # before fdopen, which refuses a folder with IsADirectoryError
        os.close(descriptor)
        raise error(f"{name}: {_kind(mode)}, not a regular file")
    with os.fdopen(descriptor, "rb") as handle:
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


def _kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a symlink" if stat.S_ISLNK(mode) else "not a file")


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


def read_json_bounded(path: str | Path, limit: int, what: str, error: type[SpecregError] = SpecregError) -> Any:
    """read_text_bounded parsed as JSON, nested at most MAX_DOCUMENT_DEPTH containers deep;
    ``error`` (one line naming ``what`` and the path) otherwise."""
    from specreg.core.documents import MAX_DOCUMENT_DEPTH, depth_problem

    text = read_text_bounded(path, limit, what, error)
    name = f"{what} {Path(path).expanduser()}" if what else str(Path(path).expanduser())
    try:
        document = json.loads(text)
    except RecursionError:
        raise error(f"{name}: not readable JSON (nested deeper than {MAX_DOCUMENT_DEPTH} levels)") from None
    except ValueError as exc:
        raise error(f"{name}: not readable JSON ({exc})") from None
    problem = depth_problem(document)
    if problem:
        raise error(f"{name}: not readable JSON ({problem})")
    return document


# a model folder's JSON files (config, tokenizer, indexes): a tokenizer.json of a 256k vocabulary is
# ~30 MB
MAX_JSON_BYTES = 256 * 1024 * 1024
MAX_JSON_DEPTH = 64


def read_json_file(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """A JSON object from a model file (or its already read bytes); ModelReferenceError naming
    the file for anything else: unreadable, too large, not JSON, nested too deeply."""
    from specreg.core.documents import depth_problem

    try:
        if data is None:
            data = read_bounded(path, MAX_JSON_BYTES, "", ModelReferenceError)
        parsed = json.loads(data.decode("utf-8"))
    except OSError as exc:
        raise ModelReferenceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except RecursionError:
        raise ModelReferenceError(f"{path}: not readable JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        reason = " ".join(str(exc).split())[:160]
        raise ModelReferenceError(f"{path}: not readable JSON ({exc.__class__.__name__}: {reason})") from None
    if not isinstance(parsed, dict):
        raise ModelReferenceError(f"{path}: expected a JSON object, got {type(parsed).__name__}")
    problem = depth_problem(parsed, MAX_JSON_DEPTH)
    if problem:
        raise ModelReferenceError(f"{path}: JSON {problem}")
    return parsed


def _refuse_unwritable(path: Path, name: str, overwrite: bool, error: type[SpecregError]) -> None:
    """``error`` unless ``path`` is absent, or (with ``overwrite``) a regular file, not a link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise error(f"{name}: cannot write ({exc.strerror or exc})") from None
    if stat.S_ISLNK(mode):
        raise error(f"{name}: a symlink to {os.readlink(path)}; refusing to write through it (remove it first)")
    if not stat.S_ISREG(mode):
        raise error(f"{name}: {_kind(mode)}, not a regular file; refusing to write it")
    if not overwrite:
        raise error(f"{name}: exists; refusing to overwrite it")


def write_fresh(path: str | Path, content: str | bytes, what: str, *, mode: int | None = None,
                overwrite: bool = True, error: type[SpecregError] = SpecregError) -> Path:
    """Write ``content`` to ``path`` as a fresh file: a temporary file beside it, moved into place,
    so a reader never sees half of it and nothing is written through a link or into another
    name of the same file. Refused (``error``, one line naming ``what`` and the path) when a
    symlink or anything but a regular file stands at ``path``, or, without ``overwrite``, when
    anything does. ``mode``: the new file's permissions (default: an overwritten file's, else
    0666 less the umask). Returns the path."""
    path = Path(path).expanduser()
    name = f"{what} {path}" if what else str(path)
    PathTooLongError.refuse(path)  # before a folder on the way is made
    _refuse_unwritable(path, name, overwrite, error)
    data = content.encode("utf-8") if isinstance(content, str) else content
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = os.stat(path).st_mode & 0o7777 if path.exists() else 0o666 & ~umask
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".tmp")
        with os.fdopen(descriptor, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # before a byte is written: a private key is never readable by others
            handle.write(data)
        if overwrite:
            os.replace(temporary, path)  # replaces a name, never follows one made meanwhile
        else:
            os.link(temporary, path)  # fails if the name was taken meanwhile: nothing overwritten
            os.unlink(temporary)
        temporary = None
    except FileExistsError:
        raise error(f"{name}: exists; refusing to overwrite it") from None
    except OSError as exc:
        raise error(f"{name}: cannot write ({exc.strerror or exc})") from None
    finally:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
    return path


def append_text(path: str | Path, text: str, what: str, error: type[SpecregError] = SpecregError) -> Path:
    """Append ``text`` to the regular file ``path`` (created when missing), never through a
    symlink: the runner's own $GITHUB_OUTPUT, which earlier steps wrote to, keeps what it holds.
    ``error`` (one line naming ``what`` and the path) for a link, a folder, a FIFO or a device."""
    path = Path(path).expanduser()
    name = f"{what} {path}" if what else str(path)
    _refuse_unwritable(path, name, True, error)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        # O_NOFOLLOW: a link made after the check above is refused (ELOOP), not followed
        descriptor = os.open(path, flags, 0o666)
    except OSError as exc:
        raise error(f"{name}: cannot write ({exc.strerror or exc})") from None
    with os.fdopen(descriptor, "ab") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise error(f"{name}: {_kind(os.fstat(descriptor).st_mode)}, not a regular file; refusing to write it")
        try:
            handle.write(text.encode("utf-8"))
        except OSError as exc:
            raise error(f"{name}: cannot write ({exc.strerror or exc})") from None
    return path
