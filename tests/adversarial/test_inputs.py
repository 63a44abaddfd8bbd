"""Hostile and careless INPUTS (issue 14): model folders, safetensors headers, shard indexes,
configs, tokenizers, chat templates, golden sets, policies, lengths and paths.

Each test was seen failing (a traceback, a wrong acceptance, or a check that passed) before
its fix. CLI tests run a real ``python -m specreg.cli`` subprocess and assert one line on
stderr, the exit code and no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from specreg.core.fingerprint import compare_fingerprints, fingerprint_model, read_safetensors_header, sha256_file
from specreg.core.types import ModelFingerprint, ModelRef
from specreg.errors import ModelReferenceError

SPECREG = [sys.executable, "-m", "specreg.cli"]


def run_cli(*args, env=None, cwd=None, timeout=300):
    result = subprocess.run(SPECREG + [str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                            env={**os.environ, **(env or {})}, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def one_line_error(result, code, *fragments):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def copy_model(tiny_models, tmp_path, name="model", source="draft") -> Path:
    path = tmp_path / name
    shutil.copytree(tiny_models[source], path)
    return path


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# --- item 8: corrupt safetensors, as strict as the safetensors library ---------------------

def safetensors_bytes(header, data: bytes = b"", raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
CORRUPT_HEADERS = {
    "negative dim": ({"w": {**F32, "shape": [-2]}}, 8, None),
    "overlapping offsets": ({"a": F32, "b": F32}, 8, None),
    "gap between tensors": ({"a": F32, "b": {**F32, "data_offsets": [16, 24]}}, 24, None),
    "offsets past the data": ({"w": {**F32, "shape": [4], "data_offsets": [0, 16]}}, 8, None),
    "non-string metadata": ({"__metadata__": {"format": 1}, "w": F32}, 8, None),
    "metadata a list": ({"__metadata__": ["pt"], "w": F32}, 8, None),
    "unknown dtype": ({"w": {**F32, "dtype": "F31"}}, 8, None),
    "header a JSON array": (None, 0, b"[1, 2]"),
    "header a JSON string": (None, 0, b'"abc"'),
    "trailing data": ({"w": F32}, 16, None),
    "shape 1e400": (None, 8, b'{"w":{"dtype":"F32","shape":[1e400],"data_offsets":[0,8]}}'),
    "shape a float": ({"w": {**F32, "shape": [2.0]}}, 8, None),
    "shape a bool": ({"w": {**F32, "shape": [True, 2]}}, 8, None),
    "offsets three numbers": ({"w": {**F32, "data_offsets": [0, 8, 9]}}, 8, None),
    "tensor not an object": ({"w": [1, 2]}, 8, None),
    "missing shape": ({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, 8, None),
    "shape overflows 64 bits": ({"w": {**F32, "shape": [2 ** 40, 2 ** 40]}}, 8, None),
    "header not UTF-8": (None, 8, b'{"w\xff":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'),
    "header nested 100000 deep": (None, 0, b"{" + b'"a":[' * 100000 + b"]" * 100000 + b"}"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_HEADERS))
def test_corrupt_safetensors_refused_like_the_library(case, tmp_path):
    header, data_len, raw = CORRUPT_HEADERS[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(header, b"\0" * data_len, raw))
    from safetensors import safe_open

    with pytest.raises(Exception):  # the library refuses it ...
        with safe_open(str(path), framework="pt") as handle:
            list(handle.keys())
    with pytest.raises(ModelReferenceError, match="corrupt safetensors header"):  # ... and so do we
        read_safetensors_header(path)


def test_a_header_naming_one_tensor_twice_is_refused(tmp_path):
    """Stricter than the library (which keeps one of the two): a header that says two things about
    one tensor is not trusted."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(None, b"\0" * 8, b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                                        b'"w":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}'))
    with pytest.raises(ModelReferenceError, match="duplicate key 'w'"):
        read_safetensors_header(path)


def test_valid_safetensors_header_accepted_like_the_library(tmp_path):
    path = tmp_path / "model.safetensors"
    header = {"__metadata__": {"format": "pt"}, "a": F32, "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]},
              "empty": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]}}
    path.write_bytes(safetensors_bytes(header, b"\0" * 16))
    assert set(read_safetensors_header(path)) == {"__metadata__", "a", "b", "empty"}


def test_register_refuses_a_model_with_overlapping_tensors(tiny_models, tmp_path):
    from specreg import Registry

    model = copy_model(tiny_models, tmp_path)
    (model / "model.safetensors").write_bytes(safetensors_bytes({"a": F32, "b": F32}, b"\0" * 8))
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(ModelReferenceError, match="model.safetensors: corrupt safetensors header .*overlap"):
        registry.register("p", target=str(tiny_models["target"]), draft=str(model), num_speculative_tokens=2)
    assert registry.list() == []


