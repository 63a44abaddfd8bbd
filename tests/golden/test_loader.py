"""Golden prompt sets: the shipped sets, the file formats, the content hash and every error."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from specreg.errors import GoldenSetError
from specreg.golden_prompts.loader import (
    SCHEMA_PATH,
    SHIPPED_DIR,
    load_golden_set,
    shipped_set_names,
)
from specreg.golden_prompts.records import SHIPPED, GoldenRef

WORKLOADS = {"support", "summarization", "code", "business_mail", "creative"}

VALID = {
    "name": "mine",
    "version": 2,
    "description": "a user's set",
    "records": [
        {"id": "chat-1", "category": "support", "max_new_tokens": 16,
         "messages": [{"role": "system", "content": "be brief."}, {"role": "user", "content": "hi"}]},
        {"id": "raw-1", "category": "code", "prompt": "def f():\n", "max_new_tokens": 8,
         "temperature": 1, "top_p": 0.9, "top_k": 20, "seed": 3, "tags": ["python"]},
    ],
}


def write_yaml(path: Path, document) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def write_jsonl(path: Path, document) -> Path:
    header = {k: v for k, v in document.items() if k != "records"}
    lines = [json.dumps(header)] + [json.dumps(r) for r in document["records"]]
    path.write_text("\n".join(lines) + "\n")
    return path


def with_record(index: int, **changes) -> dict:
    document = json.loads(json.dumps(VALID))
    for key, value in changes.items():
        if value is None:
            document["records"][index].pop(key, None)
        else:
            document["records"][index][key] = value
    return document


# --- shipped sets --------------------------------------------------------------------------


def test_shipped_sets_validate_against_the_schema_and_cover_the_workloads():
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert shipped_set_names() == ["default", "smoke"]
    for name in shipped_set_names():
        raw = yaml.safe_load((SHIPPED_DIR / f"{name}.yaml").read_text())
        jsonschema.Draft202012Validator(schema).validate(raw)
        golden = load_golden_set(name)
        assert golden.name == name
        assert set(golden.categories) == WORKLOADS
        assert golden.chat_records and any(not r.is_chat for r in golden.records)
        creative = golden.by_category()["creative"]
        assert all(r.temperature and r.temperature > 0 and r.seed is not None for r in creative)
        assert all(r.is_greedy for r in golden.records if r.category != "creative")

    default, smoke = load_golden_set("default"), load_golden_set("smoke")
    assert len(default) >= 40
    assert 5 <= len(smoke) <= 8
    assert all(16 <= r.max_new_tokens <= 24 for r in smoke.records)
    assert all(1 <= n <= 2 for n in map(len, smoke.by_category().values()))
    assert default.source == SHIPPED_DIR / "default.yaml"


def test_a_set_resolves_to_one_reference_its_runs_are_matched_by(tmp_path, monkeypatch):
    # the gate matches validation runs by this hash alone: a change to how it is computed would
    # leave every recorded run counting for nothing
    smoke = load_golden_set("smoke")
    assert smoke.reference == GoldenRef("smoke", SHIPPED,
                                        "4e41f1a77a7b86734f49a2caa86fbf26464d997d2c1b257f06311a4008c55997")
    # the same content in a file named by its path: the same set by content, from somewhere else
    (tmp_path / "smoke.yaml").write_text((SHIPPED_DIR / "smoke.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert load_golden_set("./smoke.yaml").reference == GoldenRef("smoke", "smoke.yaml", smoke.content_sha256)
    assert load_golden_set("smoke").reference.source == SHIPPED  # a bare name is never the file beside it


def test_a_user_file_loads_by_path_in_yaml_json_and_jsonl_with_the_same_hash(tmp_path):
    from_yaml = load_golden_set(write_yaml(tmp_path / "mine.yaml", VALID))
    (tmp_path / "mine.json").write_text(json.dumps(VALID))
    from_json = load_golden_set(tmp_path / "mine.json")
    from_jsonl = load_golden_set(write_jsonl(tmp_path / "mine.jsonl", VALID))
    assert from_yaml.content_sha256 == from_json.content_sha256 == from_jsonl.content_sha256
    chat, raw = from_yaml.records
    assert (from_yaml.name, from_yaml.version, from_yaml.description) == ("mine", "2", "a user's set")
    assert chat.is_chat and chat.message_dicts() == VALID["records"][0]["messages"]
    assert raw.prompt == "def f():\n" and raw.temperature == 1.0 and raw.tags == ("python",)
    assert not raw.is_greedy and chat.is_greedy


def test_content_hash_is_stable_under_key_reordering_and_formatting(tmp_path):
    reordered = {
        "records": [dict(reversed(list(r.items()))) for r in VALID["records"]],
        "version": "2",  # same version, written as a string
        "name": "mine",
    }
    reordered["records"][1]["temperature"] = 1.0  # 1 and 1.0 are one setting
    reordered["records"][0]["tags"] = []  # empty tags == no tags
    path = tmp_path / "reordered.yaml"
    path.write_text("# a comment\n" + yaml.safe_dump(reordered, sort_keys=False, default_flow_style=True))
    original = load_golden_set(write_yaml(tmp_path / "mine.yaml", VALID))
    assert load_golden_set(path).content_sha256 == original.content_sha256
    # description is documentation, not content
    other_description = dict(VALID, description="changed")
    assert load_golden_set(write_yaml(tmp_path / "d.yaml", other_description)).content_sha256 == original.content_sha256


def test_content_hash_is_the_sha256_of_the_canonical_json_stored_runs_recorded(tmp_path):
    """The definition every recorded golden_sha256 was computed with: sorted keys, no spaces,
    UTF-8 (not ASCII escapes), records in schema names with only their set fields."""
    import hashlib

    document = dict(VALID, records=[dict(VALID["records"][0], messages=[{"role": "user", "content": "grüß dich ✓"}])])
    loaded = load_golden_set(write_yaml(tmp_path / "mine.yaml", document))
    canonical = {"name": "mine", "version": "2", "records": [
        {"id": "chat-1", "category": "support", "messages": [{"role": "user", "content": "grüß dich ✓"}],
         "max_new_tokens": 16}]}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert loaded.content_sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.mark.parametrize("change", [
    {"prompt": "def g():\n"},
    {"max_new_tokens": 9},
    {"seed": 4},
    {"tags": ["python", "new"]},
])
def test_content_hash_changes_when_a_record_changes(tmp_path, change):
    original = load_golden_set(write_yaml(tmp_path / "a.yaml", VALID))
    changed = load_golden_set(write_yaml(tmp_path / "b.yaml", with_record(1, **change)))
    assert changed.content_sha256 != original.content_sha256


def test_content_hash_changes_with_record_order_and_version(tmp_path):
    original = load_golden_set(write_yaml(tmp_path / "a.yaml", VALID))
    swapped = dict(VALID, records=list(reversed(VALID["records"])))
    assert load_golden_set(write_yaml(tmp_path / "b.yaml", swapped)).content_sha256 != original.content_sha256
    assert load_golden_set(write_yaml(tmp_path / "c.yaml", dict(VALID, version=3))).content_sha256 != original.content_sha256


# --- errors: one line naming file, record and field -----------------------------------------


@pytest.mark.parametrize("document, expected", [
    (with_record(1, max_new_tokens=0),
     "records[1] (id 'raw-1') field 'max_new_tokens': 0 is less than the minimum of 1"),
    (with_record(1, max_new_tokens="many"),
     "records[1] (id 'raw-1') field 'max_new_tokens': expected integer, got string 'many'"),
    (with_record(0, category=None),
     "records[0] (id 'chat-1') field 'category': missing"),
    (with_record(1, id=None),
     "records[1] field 'id': missing"),
    (with_record(1, messages=[{"role": "user", "content": "x"}]),
     "records[1] (id 'raw-1'): needs exactly one of 'messages' (chat) or 'prompt' (raw text), has both"),
    (with_record(0, messages=None),
     "records[0] (id 'chat-1'): needs exactly one of 'messages' (chat) or 'prompt' (raw text), has neither"),
    (with_record(0, messages=[{"role": "bot", "content": "x"}]),
     "records[0] (id 'chat-1') field 'messages[0].role': 'bot' is not one of 'system', 'user', 'assistant'"),
    (with_record(0, messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]),
     "records[0] (id 'chat-1') field 'messages[1].role': the last message must be from 'user' or "
     "'system' (the model writes the answer), got 'assistant'"),
    (with_record(1, max_new_token=5),
     "records[1] (id 'raw-1') field 'max_new_token': unknown field (allowed: category, id, max_new_tokens, "
     "messages, prompt, seed, tags, temperature, top_k, top_p)"),
    (with_record(1, top_p=1.5),
     "records[1] (id 'raw-1') field 'top_p': 1.5 is greater than the maximum of 1"),
    (with_record(1, temperature=-0.5),
     "records[1] (id 'raw-1') field 'temperature': -0.5 is less than the minimum of 0"),
    (with_record(1, id="chat-1"),
     "records[1] (id 'chat-1') field 'id': duplicate id, first used by records[0]"),
    (with_record(1, id="has space"),
     "records[1] (id 'has space') field 'id': 'has space' does not match ^[A-Za-z0-9][A-Za-z0-9._-]*$"),
    (dict(VALID, records=[]), "field 'records': [] should be non-empty"),
    ({"name": "mine", "records": VALID["records"]}, "field 'version': missing"),
    (["not", "a", "mapping"], "expected a mapping with 'name', 'version' and 'records', got list"),
])
def test_each_kind_of_error_gives_the_exact_message(tmp_path, document, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(path)
    assert str(info.value) == f"{path}: {expected}"
    assert "\n" not in str(info.value)


def test_several_errors_report_the_first_and_count_the_rest(tmp_path):
    document = with_record(1, max_new_tokens=0, top_p=7)
    path = write_yaml(tmp_path / "two.yaml", document)
    with pytest.raises(GoldenSetError, match=r"field 'max_new_tokens': 0 is less .* \(and 1 more error\)$"):
        load_golden_set(path)


def test_jsonl_errors_name_the_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", with_record(1, max_new_tokens=0))
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(path)
    assert str(info.value) == (f"{path}: line 3, records[1] (id 'raw-1') field 'max_new_tokens': "
                               "0 is less than the minimum of 1")

    path.write_text('{"name": "x", "version": 1}\n{"id": "a", oops}\n')
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(path)
    assert str(info.value) == f"{path}: line 2: invalid JSON at column 13: Expecting property name enclosed in double quotes"

    path.write_text('{"id": "a", "category": "code", "prompt": "x", "max_new_tokens": 1}\n')
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(path)
    assert str(info.value) == f'{path}: line 1: the first line must be the set header {{"name": ..., "version": ...}}'


import yaml  # noqa: E402

@pytest.mark.parametrize("text, expected", [
    # libyaml (the C parser the loader uses where PyYAML has it) words it its own way
    ("name: x\nversion: 1\nrecords: [\n", "invalid YAML at line 4, column 1: " + (
        "did not find expected node content" if yaml.__with_libyaml__
        else "expected the node content, but found '<stream end>'")),
    ("", "empty golden set file"),
    ("name: x\nname: y\nversion: 1\nrecords: []\n", "duplicate key 'name' at line 2"),
])
def test_yaml_syntax_errors_name_the_line(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(path)
    assert str(info.value) == f"{path}: {expected}"


def test_unknown_names_paths_and_formats(tmp_path):
    with pytest.raises(GoldenSetError) as info:
        load_golden_set("nosuchset")
    assert str(info.value) == ("unknown golden set 'nosuchset': shipped sets are default, smoke; "
                               "or pass the path of a .yaml or .jsonl file")
    missing = tmp_path / "missing.yaml"
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(missing)
    assert str(info.value) == f"{missing}: golden set file not found"
    wrong = tmp_path / "set.txt"
    wrong.write_text("name: x")
    with pytest.raises(GoldenSetError) as info:
        load_golden_set(wrong)
    assert str(info.value) == f"{wrong}: unknown golden set format '.txt' (use .yaml, .yml, .json or .jsonl)"


def test_records_are_immutable():
    golden = load_golden_set("smoke")
    with pytest.raises(AttributeError):
        golden.records[0].prompt = "changed"
    with pytest.raises(AttributeError):
        golden.name = "other"
