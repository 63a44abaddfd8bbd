"""Governance fixtures: a policy file on the smoke golden set; helpers live in govstate.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # govstate: shared by the test modules here

from govstate import POLICY_TOML  # noqa: E402


@pytest.fixture
def policy_file(tmp_path, monkeypatch):
    """A policy on the smoke golden set; also set as $SPECREG_POLICY for CLI runs."""
    path = tmp_path / "specreg.toml"
    path.write_text(POLICY_TOML)
    monkeypatch.setenv("SPECREG_POLICY", str(path))
    return path
