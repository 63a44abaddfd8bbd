"""Running llama-server on loopback: the server a llamacpp export describes (``serve_export``) or
any GGUF pair (``start_server``), started only once its sha256 is one the registry recorded at
its build, for `specreg validate --engine llamacpp`, the demo and the tests. The argument lines
are llamacpp.command()'s, the same the export writes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreg.errors import SpecregError
from specreg.registry.deploy.engines import llamacpp_build
from specreg.registry.deploy.engines.llamacpp import GGUF_DIR, ROLES, SPEC_TYPES, command


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LlamaServer:
    """A llama-server process started by start_server; ``stop()`` (or leaving a ``with``) ends it."""

    process: subprocess.Popen
    port: int
    argv: list[str]
    log_path: Path
    started_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def completion(self, prompt: str | list[int], max_tokens: int, timeout: float = 300, **fields) -> dict:
        """POST /completion (greedy unless ``fields`` say otherwise); the server's JSON answer,
        with ``timings`` (``draft_n``, ``draft_n_accepted`` when it drafted)."""
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                **fields}
        return self.post("/completion", body, timeout)

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def metrics(self, timeout: float = 30) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=timeout) as response:
            return response.read().decode()

    def stop(self, timeout: float = 30) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(target_gguf: str | Path, draft_gguf: str | Path | None = None, *, records, k: int = 4,
                 parallel: int = 1, port: int | None = None, threads: int | None = None,
                 log_path: str | Path | None = None, timeout: float = 300, log=None,
                 spec_type: str = "draft-simple") -> LlamaServer:
    """Start the built llama-server on 127.0.0.1 once its sha256 is one the registry of
    ``records`` recorded at its build (llamacpp_build.trusted_server: `specreg llamacpp-build`
    builds and records it) and wait until /health answers 200. ``draft_gguf`` None serves the
    target alone; ``parallel`` is -np; ``spec_type`` how the draft file drafts (command());
    ``port`` None picks a free loopback port. The argument lines are command()'s, the same the
    export writes. Raises SpecregError with the end of the server's log if it exits or does
    not become healthy within ``timeout`` seconds (the process is stopped then)."""
    program, digest = llamacpp_build.trusted_server(records, log=log)
    port = port or free_port()
    opts = {"parallel": parallel, "threads": threads, "host": "127.0.0.1", "port": port}
    argv = [word for line in command(str(target_gguf), None if draft_gguf is None else str(draft_gguf), k, opts,
                                     "specreg", program=str(program), spec_type=spec_type) for word in line]
    log_path = Path(log_path) if log_path else Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-server-{port}.log"
    started = time.monotonic()
    with open(log_path, "w") as output:
        # its own session (a Ctrl-C at the terminal reaches specreg, which stops it) and, on Linux,
        # PR_SET_PDEATHSIG: a specreg killed outright takes the server along, no orphan
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=die_with_parent)
    server = LlamaServer(process=process, port=port, argv=argv, log_path=log_path)
    wait_healthy(server, "llama-server", started, timeout, poll_s=0.25)
    server.started_s = round(time.monotonic() - started, 2)
    server.info = {"program": str(program), "sha256": digest, **llamacpp_build.source_info()}
    return server


def wait_healthy(server, what: str, started: float, timeout: float, poll_s: float) -> None:
    """Wait until ``server`` (a started LlamaServer or VllmServer: .process, .url, .log_path,
    .stop()) answers /health with 200. SpecregError with the end of its log when it exits first or
    is not healthy ``timeout`` s after ``started``; the server is stopped then, and on Ctrl-C or
    SIGTERM while waiting: never left running."""
    try:
        while True:
            if server.process.poll() is not None:
                raise SpecregError(f"{what} exited with {server.process.returncode} before serving: "
                                   f"{log_tail(server.log_path)}")
            try:
                with urllib.request.urlopen(server.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() - started > timeout:
                raise SpecregError(f"{what} did not become healthy in {timeout:.0f} s: {log_tail(server.log_path)}")
            time.sleep(poll_s)
    except BaseException:
        server.stop()
        raise


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when its parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the server is still stopped by every ordinary exit path


def serve_export(export_dir: str | Path, *, records, draft: bool = True, parallel: int = 1, port: int | None = None,
                 threads: int | None = None, log=None) -> LlamaServer:
    """start_server on the GGUF files of a llamacpp export folder (specreg export --format
    llamacpp -o DIR), with k from its lock; ``draft`` False serves the same target without the
    draft (the baseline for equivalence and speedup)."""
    folder = Path(export_dir)
    lock_path = folder / "specreg.lock.json"
    try:
        lock = json.loads(lock_path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecregError(f"{lock_path}: not a readable lock ({exc})") from None
    found = {role: sorted((folder / GGUF_DIR / role).glob("*.gguf")) for role in ROLES}
    if len(found["target"]) != 1 or len(found["draft"]) != 1:
        raise SpecregError(f"{folder}: not a llamacpp export (expected one GGUF in each of "
                           f"{GGUF_DIR}/target and {GGUF_DIR}/draft)")
    k = int(lock["speculative_config"]["num_speculative_tokens"])
    kind = SPEC_TYPES.get(lock["speculative_config"].get("method"), "draft-simple")
    return start_server(found["target"][0], found["draft"][0] if draft else None, records=records, k=k,
                        parallel=parallel, port=port, threads=threads, log=log, spec_type=kind)


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
