"""`specreg ui` as a person runs it: one server process, its output in a log file (no library
warnings on the terminal), and Ctrl-C (SIGINT) stops every process it started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request

import psutil
import pytest

from clirun import SPECREG
from mlflow_server import free_port


@pytest.mark.slow
def test_ctrl_c_stops_every_process_specreg_ui_started(tmp_path):
    port = free_port()
    env = {**os.environ, "SPECREG_HOME": str(tmp_path / "home")}
    env.pop("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", None)
    ui = subprocess.Popen(SPECREG + ["ui", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 240  # the MLflow server's first start migrates its store
        while time.monotonic() < deadline:
            started |= {child.pid for child in psutil.Process(ui.pid).children(recursive=True)}
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
            assert ui.poll() is None, ui.communicate()
        else:
            raise AssertionError("the MLflow UI did not answer within 240 s")
        started |= {child.pid for child in psutil.Process(ui.pid).children(recursive=True)}
        assert started
        ui.send_signal(signal.SIGINT)
        out, err = ui.communicate(timeout=60)
    finally:
        if ui.poll() is None:
            ui.kill()
    alive = [pid for pid in started if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [psutil.Process(pid).cmdline() for pid in alive]
    assert ui.returncode == 0, (ui.returncode, err)
    assert f"MLflow UI: http://127.0.0.1:{port}" in out and "Ctrl-C stops it" in out
    assert out.rstrip().endswith("MLflow UI stopped, with every process it started")
    # what the server and its libraries print stays in the log, never on the terminal
    assert err == "", err
    assert (tmp_path / "home" / "mlflow" / "ui.log").stat().st_size > 0
