"""`specreg convert-weights`: folders released with pickle weights (an EAGLE-3 head as SafeAILab's
trainer saves it, a model sharded into pytorch_model-*.bin) copied with safetensors weights that
register without --allow-pickle and load as the originals did; a pickle that would run code, and
every user mistake, refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)

TARGET_LAYERS = 8  # EAGLE's default aux layers (2, N // 2, N - 3) = (2, 4, 5), distinct


@pytest.fixture(scope="module")
def released(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """{"target": an 8-layer tiny Llama, "head": an EAGLE-3 head for it as SafeAILab's EAGLE
    trainer releases one (config.json with the head's LlamaConfig, architectures
    LlamaForCausalLMEagle3 and draft_vocab_size, no layer ids; pytorch_model.bin with the layer
    under midlayer.*, no embed_tokens), "sharded": the tiny draft model as pytorch_model-0000N-of-00002.bin
    shards with their index, its tokenizer beside them}."""
    import torch
    from safetensors.torch import load_file
    from tinymodels import build_llama

    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head

    root = tmp_path_factory.mktemp("released")
    target = build_llama(root / "target", tiny_models["tokenizer"], seed=7, num_layers=TARGET_LAYERS)
    speculators = save_eagle3_head(new_eagle3_head(load_model(target), aux_layer_ids=(2, 4, 5), seed=3),
                                   root / "speculators", str(target), ["LlamaForCausalLM"])
    source = json.loads((speculators / "config.json").read_text())
    head = root / "safeailab-head"
    head.mkdir()
    config = dict(source["transformer_layer_config"], architectures=["LlamaForCausalLMEagle3"],
                  draft_vocab_size=source["draft_vocab_size"])
    (head / "config.json").write_text(json.dumps(config))
    state = {name.replace("layers.0.", "midlayer.", 1): value
             for name, value in load_file(str(speculators / "model.safetensors")).items()}
    torch.save(state, head / "pytorch_model.bin")

    sharded = root / "sharded-draft"
    shutil.copytree(tiny_models["draft"], sharded)
    weights = load_file(str(sharded / "model.safetensors"))
    (sharded / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"pytorch_model-00001-of-00002.bin": names[: len(names) // 2],
              "pytorch_model-00002-of-00002.bin": names[len(names) // 2:]}
    for shard, keys in shards.items():
        torch.save({key: weights[key] for key in keys}, sharded / shard)
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {key: shard for shard, keys in shards.items() for key in keys}}))
    return {"target": target, "head": head, "sharded": sharded}


def test_a_safeailab_head_is_converted_registered_and_validated(released, tmp_path):
    import torch
    from safetensors.torch import load_file

    db = f"sqlite:///{tmp_path / 'registry.db'}"
    head = released["head"]
    args = ["--target", released["target"], "--method", "eagle3", "-k", "3", "--db", db]
    one_line(run("register", "eagle", "--draft", head, *args), 1, "weights are only pickle files (pytorch_model.bin)",
             f"convert them (specreg convert-weights {head} NEW_FOLDER)")
    assert "--allow-pickle" not in run("register", "eagle", "--draft", head, *args).stderr  # it cannot help a head

    out = tmp_path / "head-safetensors"
    result = run("convert-weights", head, out, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(c["source"], c["written"]) for c in report["converted"]] == [("pytorch_model.bin", "model.safetensors")]
    assert report["copied"] == ["config.json"] and report["left_out"] == []
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert (out / "config.json").read_bytes() == (head / "config.json").read_bytes()
    original = torch.load(head / "pytorch_model.bin", weights_only=True)
    converted = load_file(str(out / "model.safetensors"))
    assert sorted(converted) == sorted(original) and "midlayer.hidden_norm.weight" in converted
    for name, tensor in original.items():
        assert converted[name].dtype == tensor.dtype and torch.equal(converted[name], tensor), name

    result = run("register", "eagle", "--draft", out, *args, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["layers_fed"].startswith(
        "layers fed (as layer inputs): written by EAGLE (layer inputs), trained on the inputs of layers [2, 4, 5]")
    result = run("validate", "eagle@1", "--golden", "smoke", "--device", "cpu", "--checks",
                 "integrity,tokenizer,equivalence", "--json", "--db", db)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr)
    assert {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]} == {
        "integrity": "pass", "tokenizer": "pass", "equivalence": "pass"}


def test_sharded_pickle_weights_become_safetensors_shards_that_load_the_same_model(released, tiny_models, tmp_path):
    import torch

    from specreg.core.fingerprint import fingerprint_model
    from specreg.runtime.loading import load_model

    out = tmp_path / "draft-safetensors"
    result = run("convert-weights", released["sharded"], out)
    assert result.returncode == 0, result.stderr
    assert "pytorch_model-00001-of-00002.bin" in result.stdout and f"converted into {out}" in result.stdout
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model-00001-of-00002.safetensors",
                                                                 "model-00002-of-00002.safetensors"]
    assert not list(out.glob("*.bin")) and not (out / "pytorch_model.bin.index.json").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    pickled = json.loads((released["sharded"] / "pytorch_model.bin.index.json").read_text())["weight_map"]
    assert index["weight_map"] == {key: shard.replace("pytorch_model-", "model-").replace(".bin", ".safetensors")
                                   for key, shard in pickled.items()}
    # the tokenizer came along, and the folder fingerprints without --allow-pickle
    assert (out / "tokenizer.json").read_bytes() == (tiny_models["draft"] / "tokenizer.json").read_bytes()
    assert fingerprint_model(out).weight_format == "safetensors"
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        expected = load_model(tiny_models["draft"])(ids).logits
        assert torch.equal(load_model(out)(ids).logits, expected)


def test_tied_tensors_are_written_once_each(tmp_path):
    import torch
    from safetensors.torch import load_file

    source = tmp_path / "tied"
    source.mkdir()
    (source / "config.json").write_text("{}")
    embed = torch.arange(12, dtype=torch.float32).view(3, 4)
    torch.save({"embed_tokens.weight": embed, "lm_head.weight": embed, "row": embed[1]}, source / "pytorch_model.bin")
    assert run("convert-weights", source, tmp_path / "out").returncode == 0
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(written["lm_head.weight"], embed) and torch.equal(written["row"], embed[1])


def test_a_legacy_format_pickle_converts_and_a_file_that_is_no_pickle_is_refused(tmp_path):
    """torch.save's format before 1.6 (not a zip, so not memory-mappable) is still read."""
    import torch
    from safetensors.torch import load_file

    source = tmp_path / "legacy"
    source.mkdir()
    (source / "config.json").write_text("{}")
    weights = {"w": torch.arange(6, dtype=torch.float16).view(2, 3), "flags": torch.tensor([True, False])}
    torch.save(weights, source / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert run("convert-weights", source, tmp_path / "out").returncode == 0
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert all(torch.equal(written[name], value) and written[name].dtype == value.dtype
               for name, value in weights.items())
    (source / "pytorch_model.bin").write_text("not a pickle")
    one_line(run("convert-weights", source, tmp_path / "out2"), 1,
             f"{source / 'pytorch_model.bin'}: cannot load with torch.load(weights_only=True)")
    assert not (tmp_path / "out2").exists()


class RunsCode:
    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_would_run_code_is_refused_and_nothing_is_written(tmp_path):
    import torch

    source = tmp_path / "evil"
    source.mkdir()
    (source / "config.json").write_text("{}")
    payload = RunsCode()
    payload.marker = tmp_path / "ran"
    torch.save({"weight": payload}, source / "pytorch_model.bin")
    result = run("convert-weights", source, tmp_path / "out")
    # what the restricted unpickler refused, without torch's advice to load with weights_only=False
    one_line(result, 1, f"{source / 'pytorch_model.bin'}: cannot load with torch.load(weights_only=True): Trying "
                        "to load unsupported GLOBAL posix.system whose module posix is blocked.")
    assert "weights_only` set to `False`" not in result.stderr
    assert not (tmp_path / "ran").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil"]  # no output, no staging folder left


def test_user_mistakes_are_one_line(released, tiny_models, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    one_line(run("convert-weights", released["head"], taken), 2, f"{taken}: already exists")
    one_line(run("convert-weights", tiny_models["draft"], tmp_path / "o1"), 2,
             "already has safetensors weights (model.safetensors): nothing to convert")
    one_line(run("convert-weights", tmp_path / "missing", tmp_path / "o2"), 2, "missing: not a folder")
    one_line(run("convert-weights", released["head"], tmp_path / "no" / "such" / "out"), 2, "no such folder")
    several = tmp_path / "several"
    several.mkdir()
    (several / "config.json").write_text("{}")
    for name in ("a.bin", "b.pt"):
        (several / name).write_bytes(b"x")
    (several / "training_args.bin").write_bytes(b"x")
    one_line(run("convert-weights", several, tmp_path / "o3"), 2, "several pickle files (a.bin, b.pt)")
    broken = shutil.copytree(released["sharded"], tmp_path / "broken-index")
    (broken / "pytorch_model-00002-of-00002.bin").unlink()
    one_line(run("convert-weights", broken, tmp_path / "o4"), 1,
             "weight_map names 'pytorch_model-00002-of-00002.bin', which is not a file")
    assert not any(p.name.startswith(("o1", "o2", "o3", "o4", ".o")) for p in tmp_path.iterdir())
