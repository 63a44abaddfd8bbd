"""Cache trust (C01, C02). Before: a replaced cached `llama-server` was executed
by `validate --engine` and its digest recorded as the baseline's; a swapped cached GGUF together
with its sha256 record file was bound into the signed lock; cache folders took the umask's mode
(world-writable under umask 0). Now the registry (its audit chain, on SQLite and PostgreSQL)
holds the digests `specreg llamacpp-build` and each conversion recorded, and a file it has no
record of is refused or made again, never run or served.

These run on a cache of their own ($SPECREG_ENGINE_CACHE in tmp_path): a stand-in llama-server
(a script that leaves a mark if it is ever executed) and a stand-in converter, so that nothing is
built; the real build and conversion run in tests/engines/test_llamacpp.py and
tests/enginevalidation/test_llamacpp_engine.py under the same checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture
def engine_cache(tmp_path, monkeypatch):
    """A cache with a 'built' llama-server stand-in: executing it writes ``mark``."""
    from specreg.registry.deploy.engines import llamacpp_build

    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECREG_ENGINE_CACHE", str(cache))
    mark = tmp_path / "executed"
    home = llamacpp_build.home()
    program = home / "build" / "bin" / "llama-server"
    program.parent.mkdir(parents=True)
    program.write_text(f"#!/bin/sh\necho executed > {mark}\n")
    program.chmod(0o755)
    digest = hashlib.sha256(program.read_bytes()).hexdigest()
    (home / ".complete-llama-server").write_text(json.dumps({"seconds": 1, "sha256": digest}))
    (home / "source.json").write_text(json.dumps({"llama_cpp_commit": "0" * 40}))
    (home / ".complete-src").write_text("stand-in")
    return {"program": program, "mark": mark, "digest": digest, "home": home}


@pytest.fixture
def registered(db_url, tiny_models):
    assert run("register", "p", "--target", tiny_models["target"], "--draft", tiny_models["draft"], "-k", "3",
               "--db", db_url).returncode == 0
    return db_url


# --- C02: the llama-server binary ---------------------------------------------------------------

def test_a_binary_the_registry_has_no_record_of_is_refused_with_the_command_that_fixes_it(registered, engine_cache):
    refused = run("validate", "p@1", "--engine", "llamacpp", "--golden", "smoke", "--db", registered)
    one_line(refused, 1, f"{engine_cache['program']} (sha256 {engine_cache['digest'][:16]}) is not a llama-server "
                         f"this registry recorded as built", "`specreg llamacpp-build` with this --db")
    assert not engine_cache["mark"].exists()


def test_a_replaced_cached_binary_is_refused_and_never_executed(registered, engine_cache):
    built = run("llamacpp-build", "--db", registered)
    assert built.returncode == 0 and built.stdout.strip() == str(engine_cache["program"]), built.stderr
    from specreg.api import Registry
    from specreg.registry.deploy.engines import llamacpp_build
    from specreg.registry.store.engine_artifacts import ArtifactRecords
    from specreg.registry.store.orm import AuditEventRow

    registry = Registry(registered)
    with registry.store.session() as session:  # one audited record, on the chain
        events = session.query(AuditEventRow).filter(AuditEventRow.action == "engine_artifact").all()
        assert [(e.details["kind"], e.details["sha256"], e.pair_name) for e in events] == [
            ("llama-server", engine_cache["digest"], "-")]
    assert registry.verify_audit()[1] is None
    assert run("llamacpp-build", "--db", registered).returncode == 0  # again: nothing new recorded
    records = ArtifactRecords(registry.store, "tester")
    assert records.digests("llama-server", llamacpp_build.SERVER_KEY) == {engine_cache["digest"]}
    assert llamacpp_build.trusted_server(records) == (engine_cache["program"], engine_cache["digest"])
    engine_cache["program"].write_text(f"#!/bin/sh\necho evil > {engine_cache['mark']}\n")  # replaced in the cache
    refused = run("validate", "p@1", "--engine", "llamacpp", "--golden", "smoke", "--db", registered)
    one_line(refused, 1, "is not a llama-server this registry recorded as built")
    assert not engine_cache["mark"].exists()
    from specreg.errors import SpecregError
    from specreg.registry.deploy.engines.llamacpp_server import start_server

    with pytest.raises(SpecregError, match="is not a llama-server this registry recorded"):
        start_server("t.gguf", None, records=records)
    assert not engine_cache["mark"].exists()
    assert Registry(registered).engine_baselines("p@1") == []


def test_llamacpp_build_builds_again_a_binary_changed_since_its_build(registered, engine_cache, monkeypatch):
    """The build stamp records the digest built: a cached binary that differs is built again,
    never recorded as it is."""
    from specreg.api import Registry
    from specreg.registry.deploy.engines import llamacpp_build
    from specreg.registry.store.engine_artifacts import ArtifactRecords

    engine_cache["program"].write_text("#!/bin/sh\nexit 7\n")
    rebuilt = []
    real_binary = llamacpp_build.binary

    def build(target="llama-server", log=None, progress=None):
        stamp = engine_cache["home"] / f".complete-{target}"
        if not stamp.exists():  # what a real build leaves: the program and its stamped digest
            rebuilt.append(target)
            engine_cache["program"].write_text("#!/bin/sh\necho rebuilt\n")
            stamp.write_text(json.dumps({"sha256": hashlib.sha256(engine_cache["program"].read_bytes()).hexdigest()}))
        return real_binary(target, log=log, progress=progress)

    monkeypatch.setattr(llamacpp_build, "binary", build)
    records = ArtifactRecords(Registry(registered).store, "tester")
    path = llamacpp_build.build_and_record(records)
    assert rebuilt == ["llama-server"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert records.digests("llama-server", llamacpp_build.SERVER_KEY) == {digest}


# --- C01: GGUF conversions ----------------------------------------------------------------------

@pytest.fixture
def stand_in_converter(monkeypatch):
    """convert() writes bytes derived from the model folder (as the real converter: the same
    model gives the same file); returns the list of folders converted."""
    from specreg.registry.deploy.engines import llamacpp_build

    runs = []

    # as llamacpp_build.convert
    def convert(model_dir, outfile, outtype="f32", target_model_dir=None, config_updates=None):
        runs.append(str(model_dir))
        Path(outfile).parent.mkdir(parents=True, exist_ok=True)
        Path(outfile).write_bytes(b"GGUF" + hashlib.sha256(f"{model_dir}:{outtype}".encode()).digest())
        return Path(outfile)

    monkeypatch.setattr(llamacpp_build, "convert", convert)
    return runs


def test_a_swapped_gguf_with_its_record_file_is_converted_again_not_bound_into_the_lock(
        registered, engine_cache, stand_in_converter, tmp_path):
    from specreg.api import Registry
    from specreg.core.digests import sha256_file
    from specreg.registry.deploy.engines import llamacpp_build

    registry = Registry(registered)
    registry.export("p@1", "llamacpp", out_dir=str(tmp_path / "first"), force=True)
    assert len(stand_in_converter) == 2  # target and draft, once
    lock = json.loads((tmp_path / "first" / "specreg.lock.json").read_text())
    honest = lock["models"]["draft"]["files"]["model-f32.gguf"]
    cached = [p for p in llamacpp_build.gguf_cache().glob("*.gguf") if sha256_file(p) == honest]
    assert len(cached) == 1
    # the attacker swaps the cached GGUF and writes a matching sha256 record beside it
    cached[0].write_bytes(b"GGUF evil weights")
    evil = sha256_file(cached[0])
    cached[0].with_suffix(".json").write_text(json.dumps({"sha256": evil}))
    registry.export("p@1", "llamacpp", out_dir=str(tmp_path / "second"), force=True)
    lock = json.loads((tmp_path / "second" / "specreg.lock.json").read_text())
    assert lock["models"]["draft"]["files"]["model-f32.gguf"] == honest != evil
    assert sha256_file(tmp_path / "second" / "gguf" / "draft" / "model-f32.gguf") == honest
    assert len(stand_in_converter) == 3  # the swapped one converted again; the target reused
    # a registry that recorded no conversion trusts none found in the cache: converted again
    other = Registry(f"sqlite:///{tmp_path / 'other.db'}")
    other.register("p", target=str(registry.get("p@1").target.path), draft=str(registry.get("p@1").draft.path),
                   num_speculative_tokens=3)
    other.export("p@1", "llamacpp", out_dir=str(tmp_path / "third"), force=True)
    assert len(stand_in_converter) == 5


# --- cache folders 0755 whatever the umask ------------------------------------------------------

@pytest.mark.parametrize("umask", [0o000, 0o077, 0o022])
def test_cache_folders_are_made_0755_whatever_the_umask(tmp_path, monkeypatch, umask, stand_in_converter):
    from specreg.core.fingerprint import fingerprint_model  # noqa: F401 (imported before the umask changes)
    from specreg.core.packages import cache_root
    from specreg.registry.deploy.engines import llamacpp_build

    monkeypatch.setenv("SPECREG_ENGINE_CACHE", str(tmp_path / "a" / "b" / "cache"))
    previous = os.umask(umask)
    try:
        root = cache_root()
        with llamacpp_build.build_lock(llamacpp_build.home()):
            pass
        from specreg.core.packages import cache_dir

        cache_dir(llamacpp_build.gguf_cache())
    finally:
        os.umask(previous)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", root, llamacpp_build.home(), llamacpp_build.gguf_cache()):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, (folder, oct(folder.stat().st_mode))