# --- item 1: shard indexes --------------------------------------------------------------

def sharded_model(tiny_models, tmp_path, name="sharded") -> Path:
    """The tiny draft saved as two safetensors shards with model.safetensors.index.json."""
    from transformers import AutoModelForCausalLM

    path = tmp_path / name
    shutil.copytree(tiny_models["draft"], path)
    (path / "model.safetensors").unlink()
    model = AutoModelForCausalLM.from_pretrained(tiny_models["draft"])
    model.save_pretrained(path, max_shard_size="60KB")
    assert (path / "model.safetensors.index.json").is_file()
    return path


def test_sharded_model_hashes_every_shard_and_the_index(tiny_models, tmp_path):
    path = sharded_model(tiny_models, tmp_path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) >= 2
    fp = fingerprint_model(path)
    assert set(fp.weight_files) == shards
    assert fp.weight_files == {name: sha256_file(path / name) for name in shards}
    assert "model.safetensors.index.json" in fp.behaviour_files
    # the index decides which file each tensor loads from: editing it is a change
    edit_json(path / "model.safetensors.index.json", lambda d: d["metadata"].update(total_size=1))
    assert compare_fingerprints(fp, fingerprint_model(path)) == ["model.safetensors.index.json changed"]


@pytest.mark.parametrize("shard", ["../elsewhere/x.safetensors", "/tmp/abs.safetensors", "sub/x.safetensors",
                                   "..", "", 17])
