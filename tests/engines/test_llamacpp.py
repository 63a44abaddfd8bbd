"""llama.cpp run for real on the llamacpp export of the real SmolLM2 pair: llama-server built from
the llama-cpp-python 0.3.36 sdist's vendored llama.cpp (registry/deploy/engines/llamacpp_build.py),
GGUF files made by its own convert_hf_to_gguf.py, the signed lock over them, and a completion that
the server answers by drafting with the exported draft."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for realpair
from realpair import llama_server, real_pair  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.engine_process]

# SmolLM2's ChatML rendering of "What is the capital of France?" (tests/runtime/test_real_pair.py)
FRANCE_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
              8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The real pair registered and exported (--force: not validated here) to llamacpp with a
    signed lock; llama-server built."""
    from specreg.api import Registry
    from specreg.core.signing import create_key_pair

    server = llama_server()
    target, draft = real_pair()
    root = tmp_path_factory.mktemp("llamacpp")
    private, public = create_key_pair(root / "keys")
    registry = Registry(f"sqlite:///{root / 'registry.db'}", user="alice")
    assert registry.build_llama_server() == server  # built: its digest recorded in this registry
    registry.register("smollm2", target=str(target), draft=str(draft), num_speculative_tokens=4)
    files = registry.export("smollm2@1", "llamacpp", out_dir=str(root / "export"), force=True,
                            signing_key=str(private))
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    return {"dir": root / "export", "files": dict(files), "public": public, "server": server,
            "target": target, "draft": draft, "records": ArtifactRecords(registry.store, "alice")}


def test_every_exported_flag_is_one_the_built_server_knows(exported):
    from specreg.registry.deploy.exports import engine_schema

    help_text = subprocess.run([str(exported["server"]), "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    known = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", help_text))
    schema = engine_schema("llamacpp")
    assert set(schema["flags"]) <= known, sorted(set(schema["flags"]) - known)
    for name in schema["flags"]["--spec-type"]["enum"]:
        assert name in help_text
    script = exported["files"]["llama-server.sh"]
    used = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)(?= )", script.split("exec ", 1)[1]))
    assert used <= set(schema["flags"]), sorted(used - set(schema["flags"]))


def test_lock_binds_the_gguf_files_the_server_loads(exported):
    from specreg.registry.deploy.verify import verify_lock

    folder = exported["dir"]
    lock = json.loads((folder / "specreg.lock.json").read_text())
    for role in ("target", "draft"):
        assert lock["models"][role]["layout"] == f"gguf/{role}"
        assert set(lock["models"][role]["files"]) == {"model-f32.gguf"}
    assert lock["engine"]["name"] == "llamacpp"

    def verify(target, draft):
        return verify_lock(folder / "specreg.lock.json", public_key=exported["public"], target=target, draft=draft,
                           allow_unapproved=True)

    report = verify(folder / "gguf" / "target", folder / "gguf" / "draft")
    assert report.passed, report.to_dict()
    # the registered folders are not what this engine loads
    assert not verify(exported["target"], folder / "gguf" / "draft").passed
    gguf = folder / "gguf" / "draft" / "model-f32.gguf"
    with open(gguf, "r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    try:
        report = verify(folder / "gguf" / "target", folder / "gguf" / "draft")
        assert not report.passed and report.failure["file"] == "draft/model-f32.gguf", report.to_dict()
    finally:
        with open(gguf, "r+b") as handle:
            handle.seek(-1, 2)
            handle.write(last)


def test_server_drafts_with_the_exported_draft(exported):
    from specreg.registry.deploy.engines.llamacpp_server import serve_export

    # one thread: on a loaded shared machine two spinning ggml threads cost seconds per token
    with serve_export(exported["dir"], records=exported["records"], parallel=1, threads=1) as server:
        answer = server.completion(FRANCE_IDS, max_tokens=16)
        metrics = server.metrics()
    assert server.process.poll() is not None  # stopped
    timings = answer["timings"]
    assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"], timings
    assert answer["content"].startswith("The capital of France is Paris."), answer["content"]
    drafted = re.search(r"^llamacpp:spec_decode_num_draft_tokens_total (\S+)$", metrics, re.M)
    assert drafted and float(drafted.group(1)) == timings["draft_n"]


def test_conversion_runs_once_per_model_and_again_when_the_cached_file_changed(exported, tmp_path, monkeypatch):
    """validate --engine llamacpp and the export take their GGUF files from one cache keyed by the
    registered fingerprint: converted once, re-hashed on every reuse, converted again if edited."""
    from specreg.core.digests import sha256_file
    from specreg.core.fingerprint import fingerprint_model
    from specreg.registry.deploy.engines import llamacpp_build

    # the export's file is the cache's file, byte for byte
    fingerprint = fingerprint_model(Path(exported["draft"]))
    cached, digest = llamacpp_build.converted(exported["draft"], fingerprint, "f32", records=exported["records"])
    assert cached.parent == llamacpp_build.gguf_cache()
    assert sha256_file(exported["dir"] / "gguf" / "draft" / "model-f32.gguf") == digest

    monkeypatch.setattr(llamacpp_build, "gguf_cache", lambda: tmp_path / "gguf")
    runs = []
    real_convert = llamacpp_build.convert
    monkeypatch.setattr(llamacpp_build, "convert", lambda *a, **k: runs.append(a) or real_convert(*a, **k))
    first, first_digest = llamacpp_build.converted(exported["draft"], fingerprint, "f32", records=exported["records"])
    again, again_digest = llamacpp_build.converted(exported["draft"], fingerprint, "f32", records=exported["records"])
    assert len(runs) == 1 and (again, again_digest) == (first, first_digest) and first_digest == digest
    assert first.parent == tmp_path / "gguf"
    with open(first, "r+b") as handle:  # someone edits the cached file: it is not served, it is made again
        handle.seek(-1, 2)
        last = handle.read(1)[0]
        handle.seek(-1, 2)
        handle.write(bytes([last ^ 1]))
    assert sha256_file(first) != digest
    remade, remade_digest = llamacpp_build.converted(exported["draft"], fingerprint, "f32", records=exported["records"])
    assert len(runs) == 2 and remade_digest == digest == sha256_file(remade)
