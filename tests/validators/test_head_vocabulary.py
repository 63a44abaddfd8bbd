"""The tokenizer check of head pairs re-checks the head against the target files as they are now."""

from __future__ import annotations

import json

from headfiles import write_eagle3, write_medusa, write_target
from specreg.validators.head_vocabulary import check_head_vocabulary


def test_a_fitting_head_passes_with_what_was_compared(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = write_target(tmp_path / "models" / "target")
    result = check_head_vocabulary("eagle3", str(write_eagle3(tmp_path / "head")), str(target))
    assert result.name == "tokenizer" and result.status == "pass", result.summary
    assert result.evidence["aux_layer_ids"] == [1, 3, 4] and result.evidence["draft_vocab_size"] == 24


def test_a_target_changed_after_registration_fails_naming_the_field(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = write_target(tmp_path / "models" / "target")
    head = write_medusa(tmp_path / "medusa", heads=2)
    assert check_head_vocabulary("medusa", str(head), str(target)).status == "pass"
    config = json.loads((target / "config.json").read_text())
    config["vocab_size"] = 48  # the target grew its vocabulary; the heads still emit 40 ids
    (target / "config.json").write_text(json.dumps(config))
    result = check_head_vocabulary("medusa", str(head), str(target))
    assert result.status == "fail" and "vocab" in result.summary and "\n" not in result.summary
