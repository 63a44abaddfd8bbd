"""Plain functions (no pytest fixtures) that prepare the released engines and run
engine_check.py in them; used by conftest.py and by scripts/engine_schemas.py.

The released engines, run for real on the exports: vLLM 0.33.0 and SGLang 0.5.23.

On first use the wheels are fetched with ``pip download --no-deps`` from the package index,
unpacked whole, and the Python packages their parsers and config classes import are installed
with ``pip install --no-deps --target`` from tests/engines/vllm-deps.txt (and, in front of
it for SGLang, sglang-deps.txt); torch comes from the test venv for vLLM and from sglang-config-deps.txt (SGLang's pin) for SGLang. Everything is cached under
$SPECREG_ENGINE_CACHE, default /var/cache/specreg/engines (specreg.core.packages.cache_root: the
same cache as the real pair and llama.cpp, outside the clone); a second run reuses it.
Each step that has work to do (a first run fetches ~3 GB and takes minutes) says what and where
before it and its seconds after, through a ``log`` (the tests hand down ``terminal_line``, which
shows the lines on the terminal of `make test` while they happen).

Without network the tests skip, unless CI=true, where a missing engine is a failure.

Each engine's code runs in one subprocess for all export cases (tests/engines/engine_check.py),
forked from an engine_host.py process that imported the engine once for the pytest worker. The
CPU platform is chosen by vLLM's own VLLM_TARGET_DEVICE=cpu switch; the list of import-only
stand-ins for GPU-only modules is engine_check.STAND_INS (empty today) and is printed with the
fixture's timings.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from helpers import in_ci  # tests/ is on sys.path (tests/conftest.py)
from specreg.core.packages import PackageUnavailable, cache_root, distribution_file, run_pip

ENGINES_DIR = Path(__file__).parent
ENGINE_RELEASES = {"vllm": "0.33.0", "sglang": "0.5.23"}
CHECK_SCRIPT = ENGINES_DIR / "engine_check.py"
TIMINGS: dict[str, float] = {}


class EngineUnavailable(Exception):
    """The engine could not be fetched or installed (no network, index down)."""


def say(line: str) -> None:
    """A line on stderr: the default ``log`` (pytest captures it; the tests hand down the
    ``terminal_line`` fixture, which reaches the terminal of `make test`)."""
    print(line, file=sys.stderr, flush=True)


def offline_as_unavailable(function, *args, **kwargs):
    """``function(*args, **kwargs)``, no package index reachable raised as EngineUnavailable."""
    try:
        return function(*args, **kwargs)
    except PackageUnavailable as exc:
        raise EngineUnavailable(str(exc)) from None


# The dependency folders each engine imports from, first one first: SGLang's few extra
# packages (its own transformers pin among them) and the torch it pins with torchvision
# (sglang-config-deps.txt: its model-config path imports torchvision) sit in front of the vLLM set.
# vLLM's numba (its n-gram proposer's compiler) is a small layer of its own behind the vLLM set.
DEPS_LAYERS = {"vllm": ("vllm", "vllm-numba"), "sglang": ("sglang", "sglang-config", "vllm")}


def prepare_engine(engine: str, log=say) -> dict[str, object]:
    """Wheel downloaded and unpacked, its import dependencies installed; each step that has work
    to do (first run: ~3 GB of wheels, minutes) says what and where before and its seconds after,
    through ``log``. Returns {"code": unpacked wheel, "deps": [dependency folders, first first]}."""
    release = ENGINE_RELEASES[engine]
    root = cache_root()
    unpacked = root / f"{engine}-{release}"
    steps = 1 + len(DEPS_LAYERS[engine])
    started = time.monotonic()
    if not (unpacked / ".complete").exists():
        log(f"[engines] {engine} 1/{steps}: the {engine} {release} wheel (pip download into {root / 'wheels'} "
            f"unless there), unpacked into {unpacked}")
        wheel = offline_as_unavailable(distribution_file, engine, release, quiet=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(unpacked)
        (unpacked / ".complete").write_text(wheel.name)
        log(f"[engines] {engine} 1/{steps}: {wheel.name} ({wheel.stat().st_size / 1e6:.0f} MB) ready in "
            f"{time.monotonic() - started:.0f} s")
    TIMINGS[f"{engine} wheel"] = round(time.monotonic() - started, 1)
    deps = []
    for step, layer in enumerate(DEPS_LAYERS[engine], start=2):
        # Keyed by the requirement file's content: edit it, get a fresh folder.
        requirements = ENGINES_DIR / f"{layer}-deps.txt"
        folder = root / f"deps-{layer}-{_digest(requirements)}"
        started = time.monotonic()
        if not (folder / ".complete").exists():
            count = sum(1 for line in requirements.read_text().splitlines() if line.strip() and line[0] != "#")
            log(f"[engines] {engine} {step}/{steps}: pip install {count} packages of {requirements.name} into {folder}")
            offline_as_unavailable(run_pip, ["install", "--no-deps", "--target", str(folder), "-r", str(requirements)],
                                   f"pip install {layer} deps")
            (folder / ".complete").write_text(requirements.read_text())
            log(f"[engines] {engine} {step}/{steps}: {layer} deps installed in {time.monotonic() - started:.0f} s")
        TIMINGS[f"{layer} deps"] = round(time.monotonic() - started, 1)
        deps.append(folder)
    return {"code": unpacked, "deps": deps}


def prepare_arctic(log=say) -> Path:
    """Arctic Inference's suffix decoding cache built from its source archive on this CPU for this
    Python, as `specreg vllm-install` builds it into the vLLM venv (vllm_install.build_arctic) -> the
    folder to put on PYTHONPATH (it imports as arctic_inference). Cached under the engine cache
    root; built once. EngineUnavailable without the package index, or without cmake or a C++ compiler."""
    import shutil

    from specreg.registry.deploy.engines.vllm_install import ARCTIC, build_arctic

    built = cache_root() / f"arctic-inference-{ARCTIC[1]}"
    if (built / ".complete").exists():
        return built
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise EngineUnavailable(f"building Arctic Inference's suffix tree needs {' and '.join(missing)}")
    started = time.monotonic()
    offline_as_unavailable(build_arctic, Path(sys.executable), built, lambda line: log(f"[engines] {line}"))
    (built / ".complete").write_text(ARCTIC[1])
    log(f"[engines] arctic-inference: built in {time.monotonic() - started:.0f} s")
    return built


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


# The modules engine_host.py imports before it forks a check script's process: what the scripts of
# this folder import from the engine (a module missing here is imported by the script itself).
HOST_IMPORTS = {
    "vllm": ("vllm", "vllm.config", "vllm.engine.arg_utils", "vllm.entrypoints.cli.serve", "vllm.usage.usage_lib",
             "vllm.utils.argparse_utils", "vllm.v1.core.sched.scheduler", "vllm.v1.metrics.loggers",
             "vllm.v1.metrics.stats", "vllm.v1.spec_decode.metrics", "vllm.v1.spec_decode.ngram_proposer",
             "vllm.v1.spec_decode.suffix_decoding", "vllm.v1.spec_decode.dynamic.utils",
             "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils", "vllm.v1.worker.gpu_model_runner",
             "vllm.transformers_utils.config", "prometheus_client"),
    "sglang": ("sglang", "sglang.srt.server_args", "sglang.srt.configs.model_config", "sglang.srt.models.registry"),
}
HOSTS: dict[str, tuple[list[str], subprocess.Popen, Path]] = {}  # engine -> (import path, engine_host process, its log)


def _stop(process: subprocess.Popen) -> None:
    """A host and the script it may be running (its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, 9)
    process.wait()