def test_index_naming_a_file_outside_the_folder_is_refused(tiny_models, tmp_path, shard):
    path = sharded_model(tiny_models, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(path / sorted(p.name for p in path.glob("*.safetensors"))[0], outside / "x.safetensors")
    edit_json(path / "model.safetensors.index.json",
              lambda d: d["weight_map"].update({next(iter(d["weight_map"])): shard}))
    with pytest.raises(ModelReferenceError, match="model.safetensors.index.json: names weight file .* not a file inside"):
        fingerprint_model(path)


def test_transformers_follows_the_index_outside_the_folder(tiny_models, tmp_path):
    """Why item 1 matters: transformers loads what the index names, even ../ outside the folder."""
    from transformers.utils.hub import get_checkpoint_shard_files

    path = sharded_model(tiny_models, tmp_path)
    edit_json(path / "model.safetensors.index.json",
              lambda d: d["weight_map"].update({k: "../elsewhere/x.safetensors" for k in list(d["weight_map"])[:1]}))
    files, _ = get_checkpoint_shard_files(str(path), str(path / "model.safetensors.index.json"))
    assert os.path.join(str(path), "../elsewhere/x.safetensors") in files


def test_index_naming_a_symlink_out_is_refused(tiny_models, tmp_path):
    path = sharded_model(tiny_models, tmp_path)
    first = sorted(p.name for p in path.glob("*.safetensors"))[0]
    outside = tmp_path / "outside.safetensors"
    shutil.move(path / first, outside)
    os.symlink(outside, path / first)
    with pytest.raises(ModelReferenceError, match="symlink to .*outside the model folder"):
        fingerprint_model(path)


def test_index_naming_a_pickle_shard_needs_allow_pickle_and_is_hashed(tiny_models, tmp_path):
    path = sharded_model(tiny_models, tmp_path)
    (path / "extra.bin").write_bytes(b"not really a pickle")
    edit_json(path / "model.safetensors.index.json",
              lambda d: d["weight_map"].update({"lm_head.weight": "extra.bin"}))
    with pytest.raises(ModelReferenceError, match="names weight file 'extra.bin', which is not safetensors"):
        fingerprint_model(path)
    fp = fingerprint_model(path, allow_pickle=True)
    assert fp.weight_files["extra.bin"] == sha256_file(path / "extra.bin")
    (path / "extra.bin").write_bytes(b"swapped")
    assert "weight file extra.bin changed" in compare_fingerprints(fp, fingerprint_model(path, allow_pickle=True))


def test_index_naming_a_missing_shard_is_refused(tiny_models, tmp_path):
    path = sharded_model(tiny_models, tmp_path)
    edit_json(path / "model.safetensors.index.json",
              lambda d: d["weight_map"].update({"lm_head.weight": "model-00099-of-00099.safetensors"}))
    with pytest.raises(ModelReferenceError, match="'model-00099-of-00099.safetensors', which does not exist"):
        fingerprint_model(path)


def test_config_transformers_weights_must_stay_inside(tiny_models, tmp_path):
    path = copy_model(tiny_models, tmp_path)
    edit_json(path / "config.json", lambda d: d.update(transformers_weights="../other/model.safetensors"))
    with pytest.raises(ModelReferenceError, match="config.json: names weight file '../other/model.safetensors'"):
        fingerprint_model(path)


# --- item 7: files that change tokenization or generation -----------------------------------

BEHAVIOUR_EDITS = {
    "generation_config.json": lambda d: d.update(eos_token_id=[2, 5], do_sample=True, temperature=0.3),
    "tokenizer_config.json": lambda d: d.update(split_special_tokens=True, do_lower_case=True),
    "special_tokens_map.json": lambda d: d.update(additional_special_tokens=["<|user|>"]),
}


@pytest.mark.parametrize("name", sorted(BEHAVIOUR_EDITS))
def test_behaviour_file_changes_change_the_fingerprint(tiny_models, tmp_path, name):
    path = copy_model(tiny_models, tmp_path)
    if not (path / name).exists():
        (path / name).write_text("{}")
    before = fingerprint_model(path)
    edit_json(path / name, BEHAVIOUR_EDITS[name])
    after = fingerprint_model(path)
    assert compare_fingerprints(before, after) == [f"{name} changed"]


def test_added_tokens_file_appearing_changes_the_fingerprint(tiny_models, tmp_path):
    path = copy_model(tiny_models, tmp_path)
    before = fingerprint_model(path)
    (path / "added_tokens.json").write_text(json.dumps({"<extra>": 300}))
    assert compare_fingerprints(before, fingerprint_model(path)) == ["added_tokens.json was added"]


def scheme_one(fingerprint: ModelFingerprint) -> dict:
    """The fingerprint as a version registered before scheme 2 has it stored."""
    return {key: value for key, value in fingerprint.to_dict().items() if key not in ("scheme", "behaviour_files")}


def test_a_version_registered_under_scheme_one_still_verifies(tiny_models, tmp_path):
    from specreg.validators.integrity import check_integrity

    path = copy_model(tiny_models, tmp_path)
    old = scheme_one(fingerprint_model(path))
    recorded = ModelFingerprint.from_dict(old)
    assert recorded.to_dict() == old  # serialised as recorded: its binding digest is unchanged
    assert compare_fingerprints(recorded, fingerprint_model(path)) == []
    ref = ModelRef(reference=str(path), path=str(path), revision=None, fingerprint=recorded)
    assert check_integrity({"target": ref, "draft": None}).status == "pass"
    # what scheme 1 covered is still compared
    edit_json(path / "config.json", lambda d: d.update(rope_theta=1.0))
    assert check_integrity({"target": ref, "draft": None}).status == "fail"


def test_gate_on_a_scheme_one_registration_still_passes_integrity(tiny_models, tmp_path):
    """The gate re-fingerprints and compares: a row written before scheme 2 must not fail it."""
    from sqlalchemy import select, update

    from specreg import Registry
    from specreg.registry.governance import decisions
    from specreg.registry.store.orm import PairVersionRow

    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}")
    version = registry.register("p", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                                num_speculative_tokens=2).version
    assert version.target.fingerprint.scheme == 2
    old = {role: {**ref.to_dict(), "fingerprint": scheme_one(ref.fingerprint)}
           for role, ref in (("target", version.target), ("draft", version.draft))}
    with registry.store.session(write=True) as session:
        row_id = session.scalars(select(PairVersionRow.id)).one()
        session.execute(update(PairVersionRow).where(PairVersionRow.id == row_id).values(**old))
    version = registry.get(version.label)
    assert version.target.fingerprint.scheme is None and version.draft.fingerprint.behaviour_files is None
    assert decisions.fingerprint_changes(version) == []


# --- register on malformed configs and tokenizers: one line naming the file and field ----------

def write(name, content):
    def change(path: Path):
        target = path / name
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    return change


def json_edit(name, change):
    return lambda path: edit_json(path / name, change)


