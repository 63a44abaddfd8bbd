"""A real `specreg validate` process killed mid-way: SIGTERM -> the process marks its run
aborted and exits 143; SIGKILL -> the run stays "running" until the next validate/show finds
its process gone and marks it abandoned. The pair's state never moves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import clirun  # tests/ is on sys.path (tests/conftest.py)

from specreg.registry.store.entities import PairState
from specreg.registry.store.validations import ValidationStore


def wait_for_running_run(registry, ref, process, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        runs = ValidationStore(registry.store).list_runs(*ref)
        if runs and runs[-1].status == "running":
            return runs[-1]
        time.sleep(0.2)
    raise AssertionError("the validating process never started its run")


@pytest.mark.slow
def test_killed_validation_leaves_state_and_marks_run_aborted(registry, models, tmp_path):
    registry.register("term", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    registry.register("kill", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    env = {**os.environ, "SPECREG_DB": registry.db_url, "SPECREG_USER": "tester"}
    command = [sys.executable, "-m", "specreg.cli", "validate", "--golden", "default", "--device", "cpu",
               "--checks", "equivalence,acceptance"]
    term = subprocess.Popen(command[:4] + ["term@1"] + command[4:], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    kill = subprocess.Popen(command[:4] + ["kill@1"] + command[4:], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        term_run = wait_for_running_run(registry, ("term", 1), term)
        kill_run = wait_for_running_run(registry, ("kill", 1), kill)
        time.sleep(1.0)  # into the decode pass
        term.send_signal(signal.SIGTERM)
        kill.send_signal(signal.SIGKILL)
        _, term_err = term.communicate(timeout=60)
        kill.communicate(timeout=60)
    finally:
        for process in (term, kill):
            if process.poll() is None:
                process.kill()
                process.wait()

    assert term.returncode == 128 + signal.SIGTERM, term_err
    assert "aborted by SIGTERM" in term_err and "Traceback" not in term_err
    runs = ValidationStore(registry.store)
    assert runs.get(term_run.id).status == "aborted" and "SIGTERM" in runs.get(term_run.id).error
    assert kill.returncode == -signal.SIGKILL
    assert runs.get(kill_run.id).status == "running"  # nobody could mark it
    shown = clirun.run("show", "kill@1", "--db", registry.db_url)  # a later command sees it abandoned
    line = next(line for line in shown.stdout.splitlines() if line.startswith(f"  run {kill_run.id} "))
    assert " abandoned " in line and f"(its process (pid {kill.pid} on " in line, line
    reaped = registry.validation_runs("kill@1")  # what `show` and the next validate call
    assert [run.status for run in reaped] == ["abandoned"]
    for name in ("term", "kill"):
        assert registry.get(f"{name}@1").state is PairState.REGISTERED
        assert [event.action for event in registry.history(name)] == ["register"]
