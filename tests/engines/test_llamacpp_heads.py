"""EAGLE-3 heads in llama.cpp: the export (the head converted by llama.cpp's own
convert_hf_to_gguf.py against its target, --spec-type draft-eagle3, bound by the lock), the
refusals with the llama.cpp source line that decides each, a tokenizer llama.cpp cannot
pre-tokenize refused in one line, and, with the built llama-server, the head served and validated
in the engine, including the failure users report: a head served on other layers than validated.

The pair is tiny and trained here in seconds (a 6-layer target on the tiny corpus, in the Llama 2
tokenizer layout llama.cpp's converter reads; an EAGLE-3 head on its layer inputs 1, 3, 4, taught
to draft nothing from layers one off: demo_heads.train_eagle3_head wrong_layer_shifts), so that
the layers it reads decide its acceptance."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.engine_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for tinymodels, headfiles, realpair

AUX = (1, 3, 4)
GOLDEN = """name: corpus-lines
version: 1
description: lines of the tiny corpus the pair was trained on
records:
  - {id: fox, category: prose, prompt: "the quick brown", max_new_tokens: 24}
  - {id: mail, category: mail, prompt: "dear customer, thank", max_new_tokens: 24}
  - {id: code, category: code, prompt: "def add(a, b):", max_new_tokens: 16}
