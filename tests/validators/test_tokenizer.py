"""Tokenizer alignment on real tiny pairs: each way a draft tokenizer can differ, and the pass."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from specreg.errors import ModelReferenceError
from specreg.golden_prompts.loader import load_golden_set
from specreg.validators.tokenizer import check_tokenizer_alignment, load_tokenizer


def edit_json(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def smoke():
    return load_golden_set("smoke")


def test_identical_tokenizers_pass_and_every_golden_prompt_is_compared(pair, smoke):
    result = check_tokenizer_alignment(*pair, load_golden_set("default"))
    assert result.status == "pass", result.summary
    assert result.summary == "tokenizers match (300 tokens); 43 golden prompts of 'default' encode identically"
    assert result.figures["golden_prompts_compared"] == 43
    assert result.figures["golden_prompts_mismatched"] == 0
    assert result.evidence["findings"] == []
    assert result.evidence["golden"]["content_sha256"] == load_golden_set("default").content_sha256


def test_a_draft_autotokenizer_reads_as_the_target_class_is_built_once(pair, smoke, monkeypatch):
    """As a validation loads them (checked against the fingerprints, inside shared_tokenizers):
    where AutoTokenizer picks the target's class for the draft, its build serves both the engine's
    role and the loader comparison: two builds for the pair, not three, and the same result."""
    from specreg.core.fingerprint import fingerprint_model
    from specreg.runtime import loading
    from specreg.validators.tokenizer import load_pair_tokenizers

    expected = {"draft_expected": fingerprint_model(pair[0]), "target_expected": fingerprint_model(pair[1])}
    built = []
    real_build = loading._load_tokenizer_from
    monkeypatch.setattr(loading, "_load_tokenizer_from", lambda directory, path, tokenizer_class=None: built.append(
        tokenizer_class) or real_build(directory, path, tokenizer_class))
    with loading.shared_tokenizers():
        loaded = load_pair_tokenizers(*pair, **expected)
    assert built == [None, None]
    assert loaded["draft_tokenizer"] is loaded["draft_own_tokenizer"]
    assert type(loaded["draft_tokenizer"]) is type(loaded["target_tokenizer"])
    built.clear()
    unshared = load_pair_tokenizers(*pair, **expected)  # outside a validation each load builds
    assert built == [None, None, type(unshared["target_tokenizer"])]
    assert unshared["draft_tokenizer"] is not unshared["draft_own_tokenizer"]
    monkeypatch.setattr(loading, "_load_tokenizer_from", real_build)
    shared = check_tokenizer_alignment(*pair, smoke, **loaded)
    alone = check_tokenizer_alignment(*pair, smoke)
    assert shared.status == alone.status == "pass"
    assert (shared.summary, shared.evidence) == (alone.summary, alone.evidence)


def test_a_swapped_token_id_fails_naming_the_token(pair, draft_copy, smoke):
    tokenizer = load_tokenizer(pair[0])
    # Two ordinary (learned) tokens that the smoke mail prompt uses.
    ids = tokenizer.encode("dear customer", add_special_tokens=False)
    first, second = tokenizer.convert_ids_to_tokens(ids[:2])
    vocab = tokenizer.get_vocab()

    def swap(data):
        model_vocab = data["model"]["vocab"]
        model_vocab[first], model_vocab[second] = model_vocab[second], model_vocab[first]

    edit_json(draft_copy / "tokenizer.json", swap)
    result = check_tokenizer_alignment(draft_copy, pair[1], smoke)
    assert result.status == "fail"
    low, high = sorted([first, second], key=vocab.get)
    # Listed in draft id order: the token that moved down comes first.
    assert result.summary.startswith(
        f"token ids differ: {high!r} is {vocab[low]} in draft, {vocab[high]} in target; "
        f"{low!r} is {vocab[high]} in draft, {vocab[low]} in target")
    assert result.figures["vocab_id_mismatches"] == 2
    # The mail prompt starts with these tokens: its first difference is shown id by id.
    mismatch = {m["record"]: m for m in result.evidence["golden"]["mismatches"]}["smoke-mail-01"]
    assert (mismatch["position"], mismatch["target_id"], mismatch["draft_id"]) == (0, ids[0], ids[1])
    assert mismatch["draft_token"] == mismatch["target_token"] == first


def test_an_extra_special_token_past_an_embedding_that_cannot_hold_it_fails(pair, draft_copy, smoke):
    tokenizer = AutoTokenizer.from_pretrained(draft_copy)
    tokenizer.add_tokens(["<|extra|>"], special_tokens=True)
    tokenizer.save_pretrained(draft_copy)
    result = check_tokenizer_alignment(draft_copy, pair[1], smoke)
    assert result.status == "fail"
    findings = {f["message"]: f["status"] for f in result.evidence["findings"]}
    # past the target's vocabulary, the ids below the same: the rule for every draft id beyond it
    assert findings["the draft's tokenizer adds 1 token(s) after the target's vocabulary ('<|extra|>' (id 300)), "
                    "the ids below the same: engines feed the draft the target's token ids, so draft ids from 300 up "
                    "are never fed and never accepted; specreg verifies ids below 300 only"] == "warn"
    # but the draft embedding (300 rows) cannot hold id 300
    assert findings["draft config.json vocab_size 300 is smaller than its tokenizer (301 tokens): "
                    "ids from 300 up have no embedding"] == "fail"
    assert len(findings) == 2  # not again as an added or special token only in the draft


def test_tokens_after_the_targets_vocabulary_follow_the_larger_vocabulary_rule(pair, tmp_path, smoke):
    # a draft whose tokenizer adds special tokens after the target's, its embedding grown to hold
    # them: the same warning as embedding rows beyond the target's, and validation runs
    from tinymodels import build_llama

    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate, target_only_generate
    from specreg.runtime.methods import load_pair

    tokenizer = AutoTokenizer.from_pretrained(pair[1])
    tokenizer.add_tokens(["<|tool|>", "<|end_tool|>"], special_tokens=True)
    draft = build_llama(tmp_path / "draft-more", tokenizer=tokenizer, hidden_size=32, num_layers=1, num_heads=2,
                        num_kv_heads=1, intermediate_size=64)
    result = check_tokenizer_alignment(draft, pair[1], smoke)
    assert result.status == "warn", result.summary
    assert [f["aspect"] for f in result.evidence["findings"]] == ["vocab", "embedding_size"]
    assert all("draft ids from 300 up are never fed and never accepted" in f["message"]
               for f in result.evidence["findings"])
    loaded = load_pair(pair[1], draft)
    assert loaded.vocab_size == 300
    config = DecodeConfig(k=3, max_new_tokens=16, eos_token_ids=())
    prompt = tokenizer("dear customer, thank you", add_special_tokens=False)["input_ids"]
    assert speculative_generate(loaded, prompt, config).token_ids == target_only_generate(loaded, prompt, config).token_ids


def test_a_strict_prefix_vocabulary_is_refused_with_the_engines_reasons(pair, tmp_path, smoke):
    from tinymodels import build_llama, build_tokenizer

    smaller = build_tokenizer(tmp_path / "smaller", vocab_size=280)  # the same corpus: the first 280 tokens
    draft = build_llama(tmp_path / "draft-smaller", tokenizer=smaller, hidden_size=32, num_layers=1, num_heads=2,
                        num_kv_heads=1, intermediate_size=64)
    result = check_tokenizer_alignment(draft, pair[1], smoke)
    assert result.status == "fail"
    # the vocab finding first; fewer merges also segment text otherwise (merges, golden encodings)
    assert [f["aspect"] for f in result.evidence["findings"] if f["status"] == "fail"] == \
        ["vocab", "merges", "golden_encoding"]
    assert result.summary.startswith("the draft's vocabulary is a strict prefix of the target's (280 of 300 tokens")
    assert "padding" not in result.summary.replace("not padding", "")
    assert "use_heterogeneous_vocab" in result.summary and "vllm/config/speculative.py:496-500" in result.summary


def test_a_padded_embedding_warns_not_fails(pair, tmp_path, smoke):
    from tinymodels import build_llama

    padded = build_llama(tmp_path / "padded", pair[0], vocab_size=320, hidden_size=32,
                         num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    result = check_tokenizer_alignment(padded, pair[1], smoke)
    assert result.status == "warn", result.summary
    assert result.summary == (
        "embedding sizes differ (draft vocab_size 320, target 300): engines feed the draft the target's token ids, "
        "so draft ids from 300 up are never fed and never accepted; specreg verifies ids below 300 only; vLLM 0.33 "
        "refuses draft/target pairs whose vocab_size differs unless use_heterogeneous_vocab "
        "(vllm/config/speculative.py:2040-2052)")
    assert (result.figures["draft_vocab_size"], result.figures["target_vocab_size"]) == (320, 300)
    assert result.figures["golden_prompts_mismatched"] == 0


def test_a_different_pre_tokenizer_setting_fails(pair, draft_copy, smoke):
    edit_json(draft_copy / "tokenizer.json", lambda d: d["pre_tokenizer"].update(add_prefix_space=True))
    result = check_tokenizer_alignment(draft_copy, pair[1], smoke)
    assert result.status == "fail"
    assert result.summary.startswith("pre_tokenizer differs at add_prefix_space: draft true, target false")
    # Its effect is real: a leading space changes the first token of every raw prompt.
    assert result.figures["golden_prompts_mismatched"] >= 1


def test_a_different_eos_token_fails(pair, draft_copy, smoke):
    edit_json(draft_copy / "tokenizer_config.json", lambda d: d.update(eos_token="<pad>"))
    result = check_tokenizer_alignment(draft_copy, pair[1], smoke)
    assert result.status == "fail"
    assert "eos token differs: draft '<pad>' (id 3), target '</s>' (id 2)" in [
        f["message"] for f in result.evidence["findings"]]


def test_missing_chat_template_skips_chat_records_here(pair, draft_copy, smoke):
    (draft_copy / "chat_template.jinja").unlink()
    result = check_tokenizer_alignment(draft_copy, pair[1], smoke)
    assert result.status == "pass"
    assert result.figures["golden_prompts_skipped"] == len(smoke.chat_records) == 2
    assert result.figures["golden_prompts_compared"] == len(smoke) - 2


def test_missing_or_broken_tokenizer_files_are_one_line_errors(pair, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelReferenceError) as info:
        check_tokenizer_alignment(empty, pair[1])
    assert str(info.value) == (f"{empty}: no tokenizer files (expected one of tokenizer.json, "
                               "tokenizer.model, vocab.json, spm.model)")
    with pytest.raises(ModelReferenceError) as info:
        check_tokenizer_alignment(tmp_path / "nowhere", pair[1])
    assert str(info.value) == f"{tmp_path / 'nowhere'}: model directory not found"

    broken = tmp_path / "broken"
    shutil.copytree(pair[0], broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelReferenceError) as info:
        check_tokenizer_alignment(broken, pair[1])
    assert str(info.value).startswith(f"{broken}: cannot load tokenizer: ")
    assert "\n" not in str(info.value)


def test_without_a_golden_set_only_the_files_are_compared(pair):
    result = check_tokenizer_alignment(*pair)
    assert result.status == "pass"
    assert "golden_prompts_compared" not in result.figures
    assert json.loads(json.dumps(result.to_dict()))["name"] == "tokenizer"
