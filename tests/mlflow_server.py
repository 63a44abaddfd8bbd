"""A real `mlflow server` process for tests: temporary sqlite backend, artifacts served by the
server itself (--serve-artifacts), a free loopback port. Share it with any test folder by
re-exporting the fixture from that folder's conftest (or tests/conftest.py):

    from mlflow_server import mlflow_server  # noqa: F401
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mlflow_executable() -> list[str]:
    """The venv's `mlflow` script next to this Python, else `python -m mlflow`."""
    script = Path(sys.executable).parent / "mlflow"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mlflow"]


class MlflowServer:
    """One `mlflow server` over ``root/mlflow.db`` and ``root/artifacts``. ``kill`` simulates a
    crash; ``start`` again brings the same store back on the same port."""

    def __init__(self, root: Path, port: int | None = None, argv: list[str] | None = None):
        """``argv``: run this command instead (e.g. specreg's own ui_command) on ``port``."""
        self.root = Path(root)
        self.custom_argv = argv
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.root / "server.log"
        self.process: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        if self.custom_argv:
            return list(self.custom_argv)
        return [
            *mlflow_executable(), "server",
            "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--serve-artifacts",
            "--artifacts-destination", str(self.root / "artifacts"),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--workers", "1",
        ]

    def start(self, timeout_s: float = 240.0) -> "MlflowServer":  # a loaded 2-core machine needs minutes
        # No job runner: it starts two more interpreters (and a 10-worker Huey consumer) beside
        # each server, for MLflow's GenAI jobs that specreg never submits (mlflow/server/__init__.py,
        # MLFLOW_SERVER_ENABLE_JOB_EXECUTION, MLflow 3.17).
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
                   MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self.log_path, "ab") as log:
            # Own process group: stop/kill reach uvicorn and the job runner it spawns.
            self.process = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, cwd=self.root,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited early:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.3)
        self.kill()
        raise RuntimeError(f"mlflow server not healthy after {timeout_s}s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _signal(self, signum: int, wait_s: float) -> None:
        if self.process is None or self.process.poll() is not None:
            self.process = None
            return
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        self._signal(signal.SIGTERM, wait_s=3)  # a test server need not drain: then SIGKILL

    def kill(self) -> None:
        """SIGKILL the server's process group: a crash, not a shutdown."""
        self._signal(signal.SIGKILL, wait_s=10)

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    # REST helpers: read back the way any client (or the UI) would.

    def get(self, endpoint: str, **params) -> dict:
        """GET /api/2.0/mlflow/<endpoint>?params -> JSON; urllib.error.HTTPError on 4xx/5xx."""
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(
            f"{self.url}/api/2.0/mlflow/{endpoint}?{query}", timeout=10
        ) as response:
            return json.loads(response.read() or b"{}")

    def post(self, endpoint: str, body: dict) -> dict:
        """POST JSON to /api/2.0/mlflow/<endpoint> -> JSON."""
        request = urllib.request.Request(
            f"{self.url}/api/2.0/mlflow/{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def artifact_text(self, run_id: str, path: str) -> str:
        """Content of one run artifact, fetched through the server's artifact proxy."""
        query = urllib.parse.urlencode({"run_uuid": run_id, "path": path})
        with urllib.request.urlopen(f"{self.url}/get-artifact?{query}", timeout=10) as response:
            return response.read().decode()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A running MLflow server for the whole session (started once: ~8 s)."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()