"""


def runtime_acceptance(pair, prompts, aux_layer_ids) -> float:
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate

    saved, pair.draft.aux_layer_ids = pair.draft.aux_layer_ids, tuple(aux_layer_ids)
    try:
        drafted = accepted = 0
        for prompt in prompts:
            metrics = speculative_generate(pair, prompt, DecodeConfig(method="eagle3", k=3, max_new_tokens=24,
                                                                      eos_token_ids=())).metrics
            drafted, accepted = drafted + metrics.drafted, accepted + metrics.accepted
        return accepted / drafted
    finally:
        pair.draft.aux_layer_ids = saved


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """The tiny target and its EAGLE-3 head (folders), the loaded pair, and a registry at SQLite
    holding eagle@1; "shifted": the same weights whose config names the layers one up."""
    import torch
    from tinymodels import CORPUS, build_llama, build_tokenizer

    from specreg.api import Registry
    from specreg.builders import demo_heads, demo_pair
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head
    from specreg.runtime.loading import load_model, load_tokenizer
    from specreg.runtime.pair import ModelPair

    root = tmp_path_factory.mktemp("llamacpp-heads")
    build_tokenizer(root / "tokenizer", vocab_size=500, llama_layout=True)
    build_llama(root / "target", root / "tokenizer", num_layers=6)
    target, tokenizer = load_model(root / "target"), load_tokenizer(root / "target")
    stream = torch.tensor(tokenizer("".join(CORPUS * 3), add_special_tokens=False)["input_ids"])
    demo_pair.train(target, stream, 100, 8, seed=1, max_lr=3e-3)
    target.eval()
    target.save_pretrained(root / "target", safe_serialization=True)
    head = new_eagle3_head(target, demo_heads.frequent_tokens(stream, len(tokenizer) // 2), aux_layer_ids=AUX, seed=5)
    demo_heads.train_eagle3_head(head, target, stream, steps=60, batch_size=4, seed=5, max_lr=1e-2,
                                 wrong_layer_shifts=(-1, 1))
    save_eagle3_head(head, root / "head", str((root / "target").resolve()), target.config.architectures or [])
    shutil.copytree(root / "head", root / "shifted")
    config = json.loads((root / "shifted" / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in AUX]
    (root / "shifted" / "config.json").write_text(json.dumps(config))
    registry = Registry(f"sqlite:///{root / 'registry.db'}", user="alice")
    registry.register("eagle", target=str(root / "target"), draft=str(root / "head"), method="eagle3",
                      num_speculative_tokens=3)
    pair = ModelPair(target=target, tokenizer=tokenizer, draft=head,
                     vocab_size=int(target.get_output_embeddings().weight.shape[0]))
    prompts = [tokenizer(line[:20], add_special_tokens=False)["input_ids"] for line in CORPUS[:6]]
    golden = root / "corpus-lines.yaml"
    golden.write_text(GOLDEN)
    return SimpleNamespace(root=root, registry=registry, pair=pair, prompts=prompts, golden=golden)


def test_the_head_reads_the_layers_it_was_trained_on(heads):
    # an engine reading layers one off (vLLM PR #50170, SGLang #21272's kind of failure) must show:
    # trained with wrong_layer_shifts, the head's acceptance collapses there
    right = runtime_acceptance(heads.pair, heads.prompts, AUX)
    for shift in (-1, 1):
        wrong = runtime_acceptance(heads.pair, heads.prompts, [i + shift for i in AUX])
        assert right - wrong >= 0.3, (shift, right, wrong)


def test_export_converts_the_head_against_its_target_and_binds_it(heads):
    from specreg.registry.deploy.engines import llamacpp_build
    from specreg.registry.deploy.verify import verify_lock

    out = heads.root / "export"
    files = heads.registry.export("eagle@1", "llamacpp", out_dir=str(out), force=True, overwrite=True)
    script = dict(files)["llama-server.sh"]
    assert "--spec-draft-model gguf/draft/model-f32.gguf --spec-type draft-eagle3" in script
    assert "--spec-draft-n-max 3 --spec-draft-n-min 0 --spec-draft-p-min 0" in script
    assert "target's layer inputs 1, 3, 4" in script
    lock = json.loads((out / "specreg.lock.json").read_text())
    assert lock["models"]["draft"]["layout"] == "gguf/draft"
    assert verify_lock(out / "specreg.lock.json", public_key=None, target=out / "gguf" / "target",
                       draft=out / "gguf" / "draft", allow_unapproved=True, allow_unsigned=True).passed
    # what llama-server reads: the head's GGUF names the layers it was validated with
    sys.path.insert(0, str(llamacpp_build.source() / "gguf-py"))
    import gguf

    reader = gguf.GGUFReader(out / "gguf" / "draft" / "model-f32.gguf")
    fields = {field.name: field for field in reader.fields.values()}
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "eagle3"
    assert [int(fields["eagle3.target_layers"].parts[i][0]) for i in fields["eagle3.target_layers"].data] == list(AUX)
    # the conversion cache keys the head by its target too: the same head for another target is another entry
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    # (and by the registered aux ids the converter is shown at the config's top level)
    version, records = heads.registry.get("eagle@1"), ArtifactRecords(heads.registry.store, "alice")
    head, ids = (version.draft.path, version.draft.fingerprint), {"eagle_aux_hidden_state_layer_ids": list(AUX)}
    cached, digest = llamacpp_build.converted(*head, "f32", records=records, config_updates=ids,
                                              target=(version.target.path, version.target.fingerprint))
    assert digest == lock["models"]["draft"]["files"]["model-f32.gguf"]
    other, _ = llamacpp_build.converted(*head, "f32", records=records, config_updates=ids,
                                        target=(version.target.path, version.draft.fingerprint))
    assert other != cached


def eagle3_version(root: Path, *, aux=(1, 3, 4), tree=None, d2t=None, flags=None, layer=None):
    """A registered-looking EAGLE-3 pair over tests/headfiles.py folders (for the refusals, which
    read only configs and tensors); flags: top-level config fields, layer: transformer_layer_config
    fields changed."""
    from headfiles import HIDDEN, VOCAB, write_eagle3, write_target

    from specreg.registry.store.entities import SpecConfig, SpecMethod

    target = write_target(root / "target")
    layer_config = {"model_type": "llama", "hidden_size": HIDDEN, "vocab_size": VOCAB, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 2 * HIDDEN,
                    "rms_norm_eps": 1e-6, **(layer or {})}
    head = write_eagle3(root / "head", aux=aux, d2t=d2t,
                        config_extra={**(flags or {}), "transformer_layer_config": layer_config})
    config = SpecConfig(SpecMethod.EAGLE3, 3, tree=tree, head={"fit": {"aux_layer_ids": list(aux)}})
    return SimpleNamespace(config=config, target=SimpleNamespace(path=str(target)),
                           draft=SimpleNamespace(path=str(head)))


@pytest.mark.parametrize("case, source", [
    (dict(aux=(1, 3)), "src/models/eagle3.cpp:9-11"),
    (dict(aux=(1, 3, 4, 5)), "src/models/eagle3.cpp:9-11"),
    (dict(aux=(1, 3, 7)), "common/speculative.cpp:546-547"),
    (dict(flags={"norm_output": True}), "src/models/eagle3.cpp:24-33"),
    (dict(flags={"fc_norm": True}), "src/models/eagle3.cpp:24-33"),
    (dict(layer={"num_hidden_layers": 2}), "conversion/llama.py:50, 216"),
    (dict(layer={"model_type": "qwen3"}), "src/models/eagle3.cpp:78-97"),
    (dict(tree=((0,), (1,), (0, 0))), "common/speculative.cpp:808"),
    (dict(d2t="duplicate"), "conversion/llama.py:348-349"),
    (dict(d2t="outside"), "conversion/llama.py:346-347"),
])
def test_heads_llama_cpp_would_not_run_as_validated_are_refused_with_its_source_line(tmp_path, case, source):
    import numpy as np
    from headfiles import DRAFT_IDS

    from specreg.registry.deploy.engines import llamacpp

    if case.get("d2t") == "duplicate":
        ids = list(DRAFT_IDS)
        ids[1] = ids[0]
        case["d2t"] = np.array(ids, np.int64) - np.arange(len(ids), dtype=np.int64)
    elif case.get("d2t") == "outside":
        ids = list(DRAFT_IDS)
        ids[-1] = 40  # the headfiles target has 40 tokens
        case["d2t"] = np.array(ids, np.int64) - np.arange(len(ids), dtype=np.int64)
    why = llamacpp.refusal(eagle3_version(tmp_path, **case))
    assert why is not None and source in why and "\n" not in why
    assert llamacpp.refusal(eagle3_version(tmp_path / "right")) is None
    # the last layer's output (id N) and norm_before_fc are read by llama.cpp as by vLLM and our runtime
    assert llamacpp.refusal(eagle3_version(tmp_path / "last", aux=(1, 3, 6), flags={"norm_before_fc": True})) is None


def test_medusa_and_a_tree_are_refused_at_export_naming_llama_cpp(tmp_path):
    from headfiles import write_eagle3, write_medusa, write_target

    from specreg.api import Registry
    from specreg.errors import EngineRefusal

    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="alice")
    write_target(tmp_path / "models" / "target")
    write_medusa(tmp_path / "models" / "medusa")
    write_eagle3(tmp_path / "models" / "head")
    target = str(tmp_path / "models" / "target")
    registry.register("medusa", target=target, draft=str(tmp_path / "models" / "medusa"), method="medusa",
                      tree=[[0], [1], [0, 0]], allow_verifier_mismatch=True)
    registry.register("tree", target=target, draft=str(tmp_path / "models" / "head"), method="eagle3",
                      tree=[[0], [1], [0, 0]], allow_verifier_mismatch=True)
    for ref, source in (("medusa@1", "common/speculative.cpp:33-45"), ("tree@1", "common/speculative.cpp:808")):
        with pytest.raises(EngineRefusal, match=source.replace(".", r"\.")):
            registry.export(ref, "llamacpp", out_dir=str(tmp_path / ref), force=True)


def test_a_tokenizer_llama_cpp_cannot_pre_tokenize_is_one_line(tmp_path):
    from clirun import run_specreg
    from tinymodels import build_llama

    build_llama(tmp_path / "target", num_layers=1)  # tinymodels' own byte-level BPE: unknown to llama.cpp
    build_llama(tmp_path / "draft", tmp_path / "target", num_layers=1, seed=1)
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    assert run_specreg(["register", "byte", "--target", tmp_path / "target", "--draft", tmp_path / "draft",
                        "-k", "2", "--db", db]).returncode == 0
    done = run_specreg(["export", "byte@1", "--format", "llamacpp", "-o", tmp_path / "out", "--force", "--db", db])
    assert done.returncode == 1 and "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "tokenizer.json: llama.cpp cannot pre-tokenize this tokenizer" in error[0], done.stderr
    assert "conversion/base.py:1940-1953" in error[0]
    assert not (tmp_path / "out" / "specreg.lock.json").exists()


# ---- with the built llama-server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(heads):
    """The built llama-server, its digest recorded in the pair's registry (servers start only then)."""
    from realpair import llama_server

    llama_server()
    return heads.registry.build_llama_server()


