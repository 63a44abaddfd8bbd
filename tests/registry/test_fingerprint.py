"""Fingerprints: content hashes without loading tensors, safe refusal of pickle weights,
formatting-only changes ignored, hub ids resolved only from the local cache."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from specreg.errors import ModelReferenceError
from specreg.core.digests import sha256_file
from specreg.core.fingerprint import compare_fingerprints, fingerprint_model, resolve_reference
from specreg.core.safetensors_header import read_safetensors_header
from specreg.core.tokenizer_form import read_tokenizer_json

from helpers import copy_model  # tests/ is on sys.path (tests/conftest.py)


def test_fingerprint_reads_headers_and_hashes_files(tiny_models):
    fp = fingerprint_model(tiny_models["draft"])
    path = tiny_models["draft"] / "model.safetensors"
    assert fp.weight_files == {"model.safetensors": sha256_file(path)}
    assert fp.weight_format == "safetensors" and fp.dtype == "float32"
    header = read_safetensors_header(path)
    expected = 0
    for name, info in header.items():
        if name != "__metadata__":
            count = 1
            for dim in info["shape"]:
                count *= dim
            expected += count
    assert fp.parameter_count == expected
    # hidden 64, vocab 300, 2 layers: embed + lm_head alone are 2 * 300 * 64
    assert fp.parameter_count > 2 * 300 * 64
    assert (fp.vocab_size, fp.tokenizer_length, fp.max_position_embeddings) == (300, 300, 512)


def test_formatting_only_changes_do_not_change_the_hashes(tiny_models, tmp_path):
    path = copy_model(tiny_models["draft"], tmp_path / "model")
    before = fingerprint_model(path)
    for name in ("tokenizer.json", "config.json", "tokenizer_config.json"):
        data = json.loads((path / name).read_text())
        (path / name).write_text(json.dumps(data, indent=7, sort_keys=True))
    config = json.loads((path / "config.json").read_text())
    config["transformers_version"] = "0.0.0"
    (path / "config.json").write_text(json.dumps(config))
    assert fingerprint_model(path) == before


def test_real_changes_change_the_hashes(tiny_models, tmp_path):
    path = copy_model(tiny_models["draft"], tmp_path / "model")
    before = fingerprint_model(path)
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (path / "chat_template.jinja").write_text((path / "chat_template.jinja").read_text().replace("\n", "", 1))
    blob = bytearray((path / "model.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (path / "model.safetensors").write_bytes(bytes(blob))
    after = fingerprint_model(path)
    assert after.tokenizer_sha256 != before.tokenizer_sha256
    assert after.chat_template_sha256 != before.chat_template_sha256
    assert after.weights_sha256 != before.weights_sha256
    assert after.config_sha256 == before.config_sha256
    assert compare_fingerprints(before, after) == [
        "weight file model.safetensors changed", "tokenizer changed", "chat template changed"]


def test_tokenizer_json_is_parsed_once_per_content_and_checked_again_when_it_changes(tiny_models, tmp_path):
    path = copy_model(tiny_models["draft"], tmp_path / "model") / "tokenizer.json"
    first = read_tokenizer_json(path)
    assert read_tokenizer_json(path) is first  # the same bytes: parsed and checked once
    tokenizer = json.loads(path.read_text())
    token = next(iter(tokenizer["model"]["vocab"]))
    tokenizer["model"]["vocab"][token] = -1
    path.write_text(json.dumps(tokenizer))  # other bytes at the same path, size and all
    with pytest.raises(ModelReferenceError, match="field 'model.vocab'.* has id -1"):
        read_tokenizer_json(path)
    tokenizer["model"]["vocab"][token] = 5
    path.write_text(json.dumps(tokenizer))
    assert read_tokenizer_json(path)["model"]["vocab"][token] == 5
    path.write_text("[" * 100 + "]" * 100)
    with pytest.raises(ModelReferenceError, match="expected a JSON object"):
        read_tokenizer_json(path)


def test_pickle_only_weights_refused_unless_allowed(tiny_models, tmp_path):
    path = copy_model(tiny_models["draft"], tmp_path / "model")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(ModelReferenceError, match="pickle files \\(pytorch_model.bin\\).*--allow-pickle"):
        fingerprint_model(path)
    fp = fingerprint_model(path, allow_pickle=True)
    assert fp.weight_format == "pickle" and fp.parameter_count is None


@pytest.mark.parametrize("damage,message", [
    (lambda p: (p / "config.json").unlink(), "no config.json"),
    (lambda p: [(p / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], "no tokenizer files"),
    (lambda p: (p / "model.safetensors").unlink(), "no weight files"),
    (lambda p: (p / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}"), "corrupt safetensors header"),
    (lambda p: (p / "config.json").write_text("{not json"), "config.json: not readable JSON"),
])
def test_broken_directories_name_the_problem(tiny_models, tmp_path, damage, message):
    path = copy_model(tiny_models["draft"], tmp_path / "model")
    damage(path)
    with pytest.raises(ModelReferenceError, match=message):
        fingerprint_model(path)


def test_hub_reference_resolves_only_from_local_cache(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    commit = "a" * 40
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / commit
    shutil.copytree(tiny_models["draft"], snapshot)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text(commit)
    assert resolve_reference(f"acme/tiny@{commit}") == (snapshot.resolve(), commit)
    assert resolve_reference("acme/tiny@main") == (snapshot.resolve(), commit)
    with pytest.raises(ModelReferenceError, match="not in the local Hugging Face cache.*never downloads"):
        resolve_reference("acme/tiny@v2")
    with pytest.raises(ModelReferenceError, match="needs a pinned revision"):
        resolve_reference("acme/other")
    with pytest.raises(ModelReferenceError, match="no such directory"):
        resolve_reference(str(tmp_path / "missing"))


def test_a_settled_file_is_hashed_once_until_its_identity_changes(tmp_path, monkeypatch):
    """The load after the integrity check does not hash the weights again while each file's
    device, inode, size, mtime and ctime are unchanged; an edit in place or a file moved over it
    is hashed again. A file changed within digests.RACY_NS before it was hashed is never
    remembered: a write in the same timestamp tick would keep its identity."""
    import hashlib
    import os
    import time

    from specreg.core import digests

    monkeypatch.setattr(digests, "_DIGESTS", {})
    hashed = []
    real_hex = digests.sha256_hex
    monkeypatch.setattr(digests, "sha256_hex", lambda data: hashed.append(len(data)) or real_hex(data))
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"a" * 4096)
    # just written: hashed on every read
    assert digests.sha256_file(path) == hashlib.sha256(b"a" * 4096).hexdigest()
    assert digests.read_digested(path)[1] == hashlib.sha256(b"a" * 4096).hexdigest() and hashed == [4096]
    # seen from later on (the file settled): remembered by the integrity pass, not hashed by the load
    later = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: later() + 10 * digests.RACY_NS)
    digest = digests.sha256_file(path)
    hashed.clear()
    data, known = digests.read_digested(path)
    assert (bytes(data), known) == (b"a" * 4096, digest) and hashed == []
    time.sleep(0.05)  # past the filesystem's timestamp tick
    with open(path, "r+b") as handle:  # same size, same inode, new bytes
        handle.write(b"b")
    data, new_digest = digests.read_digested(path)
    assert new_digest == hashlib.sha256(data).hexdigest() != digest and hashed == [4096]
    other = tmp_path / "other"
    other.write_bytes(b"a" * 4096)
    os.replace(other, path)  # the old bytes back, under a new inode
    assert digests.read_digested(path)[1] == digest and hashed == [4096, 4096]


def test_files_read_ahead_are_hashed_and_read_once(tmp_path, monkeypatch):
    """A validation reads its weights ahead on a thread (digests.read_ahead): the integrity
    check's hash waits for that read instead of hashing again, the load takes its bytes, and a
    file replaced since is read anew; what was not taken is dropped on leaving."""
    import hashlib
    import os
    import threading
    import time

    from specreg.core import digests

    monkeypatch.setattr(digests, "_DIGESTS", {})
    hashed, threads = [], []
    real_hex = digests.sha256_hex

    def counting(data):
        hashed.append(len(data))
        threads.append(threading.current_thread().name)
        return real_hex(data)

    monkeypatch.setattr(digests, "sha256_hex", counting)
    first, second, missing, unused = (tmp_path / name for name in ("a.safetensors", "b.safetensors", "gone", "c"))
    first.write_bytes(b"a" * 5000)
    second.write_bytes(b"b" * 3000)
    unused.write_bytes(b"c" * 10)
    later = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: later() + 10 * digests.RACY_NS)  # settled files
    with digests.read_ahead([first, second, missing, unused]):
        assert digests.sha256_file(first) == hashlib.sha256(b"a" * 5000).hexdigest()
        data, digest = digests.read_digested(first)
        assert bytes(data) == b"a" * 5000 and digest == hashlib.sha256(b"a" * 5000).hexdigest()
        replacement = tmp_path / "new"
        replacement.write_bytes(b"B" * 3000)
        digests.sha256_file(unused)  # waits for the read ahead of all four (one thread, in order)
        os.replace(replacement, second)
        data, digest = digests.read_digested(second)
        assert bytes(data) == b"B" * 3000 and digest == hashlib.sha256(b"B" * 3000).hexdigest()
        with pytest.raises(FileNotFoundError):
            digests.read_digested(missing)
    # a, b and c hashed once each on the read-ahead thread; the replaced b once more, here
    assert hashed == [5000, 3000, 10, 3000]
    assert threads[:3] == ["specreg-read-ahead_0"] * 3 and threads[3] == threading.current_thread().name
    assert digests._READ_AHEAD == {}
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert digests.read_digested(empty) == (bytearray(), hashlib.sha256(b"").hexdigest())
