"""Memory headroom: figures checked against the real tensors and a real KV cache."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from specreg.errors import ModelReferenceError, UsageError
from specreg.validators.memory import (
    check_memory_headroom,
    kv_cache_bytes,
    parse_memory_size,
    weight_bytes,
)


def tensor_bytes(model_dir, dtype=None) -> int:
    """Bytes of every tensor actually stored (optionally cast), loaded with safetensors."""
    from safetensors.torch import load_file

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        for tensor in load_file(path).values():
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            total += tensor.numel() * tensor.element_size()
    return total


def real_kv_cache_bytes(model_dir, tokens: int, batch: int) -> int:
    """Bytes held by the KV cache of a real forward pass over `tokens` tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    input_ids = torch.ones(batch, tokens, dtype=torch.long)  # [batch, tokens]
    with torch.no_grad():
        cache = model(input_ids, use_cache=True).past_key_values
    return sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers)


def test_weight_bytes_equal_the_stored_tensors(pair):
    for model_dir in pair:
        counted = weight_bytes(model_dir)
        assert counted["bytes"] == counted["stored_bytes"] == tensor_bytes(model_dir)
        assert counted["stored_dtypes"] == {"F32": counted["bytes"]}
        # Requested in bf16, every floating tensor takes half the room.
        assert weight_bytes(model_dir, "bfloat16")["bytes"] == tensor_bytes(model_dir, torch.bfloat16)
        assert weight_bytes(model_dir, "bf16")["bytes"] * 2 == counted["bytes"]


def test_kv_cache_bytes_equal_a_real_cache(pair):
    draft, target = pair
    for model_dir in pair:
        figures = kv_cache_bytes(model_dir, tokens=24, batch_size=3, bytes_per_element=4)
        assert figures["bytes"] == real_kv_cache_bytes(model_dir, tokens=24, batch=3)
    config = json.loads((target / "config.json").read_text())
    figures = kv_cache_bytes(target, tokens=100, batch_size=2, bytes_per_element=2)
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert figures["bytes"] == 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2 * 100 * 2


def test_fits_and_does_not_fit_around_the_headroom(pair):
    fitting = check_memory_headroom(*pair, gpu_memory="1GiB", max_context_tokens=256, batch_size=2)
    assert fitting.status == "pass", fitting.summary
    total = fitting.figures["total_bytes"]
    assert total == (weight_bytes(pair[0])["bytes"] + weight_bytes(pair[1])["bytes"]
                     + real_kv_cache_bytes(pair[0], 256, 2) + real_kv_cache_bytes(pair[1], 256, 2))
    assert fitting.figures["budget_bytes"] == 2**30
    assert fitting.figures["usable_bytes"] == int(2**30 * 0.9)
    assert fitting.summary.startswith("fits: needs ")

    # Budget just above and just below what 20% headroom needs.
    enough = int(total / 0.8) + 1
    assert check_memory_headroom(*pair, gpu_memory=enough, max_context_tokens=256, batch_size=2,
                                 headroom=0.2).status == "pass"
    short = check_memory_headroom(*pair, gpu_memory=enough - 2, max_context_tokens=256, batch_size=2,
                                  headroom=0.2)
    assert short.status == "fail"
    assert short.summary.startswith("does not fit: needs ")
    assert short.summary.endswith("is usable with 20% headroom")
    assert short.figures["free_after_bytes"] < 0


def test_context_length_defaults_to_the_target_maximum(pair):
    result = check_memory_headroom(*pair, gpu_memory="80GiB")
    config = json.loads((pair[1] / "config.json").read_text())
    assert result.figures["max_context_tokens"] == config["max_position_embeddings"]
    assert result.evidence["models"]["target"]["kv_cache"]["bytes"] == kv_cache_bytes(
        pair[1], config["max_position_embeddings"], 1, 4)["bytes"]


