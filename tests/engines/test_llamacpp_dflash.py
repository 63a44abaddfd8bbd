"""DFlash heads in llama.cpp: the export converts an engine-native DFlash head with llama.cpp's
own convert_hf_to_gguf.py against its target and serves it with --spec-type draft-dflash, a block
of the registered k + 1; the GGUF read back with gguf-py holds the block, the mask token and the
target layers in llama.cpp's numbering; served, it answers with our runtime's tokens. The pair is
tiny and trained here in seconds, in the Llama 2 tokenizer layout llama.cpp's converter reads."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.engine_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for tinymodels, realpair

AUX = (1, 3)  # the states entering layers 1 and 3: DFlash target_layer_ids [0, 2]


@pytest.fixture(scope="module")
def dflash(tmp_path_factory):
    import torch
    from tinymodels import CORPUS, build_llama, build_tokenizer

    from specreg.api import Registry
    from specreg.builders import demo_pair
    from specreg.builders.demo_dflash import train_block_head
    from specreg.runtime.loading import load_model, load_tokenizer
    from specreg.runtime.methods.dflash import new_block_head, save_block_head
    from specreg.runtime.pair import ModelPair

    root = tmp_path_factory.mktemp("llamacpp-dflash")
    build_tokenizer(root / "tokenizer", vocab_size=500, llama_layout=True)
    build_llama(root / "target", root / "tokenizer", num_layers=4)
    target, tokenizer = load_model(root / "target"), load_tokenizer(root / "target")
    stream = torch.tensor(tokenizer("".join(CORPUS * 3), add_special_tokens=False)["input_ids"])
    demo_pair.train(target, stream, 100, 8, seed=1, max_lr=3e-3)
    target.eval()
    target.save_pretrained(root / "target", safe_serialization=True)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    head = new_block_head(target, block_size=4, mask_token_id=vocab - 1, aux_layer_ids=AUX, seed=5)
    train_block_head(head, target, stream, steps=40, batch_size=4, anchors=8, seed=5, max_lr=1e-2)
    save_block_head(head, root / "head", "dflash", str((root / "target").resolve()), layout="native")
    registry = Registry(f"sqlite:///{root / 'registry.db'}", user="alice")
    registry.register("flash", target=str(root / "target"), draft=str(root / "head"), method="dflash")
    pair = ModelPair(target=target, tokenizer=tokenizer, draft=head.eval(), vocab_size=vocab)
    prompts = [tokenizer(line[:20], add_special_tokens=False)["input_ids"] for line in CORPUS[:4]]
    return SimpleNamespace(root=root, registry=registry, pair=pair, prompts=prompts, mask=vocab - 1)


def test_export_converts_the_head_and_names_its_block_and_layers(dflash):
    from specreg.registry.deploy.engines import llamacpp_build

    assert dflash.registry.get("flash@1").config.num_speculative_tokens == 3
    out = dflash.root / "export"
    files = dflash.registry.export("flash@1", "llamacpp", out_dir=str(out), force=True, overwrite=True)
    script = dict(files)["llama-server.sh"]
    assert "--spec-draft-model gguf/draft/model-f32.gguf --spec-type draft-dflash" in script
    assert "--spec-draft-n-max 3 --spec-draft-n-min 0 --spec-draft-p-min 0" in script
    sys.path.insert(0, str(llamacpp_build.source() / "gguf-py"))
    import gguf

    reader = gguf.GGUFReader(out / "gguf" / "draft" / "model-f32.gguf")
    fields = {field.name: field for field in reader.fields.values()}

    def values(name):
        return [int(fields[name].parts[i][0]) for i in fields[name].data]

    assert bytes(fields["general.architecture"].parts[-1]).decode() == "dflash"
    assert values("dflash.block_size") == [4] and values("tokenizer.ggml.mask_token_id") == [dflash.mask]
    assert values("dflash.target_layers") == list(AUX)  # llama.cpp's numbering: the states entering them


@pytest.fixture(scope="module")
def server(dflash):
    from realpair import llama_server

    llama_server()
    return dflash.registry.build_llama_server()


@pytest.mark.slow
def test_served_head_answers_with_our_runtimes_tokens(dflash, server):
    from specreg.registry.deploy.engines.llamacpp_server import serve_export
    from specreg.registry.store.engine_artifacts import ArtifactRecords
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate

    out = dflash.root / "export-served"
    dflash.registry.export("flash@1", "llamacpp", out_dir=str(out), force=True, overwrite=True)
    with serve_export(out, draft=True, threads=1, records=ArtifactRecords(dflash.registry.store, "alice")) as running:
        assert "draft-dflash" in running.argv
        answers = [running.completion(prompt, 24, return_tokens=True) for prompt in dflash.prompts]
    drafted = accepted = 0
    for prompt, answer in zip(dflash.prompts, answers):
        # the engines' schedule (the prefill emits its token alone), stopping at the tokenizer's EOS as llama-server
        ours = speculative_generate(dflash.pair, prompt, DecodeConfig(method="dflash", k=3, max_new_tokens=24,
                                                                     prefill_alone=True))
        assert answer["tokens"] == ours.token_ids
        drafted, accepted = drafted + answer["timings"]["draft_n"], accepted + answer["timings"]["draft_n_accepted"]
    assert drafted > 0 and accepted > 0


GOLDEN = """name: corpus-lines
version: 1
description: lines of the tiny corpus the pair was trained on
records:
  - {id: fox, category: prose, prompt: "the quick brown", max_new_tokens: 24}
  - {id: mail, category: mail, prompt: "dear customer, thank", max_new_tokens: 24}
  - {id: code, category: code, prompt: "def add(a, b):", max_new_tokens: 16}
"""


@pytest.mark.slow
def test_validate_in_llamacpp_has_parity_with_our_runtime(dflash, server):
    import json

    from clirun import run_specreg

    golden = dflash.root / "corpus-lines.yaml"
    golden.write_text(GOLDEN)
    done = run_specreg(["validate", "flash@1", "--engine", "llamacpp", "--golden", golden, "--concurrency", "1",
                        "--engine-threads", "1", "--db", f"sqlite:///{dflash.root / 'registry.db'}", "--json"])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)["report"]
    checks = {check["name"]: check for check in report["checks"]}
    assert "--spec-type draft-dflash" in report["command"]
    assert checks["engine_parity"]["status"] == "pass", checks["engine_parity"]["summary"]
    assert report["engine_matches_runtime_tokens"] == report["prompts"] == 3
