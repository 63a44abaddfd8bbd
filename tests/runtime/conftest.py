"""Tiny fp32 Llama models for the runtime tests, built once per session (no downloads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for tinymodels

from tinymodels import build_llama, build_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Directories: tokenizer, target, random draft, padded-vocab draft, draft without tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer(root / "tokenizer")
    build_llama(root / "target", tokenizer=tokenizer, seed=1, num_layers=3, hidden_size=64)
    build_llama(root / "draft_random", tokenizer=tokenizer, seed=2, num_layers=1, hidden_size=32,
                intermediate_size=64)
    build_llama(root / "draft_padded", tokenizer=tokenizer, seed=3, num_layers=1, hidden_size=32,
                intermediate_size=64, vocab_size=len(tokenizer) + 20)
    build_llama(root / "draft_no_tokenizer", tokenizer=tokenizer, seed=4, num_layers=1, hidden_size=32)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (root / "draft_no_tokenizer" / name).unlink(missing_ok=True)
    return root


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from specreg.runtime.loading import load_tokenizer

    return load_tokenizer(tiny_dir / "target")


@pytest.fixture(scope="session")
def target(tiny_dir):
    from specreg.runtime.loading import load_model

    return load_model(tiny_dir / "target")


@pytest.fixture(scope="session")
def drafts(tiny_dir, target):
    """name -> draft model: a different random model, the target itself, a perturbed target."""
    import copy

    import torch

    from specreg.runtime.loading import load_model

    aligned = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in aligned.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.35 * parameter.std())
    return {
        "random": load_model(tiny_dir / "draft_random"),
        "self": target,
        "aligned": aligned,
    }


@pytest.fixture(scope="session")
def prompts(tokenizer):
    texts = ["the quick brown fox", "def add(a, b):", "dear customer, thank you",
             "summary: the meeting moved to friday"]
    return [tokenizer(text)["input_ids"] for text in texts]


def shrink_demo_pair(monkeypatch) -> None:
    """The demo pair's code path with a tiny budget (the real shapes and step counts take minutes)."""
    from specreg.builders import demo_pair

    monkeypatch.setattr(demo_pair, "TARGET_SHAPE", dict(demo_pair.DRAFT_SHAPE, num_hidden_layers=2))
    monkeypatch.setattr(demo_pair, "TARGET_TRAINING", (2, 2))
    monkeypatch.setattr(demo_pair, "DRAFT_TRAINING", (2, 2))


@pytest.fixture
def shrunk_demo(monkeypatch):
    """The demo builders' settings shrunk as small_demo_dir was built with, for this test."""
    shrink_demo_pair(monkeypatch)


@pytest.fixture(scope="session")
def small_demo_dir(tmp_path_factory):
    """A folder holding the shrunk demo pair, built once per session: a test using `shrunk_demo`
    that builds into it reuses the cached pair."""
    from specreg.builders import demo_pair

    directory = tmp_path_factory.mktemp("small-demo") / "pair"
    with pytest.MonkeyPatch.context() as patch:
        shrink_demo_pair(patch)
        demo_pair.build_demo_pair(directory)
    return directory