DEEP = "[" * 100000 + "]" * 100000
MALFORMED_MODELS = {
    "vocab_size NaN": (json_edit("config.json", lambda d: d.update(vocab_size=float("nan"))), "config.json: field 'vocab_size'"),
    "vocab_size 1e400": (lambda p: (p / "config.json").write_text((p / "config.json").read_text().replace(
        '"vocab_size": 300', '"vocab_size": 1e400')), "config.json: field 'vocab_size'"),
    "vocab_size a string": (json_edit("config.json", lambda d: d.update(vocab_size="300")), "field 'vocab_size'"),
    "vocab_size negative": (json_edit("config.json", lambda d: d.update(vocab_size=-1)), "field 'vocab_size'"),
    "num_hidden_layers a float": (json_edit("config.json", lambda d: d.update(num_hidden_layers=2.5)), "field 'num_hidden_layers'"),
    "max_position_embeddings huge": (json_edit("config.json", lambda d: d.update(max_position_embeddings=10 ** 30)),
                                     "field 'max_position_embeddings'"),
    "architectures a string": (json_edit("config.json", lambda d: d.update(architectures="LlamaForCausalLM")),
                               "field 'architectures'"),
    "text_config a string": (json_edit("config.json", lambda d: d.update(text_config="x")), "field 'text_config'"),
    "text_config vocab NaN": (json_edit("config.json", lambda d: d.update(text_config={"vocab_size": float("nan")})),
                              "field 'text_config.vocab_size'"),
    "config nested 100000 deep": (write("config.json", '{"a": ' + DEEP + "}"), "config.json: not readable JSON"),
    "config nested 100 deep": (write("config.json", '{"a": ' + "[" * 100 + "]" * 100 + "}"), "nested deeper than 64"),
    "config an array": (write("config.json", "[1]"), "config.json: expected a JSON object"),
    "config not UTF-8": (write("config.json", b'{"a": "\xff"}'), "config.json: not readable JSON"),
    "config a 5000-digit integer": (write("config.json", '{"vocab_size": ' + "9" * 5000 + "}"), "config.json: not readable JSON"),
    "config empty": (write("config.json", ""), "config.json: not readable JSON"),
    "tokenizer model a list": (json_edit("tokenizer.json", lambda d: d.update(model=[1, 2])), "field 'model'"),
    "tokenizer merges numbers": (json_edit("tokenizer.json", lambda d: d["model"].update(merges=[1, 2])), "field 'model.merges'"),
    "tokenizer vocab id a string": (json_edit("tokenizer.json", lambda d: d["model"]["vocab"].update({"hello": "7"})),
                                    "field 'model.vocab': token 'hello' has id '7'"),
    "tokenizer added_tokens numbers": (json_edit("tokenizer.json", lambda d: d.update(added_tokens=[1])), "field 'added_tokens'"),
    "tokenizer added_tokens id NaN": (json_edit("tokenizer.json", lambda d: d.update(added_tokens=[{"id": float("nan")}])),
                                      "field 'added_tokens'"),
    "tokenizer nested 100000 deep": (write("tokenizer.json", '{"a": ' + DEEP + "}"), "tokenizer.json: not readable JSON"),
    "tokenizer not UTF-8": (write("tokenizer.json", b"\xff\xfe"), "tokenizer.json: not readable JSON"),
    "chat_template a number": (lambda p: ((p / "chat_template.jinja").unlink(missing_ok=True),
                                          edit_json(p / "tokenizer_config.json", lambda d: d.update(chat_template=5))),
                               "tokenizer_config.json: field 'chat_template'"),
    "chat_template.jinja not UTF-8": (write("chat_template.jinja", b"{{ \xff }}"), "chat_template.jinja: cannot read"),
    "special_tokens_map an array": (write("special_tokens_map.json", "[]"), "special_tokens_map.json: expected a JSON object"),
    "generation_config not JSON": (write("generation_config.json", "{eos"), "generation_config.json: not readable JSON"),
    "weights a directory only": (lambda p: ((p / "model.safetensors").unlink(), (p / "w.safetensors").mkdir()),
                                 "no weight files"),
    "transformers_weights a number": (json_edit("config.json", lambda d: d.update(transformers_weights=5)),
                                      "field 'transformers_weights'"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_MODELS))
def test_register_on_a_malformed_model_names_file_and_field(tiny_models, tmp_path, case):
    from specreg import Registry

    change, message = MALFORMED_MODELS[case]
    model = copy_model(tiny_models, tmp_path)
    change(model)
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(ModelReferenceError) as caught:
        registry.register("p", target=str(tiny_models["target"]), draft=str(model), num_speculative_tokens=2)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400
    assert registry.list() == []


def test_cli_register_on_nan_vocab_size_is_one_line(tiny_models, tmp_path):
    model = copy_model(tiny_models, tmp_path)
    text = (model / "config.json").read_text().replace('"vocab_size": 300', '"vocab_size": NaN')
    (model / "config.json").write_text(text)
    result = run_cli("register", "p", "--target", tiny_models["target"], "--draft", model, "-k", "2",
                     "--db", f"sqlite:///{tmp_path / 'r.db'}")
    one_line_error(result, 1, "config.json: field 'vocab_size' must be a positive integer, got nan")
