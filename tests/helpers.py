"""Helpers several test packages share that are not fixtures: whether the suite runs in CI (where
a missing engine or model fails instead of skipping), a model folder copied to change it, and
transformers' own greedy decoding, the reference our runtime's greedy decodes are held to."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def copy_model(source: Path | str, destination: Path | str) -> Path:
    """A copy of the model folder ``source`` at ``destination`` (to edit or swap its files)."""
    return Path(shutil.copytree(source, destination))


def hf_greedy(target, prompt_ids: list[int], max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """The token ids transformers' ``generate`` emits greedily after ``prompt_ids``."""
    import torch

    with torch.inference_mode():
        output = target.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=eos_token_id, pad_token_id=0)
    return output[0, len(prompt_ids):].tolist()
