"""The one place the checks find where two values first differ (specreg/core/differences.py)."""

from specreg.core.differences import first_difference, first_json_difference


def test_first_difference_counts_a_length_difference():
    assert first_difference([1, 2], [1, 2]) is None
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([1, 3], [1, 2]) == 1


def test_first_difference_of_texts_is_a_character_offset():
    """The chat-template check's rendered texts: the offset of the first differing character."""
    assert first_difference("<|user|>\nhi", "<|user|>\nhi") is None
    assert first_difference("<|user|>\nhi", "<|user|> hi") == 8
    assert first_difference("<|user|>", "<|user|>\n") == 8


def test_first_json_difference_names_the_path():
    draft = {"type": "BPE", "options": {"byte_fallback": False, "splits": [1, 2]}}
    assert first_json_difference(draft, draft) is None
    assert first_json_difference(draft, {"type": "BPE", "options": {"byte_fallback": False, "splits": [1, 3]}}) == (
        "options.splits[1]", 2, 3)
    # lists of different lengths, and values of different types, differ as a whole at their path
    assert first_json_difference({"a": [1]}, {"a": [1, 2]}) == ("a", [1], [1, 2])
    assert first_json_difference(1, "1") == ("(whole)", 1, "1")