@pytest.mark.slow
def test_served_head_drafts_and_answers_as_the_target_alone(heads, server):
    from specreg.registry.deploy.engines.llamacpp_server import serve_export
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    out = heads.root / "export-served"
    heads.registry.export("eagle@1", "llamacpp", out_dir=str(out), force=True, overwrite=True)
    answers = {}
    for draft in (True, False):
        with serve_export(out, draft=draft, threads=1, records=ArtifactRecords(heads.registry.store, "alice")) \
                as running:
            assert ("draft-eagle3" in running.argv) is draft
            answers[draft] = [running.completion(prompt, 24) for prompt in heads.prompts[:3]]
    for with_head, alone in zip(answers[True], answers[False]):
        assert with_head["content"] == alone["content"]
        assert with_head["timings"]["draft_n"] > 0
    accepted = sum(a["timings"]["draft_n_accepted"] for a in answers[True])
    drafted = sum(a["timings"]["draft_n"] for a in answers[True])
    assert accepted / drafted > 0.5, (accepted, drafted)


@pytest.mark.slow
def test_validate_in_llamacpp_parity_and_a_head_served_on_other_layers_fails(heads, server, monkeypatch):
    from clirun import run_specreg

    from specreg.registry.deploy.engines import llamacpp_build

    db = f"sqlite:///{heads.root / 'registry.db'}"
    args = ["validate", "eagle@1", "--engine", "llamacpp", "--golden", heads.golden, "--concurrency", "1,2",
            "--engine-threads", "1", "--db", db, "--json"]
    done = run_specreg(args)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)["report"]
    checks = {check["name"]: check for check in report["checks"]}
    assert "--spec-type draft-eagle3" in report["command"]
    assert checks["engine_parity"]["status"] == "pass", checks["engine_parity"]["summary"]
    assert checks["engine_parity"]["figures"]["alpha_delta"] <= 0.03
    assert report["engine_matches_runtime_tokens"] == report["prompts"] == 3
    assert checks["engine_equivalence"]["status"] in ("pass", "warn")
    # whether two requests at once draft worse depends on how llama-server batched them (on a busy
    # machine they overlap more, and EAGLE-3's acceptance fell from 0.86 to 0.60 at 2): the verdict
    # must follow the measured figures, whichever they are
    concurrency = checks["engine_concurrency"]
    fell = concurrency["figures"]["alpha_c1"] - concurrency["figures"]["alpha_c2"] > 0.1
    assert concurrency["status"] == ("fail" if fell else "pass"), concurrency["summary"]
    # the per-batch schedule the two tiers support, recorded with the baseline for the exports
    speedups = {t["concurrency"]: t["with_draft_tokens_per_s"] / t["without_draft_tokens_per_s"]
                for t in report["throughput"]}
    depth = {tier: 3 if speedup >= 1 else 0 for tier, speedup in speedups.items()}
    expected = [[1, 2, depth[1]]] if depth[1] == depth[2] else [[1, 1, depth[1]], [2, 2, depth[2]]]
    assert report["speculation_schedule"] == expected

    # the engine given the head with its layer ids one up (an export or a server not running the
    # head as validated): our runtime's pass is unchanged, the engine's acceptance collapses
    converted = llamacpp_build.converted
    shifted = heads.root / "shifted"

    def converted_shifted(model_dir, fingerprint, outtype="f32", log=None, *, records, target=None,
                          config_updates=None):
        if target is None:
            return converted(model_dir, fingerprint, outtype, log=log, records=records)
        path = heads.root / f"shifted-{outtype}.gguf"
        llamacpp_build.convert(shifted, path, outtype, target_model_dir=target[0])
        return path, ""

    monkeypatch.setattr(llamacpp_build, "converted", converted_shifted)
    done = run_specreg(args)
    assert done.returncode == 100 and "Traceback" not in done.stderr
    parity = {check["name"]: check for check in json.loads(done.stdout)["report"]["checks"]}["engine_parity"]
    assert parity["status"] == "fail" and "\n" not in parity["summary"]
    assert "far below our runtime's for the same pair" in parity["summary"], parity["summary"]
