"""The one place that decides torch's threads (runtime/process.py) and the progress printer the
CLI hands to long steps (specreg/cli/progress.py)."""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace

import pytest

from specreg.cli.progress import Progress
from specreg.runtime import process


@pytest.fixture
def no_thread_settings(monkeypatch):
    for variable in ("SPECREG_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def two_core_process(no_thread_settings, monkeypatch):
    """limit_threads() on two usable cores, undone after the test: the thread pools' variables it
    sets are restored, and this process's torch keeps its threads."""
    monkeypatch.setattr(process, "usable_cores", lambda: 2)
    monkeypatch.setitem(sys.modules, "torch", None)
    for variable in (*process.POOL_VARIABLES, "OMP_WAIT_POLICY"):
        monkeypatch.setenv(variable, "")
    monkeypatch.delenv("OMP_WAIT_POLICY")


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
def test_threads_beyond_the_free_cores_wait_passively(two_core_process, monkeypatch, load, policy):
    """Two threads asked for on two cores: OpenMP's default waiting when both are free, passive
    waiting when the load holds one."""
    monkeypatch.setenv("SPECREG_THREADS", "2")
    monkeypatch.setattr(process.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(process, "busy_now", lambda: load)  # the CPUs' counters agree
    assert process.limit_threads() == 2
    assert process.os.environ.get("OMP_WAIT_POLICY") == policy


STAT = """cpu  {all}
cpu0 {a} 0 {b} {c} 5 1 2 7 0 0
cpu1 {d} 3 {e} {f} 0 0 0 0 0 0
cpu3 100 0 100 100 0 0 0 0 0 0
intr 244010 0 0
ctxt 769344
"""


def test_the_cpu_counters_sum_the_usable_cpus_busy_and_idle_ticks(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT.format(all="1 2 3", a=10, b=20, c=30, d=40, e=50, f=60))
    # busy = user + nice + system + irq + softirq; total adds idle and iowait; steal is neither
    assert process.cpu_counters({0, 1}, str(stat)) == (10 + 20 + 1 + 2 + 40 + 3 + 50, 33 + 30 + 5 + 93 + 60)
    assert process.cpu_counters({1}, str(stat)) == (93, 153)  # cpu3 is not ours, cpu0 left out
    assert process.cpu_counters({7}, str(stat)) is None  # none of ours listed
    assert process.cpu_counters({0}, str(tmp_path / "missing")) is None


@pytest.mark.parametrize("average, now, threads, sampled", [
    (0.1, 1.0, 2, False),  # the average says idle: no time spent on the counters
    (1.7, 0.05, 2, True),  # a command that has just ended still weighs on the average: free now
    (1.7, 0.9, 1, True),   # one core busy now
    (3.0, 2.0, 1, True),   # both busy: one thread, never none
    (1.7, None, 1, True),  # no counters to read: the average decides
])
def test_the_cores_free_now_overrule_the_minute_average(monkeypatch, average, now, threads, sampled):
    asked = []
    monkeypatch.setattr(process.os, "getloadavg", lambda: (average, average, average))
    monkeypatch.setattr(process, "busy_now", lambda: asked.append("read") or now)
    assert process.free_cores(cores=2) == threads
    assert asked == (["read"] if sampled else [])


@pytest.mark.parametrize("explicit, sampled, threads, policy", [
    ("1", False, 1, None),       # one thread asked for: never beyond the free cores, nothing measured
    ("2", True, 2, "PASSIVE"),   # two on a machine whose counters show one core busy
    (None, True, 1, None),
])
def test_the_counters_are_read_only_where_the_decision_needs_them(two_core_process, monkeypatch, explicit,
                                                                   sampled, threads, policy):
    asked = []
    if explicit is not None:
        monkeypatch.setenv("SPECREG_THREADS", explicit)
    monkeypatch.setattr(process.os, "getloadavg", lambda: (1.8, 1.8, 1.8))
    monkeypatch.setattr(process, "busy_now", lambda: asked.append("read") or 1.0)
    assert process.limit_threads() == threads
    assert asked == (["read"] if sampled else [])
    assert process.os.environ.get("OMP_WAIT_POLICY") == policy


def test_other_work_is_the_cpus_busy_share_less_this_processs_own(monkeypatch):
    """Ticks on two CPUs: (busy, total) 100/400, then 250/600: 150 busy ticks of 200, 1.5 of 2
    cores; this process used 0.25 CPU-s over the 1 s between: other work held 1.25."""
    samples = iter([(100, 400), (250, 600)])
    clock = SimpleNamespace(perf_counter=iter([10.0, 11.0]).__next__, process_time=iter([3.0, 3.25]).__next__,
                            sleep=lambda seconds: None)
    monkeypatch.setattr(process, "usable_cpus", lambda: {0, 1})
    monkeypatch.setattr(process, "cpu_counters", lambda cpus: next(samples))
    monkeypatch.setattr(process, "time", clock)
    assert process.busy_now(window=0.0) == pytest.approx(1.25)
    samples = iter([(100, 400), (150, 600)])  # 0.5 busy, all of it this process's own and more
    clock.perf_counter, clock.process_time = iter([0.0, 1.0]).__next__, iter([0.0, 0.7]).__next__
    assert process.busy_now(window=0.0) == 0.0
    samples = iter([(100, 400), None])
    clock.perf_counter, clock.process_time = iter([0.0, 1.0]).__next__, iter([0.0, 0.0]).__next__
    assert process.busy_now(window=0.0) is None


def test_other_work_leaves_out_this_processs_own_threads():
    """This process multiplying matrices on every usable core: the CPUs are busy, and nearly all
    of it is its own (a parallel test worker may take a share: at most what it leaves us)."""
    import time

    import torch

    cores, threads = process.usable_cores(), torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        a = torch.randn(512, 512)
        reading = process.read_cpus()
        end = time.perf_counter() + 0.6
        while time.perf_counter() < end:
            a @ a
        other = process.other_work_since(reading)
    finally:
        torch.set_num_threads(threads)
    assert other is not None and 0.0 <= other <= cores - 0.6


def test_busy_now_sees_a_process_spinning_on_this_machine():
    """A real spinning process holds one core: the counters show at least that much of the usable
    cores busy (other work, a parallel test worker, only adds), and never more than there are."""
    cores = process.usable_cores()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        busy = process.busy_now(window=0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert 0.8 <= busy <= cores + 0.05


def test_plain_progress_lines_name_the_step_with_elapsed_and_time_left():
    stream = io.StringIO()
    progress = Progress(stream=stream, bar=False, interval=0.0)
    progress("training the draft", 0, 4)
    progress("training the draft", 1, 4, "loss 0.7")
    progress("training the draft", 2, 4, "loss 0.5")
    progress("training the draft", 4, 4, "loss 0.3")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "training the draft: 0/4, 0:00 elapsed"
    assert lines[1] == "training the draft: 1/4, 0:00 elapsed (loss 0.7)"  # no pace yet: no time left
    assert lines[2].startswith("training the draft: 2/4, 0:00 elapsed, about 0:00 left (loss 0.5")
    assert lines[3] == "training the draft: 4/4, 0:00 elapsed (loss 0.3)"


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


def test_time_left_is_the_pace_after_the_first_item_not_the_start_of_the_step(monkeypatch):
    """Loading took 60 s before the first of 6 items ended, then each took 2 s: the first line
    names no time left (one item's time holds the loading), the next ones 2 s an item left."""
    from specreg.cli import progress as progress_module

    now = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    progress = Progress(stream=stream, bar=False, interval=0.0)
    progress("decoding golden prompts", 0, 6, "loading the models")
    now[0] += 60
    progress("decoding golden prompts", 1, 6, "a")
    now[0] += 2
    progress("decoding golden prompts", 2, 6, "b")
    now[0] += 2
    progress("decoding golden prompts", 3, 6, "c")
    lines = stream.getvalue().splitlines()
    assert lines[1] == "decoding golden prompts: 1/6, 1:00 elapsed (a)"
    assert lines[2] == "decoding golden prompts: 2/6, 1:02 elapsed, about 0:08 left (b)"
    assert lines[3] == "decoding golden prompts: 3/6, 1:04 elapsed, about 0:06 left (c)"


def test_a_command_says_something_at_once_and_between_its_steps():
    """On a terminal a command with a title says so at once; between steps (a check that reports
    nothing, a promote mirroring to MLflow) the heartbeat still prints a line every interval, in
    a log as on a terminal, and nothing after close."""
    import time

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    with Progress(stream=terminal, title="promote chat@1 to production", interval=3600):
        assert terminal.getvalue() == "promote chat@1 to production ...\n"
    stream = io.StringIO()
    progress = Progress(stream=stream, bar=False, interval=1.0, title="promote chat@1 to production")
    progress("check integrity", 1, 1, "pass")
    time.sleep(2.6)
    progress.close()
    printed = stream.getvalue()
    time.sleep(1.5)
    assert stream.getvalue() == printed
    lines = printed.splitlines()
    assert lines[0] == "check integrity: 1/1, 0:00 elapsed (pass)"
    assert 1 <= len(lines) - 1 <= 3 and all(line.startswith("promote chat@1 to production: 0:0") and
                                            line.endswith("elapsed (after check integrity)") for line in lines[1:])
    quiet = io.StringIO()
    with Progress(stream=quiet, bar=False, interval=1.0, title="approve chat@1"):
        time.sleep(2.5)  # nothing reported at all: still a line every interval
    assert quiet.getvalue().splitlines()[0].startswith("approve chat@1: 0:0")


def test_a_bar_shows_the_same_time_left(monkeypatch):
    """On a terminal the bar's time left is the pace after the first item too, not tqdm's, which
    counts the loading before it: 60 s of loading, then 2 s an item, 3 of 6 done -> 0:06 left."""
    from specreg.cli import progress as progress_module

    now = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    progress = Progress(stream=stream, bar=True, interval=0.0)
    progress("decoding golden prompts", 0, 6, "loading the models")
    for done, step in ((1, 60), (2, 2), (3, 2)):
        now[0] += step
        progress("decoding golden prompts", done, 6, "a")
    drawn = stream.getvalue().split("\r")
    assert "1/6" in drawn[-3] and "left" not in drawn[-3]
    assert "3/6" in drawn[-1] and drawn[-1].rstrip().endswith(", about 0:06 left, a"), drawn[-1]
    progress.close()
