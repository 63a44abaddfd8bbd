"""Governance fixtures: a policy file on the smoke golden set; helpers live in govstate.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # govstate: shared by the test modules here

from govstate import recorded_policy_file  # noqa: E402


@pytest.fixture
def policy_file(tmp_path, request):
    """A policy on the smoke golden set, made the policy of record of the test's database."""
    return recorded_policy_file(tmp_path, request)
