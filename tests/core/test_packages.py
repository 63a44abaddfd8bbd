"""specreg.core.packages: one engine cache, and downloads that say what they fetch and how far they
are. pip is pointed at a folder of locally built wheels (PIP_NO_INDEX, PIP_FIND_LINKS), or at a
local HTTP server for the terminal's progress bar: no network."""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specreg.core.packages import PackageUnavailable, cache_root, distribution_file
from terminal import in_terminal

ENGINES_DIR = Path(__file__).parents[1] / "engines"


def tiny_wheel(folder: Path, name: str, version: str, payload: int = 0) -> Path:
    """A pure-Python wheel of ``name==version`` with ``payload`` random bytes in it."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{module}/data.bin", os.urandom(payload))
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """A folder of wheels as pip's only source, and an empty engine cache -> the folder."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("SPECREG_ENGINE_CACHE", str(tmp_path / "cache"))
    return index


@pytest.fixture
def engine_env():
    """tests/engines/engine_env.py, the engine tests' preparation (imported, not run)."""
    sys.path.insert(0, str(ENGINES_DIR))
    try:
        import engine_env
    finally:
        sys.path.remove(str(ENGINES_DIR))
    return engine_env


def test_engine_tests_use_the_one_cache_root(engine_env, tmp_path, monkeypatch):
    assert engine_env.cache_root is cache_root
    monkeypatch.setenv("SPECREG_ENGINE_CACHE", str(tmp_path / "engines"))
    assert engine_env.cache_root() == tmp_path / "engines"


def test_a_download_says_what_where_and_how_long_then_the_cache_is_silent(local_index, tmp_path, capsys):
    tiny_wheel(local_index, "tiny-pkg", "1.0", payload=1000)
    wheels = tmp_path / "cache" / "wheels"
    path = distribution_file("tiny-pkg", "1.0")
    assert path == wheels / "tiny_pkg-1.0-py3-none-any.whl"
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == f"downloading tiny-pkg 1.0 (wheel) from the package index into {wheels} (first use only)"
    assert f"Saved {path}" in lines  # pip's own plain lines: stderr is no terminal here
    assert lines[-1].startswith("downloaded tiny_pkg-1.0-py3-none-any.whl (0.0 MB) in ")
    assert lines[-1].endswith(" s")
    assert distribution_file("tiny-pkg", "1.0") == path
    assert capsys.readouterr() == ("", "")


def test_quiet_download_prints_nothing(local_index, capsys):
    tiny_wheel(local_index, "tiny-pkg", "1.0")
    assert distribution_file("tiny-pkg", "1.0", quiet=True).is_file()
    assert capsys.readouterr() == ("", "")


def test_a_missing_package_is_one_error_line(local_index, capsys):
    tiny_wheel(local_index, "tiny-pkg", "1.0")
    with pytest.raises(PackageUnavailable) as raised:
        distribution_file("tiny-pkg", "2.0")
    assert str(raised.value) == ("pip download tiny-pkg==2.0 failed: "
                                 "ERROR: No matching distribution found for tiny-pkg==2.0")
    err = capsys.readouterr().err
    assert err.startswith("downloading tiny-pkg 2.0 (wheel) from the package index into ")
    assert "ERROR:" not in err  # pip's error lines are summed up in the exception's one line
    assert "downloaded" not in err


def test_on_a_terminal_pip_draws_its_progress_bar(local_index, tmp_path, monkeypatch):
    tiny_wheel(local_index, "big-pkg", "1.0", payload=300_000)  # pip shows a bar above 40 kB
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(local_index))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "PIP_FIND_LINKS": f"http://127.0.0.1:{server.server_port}/", "TERM": "xterm"}
    try:
        code, lines = in_terminal([], env, program=[sys.executable, "-c", "from specreg.core.packages import "
                                                    "distribution_file; print(distribution_file('big-pkg', '1.0'))"])
    finally:
        server.shutdown()
    assert code == 0, lines
    wheels = tmp_path / "cache" / "wheels"
    assert lines[0] == f"downloading big-pkg 1.0 (wheel) from the package index into {wheels} (first use only)"
    assert any("Downloading http://127.0.0.1:" in line for line in lines)
    assert any("━" in line and re.search(r"(\d+\.\d)/\1 kB", line) for line in lines)  # pip's own bar, full
    assert lines[-2].startswith("downloaded big_pkg-1.0-py3-none-any.whl (0.3 MB) in ")
    assert lines[-1] == str(wheels / "big_pkg-1.0-py3-none-any.whl")  # the program's stdout, after


def test_engine_preparation_says_each_step_with_its_seconds(engine_env, local_index, tmp_path, monkeypatch):
    """engine_env.prepare_engine on a stand-in engine (its wheel and one dependency layer from the
    local folder): a line before and after each step that has work to do, none once cached."""
    tiny_wheel(local_index, "tiny-engine", "1.0")
    tiny_wheel(local_index, "tiny-dep", "2.0")
    (tmp_path / "tiny-deps.txt").write_text("# the stand-in engine's imports\ntiny-dep==2.0\n")
    monkeypatch.setattr(engine_env, "ENGINES_DIR", tmp_path)
    monkeypatch.setattr(engine_env, "ENGINE_RELEASES", {"tiny-engine": "1.0"})
    monkeypatch.setattr(engine_env, "DEPS_LAYERS", {"tiny-engine": ("tiny",)})
    lines = []
    paths = engine_env.prepare_engine("tiny-engine", log=lines.append)
    root = tmp_path / "cache"
    folder = paths["deps"][0]
    assert (folder / "tiny_dep" / "data.bin").is_file() and paths["code"] == root / "tiny-engine-1.0"
    assert lines[0] == (f"[engines] tiny-engine 1/2: the tiny-engine 1.0 wheel (pip download into {root / 'wheels'} "
                        f"unless there), unpacked into {root / 'tiny-engine-1.0'}")
    assert re.fullmatch(r"\[engines\] tiny-engine 1/2: tiny_engine-1\.0-py3-none-any\.whl \(0 MB\) ready in \d+ s",
                        lines[1])
    assert lines[2] == f"[engines] tiny-engine 2/2: pip install 1 packages of tiny-deps.txt into {folder}"
    assert re.fullmatch(r"\[engines\] tiny-engine 2/2: tiny deps installed in \d+ s", lines[3])
    assert len(lines) == 4
    assert engine_env.prepare_engine("tiny-engine", log=lines.append) == paths
    assert len(lines) == 4  # cached: nothing to say


def test_engine_preparation_without_the_package_is_unavailable(engine_env, local_index, monkeypatch):
    monkeypatch.setattr(engine_env, "ENGINE_RELEASES", {"tiny-engine": "1.0"})
    monkeypatch.setattr(engine_env, "DEPS_LAYERS", {"tiny-engine": ()})
    with pytest.raises(engine_env.EngineUnavailable, match="No matching distribution found for tiny-engine==1.0"):
        engine_env.prepare_engine("tiny-engine", log=lambda line: None)
