"""Chat-template alignment: identical, a missing newline, no template, a failing template."""

from __future__ import annotations

import os

import pytest
from tinymodels import CHAT_TEMPLATE
from transformers import AutoTokenizer

from specreg.golden_prompts.loader import golden_set_from_document, load_golden_set
from specreg.validators.chat_template import check_chat_template_alignment


def set_template(model_dir, template):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(model_dir)


def test_identical_templates_pass_on_every_conversation(pair):
    golden = load_golden_set("default")
    result = check_chat_template_alignment(*pair, golden)
    assert result.status == "pass", result.summary
    assert result.figures["conversations"] == len(golden.chat_records) == 20
    assert result.figures["renders_compared"] == 40
    assert result.evidence["templates_identical"] is True
    assert result.summary == ("chat templates agree on 20 conversations of 'default' "
                              "(40 renders, with and without the generation prompt)")


def test_a_missing_newline_fails_showing_the_difference(pair, draft_copy):
    set_template(draft_copy, CHAT_TEMPLATE.replace("</s>\n", "</s>"))
    golden = load_golden_set("smoke")
    result = check_chat_template_alignment(draft_copy, pair[1], golden)
    assert result.status == "fail"

    # The first conversation, rendered by each side directly: where do they part?
    record = golden.chat_records[0]
    draft_text = AutoTokenizer.from_pretrained(draft_copy).apply_chat_template(
        record.message_dicts(), tokenize=False, add_generation_prompt=True)
    target_text = AutoTokenizer.from_pretrained(pair[1]).apply_chat_template(
        record.message_dicts(), tokenize=False, add_generation_prompt=True)
    offset = len(os.path.commonprefix([draft_text, target_text]))
    assert target_text[offset] == "\n" and draft_text[offset] == "<"

    first = result.evidence["text_mismatches"][0]
    assert (first["record"], first["add_generation_prompt"], first["offset"]) == (record.id, True, offset)
    assert first["draft_context"] == "..." + repr(draft_text[offset - 20:offset]) + " ^ " + repr(draft_text[offset:offset + 20])
    assert first["target_context"].endswith("' ^ '\\n<|assistant|>\\n'")
    assert result.summary.startswith(
        f"chat templates render record '{record.id}' (with generation prompt) differently at character {offset}: ")
    # Both renders of both conversations differ, as text and as ids.
    assert result.figures["text_mismatches"] == result.figures["token_mismatches"] == 4
    assert result.evidence["templates_identical"] is False


def test_no_template_on_one_side_fails_with_the_reason(pair, draft_copy):
    (draft_copy / "chat_template.jinja").unlink()
    result = check_chat_template_alignment(draft_copy, pair[1], load_golden_set("smoke"))
    assert result.status == "fail"
    assert result.summary == ("the draft has no chat template, but golden set 'smoke' has 2 messages "
                              "records that must be rendered through one")


def test_a_set_without_messages_is_skipped_and_says_so(pair):
    golden = golden_set_from_document({"name": "raw-only", "version": 1, "records": [
        {"id": "r1", "category": "code", "prompt": "def f():\n", "max_new_tokens": 4}]})
    result = check_chat_template_alignment(*pair, golden)
    assert result.status == "skip"
    assert result.summary == "golden set 'raw-only' has no messages records; chat templates not compared"


def test_a_template_that_raises_fails_naming_the_record(pair, draft_copy):
    refusing = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('system role not supported') }}"
                "{% endif %}" + CHAT_TEMPLATE)
    set_template(draft_copy, refusing)
    result = check_chat_template_alignment(draft_copy, pair[1], load_golden_set("smoke"))
    assert result.status == "fail"
    assert result.summary.startswith(
        "draft chat template fails on record 'smoke-mail-02': system role not supported")
    assert result.figures["render_errors"] == 2  # with and without the generation prompt


@pytest.mark.parametrize("side", ["draft", "target"])
def test_neither_or_either_side_missing(pair, draft_copy, tmp_path, side):
    import shutil

    target_copy = shutil.copytree(pair[1], tmp_path / "target-copy")
    (draft_copy / "chat_template.jinja").unlink()
    if side == "target":
        (target_copy / "chat_template.jinja").unlink()
    result = check_chat_template_alignment(draft_copy, target_copy, load_golden_set("smoke"))
    assert result.status == "fail"
    expected = "neither model has" if side == "target" else "the draft has no"
    assert result.summary.startswith(expected)
