"""Hostile and careless INPUTS: model folders, safetensors headers, shard indexes,
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
from pathlib import Path

import pytest

from specreg.core.digests import sha256_file
from specreg.core.fingerprint import compare_fingerprints, fingerprint_model
from specreg.core.safetensors_header import read_safetensors_header
from specreg.core.types import ModelFingerprint, ModelRef
from specreg.errors import ModelReferenceError

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)
from helpers import copy_model


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

    model = copy_model(tiny_models["draft"], tmp_path / "model")
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
    """Why item 1 matters: the transformers releasing before its own shard-name check
    (transformers.utils.hub._check_shard_filenames_stay_in_model_dir) load what the index names,
    even ../ outside the folder; the releases with it refuse, as the registry does for all."""
    from transformers.utils import hub

    path = sharded_model(tiny_models, tmp_path)
    edit_json(path / "model.safetensors.index.json",
              lambda d: d["weight_map"].update({k: "../elsewhere/x.safetensors" for k in list(d["weight_map"])[:1]}))
    if hasattr(hub, "_check_shard_filenames_stay_in_model_dir"):
        with pytest.raises(ValueError, match="points outside the model directory: ../elsewhere/x.safetensors"):
            hub.get_checkpoint_shard_files(str(path), str(path / "model.safetensors.index.json"))
    else:
        files, _ = hub.get_checkpoint_shard_files(str(path), str(path / "model.safetensors.index.json"))
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
    path = copy_model(tiny_models["draft"], tmp_path / "model")
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
    path = copy_model(tiny_models["draft"], tmp_path / "model")
    if not (path / name).exists():
        (path / name).write_text("{}")
    before = fingerprint_model(path)
    edit_json(path / name, BEHAVIOUR_EDITS[name])
    after = fingerprint_model(path)
    assert compare_fingerprints(before, after) == [f"{name} changed"]


def test_added_tokens_file_appearing_changes_the_fingerprint(tiny_models, tmp_path):
    path = copy_model(tiny_models["draft"], tmp_path / "model")
    before = fingerprint_model(path)
    (path / "added_tokens.json").write_text(json.dumps({"<extra>": 300}))
    assert compare_fingerprints(before, fingerprint_model(path)) == ["added_tokens.json was added"]


def scheme_one(fingerprint: ModelFingerprint) -> dict:
    """The fingerprint as a version registered before scheme 2 has it stored."""
    return {key: value for key, value in fingerprint.to_dict().items() if key not in ("scheme", "behaviour_files")}


def test_a_version_registered_under_scheme_one_still_verifies(tiny_models, tmp_path):
    from specreg.validators.integrity import check_integrity

    path = copy_model(tiny_models["draft"], tmp_path / "model")
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
    from specreg.registry.governance import queries as decisions
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
    # sizes no weights could have, or more than these weights hold: refused from the config and the
    # safetensors headers, before a validation spends minutes on them
    "num_hidden_layers 10^9": (json_edit("config.json", lambda d: d.update(num_hidden_layers=10 ** 9)),
                               "config.json: field 'num_hidden_layers' is 1000000000, above any real model's (4096 "
                               "at most)"),
    "num_hidden_layers past the weights": (json_edit("config.json", lambda d: d.update(num_hidden_layers=3)),
                                           "config.json: field 'num_hidden_layers' is 3, but the weights hold 2 "
                                           "layer(s) (layers.0 to layers.1)"),
    "hidden_size wider than the embedding": (json_edit("config.json", lambda d: d.update(hidden_size=128)),
                                             "config.json: field 'hidden_size' is 128, but the token embedding has "
                                             "64 columns"),
    "vocab_size longer than the embedding": (json_edit("config.json", lambda d: d.update(vocab_size=400)),
                                             "config.json: field 'vocab_size' is 400, but the token embedding has "
                                             "300 rows"),
    "text_config hidden_size 10^9": (json_edit("config.json", lambda d: d.update(text_config={"hidden_size": 10 ** 9})),
                                     "field 'text_config.hidden_size' is 1000000000, above any real model's"),
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
    model = copy_model(tiny_models["draft"], tmp_path / "model")
    change(model)
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(ModelReferenceError) as caught:
        registry.register("p", target=str(tiny_models["target"]), draft=str(model), num_speculative_tokens=2)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400
    assert registry.list() == []


def test_cli_register_on_nan_vocab_size_is_one_line(tiny_models, tmp_path):
    model = copy_model(tiny_models["draft"], tmp_path / "model")
    text = (model / "config.json").read_text().replace('"vocab_size": 300', '"vocab_size": NaN')
    (model / "config.json").write_text(text)
    result = run("register", "p", "--target", tiny_models["target"], "--draft", model, "-k", "2",
                 "--db", f"sqlite:///{tmp_path / 'r.db'}")
    one_line(result, 1, "config.json: field 'vocab_size' must be a positive integer, got nan")


# --- item 4: files swapped between the integrity check and the model load ---------------------

@pytest.mark.parametrize("settled", [False, True], ids=["fresh files", "settled files"])
@pytest.mark.parametrize("swapped", ["model.safetensors", "config.json", "tokenizer.json"])
def test_files_swapped_after_the_integrity_check_are_not_validated(tiny_models, tmp_path, swapped, settled,
                                                                   monkeypatch):
    """Settled files (changed long before they were hashed) are the ones whose digests the load
    reuses while their identity is unchanged (digests.read_digested): a swap changes it."""
    import time

    from specreg import Registry
    from specreg.core import digests
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.validators.suite import ValidationOptions, run_suite

    if settled:
        later = time.time_ns
        monkeypatch.setattr(time, "time_ns", lambda: later() + 10 * digests.RACY_NS)
    monkeypatch.setattr(digests, "_DIGESTS", {})

    draft = copy_model(tiny_models["draft"], tmp_path / "draft")
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}")
    version = registry.register("p", target=str(tiny_models["target"]), draft=str(draft),
                                num_speculative_tokens=2).version
    replacements = {
        "model.safetensors": lambda: shutil.copy(tiny_models["draft2"] / "model.safetensors", draft / "model.safetensors"),
        "config.json": lambda: edit_json(draft / "config.json", lambda d: d.update(rms_norm_eps=0.5)),
        "tokenizer.json": lambda: edit_json(draft / "tokenizer.json",
                                            lambda d: d["model"]["vocab"].update({"hello": 7, "world": 5})),
    }
    seen = []

    def swap_after(check):
        seen.append((check.name, check.status))
        if check.name == "integrity":
            # weight files are hashed whole, and only settled ones' digests are kept for the load
            weights = digests.file_identity((draft / "model.safetensors").stat())
            assert (weights in digests._DIGESTS) is settled
            replacements[swapped]()  # the attacker's moment: after the hash, before the load

    options = ValidationOptions(device="cpu", checks=("integrity", "tokenizer", "equivalence"))
    result = run_suite(version, load_golden_set("smoke"), options, device="cpu", on_check=swap_after)
    assert seen[0] == ("integrity", "pass")
    # the swap is caught where the files are read (a check that cannot run fails alone, with the reason)
    assert not result.passed
    reasons = [c.summary for c in result.checks if c.status == "fail"]
    assert any(f"{draft}" in r and "changed since the model was fingerprinted" in r for r in reasons), reasons
    equivalence = next(c for c in result.checks if c.name == "equivalence")
    assert equivalence.status == "fail"  # nothing was decoded on the swapped files


def test_a_tokenizer_changed_after_the_tokenizer_check_is_not_handed_to_the_runtime(tiny_models, tmp_path):
    """Inside a validation the runtime reuses the tokenizer the checks built only for the same
    bytes, read and checked again (loading.shared_tokenizers): a file changed in between fails."""
    from specreg import Registry
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.loading import shared_tokenizers
    from specreg.validators.suite import ValidationOptions, run_suite

    draft = copy_model(tiny_models["draft"], tmp_path / "draft")
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}")
    version = registry.register("p", target=str(tiny_models["target"]), draft=str(draft),
                                num_speculative_tokens=2).version

    def swap_after(check):
        if check.name == "tokenizer":
            edit_json(draft / "tokenizer.json", lambda d: d["model"]["vocab"].update({"hello": 7, "world": 5}))

    options = ValidationOptions(device="cpu", checks=("tokenizer", "equivalence"))
    with shared_tokenizers():
        result = run_suite(version, load_golden_set("smoke"), options, device="cpu", on_check=swap_after)
    tokenizer, equivalence = result.checks
    assert tokenizer.status == "pass"
    assert equivalence.status == "fail" and f"{draft}" in equivalence.summary
    assert "changed since the model was fingerprinted" in equivalence.summary


def test_a_shared_autotokenizer_build_serves_a_later_load_with_the_class_it_picked(tiny_models):
    """Inside shared_tokenizers a load without a class (AutoTokenizer) is also the load of the
    same files with the class it picked; another class builds again, and outside it nothing is
    shared."""
    from transformers import Qwen2Tokenizer

    from specreg.runtime.loading import load_tokenizer, shared_tokenizers

    expected = fingerprint_model(tiny_models["draft"])
    with shared_tokenizers():
        picked = load_tokenizer(tiny_models["draft"], expected=expected)
        assert load_tokenizer(tiny_models["draft"], expected=expected, tokenizer_class=type(picked)) is picked
        assert type(picked) is not Qwen2Tokenizer
        other = load_tokenizer(tiny_models["draft"], expected=expected, tokenizer_class=Qwen2Tokenizer)
        assert type(other) is Qwen2Tokenizer and other is not picked
    assert load_tokenizer(tiny_models["draft"], expected=expected, tokenizer_class=type(picked)) is not picked


def test_verified_load_gives_the_same_model_as_transformers(tiny_models):
    import torch

    from specreg.runtime.loading import load_model, load_tokenizer

    expected = fingerprint_model(tiny_models["draft"])
    verified = load_model(tiny_models["draft"], "cpu", "float32", expected=expected)
    plain = load_model(tiny_models["draft"], "cpu", "float32")
    ids = torch.tensor([[1, 5, 9, 20, 33]])
    assert torch.equal(verified(ids).logits, plain(ids).logits)
    tokenizer = load_tokenizer(tiny_models["draft"], expected=expected)
    assert tokenizer.get_vocab() == load_tokenizer(tiny_models["draft"]).get_vocab()
    assert tokenizer.name_or_path == str(tiny_models["draft"])


# --- item 13: billion laughs and deep nesting in golden sets and policies --------------------

BILLION_LAUGHS = "\n".join(
    ["name: lol", "version: '1'", 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    + ["records: [{id: x, category: c, max_new_tokens: 1, prompt: *a9}]"])
DEEP_YAML = "name: deep\nversion: '1'\nrecords: " + "[" * 5000 + "]" * 5000 + "\n"


def test_billion_laughs_golden_set_is_refused_before_expansion(tmp_path):
    import time

    from specreg.errors import GoldenSetError
    from specreg.golden_prompts.loader import load_golden_set

    path = tmp_path / "lol.yaml"
    path.write_text(BILLION_LAUGHS)
    started = time.perf_counter()
    with pytest.raises(GoldenSetError, match=r"lol.yaml: YAML alias \*a0 at line 4: aliases are not allowed"):
        load_golden_set(str(path))
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("suffix,text", [
    (".yaml", DEEP_YAML),
    (".json", '{"name": "deep", "version": "1", "records": ' + "[" * 100000 + "]" * 100000 + "}"),
    (".json", '{"name": "deep", "version": "1", "records": ' + "[" * 40 + "]" * 40 + "}"),
    (".jsonl", '{"name": "deep", "version": "1"}\n' + "[" * 100000 + "]" * 100000 + "\n"),
    (".json", '{"name": "deep", "version": ' + "9" * 5000 + ', "records": []}'),
])
def test_deeply_nested_golden_sets_are_one_line_errors(tmp_path, suffix, text):
    from specreg.errors import GoldenSetError
    from specreg.golden_prompts.loader import load_golden_set

    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    with pytest.raises(GoldenSetError) as caught:
        load_golden_set(str(path))
    assert str(caught.value).startswith(f"{path}:") and "\n" not in str(caught.value)
    assert len(str(caught.value)) < 300


def test_oversized_golden_set_is_refused_without_reading_it(tmp_path):
    from specreg.errors import GoldenSetError
    from specreg.golden_prompts.loader import load_golden_set

    path = tmp_path / "huge.yaml"
    with open(path, "wb") as handle:
        handle.truncate(17 * 1024 * 1024)  # sparse: nothing to read if the size is checked first
    with pytest.raises(GoldenSetError, match="huge.yaml: 17825792 bytes, over the limit"):
        load_golden_set(str(path))


@pytest.mark.parametrize("name,text,message", [
    ("lol.yaml", BILLION_LAUGHS.replace("records:", "environments:"), "aliases are not allowed"),
    ("deep.yaml", "environments: " + "[" * 5000 + "]" * 5000, "nested deeper than 32 levels"),
    ("deep.toml", "a = " + "[" * 5000 + "]" * 5000, "invalid TOML"),
    ("deep2.toml", "a = " + "[" * 40 + "]" * 40, "nested deeper than 32 levels"),
    ("nan.yaml", "max_validation_age_days: .nan\nenvironments: {prod: {}}", "must be a finite number"),
])
def test_hostile_policies_are_one_line_errors(tmp_path, name, text, message):
    from specreg.errors import UsageError
    from specreg.registry.governance.policy import load_policy

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as caught:
        load_policy(str(path))
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


def test_cli_policy_billion_laughs_is_one_line(tmp_path):
    path = tmp_path / "lol.yaml"
    path.write_text(BILLION_LAUGHS.replace("records:", "environments:"))
    result = run("policy", "show", "--policy", path)
    one_line(result, 2, "aliases are not allowed")


# --- item 16: a stray file named like a shipped golden set ------------------------------------

@pytest.mark.parametrize("name", ["smoke", "default"])
def test_a_file_in_the_working_directory_does_not_shadow_a_shipped_set(tmp_path, monkeypatch, name):
    from specreg.golden_prompts.loader import SHIPPED_DIR, load_golden_set

    (tmp_path / name).write_text("name: evil\nversion: '1'\nrecords: []\n")
    monkeypatch.chdir(tmp_path)
    golden = load_golden_set(name)
    assert golden.source == SHIPPED_DIR / f"{name}.yaml" and golden.name == name and len(golden) > 0
    # a file is still loaded by path
    (tmp_path / "mine.yaml").write_text((SHIPPED_DIR / "smoke.yaml").read_text())
    assert load_golden_set("mine.yaml").source == Path("mine.yaml")
    assert load_golden_set("./mine.yaml").content_sha256 == load_golden_set("smoke").content_sha256


# --- chat templates that raise, loop or explode ------------------------------------------------

HOSTILE_TEMPLATES = {
    "division by zero": ("{{ 1/0 }}", "raised ZeroDivisionError"),
    "range too big": ("{% for i in range(10**12) %}x{% endfor %}", "raised OverflowError"),
    "loops for ever": ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
                       "did not render record"),
    "huge output": ("{% for i in range(99999) %}{{ 'x' * 99999 }}{% endfor %}", "rendered more than 1000000"),
    "type error": ("{{ messages + 1 }}", "raised TypeError"),
    "raise_exception": ("{{ raise_exception('no system role') }}", "no system role"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TEMPLATES))
def test_hostile_chat_templates_fail_the_check_in_bounded_time(tiny_models, tmp_path, case, monkeypatch):
    import time

    from specreg.golden_prompts import template_sandbox
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.validators.chat_template import check_chat_template_alignment

    # The same time limit at 1 s instead of 5 s per record: the endless template then costs
    # ~4 s (one limit per render of a smoke chat record), not ~20 s; the check behaves the same.
    monkeypatch.setattr(template_sandbox, "RENDER_SECONDS", 1.0)
    template, message = HOSTILE_TEMPLATES[case]
    draft = copy_model(tiny_models["draft"], tmp_path / "model")
    (draft / "chat_template.jinja").write_text(template)
    started = time.perf_counter()
    result = check_chat_template_alignment(draft, tiny_models["target"], load_golden_set("smoke"))
    assert time.perf_counter() - started < 60
    assert result.status == "fail"
    errors = result.evidence["render_errors"]
    assert errors and all(error["side"] == "draft" for error in errors)
    assert message in errors[0]["error"], errors[0]


# --- item 17: the same limits on SQLite and PostgreSQL, checked in the application ------------

@pytest.mark.parametrize("change,message", [
    ({"num_speculative_tokens": 99999999999}, "invalid num_speculative_tokens 99999999999: use 1 to 64"),
    ({"num_speculative_tokens": 65}, "invalid num_speculative_tokens 65"),
    ({"max_batch_size_for_speculation": 2 ** 40}, "invalid max_batch_size_for_speculation"),
    ({"notes": "n" * 10_001}, "notes is 10001 characters long, over the limit of 10000"),
    ({"method": "ngram", "draft": None, "prompt_lookup_min": 1, "prompt_lookup_max": 2 ** 33},
     "invalid prompt_lookup_max 8589934592: use 1 to 64"),
])
def test_out_of_range_registrations_refused_on_both_databases(tiny_models, db_url, change, message):
    from specreg import Registry
    from specreg.errors import UsageError

    registry = Registry(db_url)
    arguments = {"target": str(tiny_models["target"]), "draft": str(tiny_models["draft"]), "num_speculative_tokens": 2,
                 **change}
    with pytest.raises(UsageError, match=message):
        registry.register("p", **arguments)
    assert registry.list() == []


def test_user_name_limits_are_the_same_on_both_databases(tiny_models, db_url, tmp_path):
    from specreg import Registry
    from specreg.errors import IdentityError

    arguments = {"target": str(tiny_models["target"]), "draft": str(tiny_models["draft"]), "num_speculative_tokens": 64}
    with pytest.raises(IdentityError, match="300 characters, at most 255"):
        Registry(db_url, user="u" * 300).register("p", **arguments)
    # the actor column's size is accepted on both (on PostgreSQL as a claimed user beside the role,
    # which the policy must allow: there the actor is the authenticated role)
    policy = tmp_path / "policy.toml"
    policy.write_text("[identity]\nallow_claimed_user = true\n\n[environments.production]\napproval_required = true\n")
    from policyrecord import record_policy

    record_policy(db_url, policy, tmp_path)
    longest = Registry(db_url, user="u" * 255)
    version = longest.register("p", **arguments, notes="n" * 10_000).version
    assert version.registered_by == "u" * 255 and version.config.num_speculative_tokens == 64


def test_cli_huge_k_is_one_line(tiny_models, tmp_path):
    result = run("register", "p", "--target", tiny_models["target"], "--draft", tiny_models["draft"],
                 "-k", "99999999999", "--db", f"sqlite:///{tmp_path / 'r.db'}")
    one_line(result, 2, "invalid num_speculative_tokens 99999999999: use 1 to 64")


@pytest.mark.parametrize("option,value,message", [
    ("--distribution-samples", "99999999999", "invalid distribution samples 99999999999"),
    ("--near-tie-tolerance", "nan", "invalid near-tie tolerance nan"),
    ("--acceptance-tolerance", "nan", "invalid acceptance tolerance nan"),
])
def test_cli_validate_out_of_range_options_are_one_line(tiny_models, tmp_path, option, value, message):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    run("register", "p", "--target", tiny_models["target"], "--draft", tiny_models["draft"], "-k", "2", "--db", db)
    result = run("validate", "p@1", option, value, "--device", "cpu", "--db", db)
    one_line(result, 2, message)


# --- report paths checked before the run; --db / SPECREG_HOME paths --------------------------

@pytest.mark.parametrize("option,where,message", [
    ("--report", "adir", "--report {tmp}/adir: is a directory"),
    ("--junit", "afile/x.xml", "--junit {tmp}/afile/x.xml: {tmp}/afile is not a directory"),
    ("--markdown", "adir/../afile/y.md", "--markdown {tmp}/adir/../afile/y.md: {tmp}/adir/../afile is not a directory"),
])
def test_bad_report_paths_fail_before_the_run_is_recorded(tiny_models, tmp_path, option, where, message):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    run("register", "p", "--target", tiny_models["target"], "--draft", tiny_models["draft"], "-k", "2", "--db", db)
    path = str(tmp_path / where) if where else ""
    result = run("validate", "p@1", "--checks", "integrity", "--device", "cpu", option, path, "--db", db)
    one_line(result, 2, message.format(tmp=tmp_path))
    shown = json.loads(run("show", "p@1", "--json", "--db", db).stdout)
    assert shown["validations"] == [] and shown["state"] == "registered"


@pytest.mark.parametrize("how,value,message", [
    ("--db", "sqlite:///{tmp}/afile/x.db", "cannot create its folder {tmp}/afile: a file is in the way"),
    ("--db", "sqlite:///{tmp}/x%00y.db", "the file name holds a NUL byte"),
    ("--db", "sqlite:///{tmp}/adir", "unable to open database file"),
    ("--db", "notaurl", "database URL 'notaurl' is not a valid SQLAlchemy URL"),
    ("SPECREG_HOME", "{tmp}/afile", "cannot create its folder {tmp}/afile: a file is in the way"),
    ("SPECREG_HOME", "{tmp}/afile/sub", "cannot create its folder {tmp}/afile/sub: Not a directory"),
])
def test_bad_database_locations_are_one_line(tmp_path, how, value, message):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    value = value.format(tmp=tmp_path)
    if how == "--db":
        result = run("list", "--db", value)
    else:
        result = run("list", env={"SPECREG_HOME": value})
    one_line(result, 1, message.format(tmp=tmp_path))


# --- validate on models changed after registration ------------------------------------------

def test_validate_after_nan_vocab_size_fails_integrity_and_runs_nothing_else(tiny_models, tmp_path):
    draft = copy_model(tiny_models["draft"], tmp_path / "model")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    run("register", "p", "--target", tiny_models["target"], "--draft", draft, "-k", "2", "--db", db)
    text = (draft / "config.json").read_text().replace('"vocab_size": 300', '"vocab_size": NaN')
    (draft / "config.json").write_text(text)
    result = run("validate", "p@1", "--golden", "smoke", "--device", "cpu", "--json", "--db", db)
    assert result.returncode == 100, result.stderr
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["integrity"]["status"] == "fail" and "field 'vocab_size' must be a positive integer, got nan" in checks["integrity"]["summary"]
    assert {name for name, check in checks.items() if check["status"] != "skip"} == {"integrity"}
    # without the integrity check the verified load still refuses the changed file: the runtime
    # checks fail with that reason (a check that cannot run fails alone), exit 100, one line
    result = run("validate", "p@1", "--golden", "smoke", "--device", "cpu", "--checks", "equivalence", "--json",
                 "--db", db)
    assert result.returncode == 100 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    (equivalence,) = json.loads(result.stdout)["checks"]
    assert equivalence["status"] == "fail"
    assert f"{draft}: config.json changed since the model was fingerprinted; not loading it" in equivalence["summary"]
