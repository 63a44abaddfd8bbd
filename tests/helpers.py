"""Helpers several test packages share that are not fixtures: whether the suite runs in CI (where
a missing engine or model fails instead of skipping), the environment every test runs in, a model
folder copied to change it, transformers' own greedy decoding, the reference our runtime's
greedy decodes are held to, and a one-step tree rule lifted to the rule's n-draw form."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def isolate_environment(monkeypatch, home: Path) -> None:
    """The environment every test runs in (tests/conftest.py's isolated_home), set through
    ``monkeypatch``: ``home`` as $SPECREG_HOME, no ~/.specreg, real MLflow store or caller's setting."""
    monkeypatch.setenv("SPECREG_HOME", str(home))
    monkeypatch.delenv("SPECREG_DB", raising=False)
    monkeypatch.delenv("SPECREG_POLICY", raising=False)
    monkeypatch.delenv("SPECREG_AUDIT_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # pytest-xdist's workers set COLUMNS=80, and tables for people wrap at $COLUMNS: the CLI runs
    # here as in a pipe or a CI log (tests/validation/test_terminal_width.py runs it in a pty).
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("SPECREG_USER", "tester")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The MLflow mirror is exercised by tests/mlflow against a real server; elsewhere it is off
    # so that each registry test does not also initialise an MLflow store.
    monkeypatch.setenv("SPECREG_MLFLOW", "off")


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


def each_draw(tree_rule):
    """A one-step tree rule (the form the decode loop calls) that also takes the tree rule's n-draw
    form (uniforms # [n, nodes+1], laws and tokens given once for all), as the distribution check
    calls it: the draws one call after another -> (num_accepted # [n], accepted_nodes # [n, depth],
    emitted # [n, depth+1], -1 padded), as acceptance_rule.tree_rejection_sample returns them."""
    import torch

    def both(draft_probs, target_probs, node_token_ids, parent_ids, uniforms, generator=None):
        if uniforms.dim() == 1:
            return tree_rule(draft_probs, target_probs, node_token_ids, parent_ids, uniforms, generator)
        parents, depths = parent_ids.tolist(), [0] * parent_ids.shape[0]
        for node, parent in enumerate(parents):
            depths[node] = depths[parent] + 1 if parent >= 0 else 0
        n, depth = uniforms.shape[0], max(depths)
        counts = torch.zeros(n, dtype=torch.long)
        accepted, emitted = torch.full((n, depth), -1), torch.full((n, depth + 1), -1)
        for draw in range(n):
            nodes, tokens = tree_rule(draft_probs, target_probs, node_token_ids, parent_ids, uniforms[draw], generator)
            counts[draw], accepted[draw, :len(nodes)], emitted[draw, :len(tokens)] = len(nodes), nodes, tokens
        return counts, accepted, emitted

    return both