def _stop_hosts() -> None:
    for _, process, log in HOSTS.values():
        _stop(process)
        log.unlink(missing_ok=True)
    HOSTS.clear()


atexit.register(_stop_hosts)


def engine_host(engine: str, path: list[str]) -> subprocess.Popen:
    """This process's engine_host.py for ``engine`` whose import path holds ``path`` (its folders,
    first first), started on first use and kept until this process exits. A host with more folders
    serves a job that needs fewer (Arctic Inference's folder on the path changes nothing for a
    script that does not import it); a job needing a folder the host lacks gets a new host."""
    held = HOSTS.get(engine)
    if held is not None and set(path) <= set(held[0]) and held[1].poll() is None:
        return held[1]
    if held is not None:
        _stop(held[1])
        held[2].unlink(missing_ok=True)
    path = [*path, *(folder for folder in (held[0] if held else []) if folder not in path)]
    log = Path(tempfile.mkstemp(prefix=f"{engine}-host-", suffix=".log")[1])
    with open(log, "w") as stderr:
        process = subprocess.Popen([sys.executable, str(ENGINES_DIR / "engine_host.py"), *HOST_IMPORTS[engine]],
                                   env=engine_process_env(path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=stderr, text=True, start_new_session=True)
    HOSTS[engine] = (path, process, log)
    return process


def engine_process_env(path: list[str]) -> dict[str, str]:
    """The environment of an engine's process: this one's, the engine's folders first on the import
    path, no model hub, vLLM on its CPU platform."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                VLLM_TARGET_DEVICE="cpu")


def run_engine(engine: str, cases: list[dict], workdir: Path, timeout: int = 900, script: Path = CHECK_SCRIPT,
               log=say, arctic: bool = False) -> dict:
    """Run engine_check.py (or another ``script`` of this folder taking the same arguments) on the
    cases with the engine first on the import path (and, with ``arctic``, Arctic Inference's
    suffix cache, prepare_arctic); returns engine_check's
    {"results": [...], "schema": {...}, "stand_ins": [...], "seconds": N} or the script's output;
    the preparation's lines and the timings go to ``log``. The script runs as its own process,
    forked from this process's engine_host (the engine imported once per pytest worker)."""
    paths = prepare_engine(engine, log)
    if arctic:
        paths["deps"] = [offline_as_unavailable(prepare_arctic, log), *paths["deps"]]
    cases_path, out_path = workdir / f"{engine}-{script.stem}-cases.json", workdir / f"{engine}-{script.stem}-out.json"
    script_log = workdir / f"{engine}-{script.stem}.log"
    cases_path.write_text(json.dumps(cases))
    path = [*map(str, paths["deps"]), str(paths["code"])]
    host = engine_host(engine, path)
    started = time.monotonic()
    host.stdin.write(json.dumps({"script": str(script), "argv": [engine, str(cases_path), str(out_path)],
                                 "log": str(script_log), "env": engine_process_env(HOSTS[engine][0])}) + "\n")
    host.stdin.flush()
    ready, _, _ = select.select([host.stdout], [], [], timeout)
    answer = host.stdout.readline() if ready else ""
    TIMINGS[f"{engine} run"] = round(time.monotonic() - started, 1)
    if not answer:  # the host died or the script ran past the timeout: neither is kept
        _, _, host_log = HOSTS.pop(engine)
        _stop(host)
        script_tail = script_log.read_text()[-2000:] if script_log.exists() else ""
        raise AssertionError(f"{engine} check {'timed out' if not ready else 'host died'}:\n"
                             f"{host_log.read_text()[-2000:]}\n{script_tail}")
    code = json.loads(answer)["code"]
    assert code == 0, f"{engine} check crashed:\n{script_log.read_text()[-4000:]}"
    output = json.loads(out_path.read_text())
    log(f"[engines] {engine} check: {len(cases)} cases, stand-ins {output.get('stand_ins', [])}, timings (s) {TIMINGS}")
    return output


def engine_env_or_skip(engine: str, log=say, **extra) -> dict[str, str]:
    """The environment of a process that imports the prepared ``engine`` first (os.environ with
    its PYTHONPATH, offline hub switches and ``extra``); without the package index the calling
    test skips, unless CI=true, where a missing engine is a failure."""
    import pytest

    try:
        paths = prepare_engine(engine, log=log)
    except EngineUnavailable as exc:
        if in_ci():
            raise
        pytest.skip(f"{engine} wheel unavailable: {exc}")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, paths["deps"]), str(paths["code"])]),
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)


@contextlib.contextmanager
def loopback_servers(script: Path, plans: dict, env: dict[str, str]):
    """Start ``script`` with every plan ({name: argv}): one process imports the engine (the slow
    part) and forks a server per plan (scripted_target.serve_plans), each printing its port ->
    {name: "http://127.0.0.1:PORT"}. All are stopped on leaving the block."""
    process = subprocess.Popen([sys.executable, str(script), "--plans", json.dumps(list(plans.values()))], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        urls = {}
        for name in plans:
            line = process.stdout.readline()
            assert line.strip().isdigit(), f"{script.name} {name}: {process.stderr.read()[-3000:]}"
            urls[name] = f"http://127.0.0.1:{line.strip()}"
        yield urls
    finally:
        process.terminate()
        process.wait(timeout=20)
