"""The MLflow UI and where MLflow keeps things: the `specreg ui` command line and the server it
starts, the UI addresses of registered models and model versions, and the artifact folder of a
local store."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from specreg.errors import UsageError


def local_artifact_root(tracking_uri: str) -> Path | None:
    """For a local store (``sqlite:///DIR/x.db`` or a plain folder) the folder its artifacts
    belong in: ``DIR/artifacts``; None for a server (http/https/databricks ...)."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme == "sqlite":
        # sqlite:////abs/path.db -> path "//abs/path.db"; sqlite:///rel.db -> "/rel.db"
        db_path = Path(unquote(tracking_uri[len("sqlite:///"):]))
        return db_path.expanduser().resolve().parent / "artifacts"
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path)).expanduser().resolve() / "artifacts"
    return None


def ui_command(tracking_uri: str, host: str = "127.0.0.1", port: int = 5000) -> list[str]:
    """argv that serves the MLflow UI over a local store: ``python -m mlflow server
    --backend-store-uri URI --default-artifact-root DIR --host HOST --port P``.
    Raises UsageError for a remote tracking URI (there is a server already: open it)."""
    artifact_root = local_artifact_root(tracking_uri)
    if artifact_root is None:
        raise UsageError(
            f"MLflow tracking URI {tracking_uri} is a server already; open it in a browser"
        )
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", tracking_uri,
        "--default-artifact-root", str(artifact_root),
        "--host", host,
        "--port", str(port),
        # one uvicorn process: MLflow's default is 4 workers under a supervisor (13 processes
        # with its helpers) for a UI one person reads
        "--workers", "1",
    ]


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` already (a probe binds it as the server would:
    with SO_REUSEADDR, so a closed connection's TIME_WAIT does not count as taken)."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r}: cannot be resolved ({exc.strerror})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return True
    return False


def health_url(host: str, port: int) -> str:
    """Where the server started here answers when it is up (a wildcard host is reached on loopback)."""
    reach = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{'[' + reach + ']' if ':' in reach else reach}:{port}/health"


def port_of(url: str) -> int:
    return int(urlparse(url).port or 80)


def answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def listens_in_group(group: int, port: int) -> bool | None:
    """Whether a process of process group ``group`` holds the listening TCP socket on ``port``
    (Linux: /proc/net/tcp{,6} and each process's file descriptors); None where /proc cannot tell."""
    import os

    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None if not os.path.exists("/proc/net/tcp") else False
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                if int(handle.read().rsplit(")", 1)[1].split()[2]) != group:
                    continue
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                return True
        except (OSError, ValueError, IndexError):
            continue
    return False


# the signals that end `specreg ui` and, with it, the server it started: Ctrl-C, a kill, and the
# terminal closing (SIGHUP), which would otherwise leave the server running behind a closed terminal
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def serve_ui(argv: list[str], log: Path, stop_after_s: float = 10.0, *, health: str | None = None,
             on_ready=None) -> tuple[int | None, bool]:
    """Run the UI server ``argv`` until it exits or this process gets SIGINT / SIGTERM / SIGHUP, its
    output appended to ``log``; then stop every process it started -> (its exit code, None: stopped
    by a signal here; whether it answered at ``health``).

    ``on_ready()`` is called once, when ``health`` answers while the server started here is still
    running and (where /proc tells) one of its processes holds the listening socket: the port was
    free before it started (port_taken), and what answers is this server, not one that took the
    port in between.
    The server runs in a session of its own, so that the whole process group (uvicorn and any
    helper MLflow forks) can be signalled at once: SIGTERM, then SIGKILL after
    ``stop_after_s``. Library warnings go to the log, never to the terminal."""
    import os
    import signal
    import subprocess
    import time

    log.parent.mkdir(parents=True, exist_ok=True)
    # no job runner (two more interpreters and a 10-worker consumer for MLflow's GenAI jobs,
    # which specreg never submits) and no telemetry, unless the caller asks for them
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true", **os.environ,
           "PYTHONWARNINGS": "ignore"}
    stopped, ready = [], False

    def stop(signum, _frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, stop)
                for number in (getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name))}
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        try:
            while health is not None and process.poll() is None and not ready:
                # what answers must be this server: a process of its group holds the port
                if answers(health) and process.poll() is None and listens_in_group(process.pid, port_of(health)) is not False:
                    ready = True
                    if on_ready is not None:
                        on_ready()
                else:
                    time.sleep(0.5)
            code = process.wait()
        except KeyboardInterrupt:
            code = None
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            stop_group(process, stop_after_s, time)
    return (None if stopped else code), ready


def last_line(log: Path) -> str:
    """The log's last non-empty line (what a server that died said last), or ""."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def stop_group(process, stop_after_s: float, time) -> None:
    """SIGTERM the process group of ``process`` (its own session), SIGKILL what is left after
    ``stop_after_s``; reap ``process``."""
    import os
    import signal

    def alive() -> bool:
        try:
            os.killpg(process.pid, 0)
            return True
        except ProcessLookupError:
            return False

    if alive():
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + stop_after_s
    while time.monotonic() < deadline:
        process.poll()  # reap the leader, so that only its live children keep the group
        if not alive():
            break
        time.sleep(0.1)
    else:
        if alive():
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def model_version_url(base_url: str, name: str, version: int | str) -> str:
    """UI address of a model version: ``BASE/#/models/<name>/versions/<v>`` (the MLflow 3
    React app's hash route ``/models/:modelName/versions/:version``)."""
    return f"{base_url.rstrip('/')}/#/models/{quote(str(name), safe='')}/versions/{version}"


def registered_model_url(base_url: str, name: str) -> str:
    """UI address of a registered model: ``BASE/#/models/<name>``."""
    return f"{base_url.rstrip('/')}/#/models/{quote(str(name), safe='')}"
