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


def test_safetensors_tensors_view_the_verified_bytes_and_equal_the_library(tmp_path):
    """The loader's tensors equal what the safetensors library reads, for the dtypes of model
    files and tensors off their alignment (an int64 after 6 bytes of float16, as a hand-written file
    may lay them out); the aligned ones are views of the buffer read once (no copy), and a
    header the library refuses is refused naming the file."""
    import struct

    import torch
    from safetensors.torch import load as load_bytes

    from specreg.core.digests import read_digested
    from specreg.runtime.loading import safetensors_tensors

    values = {"a_half": torch.arange(3, dtype=torch.float16), "b_long": torch.arange(5) * 7,
              "c_float": torch.randn(4, 6), "d_bf16": torch.randn(2, 3).bfloat16(),
              "e_empty": torch.zeros(0, 4), "f_bool": torch.tensor([True, False, True])}
    names = {torch.float16: "F16", torch.int64: "I64", torch.float32: "F32", torch.bfloat16: "BF16",
             torch.bool: "BOOL"}
    header, blob = {}, b""
    for name, tensor in values.items():  # in this order: b_long starts at byte 6
        raw = tensor.numpy().tobytes() if tensor.dtype != torch.bfloat16 else tensor.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + blob)
    data, _ = read_digested(path)
    tensors = safetensors_tensors(data, path)
    expected = load_bytes(path.read_bytes())
    assert tensors.keys() == expected.keys() == values.keys()
    for name, tensor in expected.items():
        assert tensors[name].dtype == tensor.dtype and torch.equal(tensors[name], tensor), name
    start = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
    inside = {name for name, tensor in tensors.items()
              if tensor.numel() and start <= tensor.data_ptr() < start + len(data)}
    # b_long starts at byte 6 and c_float at 46, off their alignment: copied
    assert inside == {"a_half", "d_bf16", "f_bool"}
    data[8:16] = b"[" + b" " * 7  # the header no longer a JSON object
    with pytest.raises(ModelReferenceError, match="model.safetensors: corrupt safetensors header"):
        safetensors_tensors(data, path)
