"""The llama.cpp export of EAGLE-3 heads whose aux layer ids sit only inside eagle_config, as
ModelOpt and SpecForge write them: llama.cpp's converter reads the ids from the config's top level
only (conversion/llama.py:74-81) and otherwise writes its default (2, N // 2, N - 3) into
eagle3.target_layers; the export writes the registered ids where it reads them, and reads every
head GGUF back through gguf-py before the lock binds it (a GGUF naming other layers is refused).

The pair: a tiny 20-layer Llama over the Llama 2 tokenizer layout the converter reads, and an
EAGLE-3 head (runtime/methods/eagle3.py) trained on nothing, registered from the ModelOpt layout
with ids [1, 10, 18]; the converter's default for 20 layers is [2, 10, 17]."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.engine_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for tinymodels, headfiles

AUX = [1, 10, 18]
DEFAULT = [2, 10, 17]  # the converter's (2, N // 2, N - 3) for 20 layers


@pytest.fixture(scope="module")
def modelopt(tmp_path_factory):
    from headfiles import eagle_config_layout
    from tinymodels import build_llama, build_tokenizer

    from specreg.api import Registry
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head

    root = tmp_path_factory.mktemp("llamacpp-read-back")
    build_tokenizer(root / "tokenizer", vocab_size=300, llama_layout=True)
    build_llama(root / "target", root / "tokenizer", num_layers=20, hidden_size=32, intermediate_size=64)
    target = load_model(root / "target")
    vocab = int(target.get_output_embeddings().weight.shape[0])
    head = new_eagle3_head(target, range(3, vocab, 2), aux_layer_ids=AUX, seed=1)
    save_eagle3_head(head, root / "speculators-head", str(root / "target"))
    eagle_config_layout(root / "speculators-head", root / "head")
    registry = Registry(f"sqlite:///{root / 'registry.db'}", user="alice")
    registry.register("modelopt", target=str(root / "target"), draft=str(root / "head"), method="eagle3",
                      num_speculative_tokens=3, allow_verifier_mismatch=True)
    return SimpleNamespace(root=root, registry=registry, vocab=vocab)


def target_layers(gguf_path: Path) -> list[int]:
    from specreg.registry.deploy.engines import llamacpp_build

    fields = llamacpp_build.gguf_package().GGUFReader(gguf_path).fields
    return [int(fields["eagle3.target_layers"].parts[i][0]) for i in fields["eagle3.target_layers"].data]


def test_export_writes_the_registered_ids_where_the_converter_reads_them(modelopt):
    out = modelopt.root / "export"
    modelopt.registry.export("modelopt@1", "llamacpp", out_dir=str(out), force=True)
    assert target_layers(out / "gguf" / "draft" / "model-f32.gguf") == AUX
    lock = json.loads((out / "specreg.lock.json").read_text())
    assert lock["models"]["draft"]["layout"] == "gguf/draft"
    # the registered head folder is untouched: the ids were written on a staged copy of its config
    config = json.loads((Path(modelopt.registry.get("modelopt@1").draft.path) / "config.json").read_text())
    assert "eagle_aux_hidden_state_layer_ids" not in config


def test_a_gguf_that_reads_back_other_layers_is_refused_and_nothing_is_written(modelopt, monkeypatch):
    """The failure as it was: the head's folder converted as it is gets the converter's default layers;
    read back from the GGUF, the export is refused before anything is written."""
    from specreg.errors import ReadBackError
    from specreg.registry.deploy.engines import llamacpp_build

    converted = llamacpp_build.converted

    def as_before(*args, config_updates=None, **kwargs):  # the export as it was: the head's config as it is
        return converted(*args, **kwargs)

    version = modelopt.registry.get("modelopt@1")
    assert version.config.head["fit"]["aux_layer_ids"] == AUX  # registered (and validated) from eagle_config

    monkeypatch.setattr(llamacpp_build, "converted", as_before)
    out = modelopt.root / "refused"
    with pytest.raises(ReadBackError) as info:
        modelopt.registry.export("modelopt@1", "llamacpp", out_dir=str(out), force=True)
    assert str(info.value) == (
        "llamacpp export of modelopt@1 refused: gguf/draft/model-f32.gguf eagle3.target_layers reads back "
        f"{DEFAULT}, registered {AUX}; the lock binds only what reads back as registered")
    assert not out.exists() and info.value.exit_code == 1


def write_gguf(path: Path, architecture: str, layers: list[int], draft_to_target: list[int]) -> Path:
    """A GGUF holding what llama-server reads of an EAGLE-3 head, written with gguf-py's own writer."""
    import numpy as np

    from specreg.registry.deploy.engines import llamacpp_build

    gguf = llamacpp_build.gguf_package()
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_array(f"{architecture}.target_layers", layers)
    writer.add_tensor("d2t", np.array(draft_to_target, np.int64), raw_dtype=gguf.GGMLQuantizationType.I64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("architecture, layers, shift, message", [
    ("eagle3", AUX, 0, None),
    ("eagle3", [10, 1, 18], 0, "eagle3.target_layers reads back [10, 1, 18], registered [1, 10, 18]"),
    ("eagle3", AUX, 1, "d2t reads back draft id 0 -> target id 4, registered 3"),
    ("llama", AUX, 0, "general.architecture 'llama' reads back 'draft_model', registered 'eagle3'"),
])
def test_the_gguf_reader_refuses_other_layers_order_d2t_or_architecture(modelopt, tmp_path, architecture, layers,
                                                                         shift, message):
    from specreg.errors import ReadBackError
    from specreg.registry.deploy import read_back
    from specreg.registry.deploy.engines import llamacpp_build

    version = modelopt.registry.get("modelopt@1")
    draft_to_target = list(range(3, modelopt.vocab, 2))
    draft_to_target[0] += shift
    path = write_gguf(tmp_path / "head.gguf", architecture, layers, draft_to_target)
    values = llamacpp_build.gguf_values(path, "gguf/draft/model-f32.gguf")
    if message is None:
        read_back.check_values("llamacpp export", version, values)
        return
    with pytest.raises(ReadBackError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_back.check_values("llamacpp export", version, values)


@pytest.mark.slow
def test_llama_server_runs_the_exported_head_on_the_registered_layers(modelopt):
    """The export's GGUF files served: llama-server loads the head with eagle3.target_layers [1, 10, 18]
    (it aborts on a layer it cannot extract, common/speculative.cpp:546-547, 632-633) and drafts."""
    from realpair import llama_server

    from specreg.registry.deploy.engines.llamacpp_server import serve_export
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    llama_server()
    modelopt.registry.build_llama_server()
    out = modelopt.root / "served"
    modelopt.registry.export("modelopt@1", "llamacpp", out_dir=str(out), force=True)
    with serve_export(out, threads=1, records=ArtifactRecords(modelopt.registry.store, "alice")) as running:
        assert "draft-eagle3" in running.argv
        answer = running.completion([1, 5, 9, 13, 17], 8)
    assert answer["timings"]["draft_n"] > 0
