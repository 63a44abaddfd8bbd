"""Plain functions (no pytest fixtures) that prepare the released engines and run
engine_check.py in them; used by conftest.py and by scripts/engine_schemas.py.

The released engines, run for real on the exports: vLLM 0.33.0 and SGLang 0.5.23.

On first use the wheels are fetched with ``pip download --no-deps`` from the package index,
unpacked whole, and the Python packages their parsers and config classes import are installed
with ``pip install --no-deps --target`` from tests/engines/vllm-deps.txt (and, in front of
it for SGLang, sglang-deps.txt); torch comes from the test venv for vLLM and from sglang-config-deps.txt (SGLang's pin) for SGLang. Everything is cached under
$SPECREG_ENGINE_CACHE, default /var/cache/specreg/engines (specreg.core.packages.cache_root: the
same cache as the real pair and llama.cpp, outside the clone); a second run reuses it.

Without network the tests skip, unless CI=true, where a missing engine is a failure.

Each engine's code runs in one subprocess for all export cases (tests/engines/engine_check.py):
the engine is imported once. The CPU platform is chosen by vLLM's own VLLM_TARGET_DEVICE=cpu
switch; the list of import-only stand-ins for GPU-only modules is engine_check.STAND_INS
(empty today) and is printed with the fixture's timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from specreg.core.packages import OFFLINE_SIGNS, cache_root

ENGINES_DIR = Path(__file__).parent
ENGINE_RELEASES = {"vllm": "0.33.0", "sglang": "0.5.23"}
CHECK_SCRIPT = ENGINES_DIR / "engine_check.py"
TIMINGS: dict[str, float] = {}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


class EngineUnavailable(Exception):
    """The engine could not be fetched or installed (no network, index down)."""


def unavailable(reason: str):
    raise EngineUnavailable(reason)


def run_pip(args: list[str], what: str) -> None:
    command = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        # No index reachable: skip (a failure in CI); anything else is a real error.
        if any(sign in completed.stderr for sign in OFFLINE_SIGNS):
            unavailable(f"{what} failed: {last}")
        raise RuntimeError(f"{what} failed: {last}")


# The dependency folders each engine imports from, first one first: SGLang's few extra
# packages (its own transformers pin among them) and the torch it pins with torchvision
# (sglang-config-deps.txt: its model-config path imports torchvision) sit in front of the vLLM set.
# vLLM's numba (its n-gram proposer's compiler) is a small layer of its own behind the vLLM set.
DEPS_LAYERS = {"vllm": ("vllm", "vllm-numba"), "sglang": ("sglang", "sglang-config", "vllm")}


def prepare_engine(engine: str) -> dict[str, object]:
    """Wheel downloaded and unpacked, its import dependencies installed; returns
    {"code": unpacked wheel, "deps": [dependency folders, first first]}."""
    release = ENGINE_RELEASES[engine]
    root = cache_root()
    wheels = root / "wheels"
    unpacked = root / f"{engine}-{release}"
    started = time.monotonic()
    if not (unpacked / ".complete").exists():
        wheels.mkdir(parents=True, exist_ok=True)
        found = sorted(wheels.glob(f"{engine}-{release}-*.whl"))
        if not found:
            run_pip(["download", "--no-deps", f"{engine}=={release}", "-d", str(wheels)], f"pip download {engine}=={release}")
            found = sorted(wheels.glob(f"{engine}-{release}-*.whl"))
        with zipfile.ZipFile(found[0]) as wheel:
            wheel.extractall(unpacked)
        (unpacked / ".complete").write_text(found[0].name)
    TIMINGS[f"{engine} wheel"] = round(time.monotonic() - started, 1)
    deps = []
    for layer in DEPS_LAYERS[engine]:
        # Keyed by the requirement file's content: edit it, get a fresh folder.
        requirements = ENGINES_DIR / f"{layer}-deps.txt"
        folder = root / f"deps-{layer}-{_digest(requirements)}"
        started = time.monotonic()
        if not (folder / ".complete").exists():
            run_pip(["install", "--no-deps", "--target", str(folder), "-r", str(requirements)], f"pip install {layer} deps")
            (folder / ".complete").write_text(requirements.read_text())
        TIMINGS[f"{layer} deps"] = round(time.monotonic() - started, 1)
        deps.append(folder)
    return {"code": unpacked, "deps": deps}


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def run_engine(engine: str, cases: list[dict], workdir: Path, timeout: int = 900, script: Path = CHECK_SCRIPT) -> dict:
    """Run engine_check.py (or another ``script`` of this folder taking the same arguments) on the
    cases with the engine first on the import path; returns engine_check's
    {"results": [...], "schema": {...}, "stand_ins": [...], "seconds": N} or the script's output."""
    paths = prepare_engine(engine)
    cases_path, out_path = workdir / f"{engine}-{script.stem}-cases.json", workdir / f"{engine}-{script.stem}-out.json"
    cases_path.write_text(json.dumps(cases))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, paths["deps"]), str(paths["code"])]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_TARGET_DEVICE="cpu")
    started = time.monotonic()
    completed = subprocess.run([sys.executable, str(script), engine, str(cases_path), str(out_path)],
                               env=env, capture_output=True, text=True, timeout=timeout)
    TIMINGS[f"{engine} run"] = round(time.monotonic() - started, 1)
    assert completed.returncode == 0, f"{engine} check crashed:\n{completed.stderr[-4000:]}"
    output = json.loads(out_path.read_text())
    print(f"\n[engine check] {engine}: {len(cases)} cases, stand-ins {output.get('stand_ins', [])}, "
          f"timings (s) {TIMINGS}", file=sys.stderr)
    return output
