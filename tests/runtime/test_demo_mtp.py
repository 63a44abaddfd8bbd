"""The demo MTP builder on the tiny target (small settings): it trains, writes a target directory
that read_mtp, the runtime and transformers accept, and reuses it while its key holds."""

from __future__ import annotations

import pytest
import torch

from specreg.builders import demo_mtp


@pytest.mark.slow
def test_build_then_reuse_then_rebuild_on_a_new_setting(tmp_path, tiny_dir, monkeypatch, prompts):
    from transformers import AutoModelForCausalLM

    from specreg.core.heads.mtp_checkpoint import read_mtp
    from specreg.runtime.methods import load_pair

    monkeypatch.setattr(demo_mtp, "MTP_WINDOWS", 8)
    monkeypatch.setattr(demo_mtp, "MTP_TRAINING", (6, 2))
    out = demo_mtp.build_demo_mtp(tmp_path / "target-mtp", tiny_dir / "target")
    weights = out / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    spec = read_mtp(out)
    assert spec.layout == "mtp:deepseek" and spec.num_layers == 1
    assert (out / "tokenizer.json").read_bytes() == (tiny_dir / "target" / "tokenizer.json").read_bytes()
    pair = load_pair(out, method="mtp")
    assert not torch.equal(pair.draft.layers[0].eh_proj.weight, torch.zeros_like(pair.draft.layers[0].eh_proj.weight))
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir / "target")
    tokens = torch.tensor([prompts[0]])
    with torch.inference_mode():
        assert torch.equal(plain(input_ids=tokens).logits, pair.target(input_ids=tokens).logits)
    assert demo_mtp.build_demo_mtp(tmp_path / "target-mtp", tiny_dir / "target") == out
    assert weights.stat().st_mtime_ns == built_at  # cached
    monkeypatch.setattr(demo_mtp, "MTP_TRAINING", (7, 2))
    demo_mtp.build_demo_mtp(tmp_path / "target-mtp", tiny_dir / "target")
    assert weights.stat().st_mtime_ns != built_at  # a new setting is a new build
