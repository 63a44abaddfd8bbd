"""Pairs for the validation tests, built from the session's tiny models (no downloads), and a
small golden set: two greedy prompts (chat and raw) and one sampled prompt, few tokens each."""

from __future__ import annotations

import shutil
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


@pytest.fixture(scope="session")
def models(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """target, draft (random), self (a copy of the target: accepts everything), padded (draft
    whose embeddings have 20 padding rows beyond the tokenizer)."""
    from tinymodels import build_llama

    root = tmp_path_factory.mktemp("validation-models")
    self_draft = Path(shutil.copytree(tiny_models["target"], root / "self"))
    padded = build_llama(root / "padded", tiny_models["tokenizer"], seed=5,
                         vocab_size=len(_tokenizer(tiny_models["tokenizer"])) + 20)
    return {"target": tiny_models["target"], "draft": tiny_models["draft"], "self": self_draft, "padded": padded}


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@pytest.fixture
def registry(tmp_path):
    from specreg.api import Registry

    return Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="tester")
