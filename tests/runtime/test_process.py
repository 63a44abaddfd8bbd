"""The one place that decides torch's threads (runtime/process.py) and the progress printer the
CLI hands to long steps (specreg/cli/progress.py)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from specreg.cli.progress import Progress
from specreg.runtime import process


@pytest.fixture
def no_thread_settings(monkeypatch):
    for variable in ("SPECREG_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize("cores, load, threads", [
    (2, 0.1, 2),   # idle: one thread a core
    (2, 0.9, 1),   # one core busy
    (2, 9.0, 1),   # a loaded 2-core machine: never more threads than free cores, at least 1
    (2, 1.6, 1),
    (16, 3.6, 12),
])
def test_free_cores_decide_without_an_explicit_setting(no_thread_settings, cores, load, threads):
    assert process.decide_threads(cores=cores, load=load) == threads


def test_an_explicit_setting_wins_but_never_exceeds_the_cores(no_thread_settings, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert process.decide_threads(cores=8, load=0.0) == 1
    monkeypatch.setenv("SPECREG_THREADS", "6")  # specreg's own variable first
    assert process.decide_threads(cores=8, load=0.0) == 6
    assert process.decide_threads(cores=2, load=0.0) == 2
    monkeypatch.setenv("SPECREG_THREADS", "zero")  # not a positive integer: ignored
    assert process.decide_threads(cores=8, load=0.0) == 1


def test_a_process_started_by_the_cli_gets_the_decision_before_torch_loads(no_thread_settings):
    code = ("import os, sys; sys.argv = ['specreg', '--version']\n"
            "from specreg.runtime.process import prepare_process\n"
            "n = prepare_process(); import torch\n"
            "print(n, torch.get_num_threads(), os.environ.get('OMP_WAIT_POLICY', 'default'),\n"
            "      os.environ['HF_HUB_DISABLE_PROGRESS_BARS'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "SPECREG_THREADS": "1"})
    assert out.stdout.split() == ["1", "1", "default", "1"]


@pytest.mark.parametrize("load, policy", [(0.1, None), (1.6, "PASSIVE")])
def test_threads_beyond_the_free_cores_wait_passively(no_thread_settings, monkeypatch, load, policy):
    """Two threads asked for on two cores: OpenMP's default waiting when both are free, passive
    waiting when the load holds one."""
    monkeypatch.setenv("SPECREG_THREADS", "2")
    monkeypatch.setattr(process, "usable_cores", lambda: 2)
    monkeypatch.setattr(process.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setitem(sys.modules, "torch", None)  # this process's torch keeps its threads
    for variable in (*process.POOL_VARIABLES, "OMP_WAIT_POLICY"):
        monkeypatch.setenv(variable, "")  # so that what limit_threads sets is undone after the test
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert process.limit_threads() == 2
    assert process.os.environ.get("OMP_WAIT_POLICY") == policy


def test_plain_progress_lines_name_the_step_with_elapsed_and_time_left():
    stream = io.StringIO()
    progress = Progress(stream=stream, bar=False, interval=0.0)
    progress("training the draft", 0, 4)
    progress("training the draft", 2, 4, "loss 0.5")
    progress("training the draft", 4, 4, "loss 0.3")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "training the draft: 0/4, 0:00 elapsed"
    assert lines[1].startswith("training the draft: 2/4, 0:00 elapsed, about 0:00 left (loss 0.5")
    assert lines[2] == "training the draft: 4/4, 0:00 elapsed (loss 0.3)"


def test_plain_progress_is_throttled_and_json_gets_none():
    stream = io.StringIO()
    progress = Progress(stream=stream, bar=False, interval=3600)
    for done in range(0, 101):
        progress("decoding", done, 100)
    assert stream.getvalue().splitlines() == ["decoding: 0/100, 0:00 elapsed", "decoding: 100/100, 0:00 elapsed"]
    silent = io.StringIO()
    off = Progress(enabled=False, stream=silent)
    off("decoding", 1, 2)
    off.note("check integrity: pass")
    assert silent.getvalue() == ""


def test_a_build_reports_its_compile_steps_and_keeps_its_whole_log(tmp_path):
    """`specreg llamacpp-build`: ninja's [N/M] (or make's [ N%]) lines drive the progress; every line
    goes to the build log; the exit code is the build tool's."""
    from specreg.registry.deploy.engines.llamacpp_build import run_logged

    steps = []
    log = tmp_path / "build.log"
    script = "printf '[1/3] Building a\\nwarning: x\\n[2/3] Building b\\n[3/3] Linking llama-server\\n'; exit 3"
    assert run_logged(["sh", "-c", script], log, lambda *a: steps.append(a), "building llama-server") == 3
    assert steps == [("building llama-server", 1, 3), ("building llama-server", 2, 3), ("building llama-server", 3, 3)]
    assert log.read_text().splitlines() == ["[1/3] Building a", "warning: x", "[2/3] Building b",
                                           "[3/3] Linking llama-server"]
    steps.clear()
    assert run_logged(["sh", "-c", "printf '[ 50%%] Building a\\n[100%%] Built target b\\n'"], log,
                      lambda *a: steps.append(a), "building") == 0
    assert steps == [("building", 50, 100), ("building", 100, 100)]


def test_in_a_log_a_silent_step_still_prints_a_line_every_interval():
    """Loading the models reports once, then nothing until the first prompt is decoded: in a CI
    log a line still comes every interval, from the heartbeat."""
    import time

    stream = io.StringIO()
    progress = Progress(stream=stream, bar=False, interval=1.0)
    progress("decoding golden prompts", 0, 43, "loading the models")
    time.sleep(3.5)  # a step that says nothing for 3.5 intervals
    progress.close()
    printed = stream.getvalue()
    time.sleep(1.5)  # closed: no more heartbeats
    assert stream.getvalue() == printed
    lines = printed.splitlines()
    assert lines[0] == "decoding golden prompts: 0/43, 0:00 elapsed (loading the models)"
    assert 2 <= len(lines) - 1 <= 4 and all(line.startswith("decoding golden prompts: 0/43, 0:0")
                                            and line.endswith("(still loading the models)") for line in lines[1:])
