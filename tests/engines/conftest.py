"""Fixtures that run the released engines (vLLM 0.33.0, SGLang 0.5.23) on the exports; the
machinery is in engine_env.py (downloads, cache, the check scripts forked from one engine_host.py
process per engine)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # engine_env
sys.path.insert(0, str(Path(__file__).parents[1] / "exports"))  # exportcase

from engine_env import EngineUnavailable, run_engine  # noqa: E402
from helpers import in_ci  # noqa: E402


def run_or_skip(engine: str, cases: list[dict], workdir: Path, **options) -> dict:
    """run_engine, skipping the test without network (a failure with CI=true)."""
    try:
        return run_engine(engine, cases, workdir, **options)
    except EngineUnavailable as exc:
        if in_ci():
            pytest.fail(f"{engine} cannot run in CI: {exc}")
        pytest.skip(f"{engine} unavailable: {exc} (set CI=true to make this a failure)")


@pytest.fixture(scope="session")
def engine_runner(terminal_line):
    """run_or_skip, for the session fixtures of the test modules; the preparation's steps (minutes
    on a first run) and the timings are shown on the terminal as they happen."""
    return functools.partial(run_or_skip, log=terminal_line)
