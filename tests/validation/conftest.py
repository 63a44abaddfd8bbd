"""For the validation tests (their pairs are tests/conftest.py's ``models``): a registry and a
small golden set: two greedy prompts (chat and raw) and one sampled prompt, few tokens each."""

from __future__ import annotations

from pathlib import Path

import pytest

GOLDEN_YAML = """
name: tiny
version: 1
records:
  - id: chat-1
    category: support
    messages:
      - {role: user, content: "hello world, this is a tiny corpus"}
    max_new_tokens: 10
  - id: raw-1
    category: code
    prompt: "def add(a, b):\\n"
    max_new_tokens: 10
  - id: sampled-1
    category: creative
    prompt: "the quick brown fox"
    max_new_tokens: 10
    temperature: 1.0
    top_p: 0.95
    seed: 3
"""


@pytest.fixture(scope="session")
def golden_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("golden") / "tiny.yaml"
    path.write_text(GOLDEN_YAML)
    return path


@pytest.fixture
def registry(tmp_path):
    from specreg.api import Registry

    return Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="tester")
