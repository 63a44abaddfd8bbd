"""Fixtures for export tests; the helpers live in exportcase.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # exportcase, the helpers shared with the tests

from exportcase import BASELINES, make_pair

from specreg.registry.store.entities import PairVersion, SpecMethod


@pytest.fixture
def draft_pair() -> PairVersion:
    return make_pair(SpecMethod.DRAFT_MODEL)


@pytest.fixture
def ngram_pair() -> PairVersion:
    return make_pair(SpecMethod.NGRAM)


@pytest.fixture
def baselines() -> dict:
    return json.loads(json.dumps(BASELINES))


@pytest.fixture
def run_script(tmp_path):
    """Run an exported shell script with the engine executables replaced by a recorder that
    writes its argv NUL-separated: the real shell does the word splitting and quoting."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.bin"
    for program in ("vllm", "python", "trtllm-serve", "text-generation-launcher"):
        path = bin_dir / program
        path.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$(basename \"$0\")\" \"$@\" > '{record}'\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def run(script_text: str, name: str = "script.sh") -> list[str]:
        script = tmp_path / "out" / name
        script.parent.mkdir(exist_ok=True)
        script.write_text(script_text)
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", HOME="/should-not-expand")
        subprocess.run(["sh", str(script)], check=True, env=env, capture_output=True, timeout=30)
        return record.read_bytes().decode().split("\0")[:-1]

    return run
