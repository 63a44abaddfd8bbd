"""Pairs for the static checks: the shared tiny draft/target and edited copies of the draft."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def pair(tiny_models):
    """(draft_dir, target_dir): two tiny Llamas saved with the same tokenizer."""
    return tiny_models["draft"], tiny_models["target"]


@pytest.fixture
def draft_copy(pair, tmp_path) -> Path:
    """A copy of the draft folder that a test may edit (tokenizer, config, weights)."""
    return Path(shutil.copytree(pair[0], tmp_path / "draft-copy"))
