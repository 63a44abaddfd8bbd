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
        # the URL is printed once the server started here answers (the MLflow server's first start
        # migrates its store: minutes on a busy machine); a line is read as it comes, and a server
        # that never answers is killed after 240 s (the read then ends)
        import threading

        watchdog = threading.Timer(240, ui.kill)
        watchdog.start()
        try:
            first = ui.stdout.readline()
            url = ui.stdout.readline()
        finally:
            watchdog.cancel()
        assert url.startswith("MLflow UI: "), (first, url, ui.poll())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            assert response.status == 200
        started |= {child.pid for child in psutil.Process(ui.pid).children(recursive=True)}
        assert started
        ui.send_signal(signal.SIGINT)
        rest, err = ui.communicate(timeout=60)
        out = first + url + rest
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


def test_a_taken_port_is_refused_in_one_line_before_any_server_starts(tmp_path):
    """Another process listens on the port: the URL would show its pages (on a shared host,
    someone else's MLflow). One line, exit 1, no URL printed, and no server started."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = {**os.environ, "SPECREG_HOME": str(tmp_path / "home")}
        started = time.monotonic()
        ui = subprocess.run(SPECREG + ["ui", "--port", str(port)], env=env, capture_output=True, text=True,
                            timeout=60)
    assert ui.returncode == 1, (ui.stdout, ui.stderr)
    assert ui.stderr == f"specreg: error: port {port} on 127.0.0.1 is taken by another process: choose a free one " \
                        "with --port\n"
    assert "MLflow UI:" not in ui.stdout and "starting" not in ui.stdout
    assert time.monotonic() - started < 30
    assert not (tmp_path / "home" / "mlflow" / "ui.log").exists()


@pytest.mark.parametrize("signal_name", ["SIGHUP", "SIGTERM"])
def test_closing_the_terminal_stops_the_server_too(tmp_path, signal_name):
    """SIGHUP (the terminal closed) or SIGTERM (a kill) while the server starts: every process
    `specreg ui` started is stopped, as with Ctrl-C."""
    port = free_port()
    env = {**os.environ, "SPECREG_HOME": str(tmp_path / "home")}
    ui = subprocess.Popen(SPECREG + ["ui", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not started and time.monotonic() < deadline:
            assert ui.poll() is None, ui.communicate()
            started = {child.pid for child in psutil.Process(ui.pid).children(recursive=True)}
            time.sleep(0.2)
        assert started, "specreg ui started no server within 60 s"
        time.sleep(1.0)  # the server's interpreter is up and importing
        started |= {child.pid for child in psutil.Process(ui.pid).children(recursive=True)}
        ui.send_signal(getattr(signal, signal_name))
        out, err = ui.communicate(timeout=60)
    finally:
        if ui.poll() is None:
            ui.kill()
    alive = [pid for pid in started if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [psutil.Process(pid).cmdline() for pid in alive]
    assert out.rstrip().endswith("MLflow UI stopped, with every process it started"), (out, err)


def test_the_server_that_answers_is_told_from_another_by_its_listening_socket():
    """What answers on the port counts as the UI only when a process of the server's own group
    holds the listening socket (/proc): a server another process started there does not."""
    import socket

    from specreg.registry.review.mlflow_ui import listens_in_group

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as ours:
        ours.bind(("127.0.0.1", 0))
        ours.listen()
        port = ours.getsockname()[1]
        assert listens_in_group(os.getpgrp(), port) is True
        other = subprocess.Popen(["sleep", "30"], start_new_session=True)
        try:
            assert listens_in_group(other.pid, port) is False  # a group that holds no socket on it
        finally:
            other.kill()
            other.wait()
    assert listens_in_group(os.getpgrp(), port) is False  # closed: nobody listens
