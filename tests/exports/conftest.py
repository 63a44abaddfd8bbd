"""Fixtures for export tests; the helpers live in exportcase.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # exportcase, the helpers shared with the tests

from exportcase import BASELINES, make_pair, record_argv

from specreg.registry.store.entities import PairVersion, SpecMethod


@pytest.fixture
def draft_pair() -> PairVersion:
    return make_pair(SpecMethod.DRAFT_MODEL)


@pytest.fixture
def ngram_pair() -> PairVersion:
    return make_pair(SpecMethod.NGRAM)


@pytest.fixture
def baselines() -> dict:
    return json.loads(json.dumps(BASELINES))


@pytest.fixture
def run_script(tmp_path):
    """Run an exported shell script; returns the argv the engine executable received."""
    counter = iter(range(10**6))

    def run(script_text: str, name: str = "script.sh") -> list[str]:
        return record_argv(script_text, tmp_path / f"run-{next(counter)}")

    return run
