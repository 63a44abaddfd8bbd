"""Starting and stopping llama-server for a pair (``specreg validate --engine llamacpp``).

``server_plan`` turns a pair version into what llama-server loads: GGUF files converted from the
registered (fingerprint-checked) checkpoints by llama.cpp's own ``convert_hf_to_gguf.py`` from the
same source the binary was built from, cached by fingerprint, and the speculative flags read from
that source (common/arg.cpp): ``-md`` + ``--spec-type draft-simple`` (without it ``-md`` drafts
nothing), ``--spec-draft-n-max K``, ``--spec-draft-n-min 0``, ``--spec-draft-p-min 0`` (greedy
drafting, comparable acceptance), ``-np N`` slots, ``--metrics``.

``running`` starts the server on a free loopback port, waits for ``/health``, and stops it on
exit, also on Ctrl-C, SIGTERM and errors (SIGTERM to its process group, SIGKILL after a grace
period); on Linux the server also gets PR_SET_PDEATHSIG, so a specreg killed outright (SIGKILL)
takes it along: no orphan.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from specreg.errors import SpecregError, UsageError
from specreg.registry.store.entities import PairVersion, SpecMethod

DEFAULT_HOME = "/var/cache/specreg/engines/llamacpp-0.3.36"
ENGINE_VERSION = "llama.cpp vendored in llama-cpp-python 0.3.36"
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16"}
START_TIMEOUT_S = 180.0
STOP_GRACE_S = 10.0


def llamacpp_home() -> Path:
    """Where llama.cpp's source (src/) and build (build/bin/llama-server) are: $SPECREG_LLAMACPP_HOME
    or the engine cache."""
    return Path(os.environ.get("SPECREG_LLAMACPP_HOME") or DEFAULT_HOME)


def server_binary() -> Path:
    binary = llamacpp_home() / "build" / "bin" / "llama-server"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise SpecregError(f"llama-server not found at {binary}: build it first (README, llama.cpp section), or point "
                           f"$SPECREG_LLAMACPP_HOME at a llama.cpp home with src/ and build/bin/")
    return binary


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class ServerPlan:
    binary: Path
    target_gguf: Path
    draft_gguf: Path | None
    k: int
    threads: int
    context_per_slot: int = 2048

    def args(self, *, draft: bool, parallel: int) -> list[str]:
        """llama-server's arguments (no host/port) with the draft or without it."""
        args = ["-m", str(self.target_gguf), "-np", str(parallel), "-c", str(self.context_per_slot * parallel),
                "-t", str(self.threads), "--metrics", "--no-webui"]
        if draft and self.draft_gguf is not None:
            args += ["-md", str(self.draft_gguf), "--spec-type", "draft-simple", "--spec-draft-n-max", str(self.k),
                     "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(self.threads)]
        return args

    def describe(self, *, draft: bool, parallel: int) -> str:
        return " ".join([str(self.binary), *self.args(draft=draft, parallel=parallel)])


def model_key(fingerprint) -> str:
    """A cache key for one registered model: its weights, config and tokenizer digests."""
    return hashlib.sha256(f"{fingerprint.weights_sha256}/{fingerprint.config_sha256}/"
                          f"{fingerprint.tokenizer_sha256}".encode()).hexdigest()


def convert_to_gguf(model_dir: str, fingerprint_sha: str, dtype: str, cache: Path) -> Path:
    """The GGUF of a registered checkpoint, made once by llama.cpp's convert_hf_to_gguf.py and
    cached in ``cache`` by the model's fingerprint and type."""
    outtype = GGUF_TYPES[dtype]
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{fingerprint_sha[:24]}-{outtype}.gguf"
    if out.is_file():
        return out
    source = llamacpp_home() / "src"
    script = source / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise SpecregError(f"{script} not found: the llama.cpp source that built llama-server is needed to convert")
    partial = Path(tempfile.mkstemp(dir=cache, suffix=".gguf.partial")[1])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source / "gguf-py"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), model_dir, "--outtype", outtype, "--outfile", str(partial)],
                          capture_output=True, text=True, env=environment)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SpecregError(f"convert_hf_to_gguf.py failed on {model_dir}: {last[:300]}")
    partial.replace(out)
    return out


def server_plan(version: PairVersion, *, cache: Path, dtype: str = "float32", threads: int | None = None) -> ServerPlan:
    """What llama-server loads for ``version`` (GGUF files kept in ``cache``); UsageError for a
    pair kind it cannot serve here."""
    from specreg.registry.governance.queries import fingerprint_changes

    if version.config.method is not SpecMethod.DRAFT_MODEL:
        raise UsageError(f"validate --engine llamacpp runs draft_model pairs; {version.label} is "
                         f"{version.config.method.value}")
    if dtype not in GGUF_TYPES:
        raise UsageError(f"invalid dtype {dtype} for llama.cpp: {', '.join(GGUF_TYPES)}")
    binary = server_binary()
    changes = fingerprint_changes(version)  # the files converted must be the registered ones
    if changes:
        raise SpecregError(f"{version.label}: the models changed since registration ({'; '.join(changes)}); "
                           f"nothing is converted or served")
    ggufs = [convert_to_gguf(model.path, model_key(model.fingerprint), dtype, cache) for model in (version.target, version.draft)]
    return ServerPlan(binary, ggufs[0], ggufs[1], version.config.num_speculative_tokens,
                      threads or max(1, os.cpu_count() or 1))


@dataclass(frozen=True)
class RunningServer:
    url: str
    pid: int
    log_path: Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child before exec (Linux)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@contextlib.contextmanager
def start_server(binary: Path, args: list[str], *, timeout_s: float = START_TIMEOUT_S) -> Iterator[RunningServer]:
    """Run ``binary args --host 127.0.0.1 --port P`` until the block ends; yields RunningServer once
    /health answers 200. The server is always stopped, whatever ends the block."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="specreg-llama-server-", suffix=".log", delete=False)
    process = subprocess.Popen([str(binary), *args, "--host", "127.0.0.1", "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    log.close()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise SpecregError(f"llama-server exited with {process.returncode} before it was ready: "
                                   f"{_tail(Path(log.name))}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SpecregError(f"llama-server was not ready after {timeout_s:g} s: {_tail(Path(log.name))}")
            time.sleep(0.2)
        yield RunningServer(url, process.pid, Path(log.name))
    finally:
        stop(process)
        Path(log.name).unlink(missing_ok=True)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL it after STOP_GRACE_S; reap it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(line.strip() for line in text[-lines:])[:600] or "(empty log)"


@contextlib.contextmanager
def running(plan: ServerPlan, *, draft: bool, parallel: int) -> Iterator[RunningServer]:
    with start_server(plan.binary, plan.args(draft=draft, parallel=parallel)) as server:
        yield server


def identity(plan: ServerPlan, server: RunningServer) -> dict:
    """Engine name, version and build of a running server: /props build_info and the binary's digest."""
    from specreg.registry.deploy.engine_client import server_identity

    props = server_identity("llamacpp", server.url)
    return {"version": ENGINE_VERSION, "build": f"{props.get('build')}; llama-server sha256 "
                                                  f"{file_sha256(plan.binary)[:16]}",
            "model": props.get("model"), "slots": props.get("slots")}
