"""A sharded checkpoint (safetensors shards + model.safetensors.index.json, as transformers'
save_pretrained writes every model over its shard size) loads against its registered
fingerprint."""

from __future__ import annotations

import json

import pytest

from specreg.core.fingerprint import fingerprint_model
from specreg.errors import ModelReferenceError


@pytest.fixture(scope="module")
def sharded(tiny_dir, tmp_path_factory):
    """The tiny target re-saved by transformers in 3+ shards with an index."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("sharded") / "target"
    model = AutoModelForCausalLM.from_pretrained(tiny_dir / "target")
    model.save_pretrained(folder, max_shard_size="100KB")
    AutoTokenizer.from_pretrained(tiny_dir / "target").save_pretrained(folder)
    shards = sorted(path.name for path in folder.glob("*.safetensors"))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(shards) >= 3 and sorted(set(index["weight_map"].values())) == shards
    return folder


def test_sharded_target_loads_against_its_fingerprint(sharded, tiny_dir):
    import torch

    from specreg.runtime.methods import load_pair

    expected = fingerprint_model(sharded)
    assert "model.safetensors.index.json" in expected.behaviour_files
    pair = load_pair(sharded, target_fingerprint=expected)
    plain = load_pair(tiny_dir / "target")
    ids = torch.tensor([[1, 5, 9, 20, 33]])
    assert torch.equal(pair.target(ids).logits, plain.target(ids).logits)
    assert pair.tokenizer.get_vocab() == plain.tokenizer.get_vocab()


def test_sharded_index_and_tokenizer_changes_are_still_caught(sharded, tmp_path):
    import shutil

    from specreg.runtime.loading import load_model, load_tokenizer

    expected = fingerprint_model(sharded)
    copy = tmp_path / "target"
    shutil.copytree(sharded, copy)
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    index["metadata"]["total_size"] += 1
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    load_tokenizer(copy, expected=expected)  # the index decides weights, not tokenization
    with pytest.raises(ModelReferenceError, match="model.safetensors.index.json changed since"):
        load_model(copy, expected=expected)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["model_max_length"] = 7
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelReferenceError, match="tokenizer_config.json changed since"):
        load_tokenizer(copy, expected=expected)
