"""Writing an export's files: every path checked first, then all moved into place at once."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specreg.errors import PathTooLongError, SpecregError


class Link(str):
    """An export entry that is a symbolic link to this path, not a text file: the head's own weight
    files inside a layout an engine loads (engines/sglang.py head_layout), linked, never copied."""


def write_export(files: list[tuple[str, str]], out_dir: str | Path, overwrite: bool = False) -> list[Path]:
    """Write rendered files under ``out_dir`` (created if missing); returns the paths written.

    Every path is checked before anything is written: refuses (SpecregError, nothing written)
    any name that is absolute or resolves outside out_dir, an out_dir (or a folder on the way)
    that is a file, a name that is a directory, and any existing file unless ``overwrite``.
    Each file goes to a temporary file beside it and all are moved into place (os.replace) only
    once every one is written, so a failure leaves neither a half-written file nor a partial set.
    A ``Link`` entry becomes a symbolic link to its path (an existing link is replaced, not followed).
    """
    out = Path(out_dir)
    PathTooLongError.refuse(out)  # before a folder on the way is made
    _refuse_non_directory(out)
    root = out.resolve()
    targets: list[tuple[Path, str]] = []
    for name, text in files:
        if not name or Path(name).is_absolute():
            raise SpecregError(f"export file name {name!r} must be a relative path inside {root}")
        candidate = root / name
        # the folder resolved ('..' and symlinked folders); the entry itself is replaced, never followed
        path = candidate.parent.resolve() / candidate.name
        if candidate.name in ("", ".", "..") or path == root or not path.is_relative_to(root):
            raise SpecregError(f"export file name {name!r} escapes the output folder {root}")
        _refuse_non_directory(path.parent)
        if path.is_dir():
            raise SpecregError(f"cannot write {path}: it is a directory")
        if (path.exists() or path.is_symlink()) and not overwrite:
            raise SpecregError(f"{path} exists; refusing to overwrite it (use --overwrite)")
        targets.append((path, text))
    umask = os.umask(0)
    os.umask(umask)
    temporary: list[tuple[Path, Path]] = []
    current = root
    try:
        for path, text in targets:
            current = path.parent
            path.parent.mkdir(parents=True, exist_ok=True)
            current = path
            if isinstance(text, Link):
                name = tempfile.mktemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
                os.symlink(str(text), name)  # fails if the name was taken meanwhile: nothing followed
                temporary.append((Path(name), path))
                continue
            handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            temporary.append((Path(name), path))
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                stream.write(text)
            # mkstemp makes 0600: keep an overwritten file's mode, else what a new file would get
            keep = path.exists() and not path.is_symlink()
            os.chmod(name, path.stat().st_mode & 0o7777 if keep else 0o666 & ~umask)
        for name, path in temporary:
            current = path
            os.replace(name, path)
    except OSError as exc:
        for name, _ in temporary:
            name.unlink(missing_ok=True)
        raise SpecregError(f"cannot write {current}: {exc.strerror or exc}") from None
    return [path for path, _ in targets]


def _refuse_non_directory(folder: Path) -> None:
    """SpecregError when ``folder`` or its nearest existing ancestor is not a directory."""
    for candidate in (folder, *folder.parents):
        if candidate.exists() or candidate.is_symlink():
            if not candidate.is_dir():
                raise SpecregError(f"cannot write to {folder}: {candidate} is not a directory")
            return