def test_a_requested_dtype_shrinks_weights_and_caches(pair):
    full = check_memory_headroom(*pair, gpu_memory="1GiB", max_context_tokens=64)
    half = check_memory_headroom(*pair, gpu_memory="1GiB", max_context_tokens=64, dtype="float16")
    assert half.figures["total_bytes"] * 2 == full.figures["total_bytes"]


def test_without_a_budget_the_cuda_device_is_used_or_the_check_skips(pair):
    result = check_memory_headroom(*pair, max_context_tokens=64)
    if torch.cuda.is_available():
        assert result.status == "pass"
        assert result.figures["budget_bytes"] == torch.cuda.mem_get_info()[1]
        assert result.evidence["budget_source"].startswith("cuda:")
    else:
        assert result.status == "skip"
        assert result.summary.startswith("no device memory budget given and no CUDA device found")
    on_cpu = check_memory_headroom(*pair, max_context_tokens=64, device="cpu")
    assert on_cpu.status == "skip"
    assert on_cpu.evidence["budget_source"] == "none: no budget given and device cpu is not a CUDA device"
    assert on_cpu.figures["total_bytes"] == result.figures["total_bytes"]


@pytest.mark.parametrize("text, expected", [
    ("80GiB", 80 * 2**30), ("24GB", 24 * 10**9), ("512MiB", 512 * 2**20), ("1.5 TiB", int(1.5 * 2**40)),
    ("100kb", 100_000), (4096, 4096),
])
def test_memory_sizes_parse(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["80XB", "eighty GiB", "80", "-1GiB", "0GiB", "", 0])
def test_a_bad_budget_is_a_usage_error_naming_the_value(pair, text):
    with pytest.raises(UsageError) as info:
        check_memory_headroom(*pair, gpu_memory=text, max_context_tokens=8)
    assert str(info.value) == (f"invalid memory size {text!r}: use a positive number and a unit, "
                               "e.g. 80GiB, 24GB or 512MiB")


def test_bad_settings_are_usage_errors(pair):
    with pytest.raises(UsageError, match=r"^invalid memory headroom 1.5: "):
        check_memory_headroom(*pair, gpu_memory="1GiB", headroom=1.5)
    with pytest.raises(UsageError, match=r"^unknown dtype 'int3': "):
        check_memory_headroom(*pair, gpu_memory="1GiB", dtype="int3")
    with pytest.raises(UsageError, match=r"^invalid batch size 0: "):
        check_memory_headroom(*pair, gpu_memory="1GiB", batch_size=0)


def test_corrupt_or_missing_weights_name_the_file(pair, draft_copy):
    weights = draft_copy / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(ModelReferenceError) as info:
        check_memory_headroom(draft_copy, pair[1], gpu_memory="1GiB")
    assert str(info.value) == f"{weights}: corrupt safetensors header (header length 1000000000 exceeds the file)"

    weights.write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(ModelReferenceError) as info:
        check_memory_headroom(draft_copy, pair[1], gpu_memory="1GiB")
    assert str(info.value) == f"{weights}: corrupt safetensors header (not JSON)"

    weights.unlink()
    with pytest.raises(ModelReferenceError) as info:
        check_memory_headroom(draft_copy, pair[1], gpu_memory="1GiB")
    assert str(info.value) == f"{draft_copy}: no weight files (*.safetensors, or pytorch_model.bin with --allow-pickle)"


def test_ngram_pair_counts_the_target_alone(pair):
    both = check_memory_headroom(*pair, gpu_memory="1GiB")
    target_only = check_memory_headroom(None, pair[1], gpu_memory="1GiB")
    assert target_only.status == "pass"
    assert target_only.figures["draft_weight_bytes"] == 0 and target_only.figures["draft_kv_cache_bytes"] == 0
    assert target_only.figures["total_bytes"] == (
        both.figures["target_weight_bytes"] + both.figures["target_kv_cache_bytes"])
    assert list(target_only.evidence["models"]) == ["target"]
